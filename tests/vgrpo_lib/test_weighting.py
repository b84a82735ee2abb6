"""Per-pair weightings of the denoising loss (vgrpo_lib.weighting)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.paths import CosineVP, RectifiedFlow
from vgrpo_lib.weighting import (
    ADAPTIVE_FLOOR,
    WEIGHTINGS,
    adaptive_x_loss,
    elbo_loss,
    eps_loss,
    make_weighting,
    v_loss,
    x_loss,
)

FAST = settings(max_examples=25, deadline=None)


def _case(seed: int, path, batch=3, k=2, data=(2, 3)):
    """A batch of (B, K, *D) pairs with a random velocity prediction v."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, k, *data, generator=g, dtype=torch.float64)
    noise = torch.randn(batch, k, *data, generator=g, dtype=torch.float64)
    t = 0.05 + 0.9 * torch.rand(batch, k, generator=g, dtype=torch.float64)
    z = path.add_noise(x, noise, t)
    v = torch.randn(batch, k, *data, generator=g, dtype=torch.float64)
    return v, x, noise, z, t, path.x_from_v(z, v, t)


@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_rectified_flow_weightings_are_rescaled_v_loss(seed):
    """For RF, x_hat - x = -t (v - v*) and eps_hat - eps = (1 - t)(v - v*), so the x loss is t^2 times the v
    loss, the eps loss (1-t)^2 times it and the ELBO loss (1-t)/t^3 * t^2 = (1-t)/t times it."""
    rf = RectifiedFlow()
    args = _case(seed, rf)
    t = args[4]
    lv = _call(v_loss, args, rf)
    torch.testing.assert_close(_call(x_loss, args, rf), t**2 * lv)
    torch.testing.assert_close(_call(eps_loss, args, rf), (1 - t) ** 2 * lv)
    torch.testing.assert_close(_call(elbo_loss, args, rf), (1 - t) / t * lv)


def _call(fn, args, path):
    v, x, noise, z, t, x_pred = args
    return fn(v, x, noise, z, t, path, x_pred)


def test_hand_computed_rectified_flow_case():
    """One pair, D = 2: x = (1, -1), eps = (0, 2), t = 0.5, v = (1, 1).
    z = 0.5 x + 0.5 eps = (0.5, 0.5); v* = eps - x = (-1, 3); v - v* = (2, -2) -> v loss = (4 + 4)/2 = 4.
    x_hat = z - 0.5 v = (0, 0); x_hat - x = (-1, 1) -> x loss 1; mean|x_hat - x| = 1 -> adaptive 1.
    eps_hat = z + 0.5 v = (1, 1); eps_hat - eps = (1, -1) -> eps loss 1.
    ELBO weight (1 - t)/t^3 = 4 -> elbo loss 4."""
    rf = RectifiedFlow()
    x = torch.tensor([[1.0, -1.0]])
    noise = torch.tensor([[0.0, 2.0]])
    t = torch.tensor([0.5])
    z = rf.add_noise(x, noise, t)
    torch.testing.assert_close(z, torch.tensor([[0.5, 0.5]]))
    v = torch.tensor([[1.0, 1.0]])
    args = (v, x, noise, z, t, rf.x_from_v(z, v, t))
    assert _call(v_loss, args, rf).tolist() == [4.0]
    assert _call(x_loss, args, rf).tolist() == [1.0]
    assert _call(adaptive_x_loss, args, rf).tolist() == [1.0]
    assert _call(eps_loss, args, rf).tolist() == [1.0]
    assert _call(elbo_loss, args, rf).tolist() == [4.0]


def test_adaptive_x_scale_hand_computed():
    """x_hat - x = (3, -1): ||.||^2 mean = 5, mean |.| = 2 -> adaptive loss 2.5."""
    rf = RectifiedFlow()
    x = torch.zeros(1, 2)
    x_pred = torch.tensor([[3.0, -1.0]])
    t = torch.tensor([0.5])
    out = adaptive_x_loss(None, x, None, None, t, rf, x_pred)
    assert out.tolist() == [2.5]


@FAST
@given(seed=st.integers(0, 2**31 - 1))
def test_adaptive_x_denominator_has_no_gradient(seed):
    """d/dx_hat [mean e^2 / sg(mean |e|)] = 2 e / (D * mean|e|): the denominator is a constant. The gradient
    of the same expression WITHOUT the stop-gradient differs (so this test can fail)."""
    rf = RectifiedFlow()
    _, x, noise, z, t, x_pred = _case(seed, rf)
    x_pred = x_pred.clone().requires_grad_(True)
    loss = adaptive_x_loss(None, x, noise, z, t, rf, x_pred)
    (grad,) = torch.autograd.grad(loss.sum(), x_pred)
    error = (x_pred - x).detach()
    d = error[0, 0].numel()
    scale = error.abs().mean(dim=(2, 3), keepdim=True)
    torch.testing.assert_close(grad, 2 * error / (d * scale))
    # Same loss with a live denominator: a different gradient.
    live = (x_pred - x).square().mean(dim=(2, 3)) / (x_pred - x).abs().mean(dim=(2, 3))
    (live_grad,) = torch.autograd.grad(live.sum(), x_pred)
    assert not torch.allclose(live_grad, grad)


def test_adaptive_x_floor_keeps_exact_prediction_finite():
    """A perfect prediction has loss 0 and finite (zero) gradient: the denominator is clamped at ADAPTIVE_FLOOR."""
    rf = RectifiedFlow()
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(0))
    x_pred = x.clone().requires_grad_(True)
    loss = adaptive_x_loss(None, x, None, None, torch.full((2,), 0.5), rf, x_pred)
    loss.sum().backward()
    assert loss.tolist() == [0.0, 0.0]
    assert torch.equal(x_pred.grad, torch.zeros_like(x))
    # Tiny errors are divided by the floor, not by their own tiny magnitude.
    tiny = x + 1e-8
    out = adaptive_x_loss(None, x, None, None, torch.full((2,), 0.5), rf, tiny)
    torch.testing.assert_close(out, (tiny - x).square().mean(1) / ADAPTIVE_FLOOR)


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_losses_are_resolution_independent(name):
    """Squared errors are averaged (not summed) over data dims: repeating every pixel 2x2 leaves the loss equal."""
    vp = CosineVP()
    v, x, noise, z, t, x_pred = _case(0, vp, data=(2, 3))
    up = lambda a: a.repeat_interleave(2, dim=-1).repeat_interleave(2, dim=-2)  # noqa: E731
    fn = make_weighting(name)
    small = fn(v, x, noise, z, t, vp, x_pred)
    big = fn(up(v), up(x), up(noise), up(z), t, vp, up(x_pred))
    assert small.shape == t.shape
    torch.testing.assert_close(big, small)


@pytest.mark.parametrize("name", sorted(WEIGHTINGS))
def test_perfect_prediction_has_zero_loss(name):
    """With v = v* (the true velocity) every weighting gives 0, on both paths."""
    for path in (RectifiedFlow(), CosineVP()):
        _, x, noise, z, t, _ = _case(1, path)
        v = path.velocity(x, noise, t)
        out = make_weighting(name)(v, x, noise, z, t, path, path.x_from_v(z, v, t))
        torch.testing.assert_close(out, torch.zeros_like(t), atol=1e-12, rtol=0)


def test_make_weighting_passes_callables_through():
    fn = lambda *args: None  # noqa: E731
    assert make_weighting(fn) is fn
    assert make_weighting("adaptive_x") is adaptive_x_loss
