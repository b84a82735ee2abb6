"""The ground-truth check's exact log-likelihood and its multi-seed, multi-dimension study."""

import math

import pytest
import torch
from torch import nn

from vgrpo_lib.benchmarks.ground_truth import _interval, exact_log_likelihood, ground_truth_study, ring_data


class LinearVelocity(nn.Module):
    """``v(z, t) = a z``: the flow maps x to ``z_1 = x e^a``, so ``p_0 = N(0, e^{-2a} I)`` in closed form."""

    def __init__(self, a: float):
        super().__init__()
        self.a = a

    def forward(self, z, t, cond=None):
        return self.a * z


@pytest.mark.parametrize("dim", [2, 5])
def test_exact_log_likelihood_of_a_linear_flow_is_the_gaussian_density(dim):
    x = torch.randn(16, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = 0.4
    expected = torch.distributions.Normal(0.0, math.exp(-a)).log_prob(x).sum(1)
    torch.testing.assert_close(exact_log_likelihood(LinearVelocity(a), x, steps=50), expected, rtol=1e-7, atol=1e-7)


def test_ring_data_keeps_the_ring_in_two_coordinates():
    points = ring_data(4000, torch.Generator().manual_seed(0), dim=6)
    assert points.shape == (4000, 6)
    assert abs(points[:, :2].norm(dim=1).mean().item() - 2.0) < 0.05  # radius 2
    assert abs(points[:, 2:].std().item() - 0.25) < 0.01


def test_study_reports_every_seed_and_dimension_with_intervals():
    from vgrpo_lib.benchmarks.estimator_lab import ESTIMATORS

    report = ground_truth_study({"vgrpo": ESTIMATORS["vgrpo"]}, seeds=(0, 1), dims=(2, 3), samples=32, draws=2,
                                pretrain_steps=30, finetune_steps=5)
    assert set(report) == {"dim2", "dim3"}
    for block in report.values():
        row = block["estimators"]["vgrpo"]["spearman"]
        assert len(row["per_seed"]) == 2 and row["interval_90"][0] <= row["mean"] <= row["interval_90"][1]
        assert [setup["seed"] for setup in block["setups"]] == [0, 1]
        stats = block["estimators"]["vgrpo"]
        relative = [v / s**2 for v, s in zip(stats["log_ratio_variance"]["per_seed"], stats["log_ratio_mean_abs"]["per_seed"])]
        assert stats["log_ratio_relative_variance"]["per_seed"] == pytest.approx(relative) and min(relative) > 0


def test_t_interval():
    # Three values with mean 2 and sample std 1: half-width t_{0.95, 2} / sqrt(3) = 2.920 / 1.732.
    low, high = _interval([1.0, 2.0, 3.0])
    assert (low, high) == pytest.approx((2 - 2.920 / math.sqrt(3), 2 + 2.920 / math.sqrt(3)))
