"""Timestep samplers for Monte-Carlo estimates of the denoising loss.

Every sampler is a distribution on ``[0, 1]`` given by its inverse CDF, so stratification composes with any
density: with ``stratified=True`` the K uniforms of one set are drawn one per stratum,
``u_k ~ U[k/K, (k+1)/K)``, and mapped through the inverse CDF, so ``t[..., k]`` lies in the k-th
K-quantile of the density (for :class:`Uniform` on ``[0, 1]``, in ``[k/K, (k+1)/K)``). Stratification keeps
the estimator unbiased and never increases its variance (V-GRPO, method.md "variance reduction" 2).

A sampler is called as ``sampler(num_sets, num_pairs, generator=..., device=..., dtype=...)`` and returns
``t`` of shape ``(num_sets, num_pairs)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vgrpo_lib._checks import check_positive_int, choose

__all__ = [
    "TimestepSampler", "Uniform", "LogitNormal", "Shifted", "DiscreteGrid", "GridSubset", "PiecewiseDensity",
    "variance_optimal_density", "shift_time", "TIMESTEP_SAMPLERS", "make_timestep_sampler",
]


class TimestepSampler:
    """Base class: ``stratified`` switches between i.i.d. and one-per-stratum uniforms."""

    def __init__(self, stratified: bool = False):
        self.stratified = stratified

    def icdf(self, u: torch.Tensor) -> torch.Tensor:
        """Map uniforms in ``[0, 1)`` to timesteps."""
        raise NotImplementedError

    def uniforms(self, num_sets, num_pairs, *, generator=None, device=None, dtype=torch.float32):
        """Uniforms ``[num_sets, num_pairs]`` in ``[0, 1)``: i.i.d., or one per stratum ``[k/K, (k+1)/K)`` of each
        row when ``stratified``."""
        check_positive_int("num_pairs", num_pairs)
        u = torch.rand((num_sets, num_pairs), generator=generator, device=device, dtype=dtype)
        if self.stratified:
            offsets = torch.arange(num_pairs, device=device, dtype=dtype)
            u = (offsets + u) / num_pairs
        return u

    def __call__(self, num_sets: int, num_pairs: int, *, generator=None, device=None, dtype=torch.float32):
        return self.icdf(self.uniforms(num_sets, num_pairs, generator=generator, device=device, dtype=dtype))

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


class Uniform(TimestepSampler):
    """``t ~ U[t_min, t_max]``."""

    def __init__(self, t_min: float = 0.0, t_max: float = 1.0, stratified: bool = False):
        super().__init__(stratified)
        if not 0.0 <= t_min < t_max <= 1.0:
            raise ValueError(f"Need 0 <= t_min < t_max <= 1, got t_min={t_min}, t_max={t_max}.")
        self.t_min, self.t_max = t_min, t_max

    def icdf(self, u):
        return self.t_min + (self.t_max - self.t_min) * u


class LogitNormal(TimestepSampler):
    """``t = sigmoid(m + s * n)``, ``n ~ N(0, 1)``: the SD3 training density (Esser et al., 2024)."""

    def __init__(self, mean: float = 0.0, std: float = 1.0, stratified: bool = False):
        super().__init__(stratified)
        if std <= 0:
            raise ValueError(f"LogitNormal std must be > 0, got {std}.")
        self.mean, self.std = mean, std

    def icdf(self, u):
        tiny = torch.finfo(u.dtype).eps
        n = torch.special.ndtri(u.clamp(tiny, 1.0 - tiny))
        return torch.sigmoid(self.mean + self.std * n)


class Shifted(TimestepSampler):
    """Uniform timesteps warped by the SD3/FLUX resolution shift ``t' = s t / (1 + (s - 1) t)``."""

    def __init__(self, shift: float = 3.0, stratified: bool = False):
        super().__init__(stratified)
        if shift <= 0:
            raise ValueError(f"shift must be > 0, got {shift}.")
        self.shift = shift

    def icdf(self, u):
        return shift_time(u, self.shift)


class DiscreteGrid(TimestepSampler):
    """Timesteps drawn from a fixed grid (e.g. the rollout sampler's shifted sigmas), uniformly over its points.

    With ``stratified=True`` the grid indices are split into K contiguous strata, one draw in each.
    """

    def __init__(self, grid: Sequence[float] | torch.Tensor, stratified: bool = True):
        super().__init__(stratified)
        grid = torch.as_tensor(grid, dtype=torch.float64).flatten()
        if grid.numel() == 0 or bool(((grid < 0) | (grid > 1)).any()):
            raise ValueError("DiscreteGrid needs a non-empty grid of timesteps in [0, 1].")
        self.grid = grid

    def icdf(self, u):
        n = self.grid.numel()
        index = (u * n).long().clamp_(0, n - 1)
        return self.grid.to(device=u.device, dtype=u.dtype)[index]


class GridSubset(DiscreteGrid):
    """K distinct points of a fixed grid per set, uniformly without replacement (a random permutation of the
    grid, its first K): DiffusionNFT's training timesteps (NVlabs/DiffusionNFT, ``scripts/train_nft_sd3.py``
    permutes the sampler's timesteps per sample and trains the first ``int(num_steps * timestep_fraction)``).
    """

    def __init__(self, grid: Sequence[float] | torch.Tensor):
        super().__init__(grid, stratified=False)

    def __call__(self, num_sets: int, num_pairs: int, *, generator=None, device=None, dtype=torch.float32):
        check_positive_int("num_pairs", num_pairs)
        if num_pairs > self.grid.numel():
            raise ValueError(f"GridSubset draws {num_pairs} distinct points from a grid of {self.grid.numel()}.")
        keys = torch.rand((num_sets, self.grid.numel()), generator=generator, device=device)
        index = keys.argsort(dim=1)[:, :num_pairs]
        return self.grid.to(device=index.device, dtype=dtype)[index]


class PiecewiseDensity(TimestepSampler):
    """Importance-sampled timesteps: a piecewise-constant density ``q`` on M equal bins of [0, 1].

    Draws come from ``q`` (stratified in its quantiles when ``stratified=True``) and every pair carries the
    importance weight ``p(t) / q(t) = 1 / (M q_bin(t))`` against the uniform density ``p``, so the weighted
    surrogate has the same expectation as the uniform one (unbiased) while ``q`` puts the pairs where the
    per-pair contribution varies most. The variance-optimal density for an estimate of ``E_p[g(t)]`` is
    ``q(t) propto p(t) sqrt(E ||g(t)||^2)``: :func:`variance_optimal_density` builds it from per-bin second
    moments measured in a pilot (this library's own estimator option, beyond the paper).
    """

    def __init__(self, probabilities: Sequence[float] | torch.Tensor, stratified: bool = True):
        super().__init__(stratified)
        q = torch.as_tensor(probabilities, dtype=torch.float64).flatten()
        if q.numel() == 0 or not bool(torch.isfinite(q).all()) or bool((q <= 0).any()):
            raise ValueError("PiecewiseDensity needs finite, strictly positive bin probabilities.")
        self.probabilities = q / q.sum()

    def icdf(self, u):
        q = self.probabilities.to(device=u.device)
        cdf = torch.cat([q.new_zeros(1), q.cumsum(0)])
        cdf[-1] = 1.0
        u64 = u.to(torch.float64)
        index = (torch.searchsorted(cdf, u64, right=True) - 1).clamp_(0, q.numel() - 1)
        within = (u64 - cdf[index]) / q[index]
        return ((index + within.clamp(0.0, 1.0)) / q.numel()).to(u.dtype)

    def importance_weight(self, t: torch.Tensor) -> torch.Tensor:
        """``1 / p(t)`` for timesteps drawn from this density (``t``'s shape): the weight that keeps a Monte-Carlo
        average over ``t`` an unbiased estimate of the uniform-``t`` average."""
        q = self.probabilities.to(device=t.device)
        index = (t.to(torch.float64) * q.numel()).long().clamp_(0, q.numel() - 1)
        return (1.0 / (q.numel() * q[index])).to(t.dtype)


def variance_optimal_density(second_moments: Sequence[float] | torch.Tensor, floor: float = 0.05) -> PiecewiseDensity:
    """``q_b propto sqrt(m_b)`` from per-bin second moments ``m_b = E ||g||^2`` of the per-pair contribution,
    mixed with ``floor`` of the uniform density so no bin is starved (weights stay bounded by ``1 / floor``)."""
    m = torch.as_tensor(second_moments, dtype=torch.float64).clamp_min(0)
    root = m.sqrt()
    q = root / root.sum() if float(root.sum()) > 0 else torch.full_like(root, 1.0 / root.numel())
    return PiecewiseDensity((1.0 - floor) * q + floor / q.numel())


def shift_time(t: torch.Tensor, shift: float) -> torch.Tensor:
    """The SD3 time shift ``s t / (1 + (s - 1) t)`` (``shift = 1`` is the identity)."""
    return shift * t / (1.0 + (shift - 1.0) * t)


TIMESTEP_SAMPLERS = {
    "uniform": lambda: Uniform(),
    "stratified": lambda: Uniform(stratified=True),
    "logit_normal": lambda: LogitNormal(),
    "stratified_logit_normal": lambda: LogitNormal(stratified=True),
    "shifted": lambda: Shifted(),
}


def make_timestep_sampler(spec: str | TimestepSampler) -> TimestepSampler:
    """A sampler from its name (see ``TIMESTEP_SAMPLERS``) or pass an instance through.

    For a discrete grid build :class:`DiscreteGrid` directly with the rollout's grid.
    """
    if isinstance(spec, TimestepSampler):
        return spec
    return TIMESTEP_SAMPLERS[choose("timestep sampler", spec, TIMESTEP_SAMPLERS)]()
