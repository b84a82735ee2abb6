"""The functional pieces of the peer methods: the CPS step, GRPO-Guard's normalised log-ratio, AWM's weighting.

Official formulas are transcribed here (never imported) with the repository, file and function they come from.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.objectives import guard_log_ratio
from vgrpo_lib.paths import RectifiedFlow
from vgrpo_lib.samplers import sample_sde, time_grid
from vgrpo_lib.sde import cps_step_mean_std, gaussian_log_prob, sde_step_mean_std
from vgrpo_lib.weighting import make_weighting

FAST = settings(max_examples=30, deadline=None)


def _official_cps_step(model_output, sample, sigma, sigma_prev, noise_level, variance_noise):
    """Transcribed from yifan123/flow_grpo, flow_grpo/diffusers_patch/sd3_sde_with_logprob.py,
    ``sde_step_with_logprob`` (branch ``sde_type == 'cps'``): returns (prev_sample, log_prob, mean, std)."""
    std_dev_t = sigma_prev * math.sin(noise_level * math.pi / 2)
    pred_original_sample = sample - sigma * model_output
    noise_estimate = sample + model_output * (1 - sigma)
    prev_sample_mean = pred_original_sample * (1 - sigma_prev) + noise_estimate * torch.sqrt(sigma_prev**2 - std_dev_t**2)
    prev_sample = prev_sample_mean + std_dev_t * variance_noise
    log_prob = -((prev_sample.detach() - prev_sample_mean) ** 2)  # "remove all constants"
    return prev_sample, log_prob.mean(dim=tuple(range(1, log_prob.ndim))), prev_sample_mean, std_dev_t


@FAST
@given(seed=st.integers(0, 2**31 - 1), t=st.floats(0.05, 1.0), frac=st.floats(0.05, 0.95), eta=st.floats(0.05, 1.0))
def test_cps_step_matches_the_official_step(seed, t, frac, eta):
    """Mean and std equal the official CPS step's; the official "log_prob" drops the Gaussian's 1 / (2 std^2) and
    constants, so its log-ratio is exactly 2 std^2 times ours (mean reduction), the conversion the docs state."""
    g = torch.Generator().manual_seed(seed)
    z, v, v_old, xi = (torch.randn(3, 2, 4, generator=g, dtype=torch.float64) for _ in range(4))
    t_now = torch.full((3,), t, dtype=torch.float64)
    t_next = t_now * frac
    mean, std = cps_step_mean_std(z, v, t_now, t_next, eta)
    sigma, sigma_prev = t_now.view(3, 1, 1), t_next.view(3, 1, 1)
    z_next, official_log_prob, official_mean, official_std = _official_cps_step(v, z, sigma, sigma_prev, eta, xi)
    # atol 1e-9: near eta = 1 the official sqrt(t'^2 - std^2) cancels (error ~ 1e-16 / cos(eta pi / 2)).
    torch.testing.assert_close(mean, official_mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(std.expand_as(mean), official_std.expand_as(mean), rtol=1e-12, atol=1e-12)
    old_mean, _ = cps_step_mean_std(z, v_old, t_now, t_next, eta)
    _, official_old_log_prob, _, _ = _official_cps_step(v_old, z, sigma, sigma_prev, eta, (z_next - old_mean) / official_std)
    ours = gaussian_log_prob(z_next, mean, std) - gaussian_log_prob(z_next, old_mean, std)
    torch.testing.assert_close(official_log_prob - official_old_log_prob, 2 * std.flatten() ** 2 * ours, rtol=1e-9, atol=1e-9)


@FAST
@given(seed=st.integers(0, 2**31 - 1), t=st.floats(0.1, 1.0), frac=st.floats(0.05, 0.95), eta=st.floats(0.05, 1.0))
def test_cps_step_keeps_the_marginal_coefficients_in_closed_form(seed, t, frac, eta):
    """With the exact velocity v = eps - x of z_t = (1 - t) x + t eps, the step's mean is (1 - t') x + t' cos(a) eps
    and its std t' sin(a) (a = eta pi / 2): z' = (1 - t') x + t' (cos(a) eps + sin(a) xi), and cos(a) eps + sin(a) xi
    is standard normal, so z' has the path's coefficients (1 - t', t') at t'."""
    g = torch.Generator().manual_seed(seed)
    x, eps = (torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(2))
    t_now = torch.full((4,), t, dtype=torch.float64)
    t_next = t_now * frac
    z = RectifiedFlow().add_noise(x, eps, t_now)
    mean, std = cps_step_mean_std(z, eps - x, t_now, t_next, eta)
    angle = eta * math.pi / 2
    torch.testing.assert_close(mean, (1 - t_next[:, None]) * x + t_next[:, None] * math.cos(angle) * eps, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(std.flatten(), t_next * math.sin(angle), rtol=1e-12, atol=1e-12)
    # Noise variance of z' given x: (t' cos a)^2 + (t' sin a)^2 = t'^2, the path's b_{t'}^2.
    torch.testing.assert_close((t_next * math.cos(angle)) ** 2 + std.flatten() ** 2, t_next**2, rtol=1e-12, atol=1e-12)


def test_cps_marginal_statistically_and_flow_sde_differs():
    """Monte Carlo (seed 0, 200k draws, tolerance 0.01 ~ 4 standard errors): one CPS step from the exact path state
    at t = 0.8 to t' = 0.4 gives z' - 0.6 x with mean 0 and std 0.4. The Flow-SDE step over the same coarse interval
    does not keep the coefficient (its std differs by more than 0.02): CPS is exact per step, the SDE only as dt -> 0."""
    g = torch.Generator().manual_seed(0)
    n = 200_000
    x = torch.full((n, 1), 1.5, dtype=torch.float64)
    eps, xi = torch.randn(n, 1, generator=g, dtype=torch.float64), torch.randn(n, 1, generator=g, dtype=torch.float64)
    t_now, t_next = torch.full((n,), 0.8, dtype=torch.float64), torch.full((n,), 0.4, dtype=torch.float64)
    z = RectifiedFlow().add_noise(x, eps, t_now)
    mean, std = cps_step_mean_std(z, eps - x, t_now, t_next, 0.7)
    noise = mean + std * xi - 0.6 * x
    assert abs(noise.mean().item()) < 0.01 and abs(noise.std().item() - 0.4) < 0.01
    sde_mean, sde_std = sde_step_mean_std(z, eps - x, t_now, t_next, 0.7)
    assert abs((sde_mean + sde_std * xi - 0.6 * x).std().item() - 0.4) > 0.02


def test_cps_rollout_records_only_noisy_steps_and_refuses_a_noisy_last_step():
    model = lambda z, t, cond: -z  # noqa: E731
    z = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    grid = time_grid(4)
    _, trajectory = sample_sde(model, z, grid, sde_type="cps", noise_level=0.5, generator=torch.Generator().manual_seed(1))
    assert trajectory.batch_size == (3, 3)  # the step to t = 0 is deterministic
    torch.testing.assert_close(trajectory["t_next"][0], torch.tensor(grid[1:4]))
    with pytest.raises(ValueError, match=r"sde_steps must be a non-empty subset of 0\.\.2 \(a cps step to t = 0 has no noise\)"):
        sample_sde(model, z, grid, sde_type="cps", sde_steps=[3])
    with pytest.raises(ValueError, match=r"noise_level must be in \(0, 1\] for sde_type='cps'"):
        sample_sde(model, z, grid, sde_type="cps", noise_level=1.5)
    with pytest.raises(ValueError, match="Unknown sde_type 'ddim'"):
        sample_sde(model, z, grid, sde_type="ddim")


def _official_guard_ratio(log_prob, old_log_prob, std_dev_t, dt, next_latents_mean, old_next_latents_mean):
    """Transcribed from X-GenGroup/Flow-Factory, src/flow_factory/trainers/grpo.py,
    ``GRPOGuardTrainer.optimize`` ("Reweighted ratio")."""
    scale_factor = torch.sqrt(-dt) * std_dev_t
    mse = (next_latents_mean - old_next_latents_mean).flatten(1).pow(2).mean(dim=1)
    return torch.exp((log_prob - old_log_prob) * scale_factor + mse / (2 * scale_factor))


@FAST
@given(seed=st.integers(0, 2**31 - 1), t=st.floats(0.1, 0.95), frac=st.floats(0.1, 0.9))
def test_guard_log_ratio_matches_flow_factory_and_is_the_noise_projection(seed, t, frac):
    g = torch.Generator().manual_seed(seed)
    z, v, v_old, xi = (torch.randn(5, 3, 4, generator=g, dtype=torch.float64) for _ in range(4))
    t_now = torch.full((5,), t, dtype=torch.float64)
    t_next = t_now * frac
    mean, std = sde_step_mean_std(z, v, t_now, t_next, 0.7)
    old_mean, _ = sde_step_mean_std(z, v_old, t_now, t_next, 0.7)
    z_next = old_mean + std * xi
    log_prob, old_log_prob = gaussian_log_prob(z_next, mean, std), gaussian_log_prob(z_next, old_mean, std)
    normalised = guard_log_ratio(log_prob - old_log_prob, mean, old_mean, std)
    # Flow-Factory's std_dev_t is the step's std without sqrt(-dt).
    dt = (t_next - t_now).view(5, 1, 1)
    official = _official_guard_ratio(log_prob, old_log_prob, (std / torch.sqrt(-dt)).flatten(), dt.flatten(), mean, old_mean)
    torch.testing.assert_close(torch.exp(normalised), official, rtol=1e-9, atol=1e-12)
    # Exactly <xi, delta> (mean over data dims), with either reduction.
    torch.testing.assert_close(normalised, (xi * (mean - old_mean)).mean((1, 2)), rtol=1e-9, atol=1e-12)
    summed = gaussian_log_prob(z_next, mean, std, "sum") - gaussian_log_prob(z_next, old_mean, std, "sum")
    torch.testing.assert_close(guard_log_ratio(summed, mean, old_mean, std, "sum"), (xi * (mean - old_mean)).sum((1, 2)), rtol=1e-9, atol=1e-10)


def test_guard_log_ratio_has_zero_mean_and_a_step_independent_scale():
    """Monte Carlo over the rollout noise (seed 0, 100k draws, tolerances ~5 standard errors): for a fixed mean gap
    delta the plain log-ratio has mean -mean(delta^2) / (2 std^2) and std sqrt(mean(delta^2) / D) / std, for
    two steps with very different std; the normalised one has mean 0 and std sqrt(mean(delta^2) / D) at both."""
    g = torch.Generator().manual_seed(0)
    n, d = 100_000, 8
    delta = 0.05 * torch.randn(1, d, generator=g, dtype=torch.float64)
    ms = delta.square().mean().item()
    scale = math.sqrt(ms / d)
    for std_value in (0.02, 0.5):
        std = torch.full((n, 1), std_value, dtype=torch.float64)
        old_mean = torch.zeros(n, d, dtype=torch.float64)
        mean = old_mean + delta
        z_next = old_mean + std * torch.randn(n, d, generator=g, dtype=torch.float64)
        plain = gaussian_log_prob(z_next, mean, std) - gaussian_log_prob(z_next, old_mean, std)
        assert abs(plain.mean().item() + ms / (2 * std_value**2)) < 5 * scale / std_value / math.sqrt(n)
        assert abs(plain.std().item() / (scale / std_value) - 1) < 0.02
        normalised = guard_log_ratio(plain, mean, old_mean, std)
        assert abs(normalised.mean().item()) < 5 * scale / math.sqrt(n)
        assert abs(normalised.std().item() / scale - 1) < 0.02


def test_guard_log_ratio_is_zero_on_policy_with_a_gradient_scaled_by_the_std():
    g = torch.Generator().manual_seed(3)
    z, xi = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    weight = torch.randn(6, 6, generator=g, requires_grad=True)
    t_now, t_next = torch.full((4,), 0.8), torch.full((4,), 0.6)
    mean, std = sde_step_mean_std(z, z @ weight, t_now, t_next, 0.7)
    old_mean = mean.detach()
    z_next = old_mean + std * xi
    plain = gaussian_log_prob(z_next, mean, std) - gaussian_log_prob(z_next, old_mean, std)
    normalised = guard_log_ratio(plain, mean, old_mean, std)
    assert torch.equal(normalised.detach(), torch.zeros(4))
    (grad_plain,) = torch.autograd.grad(plain.sum(), weight, retain_graph=True)
    (grad_norm,) = torch.autograd.grad(normalised.sum(), weight)
    torch.testing.assert_close(grad_norm, std.flatten()[0] * grad_plain)


def _official_awm_log_prob(model_output, random_noise, clean_latents, timestep, ghuber_power=0.25):
    """Transcribed from scxue/advantage_weighted_matching, advantage_weighted_matching/scripts/train_sd3_awm.py,
    ``compute_log_prob_awm`` (``weighting == 'ghuber'``)."""
    log_prob = -(model_output.double() - (random_noise.double() - clean_latents.double())) ** 2
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    eps = torch.tensor(1e-10, dtype=log_prob.dtype)
    return -(torch.pow(-log_prob + 1e-10, ghuber_power) - torch.pow(eps, ghuber_power)) * timestep.view(-1) / ghuber_power


@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_ghuber_weighting_is_minus_the_official_awm_log_prob(seed):
    g = torch.Generator().manual_seed(seed)
    x, eps, v = (torch.randn(5, 2, 3, generator=g, dtype=torch.float64) for _ in range(3))
    t = torch.rand(5, generator=g, dtype=torch.float64)
    path = RectifiedFlow()
    z = path.add_noise(x, eps, t)
    ours = make_weighting("ghuber")(v, x, eps, z, t, path, path.x_from_v(z, v, t))
    torch.testing.assert_close(-ours, _official_awm_log_prob(v, eps, x, t), rtol=1e-10, atol=1e-12)
