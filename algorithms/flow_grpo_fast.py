"""Flow-GRPO-Fast (Flow-GRPO repository, ``scripts/train_sd3_fast.py``): SDE, and training, on a few consecutive
steps branching off an otherwise deterministic (Euler ODE) rollout.

    rollout   each iteration draws a window of ``flow_grpo_fast.branch_steps`` consecutive steps starting
              uniformly in the first ``branch_range`` of the rollout (official: 2-3 steps in the first half); the
              window's steps are stochastic (``flow_grpo.*`` settings: the official fast presets use CPS with
              ``noise_level`` 0.8 and clip range 1e-5), every other step is an ODE step
    prepare   Flow-GRPO's rows, which exist only for the window's steps: only they are trained
    loss      FlowGRPOLoss

The official draws the window once per sampling call (``random.randint(lo, hi - size)`` in
``flow_grpo/diffusers_patch/sd3_pipeline_with_logprob_fast.py``); here once per iteration from the trainer's
generator, so every process branches at the same steps. Cost per sample and iteration: rollout steps + one
forward per window step per epoch.
"""

from __future__ import annotations

import torch

from vgrpo_lib.algorithms.flow_grpo import FlowGRPO

__all__ = ["FlowGRPOFast"]


class FlowGRPOFast(FlowGRPO):
    """Flow-GRPO-Fast from ``config.flow_grpo`` and ``config.flow_grpo_fast``: SDE and training on a window of
    branching steps (see the module docstring)."""

    name = "flow_grpo_fast"

    def sde_steps(self, iteration: int, generator: torch.Generator) -> list[int]:
        c = self.config.flow_grpo_fast
        last_start = int(c.branch_range * self.config.rollout.num_steps) - c.branch_steps
        start = int(torch.randint(0, last_start + 1, (1,), generator=generator))
        return list(range(start, start + c.branch_steps))

    def trained_steps(self) -> int:
        return self.config.flow_grpo_fast.branch_steps
