"""Group-relative advantages (GRPO) with the variants users compare.

``A_i = (R_i - mean_group R) / (scale + eps)`` where the G samples of one prompt form a group. All statistics
are computed with batched scatter operations over dense group ids (no Python loop over groups). Standard
deviations are population ones (``ddof = 0``, like the anchors' ``np.std``). A group whose rewards are all
equal gets advantage exactly 0 (not ``0 / eps`` noise, never NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.nn import TensorDictModuleBase

from vgrpo_lib._checks import (
    check_batch,
    check_finite,
    check_key,
    check_non_negative,
    check_not_empty,
    check_positive,
    check_real,
    check_same_device,
    check_tensor,
    choose,
)
from vgrpo_lib.objectives import soft_clip as soft_clip_fn

__all__ = [
    "SCALES", "MULTI_REWARD", "Groups", "make_groups", "normalize_rewards", "group_statistics", "group_advantage",
    "GroupAdvantage", "max_variance_subset",
]

SCALES = ("group", "batch", "none", "rank", "trimmed")
MULTI_REWARD = ("normalize_then_sum", "sum_then_normalize")


class Groups(NamedTuple):
    """Dense group index ``[B]`` (values ``0..n-1``), member count per group ``[n]`` and ``n``."""

    index: torch.Tensor
    count: torch.Tensor
    num_groups: int


def make_groups(group: torch.Tensor) -> Groups:
    """Dense ids for arbitrary integer group labels ``[B]``."""
    check_tensor("group", group)
    if group.ndim != 1 or group.dtype.is_floating_point or group.dtype.is_complex or group.dtype == torch.bool:
        raise ValueError(f"group must be a 1-D integer tensor of prompt-group ids, got {group.dtype} {tuple(group.shape)}.")
    unique, index, count = torch.unique(group, return_inverse=True, return_counts=True)
    return Groups(index, count, unique.numel())


def _segment_sum(values: torch.Tensor, groups: Groups) -> torch.Tensor:
    return values.new_zeros(groups.num_groups).index_add_(0, groups.index, values)


def _segment_mean_std(values: torch.Tensor, groups: Groups, weight: torch.Tensor | None = None):
    """Per-group (optionally 0/1-weighted) mean and population std, each ``[n]``."""
    weight = torch.ones_like(values) if weight is None else weight
    count = _segment_sum(weight, groups)
    mean = _segment_sum(values * weight, groups) / count
    var = _segment_sum((values - mean[groups.index]).square() * weight, groups) / count
    return mean, var.clamp_min(0).sqrt()


def _is_constant(values: torch.Tensor, groups: Groups) -> torch.Tensor:
    """``[n]`` True where every member of the group has the same value."""
    low = values.new_full((groups.num_groups,), float("inf")).scatter_reduce(0, groups.index, values, "amin")
    high = values.new_full((groups.num_groups,), -float("inf")).scatter_reduce(0, groups.index, values, "amax")
    return low == high


def _within_group_ranks(values: torch.Tensor, groups: Groups) -> tuple[torch.Tensor, torch.Tensor]:
    """Average ranks with ties (0-based) and tie-broken positions (by batch index) within each group, ``[B]``.

    Uses a ``[B, B]`` same-group comparison: fine for the few thousand samples of one RL batch.
    """
    same = groups.index[:, None] == groups.index[None, :]
    less = (values[None, :] < values[:, None]) & same
    equal = (values[None, :] == values[:, None]) & same
    earlier = torch.ones_like(same).tril(-1)
    average_rank = less.sum(1) + 0.5 * (equal.sum(1) - 1)
    position = less.sum(1) + (equal & earlier).sum(1)
    return average_rank.to(values.dtype), position


def normalize_rewards(reward: torch.Tensor, groups: Groups, scale: str, eps: float, trim: float) -> torch.Tensor:
    """Group-relative advantage of one reward ``[B]`` under a named ``scale`` (see :class:`GroupAdvantage`)."""
    constant = _is_constant(reward, groups)[groups.index]
    if scale == "rank":
        reward, _ = _within_group_ranks(reward, groups)
        scale = "group"
    if scale == "trimmed":
        _, position = _within_group_ranks(reward, groups)
        cut = torch.floor(trim * groups.count[groups.index])
        keep = (position >= cut) & (position < groups.count[groups.index] - cut)
        mean, std = _segment_mean_std(reward, groups, keep.to(reward.dtype))
        # A non-constant group whose kept middle is constant (e.g. one success among 0/1 rewards) has a zero
        # trimmed std: fall back to the full group std instead of dividing by eps (advantages of 1e6).
        std = torch.where(std > 0, std, _segment_mean_std(reward, groups)[1])
        advantage = (reward - mean[groups.index]) / (std[groups.index] + eps)
    else:
        mean, std = _segment_mean_std(reward, groups)
        centred = reward - mean[groups.index]
        if scale == "group":
            advantage = centred / (std[groups.index] + eps)
        elif scale == "batch":
            advantage = centred / (reward.std(correction=0) + eps)
        else:
            advantage = centred
    return torch.where(constant, torch.zeros_like(advantage), advantage)


def _check_reward(reward, group: torch.Tensor) -> None:
    """Type, emptiness, device and dtype checks shared by the reward entry points (shapes are checked by each)."""
    check_tensor("reward", reward)
    check_not_empty("reward", reward)
    check_same_device("reward", reward, "group", group)
    if reward.dtype.is_complex:
        raise ValueError(f"reward must be real-valued, got dtype {reward.dtype}.")


def _result_dtype(reward: torch.Tensor) -> torch.dtype:
    """The dtype of what is returned: float64 for float64 rewards, float32 for all others."""
    return torch.float64 if reward.dtype == torch.float64 else torch.float32


def _statistics_dtype(reward: torch.Tensor) -> torch.Tensor:
    """Statistics are computed in float64 whatever the reward's dtype: squares overflow to inf above ~256 in
    float16 and above ~1.8e19 in float32 (a float32 reward of 2e19 gave an inf group std, hence zero advantages)."""
    return reward.double()


def _check_options(soft_clip, clip, eps, trim) -> None:
    if soft_clip is not None:
        check_positive("soft_clip", soft_clip)  # inf would give inf * tanh(0) = NaN
    if clip is not None:
        check_positive("clip", clip, allow_inf=True)  # clamp(-c, c) with c <= 0 or NaN is not a clip
    check_non_negative("eps", eps)  # a negative eps can cancel the group std: +-inf advantages
    if not 0.0 <= check_real("trim", trim) < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}.")


def group_statistics(reward: torch.Tensor, group: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-prompt reward statistics: ``mean``, ``std``, ``count`` per group (``[n]``, in sorted group-id order),
    and ``zero_std_fraction``, the share of groups whose rewards are all equal (they carry no signal)."""
    check_tensor("group", group)
    _check_reward(reward, group)  # before torch.unique(group): a device mismatch is named, not a torch error
    groups = make_groups(group)
    check_batch("reward", reward, group.shape[0], ndim=1)
    dtype, reward = _result_dtype(reward), _statistics_dtype(reward)
    check_finite("reward", reward)
    mean, std = _segment_mean_std(reward, groups)
    constant = _is_constant(reward, groups)
    return {"mean": mean.to(dtype), "std": std.to(dtype), "count": groups.count,
            "zero_std_fraction": constant.float().mean()}


def group_advantage(
    reward: torch.Tensor,
    group: torch.Tensor,
    *,
    scale: str = "group",
    soft_clip: float | None = None,
    clip: float | None = None,
    eps: float = 1e-6,
    trim: float = 0.1,
    weights: Sequence[float] | torch.Tensor | None = None,
    multi_reward: str = "normalize_then_sum",
) -> torch.Tensor:
    """Functional form of :class:`GroupAdvantage`: ``reward`` ``[B]`` or ``[B, R]``, ``group`` ``[B]`` -> ``[B]``."""
    choose("advantage scale", scale, SCALES)
    choose("multi-reward aggregation", multi_reward, MULTI_REWARD)
    _check_options(soft_clip, clip, eps, trim)
    check_tensor("group", group)
    _check_reward(reward, group)
    if reward.ndim not in (1, 2):
        raise ValueError(f"reward must be [B] or [B, R], got shape {tuple(reward.shape)}.")
    if reward.ndim == 2 and reward.shape[1] == 0:
        raise ValueError(f"reward [B, R] must hold at least one reward (R >= 1), got shape {tuple(reward.shape)}.")
    check_batch("group", group, reward.shape[0], ndim=1)
    dtype, reward = _result_dtype(reward), _statistics_dtype(reward)
    check_finite("reward", reward)
    groups = make_groups(group)
    if bool((groups.count < 2).any()):
        singles = torch.unique(group)[groups.count < 2].tolist()
        raise ValueError(f"Groups of size 1 have no group-relative advantage: group id(s) {singles[:8]}.")
    if reward.ndim == 2:
        num_rewards = reward.shape[1]
        w = torch.ones(num_rewards) if weights is None else torch.as_tensor(weights, dtype=reward.dtype)
        if w.shape != (num_rewards,):
            raise ValueError(f"weights must have one entry per reward ({num_rewards}), got shape {tuple(w.shape)}.")
        check_finite("weights", w)
        w = w.to(reward.device, reward.dtype)
        if multi_reward == "sum_then_normalize":
            advantage = normalize_rewards(reward @ w, groups, scale, eps, trim)
        else:
            per_reward = torch.stack(
                [normalize_rewards(reward[:, r], groups, scale, eps, trim) for r in range(num_rewards)], 1
            )
            advantage = per_reward @ w
    else:
        if weights is not None:
            raise ValueError("weights are for multi-reward input of shape [B, R]; reward is [B].")
        advantage = normalize_rewards(reward, groups, scale, eps, trim)
    if clip is not None:
        advantage = advantage.clamp(-clip, clip)
    if soft_clip is not None:
        advantage = soft_clip_fn(advantage, soft_clip)
    return advantage.to(dtype)


def max_variance_subset(reward: torch.Tensor, group: torch.Tensor, keep: int) -> torch.Tensor:
    """PODS's max-variance down-sampling (Xu et al., 2025, "Not All Rollouts are Useful"): of each group's ``n``
    samples, the ``keep`` whose rewards have the largest (population) variance, as a mask ``[B]``.

    Such a subset is the ``i`` highest rewards and the ``keep - i`` lowest for some ``i`` (PODS's lemma), so each
    group's rewards are sorted once and its ``keep + 1`` candidates compared from prefix sums, for every group at
    once; ties go to the candidate with fewer high rewards, and equal rewards rank by their place in the batch.
    ``reward`` ``[B]`` (a multi-reward's weighted sum), ``group`` ``[B]`` integer ids of groups of equal size ``n``,
    ``1 <= keep <= n``. Updating on the subset costs ``keep / n`` of the update while keeping the rollout's most
    informative contrasts: the best and the worst samples of each prompt."""
    check_tensor("group", group)
    _check_reward(reward, group)
    check_batch("reward", reward, group.shape[0], ndim=1)
    check_finite("reward", reward)
    groups = make_groups(group)
    size = int(groups.count[0]) if groups.num_groups else 0
    if bool((groups.count != size).any()):
        raise ValueError(f"max_variance_subset needs groups of one size, got sizes {sorted(set(groups.count.tolist()))}.")
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= size:
        raise ValueError(f"keep must be an integer in [1, {size}] (the group size), got {keep!r}.")
    by_reward = torch.argsort(reward, stable=True)
    order = by_reward[torch.argsort(groups.index[by_reward], stable=True)]  # by group, then ascending reward
    ranked = reward[order].to(torch.float64).view(groups.num_groups, size)
    zero = ranked.new_zeros(groups.num_groups, 1)
    first, second = torch.cat([zero, ranked.cumsum(1)], 1), torch.cat([zero, ranked.square().cumsum(1)], 1)
    high = torch.arange(keep + 1, device=reward.device)  # candidate i: the i highest and the keep - i lowest
    total = first[:, keep - high] + first[:, size:] - first[:, size - high]
    squares = second[:, keep - high] + second[:, size:] - second[:, size - high]
    variance = squares / keep - (total / keep).square()
    best = variance.argmax(1, keepdim=True)  # the first maximum: the fewest high rewards among equal variances
    position = torch.arange(size, device=reward.device)
    chosen = (position < keep - best) | (position >= size - best)
    kept = torch.zeros_like(group, dtype=torch.bool)
    kept[order] = chosen.flatten()
    return kept


class GroupAdvantage(TensorDictModuleBase):
    """GRPO's group-relative advantage, as a function and as a TensorDict module.

    Args:
        scale: ``"group"`` (divide by the group std: GRPO), ``"batch"`` (by the batch std), ``"none"`` (centre only:
            Dr.GRPO), ``"rank"`` (z-scored within-group ranks, ties averaged), ``"trimmed"`` (centre and scale by the
            group's mean and std after dropping the ``trim`` fraction at each end).
        soft_clip: ``eta`` of V-GRPO's soft clip ``eta tanh(A / eta)`` (paper: 3, on-policy training), or None.
        clip: hard clip ``[-clip, clip]`` (Flow-GRPO: 5), applied before the soft clip; or None.
        eps: added to the scale.
        trim: fraction trimmed at each end for ``"trimmed"``.
        weights: per-reward weights for multi-reward input ``[B, R]`` (default: all 1).
        multi_reward: ``"normalize_then_sum"`` (each reward normalised in its group, then a weighted sum: GDPO-style)
            or ``"sum_then_normalize"`` (weighted sum of raw rewards, then normalised).

    Call as ``adv(reward, group) -> [B]`` or on a TensorDict (``in_keys=["reward", "group"]``,
    ``out_keys=["advantage"]``). Errors: NaN/inf rewards (the indices are named), groups of size 1, shape
    mismatches, unknown options.
    """

    def __init__(
        self,
        scale: str = "group",
        soft_clip: float | None = None,
        clip: float | None = None,
        eps: float = 1e-6,
        *,
        trim: float = 0.1,
        weights: Sequence[float] | None = None,
        multi_reward: str = "normalize_then_sum",
        in_keys: Sequence = ("reward", "group"),
        out_keys: Sequence = ("advantage",),
    ):
        super().__init__()
        self.scale = choose("advantage scale", scale, SCALES)
        self.multi_reward = choose("multi-reward aggregation", multi_reward, MULTI_REWARD)
        _check_options(soft_clip, clip, eps, trim)
        self.soft_clip, self.clip, self.eps, self.trim, self.weights = soft_clip, clip, eps, trim, weights
        self.in_keys, self.out_keys = list(in_keys), list(out_keys)

    def compute(self, reward: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
        """Advantages ``[B]`` of ``reward`` ``[B]`` or ``[B, R]`` with prompt-group ids ``group`` ``[B]``."""
        return group_advantage(
            reward,
            group,
            scale=self.scale,
            soft_clip=self.soft_clip,
            clip=self.clip,
            eps=self.eps,
            trim=self.trim,
            weights=self.weights,
            multi_reward=self.multi_reward,
        )

    def forward(self, reward_or_batch, group: torch.Tensor | None = None):
        if is_tensor_collection(reward_or_batch):
            batch: TensorDictBase = reward_or_batch
            reward_key, group_key = self.in_keys
            check_key(batch, reward_key, "the rewards")
            check_key(batch, group_key, "the prompt-group ids")
            batch.set(self.out_keys[0], self.compute(batch.get(reward_key), batch.get(group_key)))
            return batch
        if group is None:
            raise ValueError("GroupAdvantage needs the group ids: adv(reward, group).")
        return self.compute(reward_or_batch, group)
