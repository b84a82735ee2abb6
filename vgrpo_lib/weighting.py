"""Per-pair denoising losses: the weighting of the squared error that defines the ELBO surrogate.

Each weighting is a function ``(v, x, noise, z, t, path, x_pred) -> loss`` where ``v`` is the network's
velocity at ``(z, t)``, ``x`` the clean sample, ``noise`` the eps that made ``z = a_t x + b_t eps``, ``x_pred``
the implied data prediction (precomputed once by the caller) and ``loss`` has the leading shape of ``t``:
squared errors are averaged over the data dimensions (mean, not sum, so that log-ratios and clip ranges do
not scale with resolution).

Options (V-GRPO's ablation order: ``eps`` collapses, ``v`` is stable but slower, ``adaptive_x`` is best):

- ``"eps"``: ``||eps_hat - eps||^2``.
- ``"v"``: ``||v - v*||^2``, the flow-matching pretraining loss.
- ``"x"``: ``||x_hat - x||^2``.
- ``"adaptive_x"``: ``||x_hat - x||^2 / sg(mean_d |x_hat - x|)``, the denominator detached and clamped below by
  ``ADAPTIVE_FLOOR``; self-normalised so every pair contributes on a similar scale (V-GRPO, DiffusionNFT).
- ``"ghuber"``: AWM's generalised Huber loss of the velocity error, ``(t / p) ((l_v + c)^p - c^p)`` with
  ``l_v = ||v - v*||^2``, ``p = 0.25``, ``c = 1e-10`` (Xue et al., 2025, "Advantage Weighted Matching"; the
  official default): it grows like ``l_v^(1/4)``, so outlier pairs with a large error weigh little.
- ``"elbo"``: ``w_elbo(t) ||x_hat - x||^2`` with the true ELBO weight (see :meth:`Path.elbo_x_weight`), for
  study; it is singular at ``t = 0`` so sample ``t`` away from 0.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vgrpo_lib._checks import choose
from vgrpo_lib.paths import Path

__all__ = [
    "ADAPTIVE_FLOOR", "mean_over_data", "eps_loss", "v_loss", "x_loss", "adaptive_x_loss", "ghuber_loss", "elbo_loss",
    "WEIGHTINGS", "make_weighting",
]

ADAPTIVE_FLOOR = 1e-5


def mean_over_data(value: torch.Tensor, leading_ndim: int) -> torch.Tensor:
    """Average over every dimension after the first ``leading_ndim`` ones."""
    return value.mean(dim=tuple(range(leading_ndim, value.ndim))) if value.ndim > leading_ndim else value


def eps_loss(
    v: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, z: torch.Tensor, t: torch.Tensor, path: Path,
    x_pred: torch.Tensor,
) -> torch.Tensor:
    """``mean_d ||eps_hat - eps||^2`` with the leading shape of ``t`` (``v``, ``x``, ``noise``, ``z``, ``x_pred``:
    ``[*t.shape, *D]``)."""
    return mean_over_data((path.eps_from_v(z, v, t) - noise).square(), t.ndim)


def v_loss(
    v: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, z: torch.Tensor, t: torch.Tensor, path: Path,
    x_pred: torch.Tensor,
) -> torch.Tensor:
    """``mean_d ||v - v*||^2`` (the flow-matching loss), shape of ``t``; arguments as :func:`eps_loss`."""
    return mean_over_data((v - path.velocity(x, noise, t)).square(), t.ndim)


def x_loss(
    v: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, z: torch.Tensor, t: torch.Tensor, path: Path,
    x_pred: torch.Tensor,
) -> torch.Tensor:
    """``mean_d ||x_hat - x||^2``, shape of ``t``; arguments as :func:`eps_loss`."""
    return mean_over_data((x_pred - x).square(), t.ndim)


def adaptive_x_loss(
    v: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, z: torch.Tensor, t: torch.Tensor, path: Path,
    x_pred: torch.Tensor,
) -> torch.Tensor:
    """``mean_d ||x_hat - x||^2 / sg(max(mean_d |x_hat - x|, ADAPTIVE_FLOOR))``, shape of ``t``; arguments as
    :func:`eps_loss`."""
    error = x_pred - x
    scale = mean_over_data(error.detach().abs(), t.ndim).clamp_min(ADAPTIVE_FLOOR)
    return mean_over_data(error.square(), t.ndim) / scale


GHUBER_POWER, GHUBER_OFFSET = 0.25, 1e-10


def ghuber_loss(
    v: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, z: torch.Tensor, t: torch.Tensor, path: Path,
    x_pred: torch.Tensor,
) -> torch.Tensor:
    """AWM's generalised Huber loss ``(t / p) ((l_v + c)^p - c^p)`` of ``l_v = mean_d ||v - v*||^2``, shape of
    ``t``; arguments as :func:`eps_loss`."""
    error = v_loss(v, x, noise, z, t, path, x_pred)
    power, offset = GHUBER_POWER, GHUBER_OFFSET
    return t * ((error + offset) ** power - offset**power) / power


def elbo_loss(
    v: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, z: torch.Tensor, t: torch.Tensor, path: Path,
    x_pred: torch.Tensor,
) -> torch.Tensor:
    """``w_elbo(t) mean_d ||x_hat - x||^2`` (the true ELBO weight), shape of ``t``; arguments as :func:`eps_loss`."""
    return path.elbo_x_weight(t) * mean_over_data((x_pred - x).square(), t.ndim)


WEIGHTINGS: dict[str, Callable[..., torch.Tensor]] = {
    "eps": eps_loss,
    "v": v_loss,
    "x": x_loss,
    "adaptive_x": adaptive_x_loss,
    "ghuber": ghuber_loss,
    "elbo": elbo_loss,
}


def make_weighting(spec: str | Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A weighting function from its name (see ``WEIGHTINGS``) or pass a callable through."""
    if callable(spec):
        return spec
    return WEIGHTINGS[choose("weighting", spec, WEIGHTINGS)]
