"""Functional pieces of the policy objectives, on plain tensors (rlax-style: shapes in the docstrings).

Everything here is differentiable where it should be and has no hidden state; the TorchRL loss modules in
:mod:`vgrpo_lib.losses` are thin wrappers around these functions.
"""

from __future__ import annotations

from typing import Union

import torch

from vgrpo_lib._checks import check_positive, choose, renamed_keywords
from vgrpo_lib.weighting import mean_over_data

__all__ = [
    "ClipRange",
    "KL_ESTIMATORS", "NFT_ADVANTAGE_MODES", "clip_active_mask", "clip_fraction", "clip_fraction_active", "clip_sides",
    "clipped_ratio_objective", "dgpo_group_weight", "gaussian_kl_same_std", "guard_log_ratio", "kl_estimate", "nft_implicit_velocities",
    "nft_optimality", "ratio_diagnostics", "soft_clip", "x_space_kl",
]

KL_ESTIMATORS = ("k1", "k2", "k3")
# A ratio clip range: eps (symmetric), a (low, high) pair, or a loss module's buffer [2] holding that pair.
ClipRange = Union[float, tuple[float, float], torch.Tensor]


def clip_sides(clip_range: ClipRange, device: torch.device | None = None) -> tuple:
    """``(low, high)`` of a clip range: a float ``eps`` (symmetric), a ``(low, high)`` pair, or a tensor ``[2]``
    (a loss module's buffer; indexed, never read back to the host: no device sync). With ``device``, a tensor
    range is first copied there (``non_blocking``: no device sync): ``torch.clamp`` takes tensor bounds only on
    its input's device, and a loss module's buffers stay on the CPU when the module was built around a model
    already on a GPU."""
    if isinstance(clip_range, torch.Tensor) and clip_range.ndim == 1:
        if device is not None:
            clip_range = clip_range.to(device, non_blocking=True)
        return clip_range[0], clip_range[1]
    if isinstance(clip_range, (tuple, list)):
        return clip_range[0], clip_range[1]
    return clip_range, clip_range


@renamed_keywords(clip_low="clip_range", clip_high="clip_range")
def clipped_ratio_objective(log_ratio: torch.Tensor, advantage: torch.Tensor, clip_range: ClipRange) -> torch.Tensor:
    """PPO's clipped surrogate loss, per element (to be averaged by the caller).

        loss = -min(rho A, clip(rho, 1 - low, 1 + high) A),   rho = exp(log_ratio)

    Args:
        log_ratio: ``[N]`` ``log pi_theta - log pi_old`` (V-GRPO: a difference of ELBO surrogates; Flow-GRPO:
            of per-step SDE log-densities).
        advantage: ``[N]`` (broadcastable), treated as a constant.
        clip_range: ``eps`` (the range ``[1 - eps, 1 + eps]``), a ``(low, high)`` pair (``[1 - low, 1 + high]``)
            or a tensor ``[2]`` holding that pair.

    With ``log_ratio == 0`` the value is ``-A`` and the gradient ``-A * grad log_ratio`` (REINFORCE).
    """
    low, high = clip_sides(clip_range, log_ratio.device)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - low, 1.0 + high)
    return -torch.minimum(ratio * advantage, clipped * advantage)


@renamed_keywords(clip_low="clip_range", clip_high="clip_range")
def clip_fraction(log_ratio: torch.Tensor, clip_range: ClipRange) -> torch.Tensor:
    """Share of elements whose ratio lies outside the clip range, on either side and whatever the advantage's
    sign: what the official Flow-GRPO logs as ``clipfrac`` (``|ratio - 1| > clip_range``). ``clip_range`` as in
    :func:`clipped_ratio_objective`; returns a scalar tensor."""
    low, high = clip_sides(clip_range)
    ratio = torch.exp(log_ratio.detach())
    return ((ratio > 1.0 + high) | (ratio < 1.0 - low)).float().mean()


@renamed_keywords(clip_low="clip_range", clip_high="clip_range")
def clip_fraction_active(log_ratio: torch.Tensor, advantage: torch.Tensor, clip_range: ClipRange) -> torch.Tensor:
    """Share of elements whose gradient the clip removes: ratio above ``1 + high`` with a positive advantage, or
    below ``1 - low`` with a negative one (a ratio outside the range on the other side keeps its gradient, since
    ``min`` then picks the unclipped term). ``clip_range`` as in :func:`clipped_ratio_objective`."""
    return clip_active_mask(log_ratio, advantage, clip_range).float().mean()


def clip_active_mask(log_ratio: torch.Tensor, advantage: torch.Tensor, clip_range: ClipRange) -> torch.Tensor:
    """``[N]`` bool: True where the clip removes the gradient, a ratio above ``1 + high`` with a positive advantage
    or below ``1 - low`` with a negative one (:func:`clip_fraction_active` is its mean). ``clip_range`` as in
    :func:`clipped_ratio_objective`."""
    low, high = clip_sides(clip_range, log_ratio.device)
    ratio = torch.exp(log_ratio.detach())
    return ((ratio > 1.0 + high) & (advantage > 0)) | ((ratio < 1.0 - low) & (advantage < 0))


def soft_clip(advantage: torch.Tensor, eta: float) -> torch.Tensor:
    """``eta * tanh(A / eta)``: V-GRPO's advantage soft-clipping (eta = 3), identity near 0, bounded by eta."""
    check_positive("soft-clip eta", eta)  # NaN or inf eta: NaN advantages
    return eta * torch.tanh(advantage / eta)


def kl_estimate(log_ratio_ref: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Schulman's estimators of ``KL(pi || pi_ref)`` from samples of ``pi``, per element.

    ``log_ratio_ref = log pi_ref(o) - log pi(o)`` at samples ``o ~ pi``; with ``r = exp(log_ratio_ref)``:
    ``k1 = -log r`` (unbiased, high variance), ``k2 = (log r)^2 / 2`` (biased, low variance),
    ``k3 = (r - 1) - log r`` (unbiased, non-negative).
    """
    choose("KL estimator", estimator, KL_ESTIMATORS)
    if estimator == "k1":
        return -log_ratio_ref
    if estimator == "k2":
        return 0.5 * log_ratio_ref.square()
    return torch.expm1(log_ratio_ref) - log_ratio_ref


def x_space_kl(x_pred: torch.Tensor, x_pred_other: torch.Tensor, leading_ndim: int = 1) -> torch.Tensor:
    """V-GRPO's simple KL ``D_i = mean_j ||x_hat_theta(z_tj) - x_hat_other(z_tj)||^2`` per sample ``[B]``.

    Args:
        x_pred, x_pred_other: ``[B, K, *D]`` data predictions of the two policies at the same stored pairs.
    The squared distance is averaged over data dimensions (like the losses) and then over the K pairs.
    """
    if x_pred.shape != x_pred_other.shape:
        raise ValueError(f"x-space KL needs equal shapes, got {tuple(x_pred.shape)} and {tuple(x_pred_other.shape)}.")
    return mean_over_data((x_pred - x_pred_other).square(), leading_ndim + 1).mean(dim=leading_ndim)


def gaussian_kl_same_std(
    mean: torch.Tensor, mean_other: torch.Tensor, std: float | torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Closed-form ``KL(N(mean, std^2 I) || N(mean_other, std^2 I)) = ||mean - mean_other||^2 / (2 std^2)`` -> ``[B]``.

    ``reduction`` matches :func:`vgrpo_lib.sde.gaussian_log_prob`: ``"mean"`` over data dimensions (default) or
    ``"sum"`` (the true KL).
    """
    choose("KL reduction", reduction, ("mean", "sum"))
    per_dim = (mean - mean_other).square() / (2.0 * torch.as_tensor(std, dtype=mean.dtype, device=mean.device) ** 2)
    reduced = mean_over_data(per_dim, 1)
    return reduced * per_dim[0].numel() if reduction == "sum" else reduced


def guard_log_ratio(
    log_ratio: torch.Tensor, mean: torch.Tensor, old_mean: torch.Tensor, std: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """GRPO-Guard's normalised log-ratio of one Gaussian SDE step (Wang et al., 2025, "GRPO-Guard"), ``[B]``.

        log_ratio_guard = std * log_ratio + ||mean - old_mean||^2 / (2 std)

    as Flow-Factory's ``GRPOGuardTrainer`` computes it (X-GenGroup/Flow-Factory,
    src/flow_factory/trainers/grpo.py). With the stored transition ``z' = old_mean + std xi`` the plain log-ratio
    of a step is ``<xi, delta> / std - ||delta||^2 / (2 std^2)`` (``delta = mean - old_mean``, ``<.,.>`` and
    ``||.||^2`` reduced over the data dimensions like the log-densities): its mean is shifted below 0 by the
    second term and its scale grows as ``1 / std``, so a clip range that suits one step is far too wide or too
    narrow for another. The normalised one is exactly ``<xi, delta>``: zero mean over the rollout noise, a scale
    ``sqrt(mean_d delta^2 / D)`` (``"mean"`` reduction) that does not depend on the step's noise, and on-policy
    (``delta = 0``) a gradient ``std`` times the plain one, which is the paper's reweighting of the steps.

    Args:
        log_ratio: ``[B]`` ``log p_theta(z' | z) - log p_old(z' | z)`` reduced with ``reduction``.
        mean, old_mean: ``[B, *D]`` the step means under the trained and the behaviour policy.
        std: ``[B, 1, ...]`` (broadcastable) the step's standard deviation, the same for both policies.
        reduction: ``"mean"`` or ``"sum"`` over the data dimensions, as for ``log_ratio``.
    """
    choose("log-prob reduction", reduction, ("mean", "sum"))
    per_dim = (mean - old_mean).square()
    mse = mean_over_data(per_dim, 1) * (per_dim[0].numel() if reduction == "sum" else 1)
    scale = std.reshape(std.shape[0], -1)[:, 0]
    return scale * log_ratio + mse / (2.0 * scale)


def ratio_diagnostics(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached importance-ratio statistics: mean/min/max ratio, two approximate KLs between the behaviour and
    the current policy, and the normalised effective sample size ``(sum rho)^2 / (N sum rho^2)`` (1 = on-policy).

    - ``approx_kl_k3``: ``E[(rho - 1) - log rho]``, Schulman's unbiased non-negative k3 estimator of
      ``KL(old || new)`` from samples of the old policy;
    - ``approx_kl_sq``: ``0.5 E[log rho^2]`` (k2), what the official Flow-GRPO logs as ``approx_kl``.
    """
    log_ratio = log_ratio.detach()
    ratio = torch.exp(log_ratio)
    return {
        "ratio_mean": ratio.mean(),
        "ratio_min": ratio.min(),
        "ratio_max": ratio.max(),
        "approx_kl_k3": (torch.expm1(log_ratio) - log_ratio).mean(),
        "approx_kl_sq": 0.5 * log_ratio.square().mean(),
        "ess": ratio.sum().square() / (ratio.numel() * ratio.square().sum()),
    }


NFT_ADVANTAGE_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")


@renamed_keywords(adv_max="advantage_max", advantage_clip="advantage_max")
def nft_optimality(advantage: torch.Tensor, advantage_max: float, mode: str = "all") -> torch.Tensor:
    """DiffusionNFT's optimality probability ``r = clip(m(clip(A, -Amax, Amax)) / (2 Amax) + 1/2, 0, 1)`` ``[B]``
    of the advantages ``[B]``, with ``Amax = advantage_max`` (official: 5).

    ``mode`` is the official ``adv_mode`` ``m`` applied to the clipped advantage: ``"all"`` (identity),
    ``"positive_only"`` (``max(A, 0)``), ``"negative_only"`` (``min(A, 0)``), ``"one_only"`` (``1[A > 0]``),
    ``"binary"`` (``sign(A)``); the last two are then scaled by ``1 / (2 Amax)`` like any advantage, as in the
    official code, so ``r`` is 0.5 +- 0.1 for ``Amax = 5``.
    """
    choose("adv_mode", mode, NFT_ADVANTAGE_MODES)
    advantage = advantage.clamp(-advantage_max, advantage_max)
    if mode == "positive_only":
        advantage = advantage.clamp_min(0.0)
    elif mode == "negative_only":
        advantage = advantage.clamp_max(0.0)
    elif mode == "one_only":
        advantage = (advantage > 0).to(advantage.dtype)
    elif mode == "binary":
        advantage = torch.sign(advantage)
    return (advantage / (2.0 * advantage_max) + 0.5).clamp(0.0, 1.0)


def nft_implicit_velocities(v_theta: torch.Tensor, v_old: torch.Tensor, strength: float):
    """DiffusionNFT's implicit positive and negative policies with mixing strength ``b``:
    ``v+ = (1 - b) v_old + b v_theta``, ``v- = (1 + b) v_old - b v_theta``. ``v_old`` is treated as a constant."""
    v_old = v_old.detach()
    return (1.0 - strength) * v_old + strength * v_theta, (1.0 + strength) * v_old - strength * v_theta


def dgpo_group_weight(advantage: torch.Tensor, loss: torch.Tensor, ref_loss: torch.Tensor, group: torch.Tensor,
                      beta: float) -> torch.Tensor:
    """DGPO's group preference weight (Luo et al., ICLR 2026, "Reinforcing Diffusion Models by Direct Group
    Preference Optimization"), detached, ``[B, K]``:

        w_gk = sigmoid( beta / |g| * sum_{i in g} A_i (l_ik - l^ref_ik) ),    broadcast to the members i of g

    the derivative of ``-log sigmoid(R(G+) - R(G-))``, the group-level DPO loss whose implicit reward
    difference is ``-beta / |g| sum_i A_i (l_i - l^ref_i)``: the advantage-weighted positive and negative members
    of the group, each scored by how much better it is denoised than by the reference. The loss
    ``mean_ik w_gk A_i l_ik`` (``w`` constant) then has the gradient of ``(1 / beta) mean_g softplus(s_g)``.

    Args:
        advantage: ``[B]``.
        loss, ref_loss: ``[B, K]`` per-pair denoising losses of the trained and the reference policy, on the same
            pairs (members of a group must share their pairs: ``l - l^ref`` is compared within the group).
        group: ``[B]`` integer prompt-group ids; ``|g|`` counts the rows of group ``g`` present (the official
            code divides by the configured group size: the same when every group is whole).
        beta: the preference temperature (official ``beta_dpo``: 100 GenEval / OCR, 10 PickScore).
    """
    check_positive("beta", beta)
    _, index, count = torch.unique(group, return_inverse=True, return_counts=True)
    score = advantage.detach()[:, None] * (loss.detach() - ref_loss.detach())
    sums = score.new_zeros((count.numel(), score.shape[1])).index_add_(0, index, score)
    return torch.sigmoid(beta * sums / count[:, None].to(score.dtype))[index]
