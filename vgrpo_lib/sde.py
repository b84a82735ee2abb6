"""Stochastic samplers with the marginals of the rectified-flow ODE, and their Gaussian step densities.

The Flow-GRPO SDE (``sde_type="flow_sde"``):

With ``dt = t_next - t < 0`` and ``sigma_t = a sqrt(t / (1 - t))`` (``a`` = ``noise_level``, 0.7 in Flow-GRPO):

    mu = z (1 + sigma_t^2 dt / (2 t)) + v (1 + sigma_t^2 (1 - t) / (2 t)) dt
    z' = mu + sigma_t sqrt(-dt) xi,          xi ~ N(0, I)

``noise_level = 0`` reduces to the Euler ODE step ``z + v dt``. At ``t = 1`` the ratio ``t / (1 - t)`` is
infinite; as in the anchor implementation the denominator then uses ``t_next`` instead (``1 - t_next``).
Times are tensors ``[B]`` (one per row, so that shuffled transitions from different steps can share a batch).

Coefficients-preserving sampling (``sde_type="cps"``, Wang et al., 2025, "Coefficients-Preserving Sampling for
Reinforcement Learning with Flow Matching"), with ``x_hat = z - t v``, ``eps_hat = z + (1 - t) v`` and
``eta`` = ``noise_level`` in ``(0, 1]``:

    z' = (1 - t_next) x_hat + t_next cos(eta pi / 2) eps_hat + t_next sin(eta pi / 2) xi

The noise replaces part of the predicted noise instead of being added to it, so with exact predictions
``z'`` keeps the path's coefficients ``(1 - t_next, t_next)`` (the Flow-SDE step only matches them in the
limit of small steps). The step has no noise at ``t_next = 0``: the last step of a rollout is deterministic.
"""

from __future__ import annotations

import math

import torch

from vgrpo_lib._checks import check_real, choose
from vgrpo_lib.paths import _expand_time
from vgrpo_lib.weighting import mean_over_data

__all__ = [
    "LOG_PROB_REDUCTIONS", "sde_step_mean_std", "cps_step_mean_std", "SDE_TYPES", "step_mean_std", "check_noise_level",
    "gaussian_log_prob",
]

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


def cps_step_mean_std(z: torch.Tensor, v: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor, noise_level: float):
    """Mean ``[B, *D]`` and standard deviation ``[B, 1, ...]`` of one coefficients-preserving step ``t -> t_next``.

    Transcribes ``sde_type == "cps"`` of ``sde_step_with_logprob`` in the Flow-GRPO repository
    (yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py): ``std = t_next sin(eta pi / 2)`` and
    ``mean = (1 - t_next) x_hat + sqrt(t_next^2 - std^2) eps_hat``, written with ``t_next cos(eta pi / 2)``.
    Args as :func:`sde_step_mean_std`; ``noise_level`` is ``eta`` in ``(0, 1]``.
    """
    t, t_next = _expand_time(t, z), _expand_time(t_next, z)
    x_hat, eps_hat = z - t * v, z + (1.0 - t) * v
    angle = noise_level * math.pi / 2.0
    mean = (1.0 - t_next) * x_hat + t_next * math.cos(angle) * eps_hat
    return mean, t_next * math.sin(angle)


SDE_TYPES = {"flow_sde": sde_step_mean_std, "cps": cps_step_mean_std}


def step_mean_std(sde_type: str):
    """The step function ``(z, v, t, t_next, noise_level) -> (mean, std)`` of ``sde_type`` (see ``SDE_TYPES``)."""
    return SDE_TYPES[choose("sde_type", sde_type, SDE_TYPES)]


def check_noise_level(sde_type: str, noise_level: float) -> float:
    """``noise_level`` checked for ``sde_type``: finite and > 0 (0 has no step density: NaN log-probs), and at
    most 1 for ``"cps"`` (``eta``, the share of the noise that is resampled)."""
    choose("sde_type", sde_type, SDE_TYPES)
    high = 1.0 if sde_type == "cps" else math.inf
    if not (0.0 < check_real("noise_level", noise_level) <= high and math.isfinite(noise_level)):
        rule = "in (0, 1]" if sde_type == "cps" else "> 0 and finite"
        raise ValueError(
            f"noise_level must be {rule} for sde_type={sde_type!r} (0 has no step density: NaN log-probs), got "
            f"{noise_level}; use sample_euler for the deterministic ODE."
        )
    return float(noise_level)


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
