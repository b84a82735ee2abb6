"""DiffusionNFT (Zheng et al., 2025): negative-aware fine-tuning on the forward process.

    rollout   the OLD policy (the behaviour policy: a soft copy of the trained one; with LoRA a second adapter
              of the same transformer) with a deterministic ODE solver; only clean samples are kept
    loss      DiffusionNFTLoss on fresh timestep-noise pairs each gradient step: ``int(num_steps *
              timestep_fraction)`` distinct timesteps of the rollout grid per sample (official: 0.99, 9 of 10;
              1.0: every step once), implicit positive / negative policies weighted by the optimality r(A)
              (``adv_mode`` variants as in the official code)
    after     theta_old <- d theta_old + (1 - d) theta, d from :class:`~vgrpo_lib.control.OldPolicyDecay` of the
              gradient steps taken so far (type 1: min(0.001 step, 0.5); type 2: flat 75 steps, then 0.0075 per
              step up to 0.999)

Cost per sample and iteration: rollout steps + 2 forwards (trained and old policy) per pair per epoch.
"""

from __future__ import annotations

from vgrpo_lib.algorithms.base import FreshPairsAlgorithm
from vgrpo_lib.control import OldPolicyDecay
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.losses import DiffusionNFTLoss
from vgrpo_lib.timesteps import GridSubset

__all__ = ["DiffusionNFT"]


class DiffusionNFT(FreshPairsAlgorithm):
    """DiffusionNFT from ``config.diffusion_nft``: the old policy's ODE rollout, fresh timestep-noise pairs every
    step, :class:`DiffusionNFTLoss` and the old policy's soft update (see the module docstring)."""

    name = "diffusion_nft"

    def __init__(self, config, policies, sample_shape, grid):
        super().__init__(config, policies, sample_shape, grid)
        c = config.diffusion_nft
        self.decay = OldPolicyDecay(c.decay_rate, c.decay_max, c.decay_flat)
        self.num_pairs = int(config.rollout.num_steps * c.timestep_fraction)
        training_times = GridSubset(self.grid[:-1])
        self.estimator = ELBOSurrogate(self.num_pairs, training_times, sharing="none", weighting=c.weighting)
        self.loss_module = DiffusionNFTLoss(
            self.policy,
            self.behaviour,
            self.estimator,
            strength=c.strength,
            advantage_max=c.advantage_max,
            adv_mode=c.adv_mode,
            ref_model=self.reference if c.ref_kl_coef is not None else None,
            ref_kl_coef=c.ref_kl_coef,
        )

    @staticmethod
    def needs_reference(config) -> bool:
        return config.diffusion_nft.ref_kl_coef is not None

    @staticmethod
    def needs_behaviour(config) -> bool:
        return True

    def rollout_model(self, iteration):
        return self.behaviour

    def nfe(self) -> dict[str, int]:
        per_epoch = self.num_pairs * (3 if self.needs_reference(self.config) else 2)
        return {**super().nfe(), "update": per_epoch * self.config.optim.epochs}
