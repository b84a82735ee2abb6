"""Evaluation of generated testbed images: reward, accuracy, the reward-hacking gap, diversity.

``evaluate(images, prompts, task)`` scores a batch against a task:

* ``reward_mean`` (and ``reward/<name>`` for every component of a weighted multi-reward);
* ``accuracy``: share of images whose every slot the *training* classifier reads as the prompted
  digit; ``slot_accuracy``: share of correct single digits (equal to ``accuracy`` for one slot);
  ``accuracy_per_prompt``: ``{"3": acc}`` or ``{"3,7": acc}`` for the prompts present;
* ``judge_accuracy``: the same with the independent judge (different family, disjoint data), and
  ``judge_gap = accuracy - judge_accuracy``. A policy that learns to please the classifier rather
  than to draw digits opens this gap;
* ``diversity``: mean pairwise RMS pixel distance between images of the same prompt, averaged over
  prompts with at least two images (NaN when there are none). Mode collapse drives it to 0.

``sample_grid_png`` writes a grid of images as a PNG, atomically.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vgrpo_lib.integrations.atomic import atomic_write
from vgrpo_lib.integrations.figures import pyplot, tile
from vgrpo_lib.integrations.metrics import diversity  # noqa: F401 (evaluate's diversity; public here too)
from vgrpo_lib.integrations.testbed.rewards import WeightedReward, slot_logits

__all__ = ["evaluate", "sample_grid_png"]

if TYPE_CHECKING:
    from vgrpo_lib.integrations.testbed.tasks import Task


def _prompt_key(row: torch.Tensor) -> str:
    return ",".join(str(int(v)) for v in row.reshape(-1))


@torch.no_grad()
def evaluate(images: torch.Tensor, prompts: torch.Tensor, task: Task) -> dict:
    """Score ``images`` ``(B, *task.image_shape)`` in ``[0, 1]`` generated for ``prompts`` (``task``'s prompt
    shape) and return a flat dict of floats (plus ``accuracy_per_prompt``, a dict); see the module doc."""
    task.check_batch(images, prompts)
    reward = task.reward()
    out: dict = {"num_samples": images.shape[0], "reward_mean": reward(images, prompts).mean().item()}
    if isinstance(reward, WeightedReward):
        for name, values in reward.components(images, prompts).items():
            out[f"reward/{name}"] = values.mean().item()
    logits, slots = slot_logits(task.classifier(), images, prompts)
    correct_slots = logits.argmax(-1) == slots
    correct = correct_slots.all(-1)
    judge_logits, _ = slot_logits(task.judge(), images, prompts)
    judge_correct = (judge_logits.argmax(-1) == slots).all(-1)
    out["accuracy"] = correct.float().mean().item()
    out["slot_accuracy"] = correct_slots.float().mean().item()
    out["judge_accuracy"] = judge_correct.float().mean().item()
    out["judge_gap"] = out["accuracy"] - out["judge_accuracy"]
    out["diversity"] = diversity(images, prompts)
    unique, inverse = torch.unique(slots, dim=0, return_inverse=True)
    hits = torch.zeros(len(unique)).index_add_(0, inverse, correct.float())
    counts = torch.zeros(len(unique)).index_add_(0, inverse, torch.ones(len(inverse)))
    out["accuracy_per_prompt"] = {_prompt_key(u): (h / c).item() for u, h, c in zip(unique, hits, counts)}
    return out


def sample_grid_png(images: torch.Tensor, path: str | os.PathLike, nrow: int = 10, padding: int = 2) -> Path:
    """Write ``images`` ``(N, 1, H, W)`` in ``[0, 1]`` as a grayscale grid PNG with ``nrow`` images per row.

    The file appears atomically (written to a temporary file in the same folder, then renamed), so a
    reader never sees a half-written image. Returns the path.
    """
    if images.ndim != 4 or images.shape[1] != 1 or images.shape[0] == 0:
        raise ValueError(f"images must be a non-empty (N, 1, H, W) tensor, got {tuple(images.shape)}")
    if nrow < 1:
        raise ValueError(f"nrow must be >= 1, got {nrow}")
    grid = tile(images, min(nrow, images.shape[0]), padding)[0]
    plt = pyplot()
    return atomic_write(path, lambda tmp: plt.imsave(tmp, grid.numpy(), cmap="gray", vmin=0.0, vmax=1.0, format="png"))
