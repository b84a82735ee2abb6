"""vgrpo_lib: the composable core of online RL for denoising generative models.

Pure torch + tensordict + torchrl (no diffusers import). The pieces, each usable alone:

- :mod:`~vgrpo_lib.paths`: forward processes and v / x / eps conversions.
- :mod:`~vgrpo_lib.timesteps`: uniform, stratified, logit-normal, shifted and grid timestep samplers.
- :mod:`~vgrpo_lib.weighting`: eps, v, x, adaptive_x and ELBO weightings of the denoising loss.
- :mod:`~vgrpo_lib.elbo`: :class:`ELBOSurrogate`, the ELBO stand-in for a whole sample's log-likelihood.
- :mod:`~vgrpo_lib.advantages`: :class:`GroupAdvantage` and group statistics.
- :mod:`~vgrpo_lib.objectives`, :mod:`~vgrpo_lib.sde`: clipped ratio objective, KL estimators, soft clip,
  SDE step densities, DiffusionNFT pieces.
- :mod:`~vgrpo_lib.losses`: TorchRL :class:`VGRPOLoss`, :class:`FlowGRPOLoss`, :class:`DiffusionNFTLoss`, and the
  peers' :class:`GRPOGuardLoss`, :class:`AWMLoss`.
- :mod:`~vgrpo_lib.control`: schedules, adaptive KL, old-policy decay, MixGRPO window.
- :mod:`~vgrpo_lib.samplers`: Euler, Heun, DPM-Solver++(2M) and the recording SDE sampler (Flow-SDE or CPS).
"""

from vgrpo_lib.advantages import GroupAdvantage, group_advantage, group_statistics
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.losses import AWMLoss, DiffusionNFTLoss, FlowGRPOLoss, GRPOGuardLoss, VGRPOLoss, total_loss
from vgrpo_lib.paths import CosineVP, RectifiedFlow
from vgrpo_lib.samplers import sample_dpmpp_2m, sample_euler, sample_heun, sample_ode, sample_sde, time_grid

__all__ = [
    "ELBOSurrogate",
    "GroupAdvantage",
    "group_advantage",
    "group_statistics",
    "VGRPOLoss",
    "FlowGRPOLoss",
    "DiffusionNFTLoss",
    "GRPOGuardLoss",
    "AWMLoss",
    "total_loss",
    "RectifiedFlow",
    "CosineVP",
    "time_grid",
    "sample_euler",
    "sample_heun",
    "sample_dpmpp_2m",
    "sample_ode",
    "sample_sde",
]
