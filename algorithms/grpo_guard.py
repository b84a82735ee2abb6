"""GRPO-Guard (Wang et al., 2025, "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching via
Regulated Clipping"): Flow-GRPO whose per-step log-ratio is normalised before the clip.

    rollout   Flow-GRPO's (every ``flow_grpo.*`` setting applies), also recording each step's mean
    prepare   Flow-GRPO's rows, plus the behaviour policy's step mean ``old_mean``
    loss      GRPOGuardLoss: the clipped ratio of ``std * log_ratio + ||mu - mu_old||^2 / (2 std)``, zero-mean
              and with one scale at every step (the plain log-ratio is shifted below 0 and scales as 1 / std),
              each step's gradient weighted by its std

The formula follows Flow-Factory's ``GRPOGuardTrainer`` (X-GenGroup/Flow-Factory, src/flow_factory/trainers/grpo.py);
see :func:`vgrpo_lib.objectives.guard_log_ratio`. Cost: Flow-GRPO's.
"""

from __future__ import annotations

from vgrpo_lib.algorithms.flow_grpo import FlowGRPO
from vgrpo_lib.losses import GRPOGuardLoss

__all__ = ["GRPOGuard"]


class GRPOGuard(FlowGRPO):
    """GRPO-Guard from ``config.flow_grpo``: Flow-GRPO with the normalised per-step log-ratio (see the module
    docstring)."""

    name = "grpo_guard"
    loss_class = GRPOGuardLoss
    record_mean = True
