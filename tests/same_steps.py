"""Weight comparisons between runs that must take the same gradient steps up to float32 summation order
(micro-batches vs one batch, 2 ranks vs 1 process).

AdamW cannot be compared that way. It divides each weight's gradient by that gradient's own running size (its
first step is about ``lr * sign(gradient)``), so for a weight whose gradient is near the summation noise, the noise
decides the step's size and sign: up to 2 lr apart in the worst case (seen on a CI machine: 1 weight in 24576 off by
3% of lr against the 1% the old tolerance allowed); and the normalisation hides a gradient of the wrong scale (a
sum where a mean belongs). These tests therefore train with SGD with momentum in AdamW's place: stateful like
AdamW (checkpoints still carry optimizer state, sharded under FSDP2) and linear in the gradient, so that the weights'
changes from the base policy agree to float32 noise relative to the largest change, and a wrongly scaled or wrongly
averaged gradient shows up in full.
"""

from __future__ import annotations

import torch

# Each weight's change may differ from the reference change by this fraction of the largest change of any weight.
# Float32 summation order moves gradients by ~1e-6 of their largest element, and ``base + change`` rounds to the
# weights' float32 grid (measured: micro-batches of 5 vs one batch 8e-6, one ulp of a weight; 2 ranks vs 1 process
# after 2 iterations at most 2e-5). A gradient with the wrong scale or from the wrong rows differs by O(1).
CHANGE_RTOL = 1e-3
SGD_LR = 0.05  # large enough that the changes dwarf float32 rounding of the weights


def sgd_with_momentum(params, lr: float, weight_decay: float = 0.0) -> torch.optim.SGD:
    """AdamW's constructor signature as the trainer calls it; ``lr`` is replaced by ``SGD_LR``."""
    del lr
    return torch.optim.SGD(params, lr=SGD_LR, momentum=0.9, weight_decay=weight_decay)


def train_with_sgd(monkeypatch=None) -> None:
    """Make the trainer build SGD with momentum where it builds AdamW (undone with ``monkeypatch``; for the
    process's lifetime without, as in spawned ranks)."""
    if monkeypatch is None:
        torch.optim.AdamW = sgd_with_momentum
    else:
        monkeypatch.setattr(torch.optim, "AdamW", sgd_with_momentum)


def assert_same_changes(weights: dict, expected: dict, base: dict) -> None:
    """``weights - base`` equals ``expected - base`` for every tensor, within ``CHANGE_RTOL`` of the largest change.
    ``base`` must be the weights both runs started from: it sets the scale of the tolerance."""
    changes = {key: expected[key] - base[key] for key in base}
    largest = max(change.abs().max().item() for change in changes.values())
    assert largest > 0, "nothing was trained: the comparison would be vacuous"
    for key, change in changes.items():
        torch.testing.assert_close(weights[key] - base[key], change, rtol=0.0, atol=CHANGE_RTOL * largest,
                                   msg=lambda m: f"{key}: {m}")
