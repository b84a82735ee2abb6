"""AWM (Xue et al., 2025, "Advantage Weighted Matching: Aligning RL with Pretraining in Diffusion Models"): the
flow-matching pretraining loss on the policy's own samples, weighted by their advantages.

    rollout   a deterministic ODE solve (official: any solver)
    loss      AWMLoss on K pairs drawn fresh each gradient step: timesteps stratified over the rollout grid's
              steps 1 .. int(timestep_fraction * T) - 1 (official ``discrete_wo_init``, 6 pairs, fraction 0.9),
              independent noises, the generalised-Huber weighting; advantages scaled by ``advantage_scale``
              (official 1/5 after the clip to +-5); velocity-MSE KLs to a soft-updated copy of the policy
              (official coefficient 1) and optionally to the base policy (official 0.001-0.003)
    after     the copy follows the policy: theta_copy <- d theta_copy + (1 - d) theta, d = min(rate * steps, max)
              with the gradient steps so far (official ``kl_ema_decay_type='linear'``: min(0.001 step, 0.3))

The official loop (scxue/advantage_weighted_matching, scripts/train_sd3_awm.py) takes one on-policy gradient step
per rollout and shares each pair's timestep within a per-GPU micro-batch; here pairs are independent per sample.
Cost per sample and iteration: rollout steps + K forward+backward per step + K per KL model without grad.
"""

from __future__ import annotations

from vgrpo_lib.algorithms.base import FreshPairsAlgorithm
from vgrpo_lib.control import OldPolicyDecay
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.losses import AWMLoss
from vgrpo_lib.timesteps import DiscreteGrid

__all__ = ["AWM"]


class AWM(FreshPairsAlgorithm):
    """AWM from ``config.awm``: an ODE rollout and :class:`AWMLoss` on fresh pairs each step, with its soft-updated
    copy (see the module docstring)."""

    name = "awm"

    def __init__(self, config, policies, sample_shape, grid):
        super().__init__(config, policies, sample_shape, grid)
        c = config.awm
        last = int(c.timestep_fraction * config.rollout.num_steps)
        self.estimator = ELBOSurrogate(c.num_pairs, DiscreteGrid(self.grid[1:last]), sharing="none", weighting=c.weighting)
        self.decay = OldPolicyDecay(c.decay_rate, c.decay_max)
        self.loss_module = AWMLoss(
            self.policy,
            self.estimator,
            advantage_scale=c.advantage_scale,
            behaviour_model=self.behaviour,
            behaviour_kl_coef=c.behaviour_kl_coef,
            ref_model=self.reference,
            ref_kl_coef=c.ref_kl_coef,
        )

    @staticmethod
    def needs_reference(config) -> bool:
        return config.awm.ref_kl_coef is not None

    @staticmethod
    def needs_behaviour(config) -> bool:
        return config.awm.behaviour_kl_coef is not None

    def nfe(self) -> dict[str, int]:
        models = 1 + (self.behaviour is not None) + (self.reference is not None)
        return {**super().nfe(), "update": self.estimator.num_pairs * models * self.config.optim.epochs}
