"""The rollout in micro-batches (``rollout.micro_batch_size``): a bound on the rollout's memory.

    batch = rollout_in_micro_batches(rollout, cond, group, size=8)   # rollout(cond[i:i+8], group[i:i+8]), ... joined

Each micro-batch is one call of the algorithm's rollout on its rows, in order, with the trainer's generator: each
draws its own initial noise (and SDE noise, and Flow-GRPO-Fast's window) in turn, so the samples depend on the
micro-batch size (a run is reproduced with the same size) but not on anything else.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict

__all__ = ["micro_batch_rows", "rollout_in_micro_batches"]


def micro_batch_rows(rows: int, size: int) -> list[slice]:
    """The row ranges of ``rows`` rows in micro-batches of ``size`` (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"micro_batch_rows: size must be >= 1, got {size}.")
    return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]


def rollout_in_micro_batches(rollout: Callable[[object, torch.Tensor], TensorDict], cond, group: torch.Tensor,
                             size: int) -> TensorDict:
    """``rollout(cond, group)`` (``group`` ``(N,)``, ``cond`` a Tensor or TensorDict with N rows, or None) run on
    micro-batches of ``size`` rows in order and joined along the batch: a TensorDict ``[N]``."""
    parts = [rollout(None if cond is None else cond[rows], group[rows])
             for rows in micro_batch_rows(group.shape[0], size)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)
