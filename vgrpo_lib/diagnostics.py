"""How noisy is an ELBO-surrogate estimator on your model? Model-agnostic measurements for any velocity model
``model(x_t, t, cond) -> v`` and any :class:`~vgrpo_lib.elbo.ELBOSurrogate` (what ``vgrpo estimators`` reports).

Notation: N samples ``(N, *D)`` with prompt-group ids ``group`` ``(N,)`` and advantages ``A`` ``(N,)``; R
independent draws of the K timestep-noise pairs give the surrogates ``draws`` ``(R, N)`` (row r: ``s(o_i)`` under
draw r). Only within-group differences of the surrogate reach the policy gradient (advantages sum to zero in a
group), so the within-group quantities are the ones that matter.

Statistics of repeated draws (pure functions of tensors):

- :func:`coefficient_of_variation`, :func:`within_group_cv`: Monte-Carlo noise relative to the surrogate's size
  (lower is better; 0 = no noise);
- :func:`mc_noise_share`: share of the within-group variance that is noise (0 = all signal, about 1 = all noise);
- :func:`pair_noise`: the same share from ONE draw, from its per-pair terms (what ``vgrpo.adaptive_pairs`` measures
  during training);
- :func:`spearman`, :func:`within_group_rank_agreement`: does the within-group ranking depend on the pairs
  (1 = never);
- :func:`gradient_agreement`, :func:`gradient_cosine_to_reference`: cosine between independent policy-gradient
  estimates, or with a reference gradient (1 = identical directions; a lower CV is not the same as a less noisy
  gradient, so the gradient is measured directly);
- :func:`effective_sample_size`: of importance weights ``exp(log_ratio)`` (1 = all weights equal).

Measurements on a model (they call the model):

- :func:`policy_gradient`: one Monte-Carlo estimate of ``grad -(1/N) sum_i A_i s_theta(o_i)``, flattened;
- :func:`nearby_policy`: the model after one Adam step of that objective (a realistic "next" policy for
  log-ratios);
- :func:`measure_estimator`: every statistic above for one estimator on one batch (a dict).

Example:
    >>> from vgrpo_lib import ELBOSurrogate, GroupAdvantage
    >>> from vgrpo_lib.diagnostics import measure_estimator, nearby_policy
    >>> advantage = GroupAdvantage()(reward, group)
    >>> nearby = nearby_policy(model, ELBOSurrogate(), sample, None, group, advantage, lr=1e-3)
    >>> stats = measure_estimator(ELBOSurrogate(num_pairs=4), model, sample, None, group, advantage, nearby=nearby)
    >>> stats["within_group_cv"], stats["gradient_cosine"]
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn

from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.protocols import Condition, VelocityModel

__all__ = [
    "coefficient_of_variation",
    "effective_sample_size",
    "gradient_agreement",
    "gradient_cosine_to_reference",
    "mc_noise_share",
    "measure_estimator",
    "nearby_policy",
    "pair_noise",
    "policy_gradient",
    "spearman",
    "within_group_cv",
    "within_group_rank_agreement",
]


def _check_draws(draws: torch.Tensor, group: torch.Tensor | None = None, min_draws: int = 1) -> None:
    if not isinstance(draws, torch.Tensor) or draws.ndim != 2:
        raise ValueError(f"draws must be an (R, N) tensor of surrogates, got {getattr(draws, 'shape', type(draws))}.")
    if draws.shape[0] < min_draws:
        raise ValueError(f"draws needs at least {min_draws} draws (rows), got {draws.shape[0]}.")
    if group is not None and tuple(group.shape) != (draws.shape[1],):
        raise ValueError(f"group must be (N,) = ({draws.shape[1]},) like draws' columns, got {tuple(group.shape)}.")


def _group_means(values: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Per-draw group means broadcast back to the samples: ``(R, N)``."""
    _, index = torch.unique(group, return_inverse=True)
    count = torch.bincount(index).to(values.dtype)
    sums = values.new_zeros(values.shape[0], count.numel()).index_add_(1, index, values)
    return (sums / count)[:, index]


def coefficient_of_variation(draws: torch.Tensor) -> float:
    """Mean over samples of ``std_R(s_i) / |mean_R(s_i)|`` for ``draws`` ``(R, N)``, R >= 2: Monte-Carlo noise
    relative to the surrogate's size. Includes noise common to a group (which the gradient does not see); see
    :func:`within_group_cv`."""
    _check_draws(draws, min_draws=2)
    return (draws.std(0) / draws.mean(0).abs().clamp_min(1e-12)).mean().item()


def within_group_cv(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Mean over samples of ``std_R(s_i - mean_group s) / |mean_R(s_i)|`` for ``draws`` ``(R, N)`` and ``group``
    ``(N,)``: the noise of a sample's standing in its group (what the advantage-weighted gradient sees), relative
    to the surrogate's size. Lower is better; group-shared pairs remove noise common to a group."""
    _check_draws(draws, group, min_draws=2)
    deviation = draws - _group_means(draws, group)
    return (deviation.std(0) / draws.mean(0).abs().clamp_min(1e-12)).mean().item()


def mc_noise_share(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Share of the within-group variance of the surrogate that is Monte-Carlo noise (0: all signal, 1: all noise).

    With ``d_ri = s_ri - mean_group(s_r)``: noise = ``mean_i Var_r(d_ri)``, total = ``Var_{r,i}(d_ri)`` (sample
    variances: with few draws the ratio is noisy and can exceed 1).
    """
    _check_draws(draws, group, min_draws=2)
    deviation = draws - _group_means(draws, group)
    return (deviation.var(0).mean() / deviation.var().clamp_min(1e-30)).item()


def pair_noise(per_pair: torch.Tensor, group: torch.Tensor, *, couples: bool = False) -> dict[str, float]:
    """Monte-Carlo noise of the within-group surrogate, from ONE draw of pairs: its per-pair terms ``per_pair``
    ``(B, K)`` (``-l(o_i; t_k, eps_k)``, :meth:`~vgrpo_lib.elbo.ELBOSurrogate.per_pair`) and ``group`` ``(B,)``.

    ``d_ik = x_ik - mean_{j in g(i)} x_jk`` is sample i's standing in its group at pair k and ``s_i = mean_k d_ik``
    its surrogate's deviation from the group mean (what the advantage-weighted gradient sees). With the K pairs
    independent draws, ``Var_k(d_ik) / K`` estimates the noise variance of ``s_i`` without bias; per group of
    ``n >= 2`` members (whose ``s_i`` sum to 0): observed ``= sum_i s_i^2 / (n - 1)``, noise ``= sum_i Var_k(d_ik) /
    K / (n - 1)``, each averaged over the groups. ``couples=True`` (antithetic pairs, ``(eps, -eps)`` at one t)
    averages each couple first: K/2 independent units. Stratified timesteps tie pair k to stratum k, so the spread
    over k then also holds the strata's differences: the noise is overestimated (a conservative measurement).

    Returns ``noise_variance`` and ``signal_variance`` (observed minus noise: unbiased, so it can come out
    negative on a batch that is nearly all noise) at this K, and ``noise_share`` = noise / observed clipped to
    [0, 1] (1 where only the noise varies, 0 where nothing does). The repeated-draw measurement of the same share is :func:`mc_noise_share`.
    """
    if not isinstance(per_pair, torch.Tensor) or per_pair.ndim != 2:
        raise ValueError(f"per_pair must be a (B, K) tensor of per-pair terms, got {getattr(per_pair, 'shape', type(per_pair))}.")
    if tuple(group.shape) != (per_pair.shape[0],):
        raise ValueError(f"group must be (B,) = ({per_pair.shape[0]},) like per_pair's rows, got {tuple(group.shape)}.")
    x = per_pair.detach().double()
    if couples:
        if x.shape[1] % 2:
            raise ValueError(f"couples=True needs an even number of pairs, got K={x.shape[1]}.")
        x = x.unflatten(1, (-1, 2)).mean(2)
    if x.shape[1] < 2:
        raise ValueError(f"pair_noise needs at least 2 independent pairs per sample (couples count once), got {x.shape[1]}.")
    deviation = x - _group_means(x.T, group).T
    _, index = torch.unique(group, return_inverse=True)
    sizes = torch.bincount(index)
    groups = int((sizes > 1).sum())  # the groups with a within-group variance
    if not groups:
        raise ValueError("pair_noise needs a group with at least two members; every group has one.")
    members = sizes.to(x.dtype)[index]
    weight = torch.where(members > 1, 1 / (members - 1).clamp_min(1), 0.0) / groups
    observed = (weight * deviation.mean(1).square()).sum()
    noise = (weight * deviation.var(1)).sum() / x.shape[1]
    noise_value, observed_value = noise.item(), observed.item()
    share = min(noise_value / observed_value, 1.0) if observed_value > 0 else float(noise_value > 0)
    return {"noise_variance": noise_value, "signal_variance": observed_value - noise_value, "noise_share": share}


def _ranks(values: torch.Tensor) -> torch.Tensor:
    return values.argsort(-1).argsort(-1).to(torch.float64)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two vectors ``(N,)`` in [-1, 1] (no ties expected for continuous values)."""
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"spearman needs two vectors of one shape (N,), got {tuple(a.shape)} and {tuple(b.shape)}.")
    ra, rb = _ranks(a), _ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return (ra @ rb / (ra.norm() * rb.norm()).clamp_min(1e-30)).item()


def within_group_rank_agreement(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Mean Spearman correlation of the within-group ranking of the surrogate between independent draws
    (consecutive draw pairs (0, 1), (2, 3), ..., averaged over them and the groups): 1 = the ranking does not
    depend on the pairs. Use the log-ratios to a nearby policy as ``draws`` for the ranking that the importance
    ratio sees."""
    _check_draws(draws, group, min_draws=2)
    values = []
    for g in torch.unique(group):
        members = draws[:, group == g]
        values += [spearman(members[r], members[r + 1]) for r in range(0, draws.shape[0] - 1, 2)]
    return sum(values) / len(values)


def gradient_agreement(gradients: torch.Tensor) -> dict[str, float]:
    """Agreement of R >= 2 independent gradient estimates ``(R, P)`` (flattened, e.g. :func:`policy_gradient` under
    R draws of pairs):

    - ``gradient_cosine``: mean pairwise cosine ``mean_{r != q} <g_r, g_q> / (||g_r|| ||g_q||)`` (1 = the pairs do
      not change the direction; 0 = noise dominates);
    - ``gradient_cosine_se``: its jackknife standard error over the R draws (the pairwise cosines share draws, so
      they are not independent; NaN with R = 2, where no pair is left when a draw is left out);
    - ``gradient_relative_variance``: ``mean_r ||g_r - g_mean||^2 / ||g_mean||^2`` (lower is better).
    """
    if not isinstance(gradients, torch.Tensor) or gradients.ndim != 2 or gradients.shape[0] < 2:
        raise ValueError(f"gradients must be (R, P) with R >= 2 draws, got {getattr(gradients, 'shape', None)}.")
    unit = gradients / gradients.norm(dim=1, keepdim=True).clamp_min(1e-30)
    cosine = unit @ unit.T
    r = gradients.shape[0]
    off_diagonal = cosine.sum() - cosine.diagonal().sum()
    mean_cosine = off_diagonal / (r * (r - 1))
    # Leave draw k out: remove its row and column (its diagonal 1 is already out of off_diagonal).
    if r > 2:
        leave_out = (off_diagonal - 2 * (cosine.sum(1) - cosine.diagonal())) / ((r - 1) * (r - 2))
        cosine_se = ((r - 1) / r * (leave_out - leave_out.mean()).square().sum()).sqrt().item()
    else:
        cosine_se = math.nan
    mean = gradients.mean(0)
    relative = (gradients - mean).square().sum(1).mean() / mean.square().sum().clamp_min(1e-30)
    return {"gradient_cosine": mean_cosine.item(), "gradient_cosine_se": cosine_se,
            "gradient_relative_variance": relative.item()}


def gradient_cosine_to_reference(gradients: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Cosine of each gradient estimate ``(R, P)`` with a reference gradient ``(P,)`` (e.g. the mean of many draws
    with many pairs, or an exact gradient): ``reference_cosine`` (mean over R; 1 = the estimates point where the
    reference does) and ``reference_cosine_se`` (its standard error, ``std / sqrt(R)``; 0 with R = 1)."""
    if gradients.ndim != 2 or tuple(reference.shape) != (gradients.shape[1],):
        raise ValueError(f"gradients must be (R, P) and reference (P,), got {tuple(gradients.shape)} and "
                         f"{tuple(reference.shape)}.")
    cosine = (gradients @ reference) / (gradients.norm(dim=1) * reference.norm()).clamp_min(1e-30)
    se = cosine.std() / cosine.numel() ** 0.5 if cosine.numel() > 1 else cosine.new_zeros(())
    return {"reference_cosine": cosine.mean().item(), "reference_cosine_se": se.item()}


def effective_sample_size(log_weights: torch.Tensor, normalized: bool = True) -> torch.Tensor:
    """Kish's effective sample size of importance weights ``w_i = exp(log_weights_i)`` over the last dimension:

        ESS = (sum_i w_i)^2 / sum_i w_i^2,      in [1, N]; divided by N when ``normalized`` (then in [1/N, 1])

    computed from log-weights (stable for large log-ratios). ``log_weights`` ``(..., N)``, e.g. the log-ratios
    ``s_theta - s_old`` of a batch: near 1 (normalized) the ratios are nearly equal and the update stays close to
    on-policy; a small value means a few samples dominate the ratio-weighted objective. Returns ``(...)``."""
    if not isinstance(log_weights, torch.Tensor) or log_weights.ndim == 0 or log_weights.shape[-1] == 0:
        shape = getattr(log_weights, "shape", None)
        raise ValueError(f"log_weights must be a (..., N) tensor with N >= 1, got {shape}.")
    ess = (2 * torch.logsumexp(log_weights, -1) - torch.logsumexp(2 * log_weights, -1)).exp()
    return ess / log_weights.shape[-1] if normalized else ess


def _advantage_objective(estimator: ELBOSurrogate, model: VelocityModel, sample, cond, advantage, pairs):
    """``-(1/N) sum_i A_i s_theta(o_i)``: the on-policy policy-gradient objective (the ratio's gradient at 1)."""
    return -(advantage * estimator(model, sample, cond, pairs)).mean()


def policy_gradient(estimator: ELBOSurrogate, model: nn.Module, sample: torch.Tensor, cond: Condition,
                    group: torch.Tensor | None, advantage: torch.Tensor,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """One Monte-Carlo estimate of ``grad_theta -(1/N) sum_i A_i s_theta(o_i)`` (one draw of pairs, with
    ``generator``) over ``model``'s trainable parameters, flattened to ``(P,)`` float64."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("policy_gradient needs a model with trainable parameters (requires_grad); it has none.")
    pairs = estimator.sample_pairs(sample, group, generator)
    grads = torch.autograd.grad(_advantage_objective(estimator, model, sample, cond, advantage, pairs), params)
    return torch.cat([g.flatten() for g in grads]).double()


def nearby_policy(model: nn.Module, estimator: ELBOSurrogate, sample: torch.Tensor, cond: Condition,
                  group: torch.Tensor | None, advantage: torch.Tensor, lr: float = 1e-4, seed: int = 0) -> nn.Module:
    """A frozen copy of ``model`` after one Adam step (learning rate ``lr``) of the V-GRPO objective
    ``-(1/N) sum_i A_i s_theta(o_i)`` on one draw of pairs (seeded by ``seed``): a realistic next policy, for the
    log-ratios ``s_nearby - s_theta`` that an importance ratio sees."""
    nearby = copy.deepcopy(model)
    optimizer = torch.optim.Adam(nearby.parameters(), lr=lr)
    pairs = estimator.sample_pairs(sample, group, torch.Generator().manual_seed(seed))
    _advantage_objective(estimator, nearby, sample, cond, advantage, pairs).backward()
    optimizer.step()
    return nearby.requires_grad_(False)


def measure_estimator(estimator: ELBOSurrogate, model: nn.Module, sample: torch.Tensor, cond: Condition,
                      group: torch.Tensor, advantage: torch.Tensor, *, nearby: VelocityModel, draws: int = 16,
                      gradient_draws: int = 6, seed: int = 0) -> dict[str, float]:
    """Every statistic of this module for ``estimator`` on one batch: ``sample`` ``(N, *D)``, ``cond`` (batch
    size N, or None), ``group`` ``(N,)``, ``advantage`` ``(N,)``, with ``draws`` (>= 2) draws of pairs for the
    surrogates and ``gradient_draws`` (>= 2; >= 3 for the cosine's SE) for the gradients, all from one generator
    seeded by ``seed``.

    Returns a dict with ``num_pairs``; ``cv``, ``within_group_cv``, ``mc_noise_share``, ``rank_agreement``
    (within-group, between draws) of the surrogates ``s_theta``; of the log-ratio ``s_nearby - s_theta`` on
    common pairs: ``log_ratio_variance`` (variance over draws, mean over samples), ``log_ratio_mean_abs`` (its
    size: mean over samples of the absolute mean over draws), ``log_ratio_relative_variance`` (their ratio
    ``variance / mean_abs^2``: noise to signal, comparable across weightings whose surrogates differ in scale),
    ``log_ratio_rank_agreement`` (:func:`within_group_rank_agreement` of the log-ratios: does the ranking of the
    samples by their ratio to the nearby policy depend on the pairs) and ``log_ratio_ess`` (normalized
    :func:`effective_sample_size` of ``exp(log_ratio)``, mean over draws);
    :func:`gradient_agreement`'s ``gradient_cosine``, ``gradient_cosine_se``, ``gradient_relative_variance``; the
    cost ``nfe_per_sample`` (= K) and ``seconds_per_evaluation`` (median wall time of one surrogate evaluation).
    """
    generator = torch.Generator().manual_seed(seed)
    values, log_ratios, seconds = [], [], []
    with torch.no_grad():
        for _ in range(draws):
            pairs = estimator.sample_pairs(sample, group, generator)
            start = time.perf_counter()
            value = estimator(model, sample, cond, pairs)
            seconds.append(time.perf_counter() - start)
            values.append(value)
            log_ratios.append(estimator(nearby, sample, cond, pairs) - value)
    values, log_ratios = torch.stack(values).double(), torch.stack(log_ratios).double()
    gradients = [policy_gradient(estimator, model, sample, cond, group, advantage, generator)
                 for _ in range(gradient_draws)]
    return {
        "num_pairs": estimator.num_pairs,
        "cv": coefficient_of_variation(values),
        "within_group_cv": within_group_cv(values, group),
        "mc_noise_share": mc_noise_share(values, group),
        "rank_agreement": within_group_rank_agreement(values, group),
        "log_ratio_variance": log_ratios.var(0).mean().item(),
        "log_ratio_mean_abs": log_ratios.mean(0).abs().mean().item(),
        "log_ratio_relative_variance": (log_ratios.var(0).mean() / log_ratios.mean(0).abs().mean().square()).item(),
        "log_ratio_rank_agreement": within_group_rank_agreement(log_ratios, group),
        "log_ratio_ess": effective_sample_size(log_ratios).mean().item(),
        **gradient_agreement(torch.stack(gradients)),
        "nfe_per_sample": estimator.num_pairs,
        "seconds_per_evaluation": sorted(seconds)[len(seconds) // 2],
    }
