"""GenEval's scoring rules (Ghosh et al., 2023) on a plug-in detector, and Flow-GRPO's partial-credit reward.

GenEval scores compositional prompts ("a photo of three apples", "a red cat and a blue dog", "a dog
right of a cat") with an object detector and a colour classifier. Each prompt carries a spec in
GenEval's metadata format (`evaluation_metadata.jsonl`, written by its `prompts/create_prompts.py`):

    {"tag": "position", "prompt": "a photo of a dog right of a cat",
     "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["right of", 0]}]}
    {"tag": "counting", "prompt": "a photo of three apples",
     "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}]}

This module ports the rules of the public scripts (repository djghosh13/geneval, file
`evaluation/evaluate_images.py`, functions `evaluate_image`, `evaluate`, `relative_position`,
`compute_iou`; and repository yifan123/reward-server, file `reward_server/gen_eval.py`, function
`evaluate_reward`, the score Flow-GRPO trains on):

1. **Detections kept** (`select_objects`), per class: sort by confidence, keep those *above*
   `threshold` (0.3), or `counting_threshold` (0.9) when the tag is "counting"; keep at most
   `max_objects` (16); greedy overlap suppression that drops a box whose IoU (GenEval's +1-pixel
   convention) with a kept one is >= `nms_threshold` (1.0 = off, GenEval's default).
2. **GenEval's correctness** (`geneval_correct`, the benchmark number): every include clause needs
   `count` kept objects of its class; its colour (if any) must be the colour of all of the `count`
   most confident ones, classified from each object's crop; its position (if any) must hold for
   EVERY pair of (one of those objects, one object of the target clause), where
   `relative_position` is GenEval's dominant-direction test; an exclude clause fails when `count` or
   more objects of its class are kept. The image is correct only when every clause holds.
3. **Flow-GRPO's partial credit** (`flow_grpo_score`, the training reward): the mean of per-clause
   terms (count closeness `1 - |count - n| / count` with n ALL kept objects of the class, colour
   closeness, position 0/1 with that script's exact bookkeeping), excludes ignored; it also returns
   Flow-GRPO's "strict" correctness (exact counts).

The detector is a plug-in: `detector(images) -> B lists of Detection` (GenEval's Mask2Former, an
OWL-ViT, the testbed's digit detector, a test fake). Colour comes from `color_classifier(image,
boxes) -> colour names` applied to the image's crops (GenEval runs CLIP zero-shot on the masked
crop); without one, each Detection's own `color` is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .base import Reward, register_reward

__all__ = [
    "GENEVAL_TAGS", "RELATIONS", "Detection", "Detector", "ColorClassifier", "GenEvalRules", "load_geneval_metadata",
    "box_iou", "relative_position", "select_objects", "ColorsOf", "geneval_correct", "flow_grpo_score", "geneval_table",
    "GenEvalResult", "GenEvalReward",
]

GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
"""GenEval's six categories, in the order of its results table."""
RELATIONS = ("left of", "right of", "above", "below")
"""GenEval's position relations, in the column order of `relative_position`'s output."""


@dataclass(frozen=True)
class Detection:
    """One detected object: class label, confidence, box (x0, y0, x1, y1) in pixels, optional colour name."""

    label: str
    score: float
    box: tuple[float, float, float, float]
    color: str | None = None


Detector = Callable[[torch.Tensor], Sequence[Sequence[Detection]]]
ColorClassifier = Callable[[torch.Tensor, torch.Tensor], list[str]]
"""`color_classifier(image (3, H, W) in [0, 1], boxes (K, 4) x0 y0 x1 y1 pixels) -> K colour names`."""


@dataclass(frozen=True)
class GenEvalRules:
    """GenEval's evaluation options, defaults as in `evaluate_images.py`'s `--options` (and Flow-GRPO's server).

    threshold: minimum confidence (exclusive) of a kept detection; counting_threshold: the same for
    "counting" prompts; max_objects: detections kept per class; nms_threshold: a box whose IoU with a
    kept box of its class is >= this is dropped (1.0 disables it); position_threshold: the `c` of
    the position rule (centres must be apart by more than c x (sum of the two boxes' sizes)).
    """

    threshold: float = 0.3
    counting_threshold: float = 0.9
    max_objects: int = 16
    nms_threshold: float = 1.0
    position_threshold: float = 0.1


def load_geneval_metadata(path: str) -> dict[str, dict]:
    """Read GenEval's `evaluation_metadata.jsonl` into {prompt: spec}."""
    specs = {}
    with open(path) as handle:
        for line in handle:
            if line.strip():
                spec = json.loads(line)
                specs[spec["prompt"]] = spec
    return specs


def box_iou(boxes_a: torch.Tensor, boxes_b: torch.Tensor) -> torch.Tensor:
    """IoU of every pair, GenEval's `compute_iou` convention (inclusive pixels: widths are x1 - x0 + 1).

    boxes_a (A, 4), boxes_b (B, 4) as x0, y0, x1, y1 -> (A, B); 0 where the union is empty.
    """
    def area(boxes):
        return (boxes[..., 2] - boxes[..., 0] + 1).clamp_min(0) * (boxes[..., 3] - boxes[..., 1] + 1).clamp_min(0)

    a, b = boxes_a[:, None, :], boxes_b[None, :, :]
    inter = torch.cat([torch.maximum(a[..., :2], b[..., :2]), torch.minimum(a[..., 2:], b[..., 2:])], dim=-1)
    i_area = area(inter)
    union = area(a) + area(b) - i_area
    return torch.where(union != 0, i_area / torch.where(union != 0, union, 1), torch.zeros_like(union))


def relative_position(boxes_a: torch.Tensor, boxes_b: torch.Tensor, position_threshold: float = 0.1) -> torch.Tensor:
    """GenEval's `relative_position`: which of RELATIONS box A holds relative to box B (image y points down).

    boxes_a, boxes_b: (..., 4) x0, y0, x1, y1 (broadcast together) -> (..., 4) bool, columns in the
    order of RELATIONS. The centre offset is shrunk by `position_threshold` x (sum of the two box
    sizes) per axis (towards 0, not past it); no relation holds if nothing is left; otherwise a
    relation holds when the shrunk offset's component along it exceeds half the length of the raw
    offset (the dominant-direction test), so "right of" rejects a box that is mostly below.
    """
    boxes_a, boxes_b = torch.broadcast_tensors(boxes_a.double(), boxes_b.double())
    offset = (boxes_a[..., :2] + boxes_a[..., 2:]) / 2 - (boxes_b[..., :2] + boxes_b[..., 2:]) / 2
    dims = (boxes_a[..., 2:] - boxes_a[..., :2]).abs() + (boxes_b[..., 2:] - boxes_b[..., :2]).abs()
    revised = (offset.abs() - position_threshold * dims).clamp_min(0) * offset.sign()
    none = (revised.abs() < 1e-3).all(dim=-1, keepdim=True)
    norm = offset.norm(dim=-1, keepdim=True)
    dx, dy = (revised / torch.where(none, 1.0, norm)).unbind(-1)
    return torch.stack([dx < -0.5, dx > 0.5, dy < -0.5, dy > 0.5], dim=-1) & ~none


def _boxes(objects: Sequence[Detection]) -> torch.Tensor:
    return torch.tensor([d.box for d in objects], dtype=torch.float64).reshape(-1, 4)


def select_objects(detections: Sequence[Detection], tag: str, rules: GenEvalRules = GenEvalRules()
                   ) -> dict[str, list[Detection]]:
    """GenEval's `evaluate_image` box filtering: {class: kept detections, most confident first}.

    Per class: confidence > threshold (counting_threshold for tag "counting"), the `max_objects` most
    confident, then greedy suppression of boxes whose IoU with a kept one is >= `nms_threshold`.
    Classes with no kept detection are absent.
    """
    cutoff = rules.counting_threshold if tag == "counting" else rules.threshold
    kept: dict[str, list[Detection]] = {}
    for label in dict.fromkeys(d.label for d in detections):
        ordering = sorted((d for d in detections if d.label == label and d.score > cutoff),
                          key=lambda d: d.score, reverse=True)[: rules.max_objects]
        if rules.nms_threshold != 1 and len(ordering) > 1:
            iou = box_iou(_boxes(ordering), _boxes(ordering))
            alive = torch.ones(len(ordering), dtype=torch.bool)
            for i in range(len(ordering)):  # greedy: each kept box removes its later overlaps
                if alive[i]:
                    alive[i + 1:] &= iou[i, i + 1:] < rules.nms_threshold
            ordering = [d for d, keep in zip(ordering, alive.tolist()) if keep]
        if ordering:
            kept[label] = ordering
    return kept


ColorsOf = Callable[[Sequence[Detection]], list[str]]
"""Colour names of some detections of one image (see `GenEvalReward`)."""


def _all_pairs_hold(objects: Sequence[Detection], targets: Sequence[Detection], relation: str,
                    rules: GenEvalRules) -> bool:
    if relation not in RELATIONS:
        raise ValueError(f"unknown position relation {relation!r}; GenEval's are {RELATIONS}")
    rel = relative_position(_boxes(objects)[:, None], _boxes(targets)[None, :], rules.position_threshold)
    return bool(rel[..., RELATIONS.index(relation)].all())


def geneval_correct(objects: Mapping[str, Sequence[Detection]], spec: Mapping, colors_of: ColorsOf,
                    rules: GenEvalRules = GenEvalRules()) -> tuple[bool, list[str]]:
    """GenEval's `evaluate`: (is the image correct, reasons for each failed clause).

    objects: `select_objects` output; spec: a GenEval metadata entry; colors_of: colour names of
    given detections of this image. Include clauses combine with AND, exclude clauses with OR.
    """
    reasons: list[str] = []
    matched_groups: list[Sequence[Detection] | None] = []
    for req in spec.get("include", []):
        found = list(objects.get(req["class"], []))[: req["count"]]
        matched = len(found) >= req["count"]
        if not matched:
            reasons.append(f"expected {req['class']}>={req['count']}, found {len(found)}")
        elif "color" in req and colors_of(found).count(req["color"]) < req["count"]:
            matched = False
            reasons.append(f"expected {req['count']} {req['color']} {req['class']}")
        if matched and "position" in req:
            relation, target = req["position"]
            if matched_groups[target] is None:
                matched = False
                reasons.append(f"no target for {req['class']} to be {relation}")
            elif not _all_pairs_hold(found, matched_groups[target], relation, rules):
                matched = False
                reasons.append(f"expected {req['class']} {relation} target")
        matched_groups.append(found if matched else None)
    for req in spec.get("exclude", []):
        n = len(objects.get(req["class"], []))
        if n >= req["count"]:
            reasons.append(f"expected {req['class']}<{req['count']}, found {n}")
    return not reasons, reasons


def flow_grpo_score(objects: Mapping[str, Sequence[Detection]], spec: Mapping, colors_of: ColorsOf,
                    rules: GenEvalRules = GenEvalRules()) -> tuple[float, bool]:
    """Flow-GRPO's GenEval training reward (reward-server `evaluate_reward`): (partial credit, strict correct).

    Per include clause with n = ALL kept objects of its class: the term 1 - |count - n| / count;
    when n != count, one extra 0 if the clause has a colour or a position; otherwise a colour term
    1 - |count - k| / count (k of them classified as the colour) and, when the colour matched, a
    position term: 0 if the target clause failed; else 1 if every pair holds, and 0 followed by 1 if
    some pair does not (that script's bookkeeping, kept as published). The score is the mean of all
    terms (0 with none); exclude clauses are ignored. Strict correctness needs exact counts.
    """
    terms: list[float] = []
    strict = True
    matched_groups: list[Sequence[Detection] | None] = []
    for req in spec.get("include", []):
        count = req["count"]
        found = list(objects.get(req["class"], []))
        terms.append(1 - abs(count - len(found)) / count)
        matched = len(found) == count
        if not matched:
            if "color" in req or "position" in req:
                terms.append(0.0)
        else:
            if "color" in req:
                hits = colors_of(found).count(req["color"])
                terms.append(1 - abs(count - hits) / count)
                matched = hits == count
            if "position" in req and matched:
                relation, target = req["position"]
                if matched_groups[target] is None:
                    matched = False
                    terms.append(0.0)
                else:
                    if not _all_pairs_hold(found, matched_groups[target], relation, rules):
                        matched = False
                        terms.append(0.0)
                    terms.append(1.0)
        strict &= matched
        matched_groups.append(found if matched else None)
    return (sum(terms) / len(terms) if terms else 0.0), strict


def geneval_table(tags: Sequence[str], correct: Sequence[bool]) -> dict[str, float]:
    """GenEval's `summary_scores.py` table: accuracy per tag (in GENEVAL_TAGS order, present tags only)
    and "overall", the mean of the per-tag accuracies (not of all images)."""
    if len(tags) != len(correct) or not tags:
        raise ValueError(f"need one correctness flag per tag and at least one image; got {len(tags)} and {len(correct)}")
    unknown = set(tags) - set(GENEVAL_TAGS)
    if unknown:
        raise ValueError(f"unknown GenEval tags {sorted(unknown)}; expected {GENEVAL_TAGS}")
    flags = torch.tensor([bool(c) for c in correct], dtype=torch.float64)
    table = {}
    for tag in GENEVAL_TAGS:
        members = torch.tensor([t == tag for t in tags])
        if members.any():
            table[tag] = flags[members].mean().item()
    table["overall"] = sum(table.values()) / len(table)
    return table


@dataclass(frozen=True)
class GenEvalResult:
    """One image's verdicts: GenEval's correctness (and why not), Flow-GRPO's partial credit and strict flag."""

    tag: str
    correct: bool
    score: float
    strict_correct: bool
    reasons: list[str] = field(default_factory=list)


@register_reward("geneval")
class GenEvalReward(Reward):
    """GenEval's rules as a reward: per-prompt specs, a detector plug-in and a crop colour classifier.

    Args:
        detector: `detector(images (B, 3, H, W) in [0, 1]) -> B lists of Detection`.
        specs: {prompt: GenEval spec with "tag"}, e.g. from `load_geneval_metadata`.
        partial: score with Flow-GRPO's partial credit (its training reward) instead of GenEval's 0/1.
        rules: GenEval's options (thresholds, suppression, position threshold).
        color_classifier: `(image (3, H, W), boxes (K, 4)) -> K colour names` from the crops; None
            reads each Detection's `color`.

    Call: `reward(images, prompts)`; `evaluate(images, specs)` gives every verdict per image.
    """

    def __init__(self, detector: Detector, specs: Mapping[str, Mapping] | None = None, partial: bool = False,
                 rules: GenEvalRules = GenEvalRules(), color_classifier: ColorClassifier | None = None):
        super().__init__()
        self.detector = detector
        self.specs = dict(specs or {})
        self.partial = partial
        self.rules = rules
        self.color_classifier = color_classifier

    def score(self, images, prompts):
        missing = [p for p in prompts if p not in self.specs]
        if missing:
            raise KeyError(f"GenEval reward: no requirement spec for prompts {missing[:3]}")
        results = self.evaluate(images, [self.specs[p] for p in prompts])
        values = [r.score if self.partial else float(r.correct) for r in results]
        return torch.tensor(values, dtype=torch.float32, device=images.device)

    def _colors_of(self, image: torch.Tensor) -> ColorsOf:
        def colors_of(objects: Sequence[Detection]) -> list[str]:
            if self.color_classifier is not None:
                return list(self.color_classifier(image, _boxes(objects).to(torch.float32)))
            if any(d.color is None for d in objects):
                raise ValueError("GenEval reward: a colour clause needs a color_classifier or detections with .color")
            return [d.color for d in objects]
        return colors_of

    @torch.no_grad()
    def evaluate(self, images: torch.Tensor, specs: Sequence[Mapping]) -> list[GenEvalResult]:
        """Every verdict for images (B, 3, H, W) in [0, 1] against one spec each (detector run once, batched)."""
        if len(specs) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(specs)} specs")
        for spec in specs:
            if spec.get("tag") not in GENEVAL_TAGS:
                raise ValueError(f"GenEval spec {spec.get('prompt', spec)!r} needs a 'tag' in {GENEVAL_TAGS}")
        detections = self.detector(images)
        results = []
        for image, found, spec in zip(images, detections, specs):
            objects = select_objects(found, spec["tag"], self.rules)
            colors_of = self._colors_of(image)
            correct, reasons = geneval_correct(objects, spec, colors_of, self.rules)
            score, strict = flow_grpo_score(objects, spec, colors_of, self.rules)
            results.append(GenEvalResult(spec["tag"], correct, score, strict, reasons))
        return results
