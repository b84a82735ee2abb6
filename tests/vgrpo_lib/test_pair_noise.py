"""The single-draw noise measurement (diagnostics.pair_noise) and the K it chooses (control.PairCountController):
closed forms on synthetic terms, agreement with the repeated-draw measurement on a real estimator, invariances."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from vgrpo_lib import ELBOSurrogate
from vgrpo_lib.control import PairCountController
from vgrpo_lib.diagnostics import mc_noise_share, pair_noise


def synthetic(groups: int, members: int, k: int, signal_std: float, noise_std: float, seed: int = 0):
    """Per-pair terms ``mu_i + c_gk + eps_ik``: a signal per sample, a term shared by the group at each pair (what
    group sharing cancels) and independent noise. The noise variance of a sample's deviation from its group's mean
    surrogate is exactly ``noise_std^2 / k`` in the measured normalisation; the signal's, ``signal_std^2``."""
    g = torch.Generator().manual_seed(seed)
    group = torch.arange(groups).repeat_interleave(members)
    mu = signal_std * torch.randn(groups * members, 1, generator=g, dtype=torch.float64)
    shared = 5.0 * torch.randn(groups, k, generator=g, dtype=torch.float64)[group]
    eps = noise_std * torch.randn(groups * members, k, generator=g, dtype=torch.float64)
    return mu + shared + eps, group


def test_the_noise_and_the_signal_match_their_closed_forms():
    """2000 groups of 4 at K = 8, signal variance 0.25 and noise variance 1/8 = 0.125 (share 1/3): the estimates are
    unbiased, so over 8000 samples each lies within 5% of the truth (their standard errors are about 1.5%)."""
    per_pair, group = synthetic(2000, 4, 8, signal_std=0.5, noise_std=1.0)
    measured = pair_noise(per_pair, group)
    assert measured["noise_variance"] == pytest.approx(1.0 / 8, rel=0.05)
    assert measured["signal_variance"] == pytest.approx(0.25, rel=0.05)
    assert measured["noise_share"] == pytest.approx(0.125 / 0.375, rel=0.05)


def test_pure_noise_measures_a_share_near_one_and_no_noise_a_share_of_zero():
    per_pair, group = synthetic(2000, 4, 8, signal_std=0.0, noise_std=1.0)
    measured = pair_noise(per_pair, group)
    assert measured["noise_share"] > 0.95 and abs(measured["signal_variance"]) < 0.05 * measured["noise_variance"]
    still, group = synthetic(50, 4, 8, signal_std=1.0, noise_std=0.0)
    assert pair_noise(still, group)["noise_share"] == pytest.approx(0.0, abs=1e-12)
    flat = torch.zeros(8, 4)
    assert pair_noise(flat, torch.arange(4).repeat_interleave(2))["noise_share"] == 0.0
    only_noise = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])  # each sample's mean equals its group's: no signal at all
    assert pair_noise(only_noise, torch.zeros(2, dtype=torch.long))["noise_share"] == 1.0


class TinyVelocity(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(9, 32), nn.Tanh(), nn.Linear(32, 8))

    def forward(self, z, t, cond):
        return self.net(torch.cat([z, t[:, None]], 1))


def test_one_draw_agrees_with_repeated_draws_on_a_real_estimator():
    """On an ELBO surrogate of a small network (i.i.d. uniform timesteps, group-shared pairs), the single-draw share,
    averaged over 24 draws, agrees with mc_noise_share over the same 24 draws' surrogates within 0.06 (measured:
    0.258 and 0.251; single draws ranged 0.17-0.35)."""
    torch.manual_seed(0)
    model, sample = TinyVelocity().double(), torch.randn(64, 8, dtype=torch.float64)
    group = torch.arange(16).repeat_interleave(4)
    estimator = ELBOSurrogate(num_pairs=8, timesteps="uniform", sharing="group")
    generator = torch.Generator().manual_seed(1)
    shares, draws = [], []
    with torch.no_grad():
        for _ in range(24):
            per_pair = estimator.per_pair(model, sample, None, estimator.sample_pairs(sample, group, generator))
            shares.append(pair_noise(per_pair, group)["noise_share"])
            draws.append(per_pair.mean(1))
    repeated = mc_noise_share(torch.stack(draws), group)
    assert 0.1 < repeated < 0.9  # a case with both noise and signal
    assert sum(shares) / len(shares) == pytest.approx(repeated, abs=0.06)


def test_antithetic_couples_count_once():
    per_pair, group = synthetic(20, 4, 8, signal_std=0.5, noise_std=1.0)
    means = per_pair.unflatten(1, (4, 2)).mean(2)
    assert pair_noise(per_pair, group, couples=True) == pair_noise(means, group)


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(0.1, 10.0), seed=st.integers(0, 10_000), members=st.integers(2, 6), k=st.integers(2, 8))
def test_the_share_ignores_scale_order_and_terms_common_to_a_group(scale, seed, members, k):
    per_pair, group = synthetic(6, members, k, signal_std=0.7, noise_std=1.0, seed=seed)
    measured = pair_noise(per_pair, group)
    shift = torch.randn(6, k, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)[group]
    moved = pair_noise(scale * per_pair + shift, group)
    assert moved["noise_share"] == pytest.approx(measured["noise_share"], rel=1e-9, abs=1e-12)
    assert moved["noise_variance"] == pytest.approx(scale**2 * measured["noise_variance"], rel=1e-9)
    order = torch.randperm(per_pair.shape[0], generator=torch.Generator().manual_seed(seed))
    shuffled = pair_noise(per_pair[order], group[order])
    assert shuffled["noise_variance"] == pytest.approx(measured["noise_variance"], rel=1e-9)
    assert shuffled["signal_variance"] == pytest.approx(measured["signal_variance"], rel=1e-9, abs=1e-12)


def test_singleton_groups_are_left_out_and_bad_shapes_named():
    per_pair, group = synthetic(10, 4, 4, signal_std=0.5, noise_std=1.0)
    with_single = torch.cat([per_pair, torch.randn(1, 4, dtype=torch.float64)])
    assert pair_noise(with_single, torch.cat([group, torch.tensor([99])])) == pair_noise(per_pair, group)
    with pytest.raises(ValueError, match="at least 2 independent pairs"):
        pair_noise(per_pair[:, :1], group)
    with pytest.raises(ValueError, match="every group has one"):
        pair_noise(per_pair, torch.arange(40))
    with pytest.raises(ValueError, match="even number of pairs"):
        pair_noise(per_pair[:, :3], group, couples=True)
    with pytest.raises(ValueError, match=r"group must be \(B,\) = \(40,\)"):
        pair_noise(per_pair, group[:5])


# -- the controller -----------------------------------------------------------------------------------------------

def test_the_controller_takes_the_smallest_k_that_meets_the_share():
    """Noise 0.3 at K = 4, signal 0.1, share 0.5: K' >= 0.3 * 4 * 0.5 / (0.5 * 0.1) = 12."""
    control = PairCountController(start=4, share=0.5, max_pairs=32)
    assert control.observe(0.3, 0.1) == 12
    # at K = 12 the same policy measures a third of the noise: it keeps K
    assert control.observe(0.1, 0.1) == 12
    assert control.observe(0.1, 0.0) == 32 and control.observe(0.0, 0.1) == 2  # no signal: max; no noise: min
    assert PairCountController(4, 0.5, 32, even=True).choose(0.3, 0.13) == 10  # 9.23 -> 10, then even
    assert PairCountController(4, 0.5, 8).choose(1.0, 0.1) == 8  # capped


@settings(max_examples=200, deadline=None)
@given(noise=st.floats(1e-6, 1e3), signal=st.floats(1e-6, 1e3), share=st.floats(0.05, 0.95), start=st.integers(2, 16))
def test_the_chosen_k_meets_the_share_and_one_less_would_not(noise, signal, share, start):
    control = PairCountController(start=start, share=share, max_pairs=64)
    k = control.choose(noise, signal)

    def predicted(pairs: int) -> float:
        scaled = noise * start / pairs
        return scaled / (scaled + signal)

    assert 2 <= k <= 64
    if k < 64:
        assert predicted(k) <= share * (1 + 1e-9)
    if k > 2:
        assert predicted(k - 1) > share * (1 - 1e-9)
    assert PairCountController(start, min(share + 0.04, 0.99), 64).choose(noise, signal) <= k  # laxer: no more pairs


def test_the_controller_measures_every_nth_iteration_and_resumes():
    control = PairCountController(start=4, share=0.5, max_pairs=16, every=3)
    assert [control.due() for _ in range(7)] == [True, False, False, True, False, False, True]
    control.observe(0.3, 0.1)
    copy = PairCountController(start=4, share=0.5, max_pairs=16, every=3)
    copy.load_state_dict(control.state_dict())
    assert (copy.num_pairs, copy.due(), control.due()) == (12, False, False)


def test_smoothing_chooses_from_the_averaged_per_pair_noise():
    """b = 0.5: the first measurement is taken whole (noise 0.3 at K = 4: 1.2 per pair, K = 12); the second, 0.3 at
    K = 12 (3.6 per pair), averages to 2.4 per pair: K >= 2.4 * 0.5 / (0.5 * 0.1) = 24 (alone it would give 36)."""
    control = PairCountController(start=4, share=0.5, max_pairs=64, smoothing=0.5)
    assert control.observe(0.3, 0.1) == 12 and control.averages == pytest.approx((1.2, 0.1))
    assert control.observe(0.3, 0.1) == 24 and control.averages == pytest.approx((2.4, 0.1))
    copy = PairCountController(start=4, share=0.5, max_pairs=64, smoothing=0.5)
    copy.load_state_dict(control.state_dict())
    assert copy.observe(0.1, 0.1) == control.observe(0.1, 0.1)  # a resumed controller averages the same history
    with pytest.raises(ValueError, match="non-finite"):
        control.observe(math.inf, 0.1)
    assert control.averages == copy.averages  # a refused measurement does not enter the average


def test_smoothing_steadies_k_around_the_noise_level():
    """Measurements scattered around a fixed noise level (each a log-normal multiple, sigma 0.7, seed 0): with b = 0.8
    K varies less than half as much as with each measurement alone, and its median stays within 25% of the K the
    true level asks for (noise 0.2 per pair, signal 0.05, share 0.5: K = 4)."""
    generator = torch.Generator().manual_seed(0)
    scatter = torch.exp(0.7 * torch.randn(400, 2, generator=generator, dtype=torch.float64)).tolist()
    chosen = {}
    for smoothing in (0.0, 0.8):
        control = PairCountController(start=4, share=0.5, max_pairs=64, smoothing=smoothing)
        chosen[smoothing] = torch.tensor(
            [float(control.observe(0.2 / control.num_pairs * a, 0.05 * b)) for a, b in scatter], dtype=torch.float64)
    assert chosen[0.8][50:].std() < 0.5 * chosen[0.0][50:].std()
    assert abs(chosen[0.8][50:].median().item() - 4) <= 1


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(share=1.0), "share must be in"), (dict(share=math.nan), "share must be in"),
     (dict(smoothing=1.0), "smoothing must be in"), (dict(smoothing=-0.1), "smoothing must be in"),
     (dict(max_pairs=3), "start <= max_pairs"), (dict(start=1), "2 <= min_pairs"), (dict(every=0), "every"),
     (dict(even=True, max_pairs=15), "must be even")],
)
def test_the_controller_refuses_bad_settings(kwargs, message):
    settings_ = dict(start=4, share=0.5, max_pairs=16) | kwargs
    with pytest.raises(ValueError, match=message):
        PairCountController(**settings_)
    with pytest.raises(ValueError, match="non-finite"):
        PairCountController(4, 0.5, 16).choose(math.nan, 1.0)
