"""Functional objective pieces (vgrpo_lib.objectives)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.objectives import (
    clip_fraction,
    clip_fraction_active,
    clipped_ratio_objective,
    gaussian_kl_same_std,
    kl_estimate,
    nft_implicit_velocities,
    nft_optimality,
    ratio_diagnostics,
    soft_clip,
    x_space_kl,
)

FAST = settings(max_examples=30, deadline=None)


def test_clipped_objective_hand_computed():
    """eps = 0.2 symmetric:
    ratio 1.5, A = +1: min(1.5, 1.2) = 1.2 -> loss -1.2 (clipped);   A = -1: min(-1.5, -1.2) = -1.5 -> 1.5.
    ratio 0.5, A = +1: min(0.5, 0.8) = 0.5 -> -0.5;                  A = -1: min(-0.5, -0.8) = -0.8 -> 0.8 (clipped).
    ratio 1.1 (inside), A = 2: -2.2."""
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0], dtype=torch.float64)
    loss = clipped_ratio_objective(torch.log(ratio), adv, 0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, 1.5, -0.5, 0.8, -2.2], dtype=torch.float64))
    # Active clips remove a gradient (1.5 with A > 0, 0.5 with A < 0); every ratio outside [0.8, 1.2] counts in
    # the official both-sides clip fraction.
    assert clip_fraction_active(torch.log(ratio), adv, 0.2).item() == pytest.approx(2 / 5)
    assert clip_fraction(torch.log(ratio), 0.2).item() == pytest.approx(4 / 5)


def test_clipped_objective_asymmetric_and_gradient_zero_where_clipped():
    """clip_range = (0.1, 0.3): ratio 1.25 with A > 0 is inside (gradient A * ratio), 1.35 is clipped
    (gradient 0); ratio 0.85 with A < 0 is clipped (below 0.9), 0.95 is inside."""
    ratio = torch.tensor([1.25, 1.35, 0.85, 0.95], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    log_ratio = torch.log(ratio).requires_grad_(True)
    loss = clipped_ratio_objective(log_ratio, adv, (0.1, 0.3))
    torch.testing.assert_close(loss.detach(), torch.tensor([-1.25, -1.3, 0.9, 0.95], dtype=torch.float64))
    (grad,) = torch.autograd.grad(loss.sum(), log_ratio)
    # d/dlogr (-rho A) = -rho A where unclipped, 0 where clipped
    torch.testing.assert_close(grad, torch.tensor([-1.25, 0.0, 0.0, 0.95], dtype=torch.float64))
    assert clip_fraction_active(log_ratio, adv, (0.1, 0.3)).item() == 0.5
    assert clip_fraction(log_ratio, (0.1, 0.3)).item() == 0.5
    # The same pair as a tensor [2] (a loss module's buffer) gives the same values.
    pair = torch.tensor([0.1, 0.3], dtype=torch.float64)
    torch.testing.assert_close(clipped_ratio_objective(log_ratio, adv, pair), loss)
    assert clip_fraction_active(log_ratio, adv, pair).item() == 0.5 and clip_fraction(log_ratio, pair).item() == 0.5


# Every device this machine has: the CPU here and in CI; CUDA too on a GPU machine (benchmarks/gpu_run.sh's device
# command runs this file there), where a CPU clip-range buffer beside CUDA ratios once failed inside torch.clamp.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_a_clip_range_buffer_on_the_cpu_clips_ratios_on_any_device(device):
    """A loss module built around a model already on a GPU keeps its clip-range buffer on the CPU; the objective
    still clips on the ratios' device, with the same values as the float range."""
    log_ratio = torch.log(torch.tensor([1.25, 1.35, 0.85, 0.95], device=device))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], device=device)
    loss = clipped_ratio_objective(log_ratio, adv, torch.tensor([0.1, 0.3]))
    assert loss.device == log_ratio.device
    torch.testing.assert_close(loss.cpu(), torch.tensor([-1.25, -1.3, 0.9, 0.95]))
    torch.testing.assert_close(loss, clipped_ratio_objective(log_ratio, adv, (0.1, 0.3)))


@FAST
@given(adv=st.lists(st.floats(-5, 5), min_size=1, max_size=8), eps=st.floats(1e-4, 0.3))
def test_on_policy_value_and_reinforce_gradient(adv, eps):
    """log_ratio == 0: value -A, gradient -A (REINFORCE), nothing clipped."""
    a = torch.tensor(adv, dtype=torch.float64)
    log_ratio = torch.zeros_like(a, requires_grad=True)
    loss = clipped_ratio_objective(log_ratio, a, eps)
    torch.testing.assert_close(loss.detach(), -a)
    (grad,) = torch.autograd.grad(loss.sum(), log_ratio)
    torch.testing.assert_close(grad, -a)
    assert clip_fraction_active(log_ratio, a, eps).item() == 0.0
    assert clip_fraction(log_ratio, eps).item() == 0.0


@FAST
@given(adv=st.lists(st.floats(-50, 50), min_size=1, max_size=8), eta=st.floats(0.1, 10))
def test_soft_clip(adv, eta):
    a = torch.tensor(adv, dtype=torch.float64)
    out = soft_clip(a, eta)
    torch.testing.assert_close(out, eta * torch.tanh(a / eta))
    assert bool((out.abs() <= eta).all())
    assert bool((out.abs() <= a.abs() + 1e-12).all())  # shrinks, never amplifies
    assert bool((out * a >= 0).all())  # same sign (a subnormal A may underflow to 0)


def test_soft_clip_identity_near_zero():
    a = torch.tensor([1e-4, -2e-4])
    torch.testing.assert_close(soft_clip(a, 3.0), a, rtol=1e-6, atol=0)


def test_kl_estimators_hand_computed():
    """log r = log(pi_ref / pi) = (-1, 0, 0.5): k1 = -log r = (1, 0, -0.5); k2 = (log r)^2 / 2 = (0.5, 0, 0.125);
    k3 = r - 1 - log r = (e^-1, 0, e^0.5 - 1.5)."""
    log_r = torch.tensor([-1.0, 0.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(kl_estimate(log_r, "k1"), torch.tensor([1.0, 0.0, -0.5], dtype=torch.float64))
    torch.testing.assert_close(kl_estimate(log_r, "k2"), torch.tensor([0.5, 0.0, 0.125], dtype=torch.float64))
    torch.testing.assert_close(
        kl_estimate(log_r, "k3"), torch.tensor([math.exp(-1), 0.0, math.exp(0.5) - 1.5], dtype=torch.float64)
    )


@FAST
@given(log_r=st.lists(st.floats(-20, 20), min_size=1, max_size=10))
def test_k3_non_negative(log_r):
    assert bool((kl_estimate(torch.tensor(log_r, dtype=torch.float64), "k3") >= 0).all())


def test_kl_estimators_unbiased_against_gaussian_kl():
    """pi = N(0, 1), pi_ref = N(0.5, 1.2^2): KL(pi || pi_ref) = log(1.2) + (1 + 0.25)/(2 * 1.44) - 1/2 = 0.1163.
    k1 and k3 averaged over 200k samples of pi (fixed seed) are within 0.01 of it (their SEs are about 0.001);
    k2 is biased (about 0.0905 here) but close for small KL (within 0.03)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g, dtype=torch.float64)
    p = torch.distributions.Normal(0.0, 1.0)
    q = torch.distributions.Normal(0.5, 1.2)
    log_r = q.log_prob(x) - p.log_prob(x)
    exact = math.log(1.2) + 1.25 / (2 * 1.44) - 0.5
    assert abs(kl_estimate(log_r, "k1").mean().item() - exact) < 0.01
    assert abs(kl_estimate(log_r, "k3").mean().item() - exact) < 0.01
    assert abs(kl_estimate(log_r, "k2").mean().item() - exact) < 0.03


def test_x_space_kl_hand_computed_and_gradient():
    """B = 1, K = 2, D = 2: differences (1, 1) and (2, 0) -> per-pair mean squares 1 and 2 -> D = 1.5.
    Gradient w.r.t. x_pred: 2 diff / (D * K) = diff / 2; non-zero whenever the policies differ."""
    old = torch.zeros(1, 2, 2, dtype=torch.float64)
    new = torch.tensor([[[1.0, 1.0], [2.0, 0.0]]], dtype=torch.float64, requires_grad=True)
    kl = x_space_kl(new, old)
    assert kl.tolist() == [1.5]
    (grad,) = torch.autograd.grad(kl.sum(), new)
    torch.testing.assert_close(grad, new.detach() / 2)
    assert x_space_kl(old, old).tolist() == [0.0]


def test_gaussian_kl_closed_form_equals_monte_carlo():
    """KL(N(m1, s^2 I) || N(m2, s^2 I)) in closed form ("sum" reduction) against a Monte-Carlo estimate
    E_{x ~ N(m1, s^2)}[log p(x) - log q(x)] with torch.distributions (100k samples, fixed seed): within 3% relative.
    The log-ratio is Gaussian with variance 2 KL, so the relative SE is sqrt(2 / (KL N)): about 0.25% and 0.7%
    for these two rows. The "mean" reduction is the sum divided by D."""
    g = torch.Generator().manual_seed(0)
    m1 = torch.randn(2, 3, generator=g, dtype=torch.float64)
    m2 = m1 + 1.5 * torch.randn(2, 3, generator=g, dtype=torch.float64)
    std = torch.tensor([[0.7], [1.3]], dtype=torch.float64)  # per-row std, broadcast like the SDE's
    closed = gaussian_kl_same_std(m1, m2, std, reduction="sum")
    p = torch.distributions.Normal(m1, std.expand_as(m1))
    q = torch.distributions.Normal(m2, std.expand_as(m2))
    x = m1 + std * torch.randn(100_000, 2, 3, generator=g, dtype=torch.float64)
    mc = (p.log_prob(x) - q.log_prob(x)).sum(-1).mean(0)
    torch.testing.assert_close(closed, mc, rtol=0.03, atol=0)
    torch.testing.assert_close(torch.distributions.kl_divergence(p, q).sum(-1), closed)
    torch.testing.assert_close(gaussian_kl_same_std(m1, m2, std, reduction="mean"), closed / 3)


def test_gaussian_kl_gradient_non_zero():
    mean = torch.tensor([[0.0, 1.0]], requires_grad=True)
    kl = gaussian_kl_same_std(mean, torch.tensor([[0.5, 1.0]]), 0.5)
    (grad,) = torch.autograd.grad(kl.sum(), mean)
    # d/dm (m - m')^2 / (2 s^2) / D = (m - m') / (s^2 D) = (-0.5 / 0.25 / 2, 0)
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0]]))


def test_ratio_diagnostics():
    on = ratio_diagnostics(torch.zeros(5))
    assert on["ratio_mean"].item() == 1.0 and on["ratio_min"].item() == 1.0 and on["ratio_max"].item() == 1.0
    assert on["approx_kl_k3"].item() == 0.0 and on["approx_kl_sq"].item() == 0.0 and on["ess"].item() == 1.0
    # ratios (1, 3): mean 2, ESS = 16 / (2 * 10) = 0.8, k3 = mean(r - 1 - log r) = (2 - log 3)/2,
    # sq = 0.5 mean(log r^2) = log(3)^2 / 4
    log_ratio = torch.log(torch.tensor([1.0, 3.0], dtype=torch.float64, requires_grad=True))
    d = ratio_diagnostics(log_ratio)
    assert d["ratio_mean"].item() == pytest.approx(2.0)
    assert d["ess"].item() == pytest.approx(0.8)
    assert d["approx_kl_k3"].item() == pytest.approx((2 - math.log(3)) / 2)
    assert d["approx_kl_sq"].item() == pytest.approx(math.log(3) ** 2 / 4)
    assert not any(v.requires_grad for v in d.values())


def test_nft_optimality():
    """r = clip(clip(A, -5, 5) / 10 + 1/2, 0, 1): A = 0 -> 1/2; 5 -> 1; -5 -> 0; 2.5 -> 0.75; 100 -> 1."""
    adv = torch.tensor([0.0, 5.0, -5.0, 2.5, 100.0, -100.0])
    assert nft_optimality(adv, 5.0).tolist() == [0.5, 1.0, 0.0, 0.75, 1.0, 0.0]


@FAST
@given(adv=st.lists(st.floats(-50, 50), min_size=1, max_size=16), amax=st.floats(0.1, 10.0))
def test_advantage_clip_before_the_loss_changes_nothing(adv, amax):
    """advantage.clip is applied by GroupAdvantage before the losses see the advantages. DiffusionNFT's optimality
    clamps to the same Amax first: clamping twice is clamping once, so its results stay bit for bit."""
    a = torch.tensor(adv, dtype=torch.float64)
    assert torch.equal(nft_optimality(a.clamp(-amax, amax), amax), nft_optimality(a, amax))


@FAST
@given(seed=st.integers(0, 2**31 - 1), b=st.floats(0.01, 2.0))
def test_nft_branches_equal_old_when_theta_equals_old(seed, b):
    """v_theta == v_old: v+ = (1 - b) v + b v = v, v- = (1 + b) v - b v = v (to rounding)."""
    v = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    positive, negative = nft_implicit_velocities(v.clone(), v, b)
    torch.testing.assert_close(positive, v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(negative, v, rtol=1e-12, atol=1e-12)


def test_nft_implicit_velocities_gradients():
    """d v+/d v_theta = b, d v-/d v_theta = -b; v_old gets no gradient (treated as a constant)."""
    v_theta = torch.randn(2, 3, requires_grad=True)
    v_old = torch.randn(2, 3, requires_grad=True)
    positive, negative = nft_implicit_velocities(v_theta, v_old, 0.3)
    (g_pos,) = torch.autograd.grad(positive.sum(), v_theta, retain_graph=True)
    (g_neg,) = torch.autograd.grad(negative.sum(), v_theta)
    torch.testing.assert_close(g_pos, torch.full((2, 3), 0.3))
    torch.testing.assert_close(g_neg, torch.full((2, 3), -0.3))
    assert positive.grad_fn is not None
    assert torch.autograd.grad((positive + negative).sum(), v_old, allow_unused=True)[0] is None
