"""The ``motion`` task's reward and its independent judge, on decoded clips ``(B, 3, F, H, W)`` in [0, 1].

* Reward (``MotionReward``): the testbed digit classifier (a CNN, split ``"train"``) reads every frame's
  ``classifier_view``; the clip's digit score is the frame-mean probability of the prompted digit. The motion
  score is ``motion_agreement``: the centre-of-mass velocity projected on the prompted direction, in units of
  the data's ``SPEED`` and clipped to [0, 1] (partial credit for slow motion, none for the wrong way). The
  reward is their product, so a clip scores high only when it shows the prompted digit moving the prompted way.
* Judge (``MotionJudge``): another model family for the digit (the testbed's MLP judge, trained on the disjoint
  ``"judge"`` split; a majority vote over the frames) and another motion estimator (``block_matching_direction``:
  the direction whose one-step shift best predicts each next frame, pixel differences, no centre of mass). A clip
  is judged right when both hold. Never a reward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .prompts import parse_motion
from .render import DIRECTION_VECTORS, SPEED, check_clips, classifier_view, grey, measured_displacement

__all__ = [
    "motion_agreement", "block_matching_direction", "read_clips", "MotionReward", "MotionJudge", "motion_reward", "motion_judge",
]


def _targets(prompts: list[str], batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    if len(prompts) != batch:
        raise ValueError(f"got {len(prompts)} prompts for {batch} clips")
    parsed = [parse_motion(p) for p in prompts]
    return torch.tensor([d for d, _ in parsed]), torch.tensor([k for _, k in parsed])


def motion_agreement(clips: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """``(B,)`` in [0, 1]: the centre-of-mass velocity of ``clips`` ``(B, C, F, H, W)`` along the unit vector of
    ``directions`` ``(B,)`` (indices into ``DIRECTIONS``), divided by ``SPEED`` and clipped."""
    velocity = measured_displacement(clips)
    along = (velocity * DIRECTION_VECTORS[directions].to(velocity.dtype)).sum(-1)
    return (along / SPEED).clamp(0, 1)


def block_matching_direction(clips: torch.Tensor) -> torch.Tensor:
    """Index into ``DIRECTIONS`` ``(B,)``: the direction whose shift by ``SPEED`` pixels of every frame best
    predicts the next frame (least mean absolute difference, summed over the clip's frame pairs)."""
    ink = grey(clips)
    if ink.shape[1] < 2:
        raise ValueError(f"measuring motion needs at least 2 frames, got {ink.shape[1]}")
    before, after = ink[:, :-1], ink[:, 1:]
    padded = F.pad(before, (SPEED, SPEED, SPEED, SPEED))
    h, w = ink.shape[-2:]
    errors = []
    for dy, dx in DIRECTION_VECTORS.long().tolist():
        # content moving by (dy, dx): the next frame at (y, x) shows this frame at (y - dy, x - dx)
        shifted = padded[..., SPEED - SPEED * dy:SPEED - SPEED * dy + h, SPEED - SPEED * dx:SPEED - SPEED * dx + w]
        errors.append((after - shifted).abs().mean(dim=(1, 2, 3)))
    return torch.stack(errors, dim=-1).argmin(-1)


@torch.no_grad()
def read_clips(classifier, clips: torch.Tensor) -> torch.Tensor:
    """The clip-level digit ``(B,)`` a classifier reads from clips ``(B, C, F, H, W)``: the argmax of its class
    probabilities averaged over the frames' ``classifier_view``."""
    views = classifier_view(clips)
    probs = classifier(views.flatten(0, 1)).softmax(-1).view(*views.shape[:2], -1)
    return probs.mean(1).argmax(-1)


class MotionReward:
    """``reward(clips, prompts) -> (B,)``: the classifier's frame-mean probability of the prompted digit times
    ``motion_agreement`` with the prompted direction (see the module doc). ``classifier`` maps
    ``(N, 1, 28, 28)`` images in [0, 1] to 10 logits. It reads whole clips (``reads_videos``: a
    :class:`~vgrpo_lib.integrations.tasks.wan.WanTask` does not average it over frames)."""

    reads_videos = True

    def __init__(self, classifier: nn.Module):
        self.classifier = classifier.eval()

    @torch.no_grad()
    def components(self, clips: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        """``{"digit": (B,), "motion": (B,)}``: the two factors of the reward."""
        check_clips(clips)
        digits, directions = _targets(prompts, clips.shape[0])
        views = classifier_view(clips)
        probs = self.classifier(views.flatten(0, 1)).softmax(-1).view(*views.shape[:2], -1)  # (B, F, 10)
        digit = probs.gather(-1, digits.view(-1, 1, 1).expand(-1, probs.shape[1], 1)).squeeze(-1).mean(1)
        return {"digit": digit, "motion": motion_agreement(clips, directions)}

    def __call__(self, clips: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        parts = self.components(clips, prompts)
        return parts["digit"] * parts["motion"]


class MotionJudge:
    """``judge(clips, prompts) -> dict`` of ``(B,)`` booleans: ``"digit"`` (the judge's frame majority is the
    prompted digit), ``"direction"`` (``block_matching_direction`` is the prompted one) and ``"both"``.
    ``judge`` maps ``(N, 1, 28, 28)`` images in [0, 1] to 10 logits (a model family other than the reward's)."""

    def __init__(self, judge: nn.Module):
        self.judge = judge.eval()

    @torch.no_grad()
    def __call__(self, clips: torch.Tensor, prompts: list[str]) -> dict[str, torch.Tensor]:
        check_clips(clips)
        digits, directions = _targets(prompts, clips.shape[0])
        views = classifier_view(clips)
        votes = self.judge(views.flatten(0, 1)).argmax(-1).view(views.shape[:2])  # (B, F)
        digit = F.one_hot(votes, 10).sum(1).argmax(-1) == digits
        direction = block_matching_direction(clips) == directions
        return {"digit": digit, "direction": direction, "both": digit & direction}


def motion_reward() -> MotionReward:
    """``MotionReward`` with the shipped testbed classifier (``checkpoints/classifier``)."""
    from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained

    return MotionReward(load_pretrained("classifier"))


def motion_judge() -> MotionJudge:
    """``MotionJudge`` with the shipped testbed judge (``checkpoints/judge``, an MLP on a disjoint split)."""
    from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained

    return MotionJudge(load_pretrained("judge"))
