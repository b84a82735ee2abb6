"""The training forwards in micro-batches of ``optim.micro_batch_size`` rows: gradient accumulation (one minibatch's
gradient from its micro-batches) and the prepare phase's forwards without gradient, at the same size."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from tensordict import TensorDictBase
from torch import nn

from vgrpo_lib.integrations.distributed import gradient_sync, metric_extreme
from vgrpo_lib.losses import total_loss

__all__ = ["accumulate_gradients", "forward_in_micro_batches"]


def accumulate_gradients(loss: Callable[[TensorDictBase, torch.Generator], TensorDictBase], policy: nn.Module,
                         minibatch: TensorDictBase, micro_batch_size: int | None, generator: torch.Generator,
                         autocast: Callable[[], AbstractContextManager]) -> dict[str, torch.Tensor]:
    """Backpropagate ``loss(rows, generator)`` of ``minibatch`` (``[B]`` rows), in micro-batches of
    ``micro_batch_size`` rows when set, each micro-batch's loss weighted by its share of the rows so that the
    gradient is the minibatch's; DDP / FSDP2 (``policy``) synchronise only on the last one. The forwards run under
    ``autocast()``. Returns the losses and diagnostics combined the same way (``*_min`` / ``*_max`` diagnostics by
    min / max, as across processes)."""
    size = micro_batch_size
    micro_batches = [minibatch] if size is None or size >= minibatch.shape[0] else minibatch.split(size)
    combined: dict[str, torch.Tensor] = {}
    for index, micro in enumerate(micro_batches):
        share = micro.shape[0] / minibatch.shape[0]
        with gradient_sync(policy, enabled=index == len(micro_batches) - 1):
            with autocast():
                losses = loss(micro, generator)
            (total_loss(losses) * share).backward()
        for key, value in losses.items():
            value, extreme = value.detach(), metric_extreme(key)
            if key not in combined:
                combined[key] = value if extreme else value * share
            elif extreme:
                combined[key] = (torch.minimum if extreme == "min" else torch.maximum)(combined[key], value)
            else:
                combined[key] = combined[key] + value * share
    return combined


@torch.no_grad()
def forward_in_micro_batches(forward: Callable[[TensorDictBase], dict[str, torch.Tensor]], rows: TensorDictBase,
                             micro_batch_size: int | None) -> dict[str, torch.Tensor]:
    """``forward(micro)`` (entries with one row per row of ``micro``) on ``rows`` (``[N]``) in micro-batches of
    ``micro_batch_size`` rows (None: all at once), without gradient; each entry joined along the rows: ``[N, ...]``."""
    size = micro_batch_size
    if size is None or size >= rows.shape[0]:
        return forward(rows)
    parts = [forward(micro) for micro in rows.split(size)]
    return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
