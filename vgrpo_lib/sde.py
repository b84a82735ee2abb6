"""The Flow-GRPO SDE: a stochastic sampler with the marginals of the rectified-flow ODE, and its step density.

With ``dt = t_next - t < 0`` and ``sigma_t = a sqrt(t / (1 - t))`` (``a`` = ``noise_level``, 0.7 in Flow-GRPO):

    mu = z (1 + sigma_t^2 dt / (2 t)) + v (1 + sigma_t^2 (1 - t) / (2 t)) dt
    z' = mu + sigma_t sqrt(-dt) xi,          xi ~ N(0, I)

``noise_level = 0`` reduces to the Euler ODE step ``z + v dt``. At ``t = 1`` the ratio ``t / (1 - t)`` is
infinite; as in the anchor implementation the denominator then uses ``t_next`` instead (``1 - t_next``).
Times are tensors ``[B]`` (one per row, so that shuffled transitions from different steps can share a batch).
"""

from __future__ import annotations

import math

import torch

from vgrpo_lib._checks import choose
from vgrpo_lib.paths import _expand_time
from vgrpo_lib.weighting import mean_over_data

LOG_PROB_REDUCTIONS = ("mean", "sum")


def sde_step_mean_std(z: torch.Tensor, v: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, noise_level: float):
    """Mean ``[B, *D]`` and standard deviation ``[B, 1, ...]`` of ``p(z' | z)`` for one SDE step ``t -> t_next``.

    Args:
        z, v: ``[B, *D]`` the state and the policy's velocity at ``(z, t)``.
        t, t_next: ``[B]`` with ``0 < t_next < t <= 1`` (the caller guarantees the order; no check here so that
            the training loss has no device sync).
    """
    t, t_next = _expand_time(t, z), _expand_time(t_next, z)
    dt = t_next - t
    denominator = 1.0 - torch.where(t >= 1.0, t_next, t)
    sigma_sq = noise_level**2 * t / denominator
    mean = z * (1.0 + sigma_sq * dt / (2.0 * t)) + v * (1.0 + sigma_sq * (1.0 - t) / (2.0 * t)) * dt
    return mean, torch.sqrt(sigma_sq * -dt)


def gaussian_log_prob(value: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean"):
    """Log-density of ``value`` under ``N(mean, std^2 I)``, reduced over the data dimensions -> ``[B]``.

    ``reduction="mean"`` (default) averages the per-dimension log-densities, as the Flow-GRPO anchor does (hence
    its tiny clip range, 1e-4); ``"sum"`` is the true joint log-density. ``std`` broadcasts against ``mean``.
    """
    choose("log-prob reduction", reduction, LOG_PROB_REDUCTIONS)
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device).expand_as(mean)
    log_density = -((value - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    per_sample = mean_over_data(log_density, 1)
    return per_sample * log_density[0].numel() if reduction == "sum" else per_sample
