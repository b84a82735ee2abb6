"""Group-relative advantages (vgrpo_lib.advantages)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from vgrpo_lib import GroupAdvantage, group_advantage, group_statistics
from vgrpo_lib.advantages import SCALES, max_variance_subset
from vgrpo_lib.testing.strategies import reward_batches

FAST = settings(max_examples=40, deadline=None)
finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
# Rewards on a grid of 1/4 make group sums exact in float64, so tolerance-based properties cannot be broken by
# near-ties whose std is at the rounding level (where a 1-ulp change of the mean is amplified by 1 / eps).
grid = st.integers(-4000, 4000).map(lambda i: i / 4)


def grouped_rewards(min_groups=1, max_groups=4, min_size=2, max_size=6, values=finite):
    """(reward float64 [B], group [B]) with every group of size >= 2, groups interleaved, labels arbitrary; some
    groups constant, some with ties, some generic: the library's own strategy (vgrpo_lib.testing.strategies)."""
    return reward_batches(dtype=torch.float64, values=values, min_groups=min_groups, max_groups=max_groups,
                          min_size=min_size, max_size=max_size)


def _group_members(group):
    return {g: (group == g).nonzero().flatten() for g in torch.unique(group).tolist()}


def test_hand_computed_group_scale():
    """Group 0: (1, 2, 3): mean 2, population std sqrt(2/3) -> (-1, 0, 1) / sqrt(2/3) = (-1.2247, 0, 1.2247).
    Group 1: (5, 5, 5): constant -> exactly 0."""
    reward = torch.tensor([1.0, 5.0, 2.0, 5.0, 3.0, 5.0], dtype=torch.float64)
    group = torch.tensor([0, 1, 0, 1, 0, 1])
    adv = group_advantage(reward, group, eps=0.0)
    s = math.sqrt(2 / 3)
    torch.testing.assert_close(adv, torch.tensor([-1 / s, 0.0, 0.0, 0.0, 1 / s, 0.0], dtype=torch.float64))
    assert adv[[1, 3, 5]].tolist() == [0.0, 0.0, 0.0]


def test_hand_computed_batch_and_none_scale():
    """(0, 2 | 10, 14): group means 1 and 12; centred (-1, 1, -2, 2). Batch population std of (0, 2, 10, 14):
    mean 6.5, deviations^2 = 42.25 + 20.25 + 12.25 + 56.25 = 131 -> std sqrt(131 / 4)."""
    reward = torch.tensor([0.0, 2.0, 10.0, 14.0], dtype=torch.float64)
    group = torch.tensor([0, 0, 1, 1])
    centred = torch.tensor([-1.0, 1.0, -2.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(group_advantage(reward, group, scale="none"), centred)
    torch.testing.assert_close(group_advantage(reward, group, scale="batch", eps=0.0), centred / math.sqrt(131 / 4))


def test_hand_computed_rank_scale_with_ties():
    """(10, 20, 20, 40) -> average ranks (0, 1.5, 1.5, 3): mean 1.5, population std sqrt((2.25*2)/4) = 1.0607."""
    reward = torch.tensor([10.0, 20.0, 20.0, 40.0], dtype=torch.float64)
    adv = group_advantage(reward, torch.zeros(4, dtype=torch.long), scale="rank", eps=0.0)
    std = math.sqrt((1.5**2 + 0 + 0 + 1.5**2) / 4)
    torch.testing.assert_close(adv, torch.tensor([-1.5, 0.0, 0.0, 1.5], dtype=torch.float64) / std)
    # Ranks ignore the magnitude: replacing 40 by 4000 changes nothing.
    reward[3] = 4000.0
    torch.testing.assert_close(group_advantage(reward, torch.zeros(4, dtype=torch.long), scale="rank", eps=0.0), adv)


def test_hand_computed_trimmed_scale():
    """G = 10, trim 0.1 drops one member at each end: (0, 1, ..., 8, 1000) keeps 1..8: mean 4.5, population std
    sqrt(5.25). Every member, kept or dropped, is centred and scaled by those statistics."""
    reward = torch.tensor([float(i) for i in range(9)] + [1000.0], dtype=torch.float64)
    group = torch.zeros(10, dtype=torch.long)
    adv = group_advantage(reward, group, scale="trimmed", trim=0.1, eps=0.0)
    torch.testing.assert_close(adv, (reward - 4.5) / math.sqrt(5.25))


def test_trimmed_binary_rewards_stay_bounded():
    """0/1 rewards with a single success: the kept middle is all zeros (zero trimmed std). The advantage must not
    blow up to 1/eps (= 1e6); it falls back to the group std: (1 - 0) / sqrt(0.09) = 3.33 for the success."""
    reward = torch.tensor([0.0] * 9 + [1.0], dtype=torch.float64)
    adv = group_advantage(reward, torch.zeros(10, dtype=torch.long), scale="trimmed", trim=0.1, eps=0.0)
    assert bool(torch.isfinite(adv).all())
    assert adv.abs().max().item() < 10
    assert adv[9].item() == pytest.approx(1 / 0.3)
    assert adv[:9].tolist() == [0.0] * 9  # centred on the trimmed mean (0)


@pytest.mark.parametrize("scale", SCALES)
@FAST
@given(data=grouped_rewards())
def test_constant_groups_exactly_zero_and_all_finite(scale, data):
    reward, group = data
    adv = group_advantage(reward, group, scale=scale)
    assert bool(torch.isfinite(adv).all())
    for members in _group_members(group).values():
        if bool((reward[members] == reward[members][0]).all()):
            assert adv[members].tolist() == [0.0] * len(members)


@pytest.mark.parametrize("scale", ["group", "batch", "none", "rank"])
@FAST
@given(data=grouped_rewards(values=grid))
def test_zero_mean_per_group(scale, data):
    reward, group = data
    adv = group_advantage(reward, group, scale=scale)
    for members in _group_members(group).values():
        assert abs(adv[members].mean().item()) < 1e-9 * max(1.0, adv[members].abs().max().item())


@FAST
@given(data=grouped_rewards(values=grid))
def test_group_scale_unit_std(data):
    """With eps = 0, every non-constant group's advantages have population std 1."""
    reward, group = data
    adv = group_advantage(reward, group, eps=0.0)
    for members in _group_members(group).values():
        r = reward[members]
        if r.std(correction=0).item() > 0:
            assert adv[members].std(correction=0).item() == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("scale", SCALES)
@FAST
@given(data=grouped_rewards(values=grid), seed=st.integers(0, 2**31 - 1))
def test_permutation_equivariant(scale, data, seed):
    reward, group = data
    perm = torch.randperm(reward.numel(), generator=torch.Generator().manual_seed(seed))
    adv = group_advantage(reward, group, scale=scale)
    adv_perm = group_advantage(reward[perm], group[perm], scale=scale)
    torch.testing.assert_close(adv_perm, adv[perm], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scale", ["group", "rank", "trimmed"])
@FAST
@given(
    # On the grid the affine map also keeps distinct rewards distinct in floating point (1 + 3e-262 == 1 would
    # otherwise create ties that legitimately change ranks).
    data=grouped_rewards(values=grid),
    a=st.floats(0.01, 100.0),
    b=st.floats(-1e3, 1e3),
    which=st.integers(0, 10),
)
def test_group_scaling_invariant_to_positive_affine_change_of_one_group(scale, data, a, b, which):
    """R -> a R + b (a > 0) on the members of one group leaves every advantage unchanged (eps = 0 so the
    invariance is exact up to rounding; 1e-6 absolute)."""
    reward, group = data
    labels = torch.unique(group)
    target = labels[which % labels.numel()]
    members = group == target
    changed = reward.clone()
    changed[members] = a * reward[members] + b
    adv = group_advantage(reward, group, scale=scale, eps=0.0)
    adv_changed = group_advantage(changed, group, scale=scale, eps=0.0)
    torch.testing.assert_close(adv_changed, adv, rtol=0, atol=1e-6)


def test_batch_scale_is_not_group_invariant():
    """Sanity check of the previous property's power: with "batch" scaling, scaling one group changes the others."""
    reward = torch.tensor([0.0, 1.0, 0.0, 2.0], dtype=torch.float64)
    group = torch.tensor([0, 0, 1, 1])
    changed = reward.clone()
    changed[:2] *= 10
    a = group_advantage(reward, group, scale="batch")
    b = group_advantage(changed, group, scale="batch")
    assert not torch.allclose(a[2:], b[2:])


@FAST
@given(data=grouped_rewards(), eta=st.floats(0.5, 5.0))
def test_soft_clip_equals_eta_tanh(data, eta):
    reward, group = data
    raw = group_advantage(reward, group)
    soft = group_advantage(reward, group, soft_clip=eta)
    torch.testing.assert_close(soft, eta * torch.tanh(raw / eta))
    assert bool((soft.abs() < eta).all())
    assert torch.equal(GroupAdvantage(soft_clip=eta)(reward, group), soft)


@FAST
@given(data=grouped_rewards(), clip=st.floats(0.1, 2.0))
def test_hard_clip(data, clip):
    reward, group = data
    raw = group_advantage(reward, group, scale="none")
    clipped = group_advantage(reward, group, scale="none", clip=clip)
    torch.testing.assert_close(clipped, raw.clamp(-clip, clip))
    # clip first, then soft clip
    both = group_advantage(reward, group, scale="none", clip=clip, soft_clip=1.0)
    torch.testing.assert_close(both, torch.tanh(raw.clamp(-clip, clip)))


def test_multi_reward_normalize_then_sum_vs_sum_then_normalize_hand_computed():
    """One group of three, R1 = (1, 2, 3), R2 = (0, 0, 30), weights (1, 0.5), eps = 0.
    normalize_then_sum: R1 -> (-1, 0, 1)/sqrt(2/3); R2: mean 10, std sqrt(200) -> (-10, -10, 20)/sqrt(200);
        A = z1 + 0.5 z2.
    sum_then_normalize: R1 + 0.5 R2 = (1, 2, 18): mean 7, deviations (-6, -5, 11), var (36 + 25 + 121)/3 = 182/3."""
    reward = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 30.0]], dtype=torch.float64)
    group = torch.zeros(3, dtype=torch.long)
    z1 = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64) / math.sqrt(2 / 3)
    z2 = torch.tensor([-10.0, -10.0, 20.0], dtype=torch.float64) / math.sqrt(200)
    nts = group_advantage(reward, group, weights=[1.0, 0.5], multi_reward="normalize_then_sum", eps=0.0)
    torch.testing.assert_close(nts, z1 + 0.5 * z2)
    stn = group_advantage(reward, group, weights=[1.0, 0.5], multi_reward="sum_then_normalize", eps=0.0)
    torch.testing.assert_close(stn, torch.tensor([-6.0, -5.0, 11.0], dtype=torch.float64) / math.sqrt(182 / 3))
    # Default weights are all ones; the module form agrees with the function.
    ones = GroupAdvantage(eps=0.0)(reward, group)
    torch.testing.assert_close(ones, z1 + z2)
    module = GroupAdvantage(weights=[1.0, 0.5], multi_reward="sum_then_normalize", eps=0.0)
    torch.testing.assert_close(module(reward, group), stn)


def test_multi_reward_constant_component_contributes_zero():
    """A reward that is constant inside the group adds exactly 0 under normalize_then_sum."""
    reward = torch.tensor([[1.0, 7.0], [3.0, 7.0]], dtype=torch.float64)
    group = torch.tensor([0, 0])
    torch.testing.assert_close(
        group_advantage(reward, group, weights=[1.0, 5.0]), group_advantage(reward[:, 0], group)
    )


def test_group_statistics_hand_computed():
    """Groups 7: (1, 3), 2: (4, 4), 5: (0, 6, 3) -> sorted ids (2, 5, 7): means (4, 3, 2), stds (0, sqrt(6), 1),
    counts (2, 3, 2); one group of three is constant -> zero_std_fraction 1/3."""
    reward = torch.tensor([1.0, 4.0, 0.0, 3.0, 4.0, 6.0, 3.0])
    group = torch.tensor([7, 2, 5, 7, 2, 5, 5])
    stats = group_statistics(reward, group)
    torch.testing.assert_close(stats["mean"], torch.tensor([4.0, 3.0, 2.0]))
    torch.testing.assert_close(stats["std"], torch.tensor([0.0, math.sqrt(6.0), 1.0]))
    assert stats["count"].tolist() == [2, 3, 2]
    assert stats["zero_std_fraction"].item() == pytest.approx(1 / 3)
    assert group_statistics(torch.tensor([1, 1, 2, 3]), torch.tensor([0, 0, 1, 1]))["zero_std_fraction"].item() == 0.5


def test_tensordict_module_form():
    reward = torch.tensor([1.0, 2.0, 3.0, 3.0])
    group = torch.tensor([0, 0, 1, 1])
    td = TensorDict({"reward": reward, "group": group}, batch_size=[4])
    module = GroupAdvantage()
    assert module.in_keys == ["reward", "group"] and module.out_keys == ["advantage"]
    out = module(td)
    assert out is td
    torch.testing.assert_close(td["advantage"], group_advantage(reward, group))
    assert td["advantage"][2:].tolist() == [0.0, 0.0]
    # Remapped (nested) keys.
    custom = GroupAdvantage(scale="none", in_keys=[("rollout", "r"), "prompt"], out_keys=[("rollout", "adv")])
    td2 = TensorDict({"rollout": {"r": reward}, "prompt": group}, batch_size=[4])
    custom(td2)
    torch.testing.assert_close(td2["rollout", "adv"], torch.tensor([-0.5, 0.5, 0.0, 0.0]))


def test_dtypes():
    """Integer rewards are promoted to float; float64 stays float64."""
    group = torch.tensor([0, 0])
    assert group_advantage(torch.tensor([0, 1]), group).dtype == torch.float32
    assert group_advantage(torch.tensor([0.0, 1.0], dtype=torch.float64), group).dtype == torch.float64


@st.composite
def equal_groups(draw):
    """(reward float64 [B], group [B], keep): 1-4 groups of one size 1-7 with arbitrary labels, interleaved; rewards on
    the 1/4 grid (exact sums: a tie between two subsets' variances is a true tie), ties frequent."""
    num_groups, size = draw(st.integers(1, 4)), draw(st.integers(1, 7))
    values = st.integers(-8, 8).map(lambda i: i / 4) if draw(st.booleans()) else grid
    reward = torch.tensor(draw(st.lists(values, min_size=num_groups * size, max_size=num_groups * size)),
                          dtype=torch.float64)
    labels = draw(st.lists(st.integers(-50, 50), min_size=num_groups, max_size=num_groups, unique=True))
    group = torch.tensor(labels).repeat_interleave(size)
    order = torch.randperm(group.numel(), generator=torch.Generator().manual_seed(draw(st.integers(0, 2**31))))
    return reward, group[order], draw(st.integers(1, size))


def _population_variance(values) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)


@FAST
@given(equal_groups())
def test_max_variance_subset_is_the_best_subset_of_each_group(case):
    """Against brute force over every subset of size keep (PODS's definition): each group keeps exactly keep samples
    and no other subset of its rewards has a larger variance."""
    import itertools

    reward, group, keep = case
    kept = max_variance_subset(reward, group, keep)
    assert kept.dtype == torch.bool and kept.shape == group.shape
    for members in _group_members(group).values():
        chosen = [float(reward[i]) for i in members if kept[i]]
        assert len(chosen) == keep
        best = max(_population_variance(subset) for subset in itertools.combinations(reward[members].tolist(), keep))
        assert _population_variance(chosen) == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_max_variance_subset_hand_computed():
    """Group 7: (0.1, 0.9, 0.5, 0.4) keeps its extremes 0.1 and 0.9. Group 3: (1, 1, 1, 0): {0, 1} is the best pair
    both as the two lowest and as the lowest and the highest; the tie goes to fewer high rewards, the two lowest,
    and the earliest 1 is the lower of the equal ones. Three of each: group 7 keeps 0.1, 0.4 and 0.9 (variance
    0.1089 against 0.1067 for 0.1, 0.5, 0.9), group 3 the 0 and its two earliest 1s. keep = n keeps all."""
    reward = torch.tensor([0.1, 1.0, 0.9, 1.0, 0.5, 1.0, 0.4, 0.0])
    group = torch.tensor([7, 3, 7, 3, 7, 3, 7, 3])
    assert max_variance_subset(reward, group, 2).tolist() == [True, True, True, False, False, False, False, True]
    assert max_variance_subset(reward, group, 4).all()
    assert max_variance_subset(reward, group, 3).tolist() == [True, True, True, True, False, False, True, True]


def test_max_variance_subset_refuses_bad_input():
    reward, group = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match="groups of one size, got sizes \\[1, 2\\]"):
        max_variance_subset(reward, group, 1)
    with pytest.raises(ValueError, match=r"keep must be an integer in \[1, 3\]"):
        max_variance_subset(torch.zeros(3), torch.zeros(3, dtype=torch.long), 4)
    with pytest.raises(ValueError, match="keep must be an integer"):
        max_variance_subset(torch.zeros(3), torch.zeros(3, dtype=torch.long), True)
    with pytest.raises(ValueError, match="NaN"):
        max_variance_subset(torch.tensor([0.0, float("nan")]), torch.zeros(2, dtype=torch.long), 1)
