"""FPO (McAllister et al., 2025, "Flow Matching Policy Gradients"): PPO's clipped objective with the ratio

    rho_i = exp( mean_j L_cfm(theta_old; o_i, t_ij, eps_ij) - mean_j L_cfm(theta; o_i, t_ij, eps_ij) )

of conditional flow-matching losses on the same K stored pairs (official: akanazawa/fpo,
playground/src/flow_policy/fpo.py, ``FpoState._compute_fpo_loss`` with ``average_losses_before_exp=True``).
Structurally V-GRPO's ratio without its variance reduction: pairs drawn independently per sample (no group
sharing), timesteps i.i.d. from the rollout grid (official ``discretize_t_for_training``; no stratification),
the plain velocity loss (no adaptive x-weighting). So the algorithm is V-GRPO's, assembled with other pieces.

    rollout   a deterministic ODE solve (as V-GRPO)
    prepare   K independent pairs per sample and the behaviour policy's mean loss on them (skipped with one
              gradient step per rollout, where the ratio is exactly 1)
    loss      VGRPOLoss: the clipped ratio (official clip range 0.05), no KL term
"""

from __future__ import annotations

from vgrpo_lib.algorithms.base import Algorithm
from vgrpo_lib.algorithms.vgrpo import VGRPO
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.losses import VGRPOLoss
from vgrpo_lib.timesteps import DiscreteGrid

__all__ = ["FPO"]


class FPO(VGRPO):
    """FPO from ``config.fpo``: V-GRPO's machinery with independent pairs and the CFM loss (see the module
    docstring)."""

    name = "fpo"

    def __init__(self, config, policies, sample_shape, grid):
        Algorithm.__init__(self, config, policies, sample_shape, grid)
        c = config.fpo
        timesteps = DiscreteGrid(self.grid[:-1], stratified=False) if c.timesteps == "grid" else c.timesteps
        self.estimator = ELBOSurrogate(c.num_pairs, timesteps, sharing="none", weighting=c.weighting)
        self.loss_module = VGRPOLoss(self.policy, self.estimator, clip_range=c.clip_range, on_policy=self.single_step)

    @staticmethod
    def needs_reference(config) -> bool:
        return False
