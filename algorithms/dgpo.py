"""DGPO (Luo, Hu and Tang, ICLR 2026, "Reinforcing Diffusion Models by Direct Group Preference Optimization"): a
group-level DPO on the policy's own ODE samples, with no stochastic sampler and no likelihood ratio.

    rollout   a deterministic ODE solve (official: DPM-Solver, CFG 4.5), from the soft-updated copy once the
              iteration passes ``copy_rollout_after`` (official ``switch_ema_ref``)
    loss      DGPOLoss on K pairs drawn fresh each gradient step, one timestep-noise set per group: K distinct
              timesteps among the rollout grid's steps 0 .. ``last_trained_step`` (official ``num_train_timesteps``
              of ``range(trunc_steps + 1)``); each group weighted by sigmoid(beta * mean_g A (l - l_ref)), the
              pairs' losses clipped against the copy, a velocity-MSE KL to the base
    after     the copy follows the policy: theta_copy <- d theta_copy + (1 - d) theta, d = min(rate * steps, max)
              with the gradient steps so far (official ``ema_ref``: min(0.001 step, 0.3))

The official loop (Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py, ``main``) takes one gradient step per rollout and
draws the trained timesteps once per epoch for the whole batch (broadcast from rank 0) and a noise per group; here
each group draws its own timesteps and noises (the group weight compares members on the same pairs either way).
Cost per sample and iteration: rollout steps (x2 with rollout CFG) + K forward+backward per step + K per distinct
frozen model (base, x2 with its CFG; copy) without grad.
"""

from __future__ import annotations

from vgrpo_lib.algorithms.base import FreshPairsAlgorithm
from vgrpo_lib.control import OldPolicyDecay
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.errors import UsageError
from vgrpo_lib.losses import DGPOLoss
from vgrpo_lib.samplers import classifier_free_guidance
from vgrpo_lib.timesteps import GridSubset

__all__ = ["DGPO"]


class DGPO(FreshPairsAlgorithm):
    """DGPO from ``config.dgpo``: an ODE rollout and :class:`DGPOLoss` on fresh group-shared pairs each step, with
    its soft-updated copy (see the module docstring)."""

    name = "dgpo"

    def __init__(self, config, policies, sample_shape, grid):
        super().__init__(config, policies, sample_shape, grid)
        c = config.dgpo
        for key, scale in (("rollout_cfg_scale", c.rollout_cfg_scale), ("reference_cfg_scale", c.reference_cfg_scale)):
            if scale != 1.0 and policies.null_cond is None:
                raise UsageError(f"dgpo.{key}={scale} needs a task with an unconditional condition (null_cond).")
        self.estimator = ELBOSurrogate(c.num_pairs, GridSubset(self.grid[: c.last_trained_step + 1]), sharing="group",
                                       weighting=c.weighting)
        self.decay = OldPolicyDecay(c.decay_rate, c.decay_max)
        base = None if self.reference is None else classifier_free_guidance(self.reference, policies.null_cond,
                                                                              c.reference_cfg_scale)
        self.null_cond = policies.null_cond
        self.loss_module = DGPOLoss(
            self.policy,
            self.estimator,
            base if c.preference_reference == "base" else self.behaviour,
            beta=c.beta,
            old_model=None if c.clip_range is None else self.behaviour,
            clip_range=c.clip_range,
            ref_model=None if c.ref_kl_coef is None else base,
            ref_kl_coef=c.ref_kl_coef,
        )

    @staticmethod
    def needs_reference(config) -> bool:
        return config.dgpo.preference_reference == "base" or config.dgpo.ref_kl_coef is not None

    @staticmethod
    def needs_behaviour(config) -> bool:
        c = config.dgpo
        return c.clip_range is not None or c.preference_reference == "copy" or c.copy_rollout_after is not None

    def rollout_model(self, iteration: int):
        c = self.config.dgpo
        model = self.behaviour if c.copy_rollout_after is not None and iteration > c.copy_rollout_after else self.policy
        return classifier_free_guidance(model, self.null_cond, c.rollout_cfg_scale)

    def nfe(self) -> dict[str, int]:
        c, nfe = self.config.dgpo, super().nfe()
        frozen = {id(m): m for m in (self.loss_module.reference_model, self.loss_module.old_model,
                                     self.loss_module.ref_model) if m is not None}
        base_cost = 2 if c.reference_cfg_scale != 1.0 else 1
        models = 1 + sum(base_cost if m is not self.behaviour else 1 for m in frozen.values())
        rollout = nfe["rollout"] * (2 if c.rollout_cfg_scale != 1.0 else 1)
        return {**nfe, "rollout": rollout, "update": self.estimator.num_pairs * models * self.config.optim.epochs}
