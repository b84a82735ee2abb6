"""Bad input: every public entry point raises a clear error naming the problem (no silent NaN)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from vgrpo_lib import (
    AWMLoss, DGPOLoss, DiffusionNFTLoss, ELBOSurrogate, FlowGRPOLoss, GroupAdvantage, VGRPOLoss, group_advantage,
    group_statistics,
)
from vgrpo_lib.control import AdaptiveKLController, Linear, Piecewise, SDEWindow, ema_update_
from vgrpo_lib.objectives import gaussian_kl_same_std, kl_estimate, soft_clip, x_space_kl
from vgrpo_lib.paths import make_path
from vgrpo_lib.samplers import sample_dpmpp_2m, sample_euler, sample_heun, sample_ode, sample_sde, time_grid
from vgrpo_lib.sde import gaussian_log_prob
from vgrpo_lib.timesteps import DiscreteGrid, LogitNormal, Shifted, Uniform, make_timestep_sampler
from vgrpo_lib.weighting import make_weighting

FAST = settings(max_examples=25, deadline=None)


# ------------------------------------------------------------------------------------------ rewards


@FAST
@given(
    size=st.integers(2, 12),
    data=st.data(),
    bad=st.sampled_from([float("nan"), float("inf"), -float("inf")]),
)
def test_non_finite_rewards_name_the_indices(size, data, bad):
    positions = sorted(data.draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=size)))
    reward = torch.arange(size, dtype=torch.float32)
    reward[positions] = bad
    group = torch.zeros(size, dtype=torch.long)
    shown = ", ".join(str(p) for p in positions[:8])
    with pytest.raises(ValueError, match=re.escape(f"reward contains NaN or inf at index {shown}")):
        group_advantage(reward, group)
    with pytest.raises(ValueError, match="NaN or inf"):
        GroupAdvantage()(TensorDict({"reward": reward, "group": group}, batch_size=[size]))
    with pytest.raises(ValueError, match=re.escape(f"at index {shown}")):
        group_statistics(reward, group)


def test_non_finite_multi_reward_names_row_and_column():
    reward = torch.tensor([[1.0, 0.0], [2.0, float("nan")]])
    with pytest.raises(ValueError, match=re.escape("at index (1, 1)")):
        group_advantage(reward, torch.tensor([0, 0]))


def test_many_non_finite_rewards_are_summarised():
    reward = torch.full((20,), float("nan"))
    with pytest.raises(ValueError, match="and 12 more"):
        group_advantage(reward, torch.zeros(20, dtype=torch.long))


@FAST
@given(labels=st.lists(st.integers(0, 4), min_size=2, max_size=12))
def test_groups_of_size_one_are_named(labels):
    counts = {label: labels.count(label) for label in labels}
    singles = sorted(label for label, count in counts.items() if count == 1)
    reward = torch.arange(len(labels), dtype=torch.float64)
    group = torch.tensor(labels)
    if singles:
        with pytest.raises(ValueError, match=re.escape(f"Groups of size 1 have no group-relative advantage: group id(s) {singles[:8]}")):
            group_advantage(reward, group)
    else:
        assert bool(torch.isfinite(group_advantage(reward, group)).all())


@FAST
@given(
    reward=st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=10),
    scale=st.sampled_from(["group", "batch", "none", "rank", "trimmed"]),
    eta=st.one_of(st.none(), st.floats(0.5, 5)),
)
def test_finite_rewards_never_give_nan(reward, scale, eta):
    """Any finite rewards in one group (including ties and constant groups): finite advantages."""
    r = torch.tensor(reward, dtype=torch.float32)
    adv = group_advantage(r, torch.zeros(len(reward), dtype=torch.long), scale=scale, soft_clip=eta)
    assert bool(torch.isfinite(adv).all())


def test_reward_and_group_shape_errors():
    with pytest.raises(ValueError, match=re.escape("group must have batch size 3, got shape (2,)")):
        group_advantage(torch.ones(3), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="1-D integer tensor of prompt-group ids"):
        group_advantage(torch.ones(2), torch.tensor([0.0, 0.0]))
    with pytest.raises(ValueError, match=re.escape("reward must be [B] or [B, R], got shape (2, 2, 2)")):
        group_advantage(torch.ones(2, 2, 2), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=re.escape("weights must have one entry per reward (3)")):
        group_advantage(torch.ones(2, 3), torch.tensor([0, 0]), weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="weights are for multi-reward input"):
        group_advantage(torch.ones(2), torch.tensor([0, 0]), weights=[1.0])
    with pytest.raises(ValueError, match=re.escape("reward must have batch size 2")):
        group_statistics(torch.ones(3), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="needs the group ids"):
        GroupAdvantage()(torch.ones(2))


def test_advantage_option_errors():
    with pytest.raises(ValueError, match="Unknown advantage scale 'zscore'"):
        GroupAdvantage(scale="zscore")
    with pytest.raises(ValueError, match="Unknown advantage scale 'zscore'"):
        group_advantage(torch.ones(2), torch.tensor([0, 0]), scale="zscore")
    with pytest.raises(ValueError, match="Unknown multi-reward aggregation 'mean'"):
        GroupAdvantage(multi_reward="mean")
    with pytest.raises(ValueError, match=re.escape("trim must be in [0, 0.5)")):
        group_advantage(torch.ones(2), torch.tensor([0, 0]), trim=0.5)
    with pytest.raises(ValueError, match="soft_clip must be > 0"):
        GroupAdvantage(soft_clip=0.0)
    with pytest.raises(ValueError, match="clip must be > 0"):
        GroupAdvantage(clip=-1.0)
    with pytest.raises(KeyError, match="'group'"):
        GroupAdvantage()(TensorDict({"reward": torch.ones(2)}, batch_size=[2]))
    with pytest.raises(KeyError, match="'score'"):
        GroupAdvantage(in_keys=["score", "group"])(TensorDict({"reward": torch.ones(2)}, batch_size=[2]))


# ------------------------------------------------------------------------------------ ELBO surrogate


@pytest.mark.parametrize("k", [0, -1, 1.5, True, "4"])
def test_num_pairs_must_be_a_positive_integer(k):
    with pytest.raises(ValueError, match="num_pairs must be a positive integer"):
        ELBOSurrogate(num_pairs=k)


def test_timestep_sampler_num_pairs_and_chunk_size():
    with pytest.raises(ValueError, match="num_pairs must be a positive integer, got 0"):
        Uniform(stratified=True)(3, 0)
    with pytest.raises(ValueError, match="chunk_size must be a positive integer, got 0"):
        ELBOSurrogate(chunk_size=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sharing": "prompt"}, "Unknown sharing 'prompt'; expected one of 'none', 'group', 'batch'"),
        ({"weighting": "snr"}, "Unknown weighting 'snr'"),
        ({"timesteps": "sigmoid"}, "Unknown timestep sampler 'sigmoid'"),
        ({"path": "ddpm"}, "Unknown path 'ddpm'; expected one of 'rectified_flow', 'cosine_vp'"),
    ],
)
def test_unknown_estimator_options(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ELBOSurrogate(**kwargs)


def test_unknown_option_factories():
    with pytest.raises(ValueError, match="Unknown path 'vp'"):
        make_path("vp")
    with pytest.raises(ValueError, match="Unknown weighting 'l1'"):
        make_weighting("l1")
    with pytest.raises(ValueError, match="Unknown timestep sampler 'beta'"):
        make_timestep_sampler("beta")


def test_pairs_sharing_and_sample_shape_errors():
    with pytest.raises(ValueError, match=re.escape('sharing="group" needs the group ids')):
        ELBOSurrogate(sharing="group").sample_pairs(torch.zeros(4, 2))
    with pytest.raises(ValueError, match=re.escape("group must have batch size 4, got shape (3,)")):
        ELBOSurrogate(sharing="group").sample_pairs(torch.zeros(4, 2), group=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="at least one data dimension"):
        ELBOSurrogate(sharing="none").sample_pairs(torch.zeros(4))


@pytest.fixture
def est_and_pairs():
    est = ELBOSurrogate(num_pairs=2, sharing="none")
    sample = torch.zeros(4, 3)
    return est, sample, est.sample_pairs(sample, generator=torch.Generator().manual_seed(0))


def test_pairs_do_not_match_the_sample(est_and_pairs):
    est, sample, pairs = est_and_pairs
    model = lambda z, t, c: z  # noqa: E731
    with pytest.raises(ValueError, match=re.escape("pairs['t'] must be (B, K) with B=5, got (4, 2)")):
        est(model, torch.zeros(5, 3), None, pairs)
    with pytest.raises(ValueError, match=re.escape("pairs['noise'] must be (B, K, *D) = (4, 2, 2), got (4, 2, 3)")):
        est(model, torch.zeros(4, 2), None, pairs)
    with pytest.raises(ValueError, match=re.escape("cond must have batch size 4, got (3, 1)")):
        est(model, sample, torch.zeros(3, 1), pairs)
    with pytest.raises(ValueError, match=re.escape("cond must have batch size 4")):
        est(model, sample, TensorDict({"e": torch.zeros(6, 1)}, batch_size=[6]), pairs)
    with pytest.raises(KeyError, match="'noise'"):
        est(model, sample, None, TensorDict({"t": pairs["t"]}, batch_size=[4, 2]))
    with pytest.raises(ValueError, match=re.escape("The model returned shape (8, 2) for inputs of shape (8, 3)")):
        est(lambda z, t, c: z[:, :2], sample, None, pairs)


def test_timestep_sampler_parameter_errors():
    with pytest.raises(ValueError, match="Need 0 <= t_min < t_max <= 1"):
        Uniform(0.5, 0.2)
    with pytest.raises(ValueError, match="LogitNormal std must be > 0"):
        LogitNormal(std=0.0)
    with pytest.raises(ValueError, match="shift must be > 0"):
        Shifted(0.0)
    with pytest.raises(ValueError, match="non-empty grid of timesteps in"):
        DiscreteGrid([])
    with pytest.raises(ValueError, match="non-empty grid of timesteps in"):
        DiscreteGrid([0.5, 1.5])


# -------------------------------------------------------------------------------------- loss modules


LOSS_KEYS = {
    "vgrpo": ["sample", "cond", "advantage", "pairs", "old_log_prob", "old_x_pred"],
    "flow": ["z", "z_next", "t", "t_next", "cond", "advantage", "old_log_prob"],
    "nft": ["sample", "cond", "advantage", "pairs"],
}


def _make_loss(kind, model, est):
    if kind == "vgrpo":
        return VGRPOLoss(model, est, behaviour_kl_coef=0.1)
    if kind == "flow":
        return FlowGRPOLoss(model)
    return DiffusionNFTLoss(model, copy.deepcopy(model), est)


@pytest.mark.parametrize(("kind", "key"), [(kind, key) for kind, keys in LOSS_KEYS.items() for key in keys])
def test_missing_keys_raise_key_error_naming_the_key(batches, kind, key):
    model, est, vgrpo, traj, nft = batches
    batch = {"vgrpo": vgrpo, "flow": traj, "nft": nft}[kind]
    loss = _make_loss(kind, model, est)
    loss(batch)  # complete batch works
    with pytest.raises(KeyError, match=f"The batch has no entry '{key}'"):
        loss(batch.exclude(key))
    # After remapping, the error names the remapped key.
    loss.set_keys(**{key: "renamed_" + key})
    with pytest.raises(KeyError, match=f"no entry 'renamed_{key}'"):
        loss(batch)


def test_vgrpo_shape_mismatches(batches):
    model, est, vgrpo, _, _ = batches
    loss = VGRPOLoss(model, est)
    bad = vgrpo.clone()
    bad["advantage"] = torch.ones(4, 1)
    with pytest.raises(ValueError, match=re.escape("advantage (4, 1) and old_log_prob (4,) must be [B] = (4,)")):
        loss(bad)
    bad = vgrpo.clone()
    bad["old_log_prob"] = torch.ones(4, 2)
    with pytest.raises(ValueError, match=re.escape("old_log_prob (4, 2)")):
        loss(bad)
    # Unbatched containers (batch_size []), so that TensorDict itself does not catch the mismatch first.
    entries = {key: vgrpo[key] for key in ("sample", "cond", "advantage", "pairs", "old_log_prob")}
    bad = TensorDict({**entries, "sample": vgrpo["sample"][:3], "cond": vgrpo["cond"][:3]}, batch_size=[])
    with pytest.raises(ValueError, match=re.escape("pairs['t'] must be (B, K) with B=3")):
        loss(bad)  # 4 rows of pairs for 3 samples
    bad = TensorDict({**entries, "cond": torch.zeros(5, 2)}, batch_size=[])
    with pytest.raises(ValueError, match=re.escape("cond must have batch size 4, got (5, 2)")):
        loss(bad)


def test_vgrpo_kl_needs_old_x_pred_of_the_right_shape(batches):
    model, est, vgrpo, _, _ = batches
    bad = vgrpo.clone()
    bad["old_x_pred"] = torch.zeros(4, 2, 5)
    with pytest.raises(ValueError, match="x-space KL needs equal shapes"):
        VGRPOLoss(model, est, behaviour_kl_coef=0.1)(bad)


def test_flow_grpo_shape_mismatches_do_not_broadcast(batches):
    """A [B, S, 1] advantage or old log-prob would broadcast against the [B*S] log-probs into a [B*S, B*S]
    matrix: a silent wrong loss. It must raise."""
    model, _, _, traj, _ = batches
    bad = traj.clone()
    bad["advantage"] = torch.ones(4, 3, 1)
    with pytest.raises(ValueError, match=re.escape("advantage (12, 1) and old_log_prob (12,) must have one entry per transition")):
        FlowGRPOLoss(model)(bad)
    bad = traj.clone()
    bad["old_log_prob"] = torch.ones(4, 3, 1)
    with pytest.raises(ValueError, match=re.escape("old_log_prob (12, 1)")):
        FlowGRPOLoss(model)(bad)


def test_nft_advantage_shape(batches):
    model, est, _, _, nft = batches
    bad = nft.clone()
    bad["advantage"] = torch.ones(4, 1)
    with pytest.raises(ValueError, match=re.escape("advantage must be [B] = [4], got (4, 1)")):
        DiffusionNFTLoss(model, copy.deepcopy(model), est)(bad)


def test_loss_constructor_errors(make_model):
    model = make_model()
    est = ELBOSurrogate()
    with pytest.raises(ValueError, match=re.escape("clip_range must be eps or a (low, high) pair with 0 <= low < 1")):
        VGRPOLoss(model, est, clip_range=1.5)
    with pytest.raises(ValueError, match=re.escape("clip_range must be eps or a (low, high) pair with 0 <= low < 1")):
        FlowGRPOLoss(model, clip_range=(0.1, -0.1))
    with pytest.raises(ValueError, match="needs both ref_model and ref_kl_coef"):
        VGRPOLoss(model, est, ref_model=model)
    with pytest.raises(ValueError, match="needs both ref_model and ref_kl_coef"):
        FlowGRPOLoss(model, ref_kl_coef=0.1)
    with pytest.raises(ValueError, match="needs both ref_model and ref_kl_coef"):
        DiffusionNFTLoss(model, model, est, ref_model=model)
    with pytest.raises(ValueError, match="needs both ref_model and ref_kl_coef"):
        AWMLoss(model, est, ref_kl_coef=0.1)
    with pytest.raises(ValueError, match="needs both ref_model and ref_kl_coef"):
        DGPOLoss(model, est, model, ref_model=model)
    with pytest.raises(ValueError, match="strength must be > 0, got 0.0"):
        DiffusionNFTLoss(model, model, est, strength=0.0)
    with pytest.raises(ValueError, match="advantage_max must be finite, got inf"):
        DiffusionNFTLoss(model, model, est, advantage_max=float("inf"))
    with pytest.raises(ValueError, match="noise_level must be > 0"):
        FlowGRPOLoss(model, noise_level=0.0)
    # A KL switched off (None) cannot be scheduled by assigning a float: torch names the buffer.
    loss = VGRPOLoss(model, est)
    with pytest.raises(TypeError, match="behaviour_kl_coef"):
        loss.behaviour_kl_coef = 0.1


def test_flow_grpo_unknown_reduction(batches):
    model, _, _, traj, _ = batches
    with pytest.raises(ValueError, match="Unknown log-prob reduction 'max'"):
        FlowGRPOLoss(model, log_prob_reduction="max")(traj)


# ------------------------------------------------------------------------------ objectives, SDE, samplers


def test_objective_option_errors():
    with pytest.raises(ValueError, match="Unknown log-prob reduction 'median'; expected one of 'mean', 'sum'"):
        gaussian_log_prob(torch.zeros(2, 2), torch.zeros(2, 2), 1.0, "median")
    with pytest.raises(ValueError, match="Unknown KL reduction 'median'"):
        gaussian_kl_same_std(torch.zeros(2, 2), torch.zeros(2, 2), 1.0, "median")
    with pytest.raises(ValueError, match="Unknown KL estimator 'k4'"):
        kl_estimate(torch.zeros(2), "k4")
    with pytest.raises(ValueError, match="soft-clip eta must be > 0"):
        soft_clip(torch.zeros(2), 0.0)
    with pytest.raises(ValueError, match=re.escape("x-space KL needs equal shapes, got (2, 2, 2) and (2, 2, 3)")):
        x_space_kl(torch.zeros(2, 2, 2), torch.zeros(2, 2, 3))


def test_sampler_errors():
    model = lambda z, t, c: z  # noqa: E731
    z = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="num_steps must be a positive integer, got 0"):
        time_grid(0)
    with pytest.raises(ValueError, match="shift must be > 0"):
        time_grid(4, shift=-1.0)
    for grid in ([0.0, 1.0], [1.0], [1.0, 0.5, 0.5], [1.5, 0.0], [1.0, -0.1]):
        with pytest.raises(ValueError, match="strictly decreasing sequence of at least 2 times in"):
            sample_euler(model, z, grid)
    with pytest.raises(ValueError, match="Unknown ODE solver 'rk4'; expected one of 'euler', 'heun', 'dpmpp_2m'"):
        sample_ode(model, z, [1.0, 0.0], method="rk4")
    with pytest.raises(ValueError, match="Unknown path 'edm'"):
        sample_dpmpp_2m(model, z, [1.0, 0.0], path="edm")
    with pytest.raises(ValueError, match=re.escape("sde_steps must be a non-empty subset of 0..1, got [5]")):
        sample_sde(model, z, [1.0, 0.5, 0.0], sde_steps=[5])
    with pytest.raises(ValueError, match="sde_steps must be a non-empty subset"):
        sample_sde(model, z, [1.0, 0.5, 0.0], sde_steps=[])
    with pytest.raises(ValueError, match="Unknown log-prob reduction 'max'"):
        sample_sde(model, z, [1.0, 0.5, 0.0], log_prob_reduction="max")


@pytest.mark.parametrize("sampler", [sample_euler, sample_heun, sample_dpmpp_2m, sample_ode, sample_sde])
def test_samplers_share_one_argument_order_and_name_a_misplaced_grid(sampler):
    """Every sampler is (model, noise, grid, cond=None, ...): the old sample_ode order (cond before grid) puts a
    tensor or None where the grid goes, which is refused naming the grid and the order, not a TypeError from
    iterating None."""
    model = lambda z, t, c: z  # noqa: E731
    z, cond = torch.zeros(2, 2), torch.tensor([0, 1])
    for misplaced in (cond, None, torch.tensor([1.0, 0.0])):
        with pytest.raises(TypeError, match=re.escape("grid must be a sequence of Python floats (e.g. time_grid(10)), got ")
                           + ".*" + re.escape("(model, noise, grid, cond=None, ...)")):
            sampler(model, z, misplaced, [1.0, 0.0])
    with pytest.raises(TypeError, match="grid must hold real numbers"):
        sampler(model, z, [cond, cond])
    with pytest.raises(TypeError, match="noise must be a torch.Tensor, got list"):
        sampler(model, [1.0, 0.0], [1.0, 0.0])
    out = sampler(model, z, [1.0, 0.0], cond)  # the right order works
    assert (out[0] if isinstance(out, tuple) else out).shape == z.shape


def test_sde_noise_level_zero_raises_instead_of_nan_log_probs():
    """noise_level = 0 has no transition density (std 0 gives 0/0 = NaN log-probs): refuse it."""
    with pytest.raises(ValueError, match="noise_level must be > 0"):
        sample_sde(lambda z, t, c: z, torch.zeros(2, 2), [1.0, 0.5, 0.0], noise_level=0.0)


# --------------------------------------------------------------------------------------------- control


def test_control_errors():
    with pytest.raises(ValueError, match="steps must be a positive integer, got 0"):
        Linear(0.0, 1.0, 0)
    with pytest.raises(ValueError, match="one more value than boundaries"):
        Piecewise((10,), (1.0,))
    with pytest.raises(ValueError, match="boundaries must be increasing"):
        Piecewise((30, 10), (1.0, 2.0, 3.0))
    with pytest.raises(ValueError, match="window size 6 exceeds the number of steps 5"):
        SDEWindow(5, 6)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        SDEWindow(5, 0)
    with pytest.raises(ValueError, match=re.escape("decay must be in [0, 1], got 1.5")):
        ema_update_([torch.zeros(1)], [torch.zeros(1)], 1.5)
    with pytest.raises(ValueError, match="matching parameter lists, got 1 and 0"):
        ema_update_([torch.zeros(1)], [], 0.5)
    with pytest.raises(ValueError, match="target > 0"):
        AdaptiveKLController(0.1, target=0.0)
    with pytest.raises(ValueError, match="horizon must be a positive integer"):
        AdaptiveKLController(0.1, target=0.1, horizon=0)


# ------------------------------------------------------------------- API errors that finish the job (issue 28.7)


def test_a_float64_sample_with_a_float32_model_is_named_as_a_dtype_mismatch(batches):
    model, est, vgrpo, traj, nft = batches
    message = "dtype mismatch: the sample is torch.float64 but the model's parameters are torch.float32"
    sample, cond = vgrpo["sample"].double(), vgrpo["cond"].double()
    pairs = est.sample_pairs(sample)
    with pytest.raises(TypeError, match=message):
        est(model, sample, cond, pairs)
    with pytest.raises(TypeError, match=message):
        VGRPOLoss(model, est, on_policy=True)(vgrpo.exclude("old_log_prob", "old_x_pred").apply(_double))
    with pytest.raises(TypeError, match=message):
        DiffusionNFTLoss(model, copy.deepcopy(model), est)(nft.apply(_double))
    with pytest.raises(TypeError, match="dtype mismatch: z \\(the SDE states\\) is torch.float64 but the model's "
                                        "parameters are torch.float32"):
        FlowGRPOLoss(model)(traj.apply(_double))
    assert torch.isfinite(est(model.double(), sample, cond, pairs)).all(), "a float64 model takes float64 samples"


class _CastsInputs(torch.nn.Module):
    """A model that casts its inputs to its own dtype (as the diffusers velocity adapters declare)."""

    casts_inputs = True

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x_t, t, cond):
        return self.inner(x_t.float(), t.float(), cond.float()).to(x_t.dtype)


def test_a_model_that_casts_its_inputs_takes_a_sample_of_another_dtype(batches):
    model, est, vgrpo, _, _ = batches
    sample, cond = vgrpo["sample"].double(), vgrpo["cond"].double()
    pairs = est.sample_pairs(sample)
    assert est(_CastsInputs(model), sample, cond, pairs).dtype == torch.float64


def _double(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.double() if tensor.is_floating_point() else tensor


def test_pairs_with_another_k_than_the_estimator_are_refused_naming_both(batches):
    model, est, vgrpo, _, _ = batches
    other = ELBOSurrogate(num_pairs=3, sharing="none")
    pairs = other.sample_pairs(vgrpo["sample"])
    with pytest.raises(ValueError, match="pairs hold K=3 pairs per sample but this estimator's num_pairs is 2"):
        est(model, vgrpo["sample"], vgrpo["cond"], pairs)
    bad = vgrpo.exclude("pairs", "old_x_pred")
    bad["pairs"] = pairs
    with pytest.raises(ValueError, match="K=3 pairs per sample but this estimator's num_pairs is 2"):
        VGRPOLoss(model, est, on_policy=True)(bad)


@pytest.mark.parametrize(
    "call, old, new",
    [
        (lambda m, e: VGRPOLoss(m, e, kl_coef=0.3), "kl_coef", "behaviour_kl_coef"),
        (lambda m, e: VGRPOLoss(m, e, clip_epsilon=0.01), "clip_epsilon", "clip_range"),
        (lambda m, e: VGRPOLoss(m, e, clip_high=0.02), "clip_high", "clip_range"),
        (lambda m, e: FlowGRPOLoss(m, kl_coef=0.04), "kl_coef", "ref_kl_coef"),
        (lambda m, e: FlowGRPOLoss(m, clip_epsilon=1e-4), "clip_epsilon", "clip_range"),
        (lambda m, e: FlowGRPOLoss(m, adv_clip=5.0), "adv_clip", "advantage_clip"),
        (lambda m, e: DiffusionNFTLoss(m, m, e, kl_coef=1e-4), "kl_coef", "ref_kl_coef"),
        (lambda m, e: DiffusionNFTLoss(m, m, e, adv_max=5.0), "adv_max", "advantage_max"),
        (lambda m, e: DiffusionNFTLoss(m, m, e, advantage_clip=5.0), "advantage_clip", "advantage_max"),
    ],
)
def test_an_old_keyword_answers_with_its_new_name(make_model, call, old, new):
    owner = call.__code__.co_names[0]  # the loss class the call builds
    with pytest.raises(TypeError, match=f"^{owner}\\(\\) got the old keyword {old}=; it is now {new}="):
        call(make_model(), ELBOSurrogate())


def test_old_keywords_of_the_objectives_answer_with_their_new_names():
    from vgrpo_lib.objectives import clip_fraction, clipped_ratio_objective, nft_optimality

    log_ratio, advantage = torch.zeros(3), torch.ones(3)
    with pytest.raises(TypeError, match="clipped_ratio_objective\\(\\) got the old keyword clip_low=; it is now clip_range="):
        clipped_ratio_objective(log_ratio, advantage, clip_low=0.1)
    with pytest.raises(TypeError, match="clip_fraction\\(\\) got the old keyword clip_high=; it is now clip_range="):
        clip_fraction(log_ratio, clip_high=0.2)
    with pytest.raises(TypeError, match="nft_optimality\\(\\) got the old keyword adv_max=; it is now advantage_max="):
        nft_optimality(advantage, adv_max=5.0)
    assert nft_optimality(advantage, advantage_max=5.0).tolist() == pytest.approx([0.6] * 3)


@pytest.mark.parametrize("sampler", [sample_euler, sample_heun, sample_dpmpp_2m, sample_ode, sample_sde],
                         ids=lambda sampler: sampler.__name__)
def test_the_samplers_old_first_keyword_answers_with_its_new_name(sampler):
    def model(x_t, t, cond):
        return x_t

    with pytest.raises(TypeError, match=f"^{sampler.__name__}\\(\\) got the old keyword z=; it is now noise="):
        sampler(model, z=torch.zeros(2, 3), grid=time_grid(2))
    assert sampler(model, noise=torch.zeros(2, 3), grid=time_grid(2)) is not None
