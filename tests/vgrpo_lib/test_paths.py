"""Forward paths and prediction conversions (vgrpo_lib.paths)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.paths import CosineVP, Path, RectifiedFlow, make_path

PATHS = [RectifiedFlow(), CosineVP()]
FAST = settings(max_examples=25, deadline=None)


def _tensors(seed: int, batch: int, dim: int, t_low: float = 0.02, t_high: float = 0.98):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    eps = torch.randn(batch, dim, generator=g, dtype=torch.float64)
    t = t_low + (t_high - t_low) * torch.rand(batch, generator=g, dtype=torch.float64)
    return x, eps, t


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@FAST
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 5), dim=st.integers(1, 6))
def test_conversions_round_trip(path, seed, batch, dim):
    """x/eps -> (z, v) -> x_hat / eps_hat recovers x and eps; v_from_x(z, x) recovers v (float64, 1e-9)."""
    x, eps, t = _tensors(seed, batch, dim)
    z = path.add_noise(x, eps, t)
    v = path.velocity(x, eps, t)
    torch.testing.assert_close(path.x_from_v(z, v, t), x, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(path.eps_from_v(z, v, t), eps, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(path.v_from_x(z, x, t), v, atol=1e-9, rtol=1e-9)
    # And the other direction: an arbitrary x prediction at an arbitrary z survives x -> v -> x.
    x_guess = x.flip(0) + 0.3
    torch.testing.assert_close(path.x_from_v(z, path.v_from_x(z, x_guess, t), t), x_guess, atol=1e-9, rtol=1e-9)


@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_rectified_flow_closed_forms(seed):
    """RF: z = (1-t) x + t eps, v* = eps - x, x_hat = z - t v, eps_hat = z + (1-t) v; the specialised
    overrides agree with the generic 2x2-solve of the base class."""
    x, eps, t = _tensors(seed, 3, 4)
    rf = RectifiedFlow()
    tc = t[:, None]
    torch.testing.assert_close(rf.add_noise(x, eps, t), (1 - tc) * x + tc * eps)
    torch.testing.assert_close(rf.velocity(x, eps, t), eps - x)
    z, v = torch.randn_like(x), torch.randn_like(x)  # arbitrary state and prediction
    torch.testing.assert_close(rf.x_from_v(z, v, t), z - tc * v)
    torch.testing.assert_close(rf.eps_from_v(z, v, t), z + (1 - tc) * v)
    torch.testing.assert_close(Path.x_from_v(rf, z, v, t), rf.x_from_v(z, v, t))
    torch.testing.assert_close(Path.eps_from_v(rf, z, v, t), rf.eps_from_v(z, v, t))
    torch.testing.assert_close(Path.velocity(rf, x, eps, t), rf.velocity(x, eps, t))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_derivatives_match_autograd(path):
    t = torch.linspace(0.05, 0.95, 19, dtype=torch.float64, requires_grad=True)
    (da,) = torch.autograd.grad(path.a(t).sum(), t)
    (db,) = torch.autograd.grad(path.b(t).sum(), t)
    torch.testing.assert_close(path.da(t.detach()), da)
    torch.testing.assert_close(path.db(t.detach()), db)


def test_cosine_vp_is_variance_preserving():
    t = torch.linspace(0, 1, 11, dtype=torch.float64)
    vp = CosineVP()
    torch.testing.assert_close(vp.a(t) ** 2 + vp.b(t) ** 2, torch.ones_like(t))
    # abar_t = cos^2(pi t / 2): endpoints are data and pure noise.
    torch.testing.assert_close(vp.a(t[[0, -1]]), torch.tensor([1.0, 0.0], dtype=torch.float64), atol=1e-15, rtol=0)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@FAST
@given(t_value=st.floats(0.02, 0.98))
def test_elbo_x_weight_is_minus_half_dlambda_dt_exp_lambda(path, t_value):
    """w(t) = -1/2 dlambda/dt * exp(lambda), with lambda = log SNR differentiated by autograd."""
    t = torch.tensor([t_value], dtype=torch.float64, requires_grad=True)
    lam = path.log_snr(t)
    (dlam,) = torch.autograd.grad(lam.sum(), t)
    expected = -0.5 * dlam * torch.exp(lam.detach())
    torch.testing.assert_close(path.elbo_x_weight(t.detach()), expected, rtol=1e-10, atol=0)


def test_rectified_flow_elbo_weight_and_log_snr_closed_form():
    t = torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)
    rf = RectifiedFlow()
    torch.testing.assert_close(rf.elbo_x_weight(t), (1 - t) / t**3)
    torch.testing.assert_close(rf.log_snr(t), 2 * torch.log((1 - t) / t))
    # lambda(0.5) = 0: equal signal and noise.
    assert rf.log_snr(torch.tensor(0.5)).item() == 0.0


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_time_broadcasts_over_leading_pair_dims(path):
    """t of shape (B, K) broadcasts over (B, K, *D) data, pair by pair."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, generator=g)
    eps = torch.randn(2, 3, 4, 5, generator=g)
    t = torch.rand(2, 3, generator=g)
    z = path.add_noise(x, eps, t)
    assert z.shape == x.shape
    for b in range(2):
        for k in range(3):
            tk = t[b, k]
            torch.testing.assert_close(z[b, k], path.a(tk) * x[b, k] + path.b(tk) * eps[b, k])


def test_make_path():
    assert isinstance(make_path("rectified_flow"), RectifiedFlow)
    assert isinstance(make_path("cosine_vp"), CosineVP)
    vp = CosineVP()
    assert make_path(vp) is vp
    assert math.isclose(CosineVP().b(torch.tensor(1.0)).item(), 1.0)
