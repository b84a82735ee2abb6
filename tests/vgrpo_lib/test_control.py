"""Step control (vgrpo_lib.control): schedules, adaptive KL, old-policy EMA, MixGRPO window."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.control import (
    AdaptiveKLController,
    Constant,
    Cosine,
    Linear,
    OldPolicyDecay,
    Piecewise,
    SDEWindow,
    Warmup,
    ema_update_,
    exceeds_kl,
    set_learning_rate,
)

FAST = settings(max_examples=30, deadline=None)


def test_constant():
    assert Constant(0.3)(0) == 0.3 and Constant(0.3)(10_000) == 0.3


def test_linear_values():
    s = Linear(start=1e-2, end=2e-3, steps=100)
    assert s(0) == pytest.approx(1e-2)
    assert s(50) == pytest.approx(6e-3)
    assert s(25) == pytest.approx(1e-2 - 0.25 * 8e-3)
    assert s(100) == pytest.approx(2e-3)
    assert s(1000) == pytest.approx(2e-3)  # held at the end
    assert s(-5) == pytest.approx(1e-2)  # clamped before the start


def test_cosine_values():
    """start + (end - start)(1 - cos(pi f))/2: f = 0 -> start, 1/2 -> midpoint, 1/4 -> end + (start-end)(1+sqrt(1/2))/2."""
    s = Cosine(start=1.0, end=0.1, steps=200)
    assert s(0) == pytest.approx(1.0)
    assert s(100) == pytest.approx(0.55)
    assert s(50) == pytest.approx(0.1 + 0.9 * (1 + math.sqrt(0.5)) / 2)
    assert s(200) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)


@FAST
@given(steps=st.integers(1, 500), start=st.floats(0, 1), end=st.floats(0, 1))
def test_schedules_monotone_between_endpoints(steps, start, end):
    for schedule in (Linear(start, end, steps), Cosine(start, end, steps)):
        values = [schedule(i) for i in range(0, steps + 2)]
        lo, hi = min(start, end), max(start, end)
        assert all(lo - 1e-12 <= v <= hi + 1e-12 for v in values)
        diffs = [b - a for a, b in zip(values, values[1:])]
        sign = 1 if end >= start else -1
        assert all(sign * d >= -1e-12 for d in diffs)


def test_piecewise_curriculum():
    """Piecewise([150, 350], [0.0, 0.3, 0.1]): 0 before 150, 0.3 from 150 (inclusive), 0.1 from 350."""
    s = Piecewise((150, 350), (0.0, 0.3, 0.1))
    assert [s(0), s(149), s(150), s(349), s(350), s(10_000)] == [0.0, 0.0, 0.3, 0.3, 0.1, 0.1]


def test_warmup():
    """Warmup over 4 steps into a constant 1.0: strictly increasing below the target, never 0 (step 0 is
    already trained), reaching the target at step 4; after warm-up the wrapped schedule's clock starts at 0."""
    w = Warmup(Constant(1.0), steps=4)
    values = [w(i) for i in range(6)]
    assert all(0 < a < b for a, b in zip(values[:4], values[1:5]))
    assert values[4] == 1.0 and values[5] == 1.0
    assert values[:4] == pytest.approx([0.2, 0.4, 0.6, 0.8])  # linear ramp (step + 1) / (steps + 1)
    decay = Warmup(Linear(1.0, 0.0, 10), steps=5)
    assert decay(5) == pytest.approx(1.0) and decay(10) == pytest.approx(0.5) and decay(15) == pytest.approx(0.0)


def test_set_learning_rate():
    params = [torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": params}, {"params": [torch.nn.Parameter(torch.zeros(1))]}], lr=1.0)
    set_learning_rate(opt, Linear(1e-3, 0.0, 10)(5))
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(5e-4)] * 2


def test_adaptive_kl_controller_direction_and_rate():
    """KL above target raises the coefficient, below lowers it; the proportional error is clipped to +-0.2:
    coef * (1 + 0.2 * n / horizon) for a huge KL."""
    up = AdaptiveKLController(0.1, target=0.01, horizon=100)
    assert up.update(0.05) > 0.1
    down = AdaptiveKLController(0.1, target=0.01, horizon=100)
    assert down.update(0.001) < 0.1
    same = AdaptiveKLController(0.1, target=0.01, horizon=100)
    assert same.update(0.01) == pytest.approx(0.1)
    clipped = AdaptiveKLController(0.1, target=0.01, horizon=100)
    assert clipped.update(100.0, num_steps=10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    # proportional in the unclipped region: KL = 1.1 target -> error 0.1
    prop = AdaptiveKLController(1.0, target=0.01, horizon=10)
    assert prop.update(0.011, num_steps=2) == pytest.approx(1.0 + 0.1 * 2 / 10)
    state = prop.state_dict()
    fresh = AdaptiveKLController(5.0, target=0.01)
    fresh.load_state_dict(state)
    assert fresh.value == prop.value


def test_adaptive_kl_converges_toward_target_kl():
    """A toy policy whose KL is proportional to 1 / coef: repeated updates drive the KL to the target (within 5%)."""
    ctl = AdaptiveKLController(0.01, target=0.02, horizon=20)
    for _ in range(2000):
        ctl.update(0.002 / ctl.value)
    assert 0.002 / ctl.value == pytest.approx(0.02, rel=0.05)


def test_exceeds_kl():
    assert exceeds_kl(0.2, 0.1) and not exceeds_kl(0.05, 0.1) and not exceeds_kl(100.0, None)


def test_old_policy_decay():
    d = OldPolicyDecay()  # min(0.001 step, 0.5)
    assert [d(0), d(100), d(499), d(500), d(10_000)] == pytest.approx([0.0, 0.1, 0.499, 0.5, 0.5])
    assert OldPolicyDecay(rate=0.01, max_decay=0.9)(50) == pytest.approx(0.5)


def test_ema_update_decay_zero_copies_and_one_keeps():
    g = torch.Generator().manual_seed(0)
    target = [torch.randn(3, 2, generator=g), torch.randn(4, generator=g)]
    source = [torch.randn(3, 2, generator=g), torch.randn(4, generator=g)]
    kept = [t.clone() for t in target]
    ema_update_(target, source, decay=1.0)
    assert all(torch.equal(a, b) for a, b in zip(target, kept))
    ema_update_(target, source, decay=0.0)
    assert all(torch.equal(a, b) for a, b in zip(target, source))


def test_ema_update_intermediate_and_on_modules():
    """decay 0.25: 0.25 * old + 0.75 * new; works in place on module parameters (no autograd error)."""
    target = torch.nn.Linear(2, 2)
    source = torch.nn.Linear(2, 2)
    before = [p.detach().clone() for p in target.parameters()]
    ema_update_(target.parameters(), source.parameters(), decay=0.25)
    for p, old, new in zip(target.parameters(), before, source.parameters()):
        torch.testing.assert_close(p.detach(), 0.25 * old + 0.75 * new.detach())
    assert all(p.requires_grad for p in target.parameters())


def test_sde_window_positions():
    """10 steps, window 4, shift every 25 iterations by 1: start = (it // 25) % 7, wrapping after 6."""
    w = SDEWindow(num_steps=10, size=4, shift_interval=25)
    assert list(w(0)) == [0, 1, 2, 3]
    assert list(w(24)) == [0, 1, 2, 3]
    assert list(w(25)) == [1, 2, 3, 4]
    assert list(w(150)) == [6, 7, 8, 9]
    assert list(w(175)) == [0, 1, 2, 3]  # wrapped
    assert list(SDEWindow(10, 4, shift_interval=1, stride=3)(2)) == [6, 7, 8, 9]
    full = SDEWindow(num_steps=10, size=10)
    assert all(list(full(i)) == list(range(10)) for i in (0, 100, 10_000))


@FAST
@given(num_steps=st.integers(1, 30), size=st.integers(1, 30), iteration=st.integers(0, 10_000), stride=st.integers(1, 4))
def test_sde_window_always_inside_grid(num_steps, size, iteration, stride):
    if size > num_steps:
        size = num_steps
    steps = list(SDEWindow(num_steps, size, shift_interval=7, stride=stride)(iteration))
    assert len(steps) == size
    assert steps == list(range(steps[0], steps[0] + size))
    assert 0 <= steps[0] and steps[-1] < num_steps
