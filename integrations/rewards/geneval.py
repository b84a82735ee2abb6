"""A GenEval-style verifiable reward: object, count, colour and position requirements checked by a detector.

GenEval (Ghosh et al., 2023) scores compositional prompts ("a photo of three apples", "a red cat
and a blue dog", "a dog right of a cat") with an object detector. Each prompt carries a spec in
GenEval's metadata format:

    {"tag": "position", "prompt": "a photo of a dog right of a cat",
     "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["right of", 0]}],
     "exclude": [{"class": "cat", "count": 2}]}

- include: at least `count` confident detections of `class` (of `color`, if given); `position`
  [relation, i] requires one such object to stand in `relation` ("left of", "right of", "above",
  "below") to an object of include[i];
- exclude: fewer than `count` detections of `class`.

The detector is a plug-in, so the reward works with any detector (GenEval's Mask2Former, an
OWL-ViT, a test fake): `detector(images) -> list (per image) of Detection`. Colour is whatever the
detector reports in `Detection.color` (GenEval classifies the crop with CLIP; a detector plug-in
can do the same).

Scores: 1.0 when every requirement holds, else 0.0 (GenEval's strict metric); with
`partial=True`, the fraction of requirements that hold (a denser training signal, as Flow-GRPO's
GenEval reward offers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from .base import Reward, register_reward


@dataclass(frozen=True)
class Detection:
    """One detected object: class label, confidence, box (x0, y0, x1, y1) in pixels, optional colour name."""

    label: str
    score: float
    box: tuple[float, float, float, float]
    color: str | None = None

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


Detector = Callable[[torch.Tensor], Sequence[Sequence[Detection]]]


def load_geneval_metadata(path: str) -> dict[str, dict]:
    """Read GenEval's `evaluation_metadata.jsonl` into {prompt: spec}."""
    specs = {}
    with open(path) as handle:
        for line in handle:
            if line.strip():
                spec = json.loads(line)
                specs[spec["prompt"]] = spec
    return specs


def _relation_holds(a: Detection, b: Detection, relation: str, margin: float) -> bool:
    """Does `a` stand in `relation` to `b`? Centers must differ by more than `margin` times the larger box size."""
    (ax, ay), (bx, by) = a.center, b.center
    size = max(a.box[2] - a.box[0], a.box[3] - a.box[1], b.box[2] - b.box[0], b.box[3] - b.box[1])
    gap = margin * size
    checks = {"left of": bx - ax > gap, "right of": ax - bx > gap, "above": by - ay > gap, "below": ay - by > gap}
    if relation not in checks:
        raise ValueError(f"unknown relation {relation!r}; expected one of {sorted(checks)}")
    return checks[relation]


def check_requirements(detections: Sequence[Detection], spec: Mapping, threshold: float = 0.3,
                       margin: float = 0.1) -> list[bool]:
    """One boolean per requirement of `spec` (includes first, then excludes) for one image.

    Args:
        detections: the detector's output for the image.
        spec: a GenEval metadata entry (see the module docstring).
        threshold: minimum detection confidence to count an object.
        margin: position relations need the centers apart by margin x the larger box size.
    """
    confident = [d for d in detections if d.score >= threshold]

    def matching(req: Mapping) -> list[Detection]:
        return [d for d in confident if d.label == req["class"] and req.get("color") in (None, d.color)]

    includes = list(spec.get("include", []))
    results = []
    for req in includes:
        found = matching(req)
        ok = len(found) >= req.get("count", 1)
        if ok and "position" in req:
            relation, other = req["position"]
            anchors = matching(includes[other])
            ok = any(_relation_holds(a, b, relation, margin) for a in found for b in anchors)
        results.append(ok)
    for req in spec.get("exclude", []):
        results.append(len(matching(req)) < req["count"])
    return results


@register_reward("geneval")
class GenEvalReward(Reward):
    """Verifiable compositional reward from per-prompt requirement specs and a detector plug-in.

    Args:
        detector: `detector(images (B, 3, H, W) in [0, 1]) -> B lists of Detection`.
        specs: {prompt: GenEval spec}, e.g. from `load_geneval_metadata`; prompts missing from it
            must get their spec through the call's `specs` argument.
        partial: score the fraction of satisfied requirements instead of all-or-nothing.
        threshold, margin: see `check_requirements`.

    Call: `reward(images, prompts)` (specs looked up by prompt) or
    `reward.score_with_specs(images, specs)` with one spec per image.
    """

    def __init__(self, detector: Detector, specs: Mapping[str, Mapping] | None = None, partial: bool = False,
                 threshold: float = 0.3, margin: float = 0.1):
        super().__init__()
        self.detector = detector
        self.specs = dict(specs or {})
        self.partial = partial
        self.threshold = threshold
        self.margin = margin

    def score(self, images, prompts):
        missing = [p for p in prompts if p not in self.specs]
        if missing:
            raise KeyError(f"GenEval reward: no requirement spec for prompts {missing[:3]}")
        return self.score_with_specs(images, [self.specs[p] for p in prompts])

    def score_with_specs(self, images: torch.Tensor, specs: Sequence[Mapping]) -> torch.Tensor:
        """(B,) scores of images against explicit specs (one per image)."""
        detections = self.detector(images)
        scores = []
        for found, spec in zip(detections, specs):
            checks = check_requirements(found, spec, self.threshold, self.margin)
            if self.partial:
                scores.append(sum(checks) / len(checks) if checks else 1.0)
            else:
                scores.append(float(all(checks)))
        return torch.tensor(scores, device=images.device)
