"""vgrpo_lib: the composable core of online RL for denoising generative models.

Pure torch + tensordict + torchrl (no diffusers import). The pieces, each usable alone:

- :mod:`~vgrpo_lib.protocols`: :class:`VelocityModel`, the model contract ``model(x_t, t, cond) -> v``.
- :mod:`~vgrpo_lib.paths`: forward processes and v / x / eps conversions.
- :mod:`~vgrpo_lib.timesteps`: uniform, stratified, logit-normal, shifted and grid timestep samplers.
- :mod:`~vgrpo_lib.weighting`: eps, v, x, adaptive_x and ELBO weightings of the denoising loss.
- :mod:`~vgrpo_lib.elbo`: :class:`ELBOSurrogate`, the ELBO stand-in for a whole sample's log-likelihood.
- :mod:`~vgrpo_lib.advantages`: :class:`GroupAdvantage` and group statistics.
- :mod:`~vgrpo_lib.objectives`, :mod:`~vgrpo_lib.sde`: clipped ratio objective, KL estimators, soft clip,
  SDE step densities, DiffusionNFT pieces.
- :mod:`~vgrpo_lib.losses`: TorchRL :class:`VGRPOLoss`, :class:`FlowGRPOLoss`, :class:`DiffusionNFTLoss`, and the
  peers' :class:`GRPOGuardLoss`, :class:`AWMLoss`, :class:`DGPOLoss`.
- :mod:`~vgrpo_lib.batches`: each loss's batch from its sampler's output in one call (:func:`flow_grpo_batch`,
  :func:`vgrpo_batch`, DiffusionNFT's :class:`OldPolicy`).
- :mod:`~vgrpo_lib.diagnostics`, :mod:`~vgrpo_lib.testing`: estimator measurements and test helpers for your own
  models and estimators.
- :mod:`~vgrpo_lib.control`: schedules, adaptive KL, old-policy decay, MixGRPO window.
- :mod:`~vgrpo_lib.samplers`: Euler, Heun, DPM-Solver++(2M) and the recording SDE sampler (Flow-SDE or CPS).

Their public names are exported here too (``from vgrpo_lib import Linear, Uniform, clipped_ratio_objective``);
``__version__`` is the package version (the one source: ``pyproject.toml`` reads it).
"""

__version__ = "0.1.0"  # the one source of the version: pyproject.toml reads it (setuptools dynamic attr)

from vgrpo_lib.advantages import GroupAdvantage, group_advantage, group_statistics
from vgrpo_lib.batches import OldPolicy, flow_grpo_batch, vgrpo_batch
from vgrpo_lib.control import (
    AdaptiveKLController,
    Constant,
    Cosine,
    Linear,
    OldPolicyDecay,
    Piecewise,
    SDEWindow,
    Warmup,
    ema_update_,
    exceeds_kl,
    set_learning_rate,
)
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.losses import AWMLoss, DGPOLoss, DiffusionNFTLoss, FlowGRPOLoss, GRPOGuardLoss, VGRPOLoss, total_loss
from vgrpo_lib.objectives import (
    clip_fraction,
    clip_fraction_active,
    clipped_ratio_objective,
    dgpo_group_weight,
    gaussian_kl_same_std,
    kl_estimate,
    nft_optimality,
    ratio_diagnostics,
    soft_clip,
    x_space_kl,
)
from vgrpo_lib.paths import CosineVP, RectifiedFlow
from vgrpo_lib.protocols import VelocityModel
from vgrpo_lib.samplers import sample_dpmpp_2m, sample_euler, sample_heun, sample_ode, sample_sde, time_grid
from vgrpo_lib.timesteps import (
    DiscreteGrid,
    GridSubset,
    LogitNormal,
    PiecewiseDensity,
    Shifted,
    Uniform,
    make_timestep_sampler,
)

__all__ = [
    "__version__",
    "VelocityModel",
    "ELBOSurrogate",
    "GroupAdvantage",
    "group_advantage",
    "group_statistics",
    "VGRPOLoss",
    "FlowGRPOLoss",
    "DiffusionNFTLoss",
    "GRPOGuardLoss",
    "AWMLoss",
    "DGPOLoss",
    "total_loss",
    # a loss's batch from its sampler's output
    "flow_grpo_batch",
    "vgrpo_batch",
    "OldPolicy",
    "RectifiedFlow",
    "CosineVP",
    "time_grid",
    "sample_euler",
    "sample_heun",
    "sample_dpmpp_2m",
    "sample_ode",
    "sample_sde",
    # timesteps
    "Uniform",
    "LogitNormal",
    "Shifted",
    "DiscreteGrid",
    "GridSubset",
    "PiecewiseDensity",
    "make_timestep_sampler",
    # step control
    "Constant",
    "Linear",
    "Cosine",
    "Piecewise",
    "Warmup",
    "AdaptiveKLController",
    "OldPolicyDecay",
    "SDEWindow",
    "exceeds_kl",
    "set_learning_rate",
    "ema_update_",
    # objectives
    "clipped_ratio_objective",
    "clip_fraction",
    "clip_fraction_active",
    "soft_clip",
    "kl_estimate",
    "x_space_kl",
    "gaussian_kl_same_std",
    "ratio_diagnostics",
    "nft_optimality",
    "dgpo_group_weight",
]
