"""Statistics of Monte-Carlo surrogate estimators, as pure functions of repeated draws.

``draws`` is ``[R, N]``: the surrogate of N samples under R independent draws of timestep-noise pairs;
``group`` is ``[N]``. Only within-group differences reach the policy gradient (advantages sum to zero in a
group), so the within-group quantities are the ones that matter.
"""

from __future__ import annotations

import torch


def _group_means(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Per-draw group means broadcast back to the samples: ``[R, N]``."""
    _, index = torch.unique(group, return_inverse=True)
    count = torch.bincount(index).to(values.dtype)
    sums = values.new_zeros(values.shape[0], count.numel()).index_add_(1, index, values)
    return (sums / count)[:, index]


def coefficient_of_variation(draws: torch.Tensor) -> float:
    """Mean over samples of ``std_R(s) / |mean_R(s)|``: Monte-Carlo noise relative to the surrogate's size."""
    return (draws.std(0) / draws.mean(0).abs().clamp_min(1e-12)).mean().item()


def within_group_cv(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Mean over samples of ``std_R(s_i - mean_group s) / |mean_R(s_i)|``: the noise of a sample's standing in
    its group (what the advantage-weighted gradient sees), relative to the surrogate's size."""
    deviation = draws - _group_means(draws, group)
    return (deviation.std(0) / draws.mean(0).abs().clamp_min(1e-12)).mean().item()


def mc_noise_share(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Share of the within-group variance of the surrogate that is Monte-Carlo noise (0: all signal).

    With ``d_ri = s_ri - mean_group(s_r)``: noise = ``mean_i Var_r(d_ri)``, total = ``Var_{r,i}(d_ri)``.
    """
    deviation = draws - _group_means(draws, group)
    return (deviation.var(0).mean() / deviation.var().clamp_min(1e-30)).item()


def _ranks(values: torch.Tensor) -> torch.Tensor:
    return values.argsort(-1).argsort(-1).to(torch.float64)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two vectors (no ties expected for continuous values)."""
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return (ra @ rb / (ra.norm() * rb.norm()).clamp_min(1e-30)).item()


def within_group_rank_agreement(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Mean Spearman correlation of the within-group ranking of the surrogate between independent draws
    (consecutive draw pairs, averaged over groups): 1 = the ranking does not depend on the pairs."""
    values = []
    for g in torch.unique(group):
        members = draws[:, group == g]
        values += [spearman(members[r], members[r + 1]) for r in range(0, draws.shape[0] - 1, 2)]
    return sum(values) / len(values)


def gradient_agreement(gradients: torch.Tensor) -> dict[str, float]:
    """From ``[R, P]`` flattened policy gradients of independent draws: mean pairwise cosine, its jackknife
    standard error over the R draws (the pairwise cosines share draws, so they are not independent), and the
    relative variance ``mean_r ||g_r - g_mean||^2 / ||g_mean||^2``."""
    unit = gradients / gradients.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cosine = unit @ unit.T
    r = gradients.shape[0]
    off_diagonal = cosine.sum() - cosine.diagonal().sum()
    mean_cosine = off_diagonal / (r * (r - 1))
    # Leave draw k out: remove its row and column (its diagonal 1 is already out of off_diagonal).
    leave_out = (off_diagonal - 2 * (cosine.sum(1) - cosine.diagonal())) / ((r - 1) * (r - 2))
    cosine_se = ((r - 1) / r * (leave_out - leave_out.mean()).square().sum()).sqrt()
    mean = gradients.mean(0)
    relative = (gradients - mean).square().sum(1).mean() / mean.square().sum().clamp_min(1e-30)
    return {"gradient_cosine": mean_cosine.item(), "gradient_cosine_se": cosine_se.item(),
            "gradient_relative_variance": relative.item()}
