"""Rollout samplers (vgrpo_lib.samplers): grids, ODE solver convergence orders, the recording SDE sampler."""

from __future__ import annotations

import pytest
import torch

from vgrpo_lib.control import SDEWindow
from vgrpo_lib.samplers import (
    ClassifierFreeGuidance,
    classifier_free_guidance,
    nfe_per_sample,
    sample_dpmpp_2m,
    sample_euler,
    sample_heun,
    sample_ode,
    sample_sde,
    time_grid,
)
from vgrpo_lib.sde import gaussian_log_prob, sde_step_mean_std

MU = torch.tensor([0.7, -1.0, 2.0], dtype=torch.float64)
S = torch.tensor([0.5, 1.5, 0.2], dtype=torch.float64)


def gaussian_velocity(z, t, cond=None):
    """Exact rectified-flow velocity of data x ~ N(MU, S^2): linear in z."""
    t = t[:, None]
    return -MU + (t - (1 - t) * S**2) / ((1 - t) ** 2 * S**2 + t**2) * (z - (1 - t) * MU)


def exact_flow(z, t_from: float, t_to: float):
    """The ODE's flow map for that field: z_t = (1 - t) MU + sigma_t eps, sigma_t = sqrt((1-t)^2 S^2 + t^2)."""
    sigma = lambda t: torch.sqrt(torch.tensor((1 - t) ** 2, dtype=torch.float64) * S**2 + t**2)  # noqa: E731
    return (1 - t_to) * MU + sigma(t_to) * (z - (1 - t_from) * MU) / sigma(t_from)


@pytest.fixture(scope="module")
def convergence_setup():
    z = torch.randn(64, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    reference = sample_euler(gaussian_velocity, z, time_grid(20_000, t_max=0.98, t_min=0.02))
    return z, reference


def test_time_grid():
    grid = time_grid(4)
    assert grid == [1.0, 0.75, 0.5, 0.25, 0.0]
    shifted = time_grid(2, shift=3.0)
    assert shifted == pytest.approx([1.0, 0.75, 0.0])  # 3 * 0.5 / (1 + 2 * 0.5) = 0.75
    inner = time_grid(10, t_max=0.98, t_min=0.02)
    assert len(inner) == 11 and inner[0] == pytest.approx(0.98) and inner[-1] == pytest.approx(0.02)
    assert all(b < a for a, b in zip(inner, inner[1:]))


def test_fine_euler_reference_matches_closed_form(convergence_setup):
    """The 20000-step Euler reference is within 1e-3 of the exact flow (its own error is O(1/20000))."""
    z, reference = convergence_setup
    assert (reference - exact_flow(z, 0.98, 0.02)).abs().max().item() < 1e-3


def _errors(solver, z, reference, steps):
    return [(solver(gaussian_velocity, z, time_grid(n, t_max=0.98, t_min=0.02)) - reference).abs().max().item() for n in steps]


def test_dpmpp_2m_converges_with_second_order(convergence_setup):
    """Error against the fine Euler solution as n doubles (n = 20, 40, 80, 160), linear field, float64:
    Euler's error ratio is about 2 (first order: asserted within [1.8, 2.2]); DPM-Solver++(2M)'s is about 4
    (second order: asserted >= 3.3), and DPM-Solver++ is more accurate than Euler at every n."""
    z, reference = convergence_setup
    steps = [20, 40, 80, 160]
    euler = _errors(sample_euler, z, reference, steps)
    dpm = _errors(sample_dpmpp_2m, z, reference, steps)
    euler_ratios = [a / b for a, b in zip(euler, euler[1:])]
    dpm_ratios = [a / b for a, b in zip(dpm, dpm[1:])]
    assert all(1.8 < r < 2.2 for r in euler_ratios), euler_ratios
    assert all(r >= 3.3 for r in dpm_ratios), dpm_ratios
    assert all(d < e for d, e in zip(dpm, euler))


def test_heun_converges_with_second_order(convergence_setup):
    """Heun against the exact flow map (the fine Euler reference's own 3e-4 error would mask Heun's error at
    large n): ratios >= 3.3 for n = 10, 20, 40, 80."""
    z, _ = convergence_setup
    exact = exact_flow(z, 0.98, 0.02)
    heun = _errors(sample_heun, z, exact, [10, 20, 40, 80])
    ratios = [a / b for a, b in zip(heun, heun[1:])]
    assert all(r >= 3.3 for r in ratios), ratios


def test_dpmpp_2m_full_grid_to_zero_is_finite_and_accurate():
    """From pure noise at t = 1 to t = 0 (the first and last steps are first order: infinite log-SNR): 40 steps
    land within 0.02 of the exact endpoint (Euler with 40 steps is much further off)."""
    z = torch.randn(32, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = exact_flow(z, 1.0, 0.0)
    out = sample_dpmpp_2m(gaussian_velocity, z, time_grid(40))
    assert bool(torch.isfinite(out).all())
    dpm_error = (out - exact).abs().max().item()
    euler_error = (sample_euler(gaussian_velocity, z, time_grid(40)) - exact).abs().max().item()
    assert dpm_error < 0.02 and dpm_error < euler_error / 2, (dpm_error, euler_error)


def test_euler_hand_computed_and_constant_field():
    """v = 2 (constant): z(0) = z(1) - 2 exactly for every solver; Euler on v = z over grid (1, 0.5, 0):
    z <- z + (-0.5) z twice -> z / 4."""
    z = torch.tensor([[1.0, -3.0]], dtype=torch.float64)
    const = lambda z, t, c: torch.full_like(z, 2.0)  # noqa: E731
    for solver in (sample_euler, sample_heun, sample_dpmpp_2m):
        torch.testing.assert_close(solver(const, z, time_grid(3)), z - 2.0)
    identity = lambda z, t, c: z  # noqa: E731
    torch.testing.assert_close(sample_euler(identity, z, [1.0, 0.5, 0.0]), z / 4)


def test_sample_ode_dispatch_and_callback():
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grid = time_grid(5, t_max=0.98, t_min=0.02)
    for name, solver in (("euler", sample_euler), ("heun", sample_heun), ("dpmpp_2m", sample_dpmpp_2m)):
        assert torch.equal(sample_ode(gaussian_velocity, z, grid, method=name), solver(gaussian_velocity, z, grid))
    seen = []
    sample_ode(gaussian_velocity, z, grid, method="heun", callback=seen.append)
    assert [info["i"] for info in seen] == list(range(5))
    assert [info["t"] for info in seen] == grid[:-1] and [info["t_next"] for info in seen] == grid[1:]
    assert nfe_per_sample("heun", 10) == 20 and nfe_per_sample("euler", 10) == 10 and nfe_per_sample("dpmpp_2m", 7) == 7


def test_cond_is_passed_to_the_model():
    calls = []

    def model(z, t, cond):
        calls.append(cond)
        assert t.shape == (z.shape[0],) and t.dtype == z.dtype
        return cond * torch.ones_like(z)

    cond = torch.tensor([[1.0], [2.0]])
    out = sample_euler(model, torch.zeros(2, 2), [1.0, 0.0], cond)
    assert all(c is cond for c in calls)
    torch.testing.assert_close(out, torch.tensor([[-1.0, -1.0], [-2.0, -2.0]]))


def test_sde_sampler_trajectory(make_model):
    """Shapes (B, S); consecutive transitions chain; the final sample is the last z_next; the recorded log_prob
    equals gaussian_log_prob of the recorded transition under the step density recomputed from the model."""
    model = make_model(data_shape=(2, 3), dtype=torch.float64)
    z0 = torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grid = time_grid(6)
    with torch.no_grad():
        final, traj = sample_sde(model, z0, grid, noise_level=0.7, generator=torch.Generator().manual_seed(1))
    assert traj.batch_size == (5, 6)
    assert traj["z"].shape == (5, 6, 2, 3) and traj["z_next"].shape == (5, 6, 2, 3)
    assert traj["t"].shape == (5, 6) and traj["log_prob"].shape == (5, 6)
    assert torch.equal(traj["z"][:, 0], z0)
    assert torch.equal(traj["z"][:, 1:], traj["z_next"][:, :-1])
    assert torch.equal(final, traj["z_next"][:, -1])
    torch.testing.assert_close(traj["t"][0], torch.tensor(grid[:-1], dtype=torch.float64))
    torch.testing.assert_close(traj["t_next"][3], torch.tensor(grid[1:], dtype=torch.float64))
    for reduction in ("mean", "sum"):
        with torch.no_grad():
            _, traj = sample_sde(model, z0, grid, generator=torch.Generator().manual_seed(1), log_prob_reduction=reduction)
            flat = traj.reshape(-1)
            mean, std = sde_step_mean_std(flat["z"], model(flat["z"], flat["t"], None), flat["t"], flat["t_next"], 0.7)
            expected = gaussian_log_prob(flat["z_next"], mean, std, reduction)
        torch.testing.assert_close(traj["log_prob"].reshape(-1), expected, rtol=1e-10, atol=1e-10)


def test_sde_sampler_deterministic_under_generator(make_model):
    model = make_model(data_shape=(3,))
    z0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, ta = sample_sde(model, z0, time_grid(4), generator=torch.Generator().manual_seed(5))
        b, tb = sample_sde(model, z0, time_grid(4), generator=torch.Generator().manual_seed(5))
        c, _ = sample_sde(model, z0, time_grid(4), generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and torch.equal(ta["log_prob"], tb["log_prob"])
    assert not torch.equal(a, c)


def test_mixgrpo_window_records_only_window_steps(make_model):
    """With sde_steps from an SDEWindow only those steps are recorded; the steps before the window are Euler
    steps (the first recorded state equals an Euler integration up to the window start)."""
    model = make_model(data_shape=(3,), dtype=torch.float64)
    z0 = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    grid = time_grid(10)
    window = SDEWindow(num_steps=10, size=3, shift_interval=5)(iteration=15)  # start 3 -> steps 3, 4, 5
    assert list(window) == [3, 4, 5]
    with torch.no_grad():
        final, traj = sample_sde(model, z0, grid, sde_steps=window, generator=torch.Generator().manual_seed(1))
        before = sample_euler(model, z0, grid[:4])
        after = sample_euler(model, traj["z_next"][:, -1], grid[6:])
    assert traj.batch_size == (4, 3)
    torch.testing.assert_close(traj["t"][0], torch.tensor([grid[3], grid[4], grid[5]], dtype=torch.float64))
    torch.testing.assert_close(traj["z"][:, 0], before, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, after, rtol=1e-12, atol=1e-12)


def test_classifier_free_guidance():
    def model(z, t, cond):
        return z * cond  # cond: (B, 1)

    null = lambda c: torch.zeros_like(c)  # noqa: E731
    assert classifier_free_guidance(model, null, 1.0) is model
    cfg = classifier_free_guidance(model, null, 4.5)
    assert isinstance(cfg, ClassifierFreeGuidance)
    z, cond = torch.randn(3, 2), torch.tensor([[1.0], [2.0], [3.0]])
    # v_u = 0, v_c = z * cond -> v = 4.5 z cond
    torch.testing.assert_close(cfg(z, torch.ones(3), cond), 4.5 * z * cond)


@pytest.mark.parametrize("shift", [1e-308, 1e308])
def test_time_grid_refuses_a_shift_its_arithmetic_cannot_hold(shift):
    with pytest.raises(ValueError, match=r"^shift must be in \[1e-3, 1e3\]"):
        time_grid(4, shift=shift)
