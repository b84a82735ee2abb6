"""vgrpo_lib.diagnostics: the estimator statistics (closed forms and properties) and the measurements on a model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib import ELBOSurrogate
from vgrpo_lib.diagnostics import (
    coefficient_of_variation,
    effective_sample_size,
    gradient_agreement,
    gradient_cosine_to_reference,
    mc_noise_share,
    measure_estimator,
    nearby_policy,
    policy_gradient,
    spearman,
    within_group_cv,
    within_group_rank_agreement,
)
from vgrpo_lib.testing import MLPVelocity
from vgrpo_lib.testing.strategies import group_ids

PROPERTIES = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def test_noise_free_draws_have_zero_cv_and_full_agreement():
    draws = torch.tensor([[1.0, 2.0, 3.0, 4.0]]).repeat(6, 1)
    group = torch.tensor([0, 0, 1, 1])
    assert coefficient_of_variation(draws) == 0.0
    assert within_group_cv(draws, group) == 0.0
    assert mc_noise_share(draws, group) == 0.0
    assert within_group_rank_agreement(draws, group) == pytest.approx(1.0)


def test_a_shift_shared_by_the_group_is_not_within_group_noise():
    # Each draw adds one random offset to every member of a group: the surrogates fluctuate (CV > 0) but
    # the within-group standing does not, which is exactly what group-shared pairs buy.
    generator = torch.Generator().manual_seed(0)
    base = torch.tensor([1.0, 2.0, 3.0, 5.0])
    group = torch.tensor([0, 0, 1, 1])
    offsets = torch.randn(200, 2, generator=generator)[:, group]
    draws = base + offsets
    assert coefficient_of_variation(draws) > 0.2
    assert within_group_cv(draws, group) == pytest.approx(0.0, abs=1e-6)


def test_pure_noise_is_all_monte_carlo_noise():
    generator = torch.Generator().manual_seed(1)
    draws = 10 + torch.randn(4000, 8, generator=generator, dtype=torch.float64)
    share = mc_noise_share(draws, torch.arange(8) // 4)
    # Every member has the same expectation, so the within-group variance is all noise: share -> 1
    # (tolerance 0.02 at 4000 draws).
    assert share == pytest.approx(1.0, abs=0.02)


def test_spearman_closed_forms():
    a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(a, a**3) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    # One adjacent swap among n = 5: rho = 1 - 6 * 2 / (5 * 24) = 0.9.
    assert spearman(a, torch.tensor([2.0, 1.0, 3.0, 4.0, 5.0])) == pytest.approx(0.9)


def test_gradient_agreement_closed_forms():
    identical = gradient_agreement(torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]))
    assert identical == {"gradient_cosine": pytest.approx(1.0), "gradient_cosine_se": pytest.approx(0.0),
                         "gradient_relative_variance": pytest.approx(0.0)}
    orthogonal = gradient_agreement(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    # mean (0.5, 0.5): each draw is sqrt(0.5) away, relative variance 0.5 / 0.5 = 1.
    assert orthogonal["gradient_cosine"] == pytest.approx(0.0)
    assert orthogonal["gradient_relative_variance"] == pytest.approx(1.0)
    assert math.isnan(orthogonal["gradient_cosine_se"])  # two draws: no pair left when one is left out


def test_gradient_cosine_standard_error_is_the_jackknife():
    """The jackknife SE against a brute-force leave-one-out, and its size on i.i.d. noise: for R = 40 draws of
    m + N(0, I) in P = 50 dimensions with ||m||^2 = 50 the pairwise cosine is about 0.5, and the SE shrinks like
    1 / sqrt(R) (between 0.005 and 0.05 here)."""
    generator = torch.Generator().manual_seed(0)
    gradients = torch.ones(50, dtype=torch.float64) + torch.randn(40, 50, generator=generator, dtype=torch.float64)
    stats = gradient_agreement(gradients)
    leave_out = torch.tensor([gradient_agreement(torch.cat([gradients[:k], gradients[k + 1:]]))["gradient_cosine"]
                              for k in range(40)], dtype=torch.float64)
    expected = (39 / 40 * (leave_out - leave_out.mean()).square().sum()).sqrt().item()
    assert stats["gradient_cosine_se"] == pytest.approx(expected, rel=1e-9)
    assert stats["gradient_cosine"] == pytest.approx(0.5, abs=0.05)
    assert 0.005 < stats["gradient_cosine_se"] < 0.05




@PROPERTIES
@given(group=group_ids(), draws=st.integers(2, 6), seed=st.integers(0, 1000))
def test_group_common_noise_never_counts_as_within_group_noise(group, draws, seed):
    """Adding any per-draw offset shared by a group's members leaves the within-group statistics unchanged."""
    generator = torch.Generator().manual_seed(seed)
    values = 5 + torch.randn(draws, group.shape[0], generator=generator, dtype=torch.float64)
    _, index = torch.unique(group, return_inverse=True)
    offsets = 3 * torch.randn(draws, int(index.max()) + 1, generator=generator, dtype=torch.float64)[:, index]
    shifted = values + offsets

    def deviation(draws):
        means = torch.stack([draws[:, index == g].mean(1) for g in range(int(index.max()) + 1)], 1)
        return draws - means[:, index]

    torch.testing.assert_close(deviation(shifted), deviation(values))
    assert mc_noise_share(shifted, group) >= 0.0
    assert mc_noise_share(shifted, group) == pytest.approx(mc_noise_share(values, group), rel=1e-9, abs=1e-12)


def test_statistics_name_bad_shapes():
    with pytest.raises(ValueError, match=r"draws must be an \(R, N\) tensor"):
        within_group_cv(torch.ones(4), torch.zeros(4))
    with pytest.raises(ValueError, match="at least 2 draws"):
        coefficient_of_variation(torch.ones(1, 4))
    with pytest.raises(ValueError, match=r"group must be \(N,\) = \(4,\)"):
        within_group_rank_agreement(torch.ones(2, 4), torch.zeros(3))
    with pytest.raises(ValueError, match="R >= 2"):
        gradient_agreement(torch.ones(1, 5))
    with pytest.raises(ValueError, match="one shape"):
        spearman(torch.ones(3), torch.ones(4))


def test_effective_sample_size_closed_forms():
    # Equal weights: ESS = N (normalized 1); two equal weights and two zero: ESS = 2.
    assert effective_sample_size(torch.zeros(5)).item() == pytest.approx(1.0)
    assert effective_sample_size(torch.zeros(5), normalized=False).item() == pytest.approx(5.0)
    two = torch.tensor([0.0, 0.0, -math.inf, -math.inf])
    assert effective_sample_size(two, normalized=False).item() == pytest.approx(2.0)
    # Weights (1, 2): (1 + 2)^2 / (1 + 4) = 9 / 5.
    assert effective_sample_size(torch.tensor([0.0, math.log(2.0)]), normalized=False).item() == pytest.approx(1.8)
    # Batched over leading dimensions, stable for huge log-weights.
    batched = effective_sample_size(torch.tensor([[0.0, 0.0], [1000.0, 0.0]]))
    torch.testing.assert_close(batched, torch.tensor([1.0, 0.5]))
    with pytest.raises(ValueError, match="log_weights"):
        effective_sample_size(torch.tensor(1.0))


@PROPERTIES
@given(st.lists(st.floats(-20, 20), min_size=1, max_size=30), st.floats(-50, 50))
def test_effective_sample_size_is_in_range_and_shift_invariant(values, shift):
    log_weights = torch.tensor(values, dtype=torch.float64)
    ess = effective_sample_size(log_weights).item()
    assert 1 / len(values) - 1e-9 <= ess <= 1 + 1e-9
    assert effective_sample_size(log_weights + shift).item() == pytest.approx(ess, rel=1e-9)


def test_gradient_cosine_to_reference_closed_forms():
    reference = torch.tensor([1.0, 0.0])
    same = gradient_cosine_to_reference(torch.tensor([[2.0, 0.0], [0.5, 0.0]]), reference)
    assert same == {"reference_cosine": pytest.approx(1.0), "reference_cosine_se": pytest.approx(0.0)}
    mixed = gradient_cosine_to_reference(torch.tensor([[0.0, 1.0], [1.0, 1.0]]), reference)
    # cosines 0 and 1/sqrt(2): their mean, and the standard error std / sqrt(R).
    cosines = torch.tensor([0.0, 1 / math.sqrt(2)])
    assert mixed["reference_cosine"] == pytest.approx(cosines.mean().item())
    assert mixed["reference_cosine_se"] == pytest.approx((cosines.std() / math.sqrt(2)).item())
    with pytest.raises(ValueError, match=r"reference \(P,\)"):
        gradient_cosine_to_reference(torch.ones(2, 3), torch.ones(2))


def _identical_members(groups: int = 3, size: int = 4):
    """Samples ``(groups * size, 3)`` whose members are identical within a group, zero-sum advantages."""
    generator = torch.Generator().manual_seed(0)
    group = torch.arange(groups).repeat_interleave(size)
    sample = torch.randn(groups, 3, generator=generator)[group]
    advantage = torch.randn(groups * size, generator=generator)
    advantage = advantage - advantage.view(groups, size).mean(1)[group]
    return sample, group, advantage


def test_policy_gradient_vanishes_for_identical_members_with_group_shared_pairs():
    """s(o_i) is one number per group when the members are equal and share their pairs, so sum_i A_i s(o_i) = 0 for
    zero-sum advantages: the gradient is exactly 0 (up to rounding). Independent pairs break the tie."""
    model = MLPVelocity(data_shape=(3,), seed=0)
    sample, group, advantage = _identical_members()
    shared = policy_gradient(ELBOSurrogate(4, sharing="group"), model, sample, None, group, advantage,
                             torch.Generator().manual_seed(1))
    independent = policy_gradient(ELBOSurrogate(4, sharing="none"), model, sample, None, group, advantage,
                                  torch.Generator().manual_seed(1))
    assert shared.dtype == torch.float64 and shared.shape == (sum(p.numel() for p in model.parameters()),)
    assert shared.abs().max() < 1e-6 < independent.abs().max()


def test_policy_gradient_is_the_gradient_of_the_advantage_weighted_surrogate():
    model = MLPVelocity(data_shape=(3,), seed=2)
    estimator = ELBOSurrogate(2, sharing="none")
    sample, group, advantage = _identical_members()
    got = policy_gradient(estimator, model, sample, None, group, advantage, torch.Generator().manual_seed(5))
    pairs = estimator.sample_pairs(sample, group, torch.Generator().manual_seed(5))
    model.zero_grad()
    (-(advantage * estimator(model, sample, None, pairs)).mean()).backward()
    expected = torch.cat([p.grad.flatten() for p in model.parameters()]).double()
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="trainable parameters"):
        policy_gradient(estimator, model.requires_grad_(False), sample, None, group, advantage)


def test_nearby_policy_is_a_frozen_step_away_and_leaves_the_model_alone():
    model = MLPVelocity(data_shape=(3,), seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    sample, group, advantage = _identical_members()
    estimator = ELBOSurrogate(2, sharing="none")
    nearby = nearby_policy(model, estimator, sample, None, group, advantage, lr=1e-2, seed=3)
    again = nearby_policy(model, estimator, sample, None, group, advantage, lr=1e-2, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert not any(p.requires_grad for p in nearby.parameters())
    # Adam's first step moves every parameter with a non-zero gradient by lr (its normalised step).
    moved = torch.cat([(p - q).flatten() for p, q in zip(nearby.parameters(), before)]).abs()
    assert moved.max() == pytest.approx(1e-2, rel=1e-3)
    assert all(torch.equal(p, q) for p, q in zip(nearby.parameters(), again.parameters()))


def test_measure_estimator_reports_every_statistic_reproducibly():
    model = MLPVelocity(data_shape=(3,), seed=0)
    sample, group, advantage = _identical_members()
    nearby = nearby_policy(model, ELBOSurrogate(), sample, None, group, advantage, lr=1e-2)
    shared = measure_estimator(ELBOSurrogate(4), model, sample, None, group, advantage, nearby=nearby, draws=4,
                               gradient_draws=3, seed=0)
    keys = {"num_pairs", "cv", "within_group_cv", "mc_noise_share", "rank_agreement", "log_ratio_variance",
            "log_ratio_mean_abs", "log_ratio_relative_variance", "log_ratio_rank_agreement", "log_ratio_ess",
            "gradient_cosine", "gradient_cosine_se", "gradient_relative_variance", "nfe_per_sample",
            "seconds_per_evaluation"}
    assert set(shared) == keys and shared["num_pairs"] == shared["nfe_per_sample"] == 4
    # Identical members sharing pairs: no within-group noise at all; independent pairs have some.
    independent = measure_estimator(ELBOSurrogate(4, sharing="none"), model, sample, None, group, advantage,
                                    nearby=nearby, draws=4, gradient_draws=3, seed=0)
    assert shared["within_group_cv"] < 1e-6 < independent["within_group_cv"]
    assert shared["cv"] > 0 and 0 < independent["log_ratio_ess"] <= 1
    again = measure_estimator(ELBOSurrogate(4, sharing="none"), model, sample, None, group, advantage, nearby=nearby,
                              draws=4, gradient_draws=3, seed=0)
    assert {k: v for k, v in again.items() if k != "seconds_per_evaluation"} == {
        k: v for k, v in independent.items() if k != "seconds_per_evaluation"}
