"""Generative bad-input fuzzing of the public API (issue 6, item 3), on top of tests/vgrpo_lib/test_bad_input.py.

Hypothesis draws, for each public entry point, a valid input or one malformation of it (wrong shapes and ranks,
wrong dtypes, empty batches, NaN/inf at random positions, size-1 groups among valid ones, group ids that
disagree with the batch, pairs with a mismatched K / data shape / batch, TensorDicts missing a random required
key, random unknown option strings, other devices, out-of-range options and config overrides).

Every malformed input must raise the documented error type (ValueError / KeyError / TypeError) with a message
that names the argument or key; anything else (a return value, a NaN, an internal torch RuntimeError) fails.
Every valid input must succeed with finite outputs. Each example records a case signature (entry point, kind of
malformation, shapes / dtypes) in ``CASES``; the last test asserts that more than ``MIN_DISTINCT_CASES``
distinct signatures were tried, prints the count and writes it to ``<pytest basetemp>/fuzz_public_api_cases.json``.

Other devices are stood in for by ``meta`` tensors (the mismatch check is the same for CPU/CUDA). Runs derandomized
(reproducible in CI) with modest example counts.
"""

from __future__ import annotations

import copy
import json
import math
import re
import string
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch import nn

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.config import OPTIONS, AlgorithmSection, TrainConfig, apply_overrides, valid_keys
from vgrpo_lib import (
    DiffusionNFTLoss,
    ELBOSurrogate,
    FlowGRPOLoss,
    GroupAdvantage,
    VGRPOLoss,
    group_advantage,
    group_statistics,
    sample_dpmpp_2m,
    sample_euler,
    sample_heun,
    sample_ode,
    sample_sde,
    time_grid,
)
from vgrpo_lib.advantages import MULTI_REWARD, SCALES
from vgrpo_lib.control import AdaptiveKLController, Cosine, Linear, OldPolicyDecay, SDEWindow, ema_update_
from vgrpo_lib.elbo import NOISE_SCHEMES, SHARING_SCOPES
from vgrpo_lib.objectives import KL_ESTIMATORS, gaussian_kl_same_std, kl_estimate, soft_clip, x_space_kl
from vgrpo_lib.paths import PATHS
from vgrpo_lib.samplers import ODE_SOLVERS
from vgrpo_lib.sde import LOG_PROB_REDUCTIONS, gaussian_log_prob
from vgrpo_lib.timesteps import TIMESTEP_SAMPLERS
from vgrpo_lib.weighting import WEIGHTINGS

CASES: Counter = Counter()
RAN: set[str] = set()
FUZZ_TESTS = {"advantages", "elbo", "vgrpo", "flow_grpo", "nft", "samplers", "objectives", "control", "config"}
MIN_DISTINCT_CASES = 700  # 877 with hypothesis derandomized here; margin for other hypothesis versions

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FUZZ_LOSS = settings(FUZZ, max_examples=100)

BAD_NUMBERS = [float("nan"), float("inf"), -float("inf"), 0.0, -1.0, -1e-3]
NON_FINITE = [float("nan"), float("inf"), -float("inf")]


def record(test: str, *signature) -> None:
    RAN.add(test)
    CASES[(test, *(str(s) for s in signature))] += 1


def expect_error(call, errors, pattern: str):
    """``call()`` must raise one of ``errors`` whose message matches ``pattern``; anything else is a gap."""
    try:
        out = call()
    except errors as error:
        message = str(error)
        assert re.search(pattern, message), f"{type(error).__name__} {message!r} does not match {pattern!r}"
        return error
    except Exception as error:  # an internal torch error: the library did not check
        pytest.fail(f"expected {errors} matching {pattern!r}, got unrelated {type(error).__name__}: {error}")
    pytest.fail(f"expected {errors} matching {pattern!r}, but the call returned {summary(out)}")


def summary(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"a tensor {tuple(out.shape)} {out.dtype} (finite: {bool(torch.isfinite(out).all()) if out.numel() else 'empty'})"
    return repr(out)[:200]


def assert_finite(out) -> None:
    """Every tensor in ``out`` (tensor, dict, TensorDict, tuple/list) is finite; floats too."""
    if isinstance(out, torch.Tensor):
        assert bool(torch.isfinite(out).all()), f"non-finite output {out}"
    elif isinstance(out, (dict, TensorDict)):
        for value in out.values():
            assert_finite(value)
    elif isinstance(out, (tuple, list)):
        for value in out:
            assert_finite(value)
    elif isinstance(out, float):
        assert math.isfinite(out)


def unknown(options) -> st.SearchStrategy[str]:
    """Random option strings that are not among ``options``."""
    options = set(options)
    return st.text(string.ascii_letters + string.digits + "_-. ", min_size=0, max_size=12).filter(lambda s: s not in options)


class TinyVelocity(nn.Module):
    """``v = Linear([z, t, cond])`` for any data shape; works in the dtype of ``z``."""

    def __init__(self, data_shape, cond_dim: int = 0, seed: int = 0):
        super().__init__()
        self.cond_dim = cond_dim
        dim = math.prod(data_shape)
        self.net = nn.Linear(dim + 1 + cond_dim, dim)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))

    def forward(self, z, t, cond=None):
        parts = [z.flatten(1).float(), t.reshape(-1, 1).float()]
        if self.cond_dim:
            parts.append(cond.float())
        return self.net(torch.cat(parts, 1)).view(z.shape).to(z.dtype)


# ------------------------------------------------------------------------------------- strategies


@st.composite
def grouped(draw, min_groups=1, max_groups=4, singletons=False):
    """Group ids ``[B]`` (arbitrary integer labels, shuffled) with every group of size >= 2, or with at least one
    size-1 group mixed among valid ones."""
    sizes = draw(st.lists(st.integers(2, 5), min_size=min_groups, max_size=max_groups))
    if singletons:
        sizes = sizes + [1] * draw(st.integers(1, 3))
    labels = draw(st.lists(st.integers(-1000, 1000), min_size=len(sizes), max_size=len(sizes), unique=True))
    ids = [label for label, size in zip(labels, sizes) for _ in range(size)]
    order = draw(st.permutations(range(len(ids))))
    group = torch.tensor([ids[i] for i in order], dtype=draw(st.sampled_from([torch.long, torch.int32, torch.int16])))
    return group, sorted(label for label, size in zip(labels, sizes) if size == 1)


@st.composite
def rewards_for(draw, batch: int, num_rewards: int | None):
    """Finite rewards ``[B]`` or ``[B, R]`` in a random dtype (integer and bool rewards are cast to float)."""
    shape = (batch,) if num_rewards is None else (batch, num_rewards)
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.long, torch.bool, torch.float16]))
    values = draw(st.lists(st.integers(-50, 50), min_size=math.prod(shape), max_size=math.prod(shape)))
    scale = draw(st.sampled_from([1.0, 0.01, 1e3]))
    reward = torch.tensor(values, dtype=torch.float64).reshape(shape)
    if dtype == torch.bool:
        return reward > 0
    if not dtype.is_floating_point:
        return reward.to(dtype)
    return (reward * scale).to(dtype)


def sprinkle_non_finite(draw, reward: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    reward = reward.float() if not reward.is_floating_point() else reward.clone()
    flat = reward.view(-1)
    positions = draw(st.sets(st.integers(0, flat.numel() - 1), min_size=1, max_size=flat.numel()))
    for p in positions:
        flat[p] = draw(st.sampled_from(NON_FINITE))
    return reward, sorted(positions)


ADV_KINDS = [
    "valid", "non_finite", "empty", "singleton", "group_length", "group_dtype", "group_rank", "reward_rank",
    "complex_reward", "no_rewards", "weights_length", "weights_non_finite", "unknown_scale", "unknown_multi_reward",
    "bad_option", "other_device", "not_a_tensor", "missing_key",
]


# ------------------------------------------------------------------------------------- advantages


@FUZZ
@given(data=st.data())
def test_fuzz_group_advantage_and_statistics(data):
    draw = data.draw
    kind = draw(st.sampled_from(ADV_KINDS))
    entry = draw(st.sampled_from(["group_advantage", "GroupAdvantage", "GroupAdvantage(td)", "group_statistics"]))
    multi = draw(st.sampled_from([None, 1, 2, 3])) if entry != "group_statistics" else None
    group, singles = draw(grouped(singletons=kind == "singleton"))
    batch = group.shape[0]
    reward = draw(rewards_for(batch, multi))
    options = {
        "scale": draw(st.sampled_from(SCALES)),
        "soft_clip": draw(st.one_of(st.none(), st.floats(0.1, 10))),
        "clip": draw(st.one_of(st.none(), st.floats(0.1, 10))),
        "eps": draw(st.sampled_from([1e-6, 0.0, 1e-3])),
        "trim": draw(st.floats(0.0, 0.49)),
        "multi_reward": draw(st.sampled_from(MULTI_REWARD)),
    }
    weights = None if multi is None else draw(st.one_of(st.none(), st.lists(st.floats(-2, 2), min_size=multi, max_size=multi)))
    sig = [entry, kind, batch, multi, str(reward.dtype).split(".")[-1]]
    errors, pattern = ValueError, None

    if kind == "non_finite":
        reward, positions = sprinkle_non_finite(draw, reward)
        sig.append(len(positions))
        pattern = r"reward contains NaN or inf at index"
    elif kind == "empty":
        reward, group = reward[:0], group[:0]
        pattern = r"reward is an empty batch"
    elif kind == "singleton":
        sig.append(len(singles))
        if entry == "group_statistics":
            pattern = None  # statistics of a size-1 group are defined (std 0)
        else:
            pattern = re.escape(f"Groups of size 1 have no group-relative advantage: group id(s) {singles[:8]}")
    elif kind == "group_length":
        delta = draw(st.sampled_from([-1, 1, 2]))
        group = torch.cat([group, group[:1].repeat(delta)]) if delta > 0 else group[:delta]
        pattern = r"(group|reward) must have batch size"
        sig.append(delta)
    elif kind == "group_dtype":
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bool, torch.complex64]))
        group = group.to(dtype)
        pattern = r"group must be a 1-D integer tensor of prompt-group ids"
        sig.append(dtype)
    elif kind == "group_rank":
        group = group[:, None].expand(batch, draw(st.integers(1, 2))) if draw(st.booleans()) else group[0]
        pattern = r"group must (have|be a 1-D)"
        sig.append(group.ndim)
    elif kind == "reward_rank":
        reward = reward.reshape(batch, 1, 1, -1) if draw(st.booleans()) else torch.tensor(1.0)
        pattern = r"reward must (be \[B\] or \[B, R\]|have batch size|have 1 dimension)"
        sig.append(reward.ndim)
    elif kind == "complex_reward":
        reward = reward.to(torch.complex64)
        pattern = r"reward must be real-valued"
    elif kind == "no_rewards":
        if entry == "group_statistics":
            reward, pattern = reward.reshape(batch, 1), r"reward must have 1 dimension"
        else:
            reward, weights, pattern = torch.zeros(batch, 0), None, r"reward \[B, R\] must hold at least one reward"
    elif kind == "weights_length" and multi is not None:
        length = draw(st.integers(0, 5).filter(lambda n: n != multi))
        weights = [1.0] * length
        pattern = r"weights must have one entry per reward"
        sig.append(length)
    elif kind == "weights_length" and entry != "group_statistics":
        weights, pattern = [1.0], r"weights are for multi-reward input"
    elif kind == "weights_non_finite" and multi is not None:
        weights = [1.0] * multi
        weights[draw(st.integers(0, multi - 1))] = draw(st.sampled_from(NON_FINITE))
        pattern = r"weights contains NaN or inf"
    elif kind == "unknown_scale" and entry != "group_statistics":
        options["scale"] = draw(unknown(SCALES))
        pattern = re.escape(f"Unknown advantage scale {options['scale']!r}")
    elif kind == "unknown_multi_reward" and entry != "group_statistics":
        options["multi_reward"] = draw(unknown(MULTI_REWARD))
        pattern = re.escape(f"Unknown multi-reward aggregation {options['multi_reward']!r}")
    elif kind == "bad_option" and entry != "group_statistics":
        name = draw(st.sampled_from(["soft_clip", "clip", "eps", "trim"]))
        bad = {
            "soft_clip": BAD_NUMBERS,
            "clip": [float("nan"), 0.0, -1.0, -float("inf")],
            "eps": [float("nan"), float("inf"), -1e-6, -1.0],
            "trim": [float("nan"), 0.5, -0.1, 1.0, float("inf")],
        }[name]
        options[name] = draw(st.sampled_from(bad))
        errors, pattern = (ValueError, TypeError), rf"\b{name} must be"
        sig += [name, options[name]]
    elif kind == "other_device":
        if draw(st.booleans()):
            reward, sig = reward.to("meta"), sig + ["reward@meta"]
            pattern = r"reward is on meta but group is on cpu"
        else:
            group, sig = group.to("meta"), sig + ["group@meta"]
            pattern = r"reward is on cpu but group is on meta"
    elif kind == "not_a_tensor" and entry != "GroupAdvantage(td)":
        which = draw(st.sampled_from(["reward", "group"]))
        if which == "reward":
            reward = reward.tolist()
        else:
            group = group.tolist()
        errors, pattern = TypeError, rf"{which} must be a torch.Tensor"
        sig.append(which)
    elif kind == "missing_key" and entry == "GroupAdvantage(td)":
        pass
    else:
        kind, sig[1] = "valid", "valid"

    if kind == "missing_key":
        if entry != "GroupAdvantage(td)":
            kind, sig[1] = "valid", "valid"
        else:
            missing = draw(st.sampled_from(["reward", "group"]))
            td = TensorDict({"reward": reward, "group": group}, batch_size=[batch]).exclude(missing)
            record("advantages", *sig, missing)
            expect_error(lambda: GroupAdvantage()(td), KeyError, rf"no entry '{missing}'")
            return

    def call():
        if entry == "group_statistics":
            return group_statistics(reward, group)
        if entry == "group_advantage":
            return group_advantage(reward, group, weights=weights, **options)
        module = GroupAdvantage(options.pop("scale"), weights=weights, **options)
        if entry == "GroupAdvantage":
            return module(reward, group)
        td = TensorDict({"reward": reward, "group": group}, batch_size=[])
        return module(td)["advantage"]

    record("advantages", *sig)
    if pattern is None:
        out = call()
        assert_finite(out)
        if entry != "group_statistics":
            assert out.shape == (batch,) and out.is_floating_point()
    else:
        expect_error(call, errors, pattern)


# ----------------------------------------------------------------------------------- ELBO surrogate

ESTIMATOR_OPTIONS = {
    "sharing": SHARING_SCOPES,
    "weighting": tuple(WEIGHTINGS),
    "timesteps": tuple(TIMESTEP_SAMPLERS),
    "path": tuple(PATHS),
    "noise": NOISE_SCHEMES,
}


@FUZZ
@given(data=st.data())
def test_fuzz_elbo_surrogate(data):
    draw = data.draw
    kind = draw(
        st.sampled_from(
            ["valid", "unknown_option", "bad_count", "sample_dtype", "sample_rank", "empty", "no_group", "group_dtype",
             "group_length", "group_device", "pairs_batch", "pairs_k", "pairs_data", "pairs_missing", "pairs_type",
             "pairs_device", "cond_batch", "model_shape"]
        )
    )
    k = draw(st.integers(1, 4))
    sharing = draw(st.sampled_from(SHARING_SCOPES))
    weighting = draw(st.sampled_from(["adaptive_x", "x", "v", "eps"]))
    data_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    group, _ = draw(grouped(max_groups=3))
    batch = group.shape[0]
    cond_dim = draw(st.integers(0, 2))
    sig = ["elbo", kind, k, sharing, len(data_shape), str(dtype).split(".")[-1]]

    if kind == "unknown_option":
        name = draw(st.sampled_from(sorted(ESTIMATOR_OPTIONS)))
        value = draw(unknown(ESTIMATOR_OPTIONS[name]))
        record("elbo", *sig, name)
        names = {"timesteps": "timestep sampler"}
        expect_error(lambda: ELBOSurrogate(**{name: value}), ValueError, re.escape(f"Unknown {names.get(name, name)} {value!r}"))
        return
    if kind == "bad_count":
        name = draw(st.sampled_from(["num_pairs", "chunk_size"]))
        value = draw(st.sampled_from([0, -1, 2.5, True, "4", float("nan")]))
        record("elbo", *sig, name, value)
        expect_error(lambda: ELBOSurrogate(**{name: value}), ValueError, rf"{name} must be a positive integer")
        return

    est = ELBOSurrogate(num_pairs=k, sharing=sharing, weighting=weighting, chunk_size=draw(st.sampled_from([None, 1, 3])))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    sample = torch.randn((batch, *data_shape), generator=generator, dtype=dtype)
    model = TinyVelocity(data_shape, cond_dim, seed=1)
    cond = torch.randn(batch, cond_dim) if cond_dim else None
    sample_group = group if sharing == "group" else draw(st.sampled_from([None, group]))

    pairs_errors = {
        "sample_dtype": (ValueError, r"sample must be a floating-point tensor"),
        "sample_rank": (ValueError, r"sample must be \(B, \*D\) with at least one data dimension"),
        "empty": (ValueError, r"sample is an empty batch"),
        "no_group": (ValueError, r'sharing="group" needs the group ids'),
        "group_dtype": (ValueError, r"group must be a 1-D integer tensor"),
        "group_length": (ValueError, r"group must have batch size"),
        "group_device": (ValueError, r"group is on meta but sample is on cpu"),
    }
    if kind in pairs_errors:
        if kind in ("no_group", "group_dtype", "group_length", "group_device") and sharing != "group":
            est = ELBOSurrogate(num_pairs=k, sharing="group")
            sig[3] = "group"
        if kind == "sample_dtype":
            sample = sample.to(draw(st.sampled_from([torch.long, torch.int32, torch.bool, torch.uint8])))
        elif kind == "sample_rank":
            sample = sample.flatten()[:batch] if draw(st.booleans()) else sample.flatten()[0]
        elif kind == "empty":
            sample, sample_group = sample[:0], group[:0]
        elif kind == "no_group":
            sample_group = None
        elif kind == "group_dtype":
            sample_group = group.to(draw(st.sampled_from([torch.float32, torch.float64, torch.bool])))
        elif kind == "group_length":
            sample_group = group[: draw(st.integers(0, batch - 1))]
        elif kind == "group_device":
            sample_group = group.to("meta")
        record("elbo", *sig, "sample_pairs")
        errors, pattern = pairs_errors[kind]
        expect_error(lambda: est.sample_pairs(sample, group=sample_group, generator=generator), errors, pattern)
        return

    pairs = est.sample_pairs(sample, group=sample_group, generator=generator)
    assert pairs.batch_size == (batch, k)
    errors, pattern = ValueError, None
    call_model = model
    if kind == "pairs_batch":
        other = draw(st.sampled_from([b for b in (1, batch - 1, batch + 1, batch + 3) if b >= 1 and b != batch]))
        pairs = ELBOSurrogate(k, sharing="none").sample_pairs(torch.zeros(other, *data_shape, dtype=dtype))
        pattern = rf"pairs\['t'\] must be \(B, K\) with B={batch}"
        sig.append(other)
    elif kind == "pairs_k":
        noise = torch.randn(batch, k + draw(st.integers(1, 2)), *data_shape, dtype=dtype)
        pairs = TensorDict({"t": pairs["t"], "noise": noise}, batch_size=[batch])
        pattern = r"pairs\['noise'\] must be \(B, K, \*D\)"
    elif kind == "pairs_data":
        other_shape = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).filter(lambda s: tuple(s) != data_shape))
        pairs = ELBOSurrogate(k, sharing="none").sample_pairs(torch.zeros(batch, *other_shape, dtype=dtype))
        pattern = r"pairs\['noise'\] must be \(B, K, \*D\)"
        sig.append(len(other_shape))
    elif kind == "pairs_missing":
        missing = draw(st.sampled_from(["t", "noise"]))
        pairs, errors, pattern = pairs.exclude(missing), KeyError, rf"The batch has no entry '{missing}'"
        sig.append(missing)
    elif kind == "pairs_type":
        pairs = draw(st.sampled_from([pairs["t"], pairs.to_dict(), None]))
        errors, pattern = TypeError, r"pairs must be the TensorDict"
        sig.append(type(pairs).__name__)
    elif kind == "pairs_device":
        pairs = pairs.to("meta")
        pattern = r"pairs\['(t|noise)'\] is on meta but sample is on cpu"
    elif kind == "cond_batch":
        cond = torch.randn(batch + draw(st.sampled_from([-1, 1, 2])), max(cond_dim, 1))
        pattern = rf"cond must have batch size {batch}"
    elif kind == "model_shape":
        call_model = lambda z, t, c: z[:, :1] if z.shape[1] > 1 else torch.cat([z, z], dim=1)  # noqa: E731
        pattern = r"The model returned shape"

    record("elbo", *sig)
    entry = draw(st.sampled_from(["__call__", "evaluate"]))
    call = (lambda: est(call_model, sample, cond, pairs)) if entry == "__call__" else (lambda: est.evaluate(call_model, sample, cond, pairs))
    if pattern is None:
        out = call()
        assert_finite(out)
        assert (out.shape if entry == "__call__" else out.batch_size) == ((batch,) if entry == "__call__" else (batch, k))
    else:
        expect_error(call, errors, pattern)


# ------------------------------------------------------------------------------------- loss modules

LOSS_MALFORMATIONS = [
    "valid", "missing_key", "empty", "advantage_shape", "old_log_prob_shape", "sample_dtype", "pairs_data",
    "pairs_batch", "pairs_k", "pairs_type", "pairs_device", "cond_batch", "old_x_pred_shape", "bad_constructor",
    "unknown_option",
]


@st.composite
def elbo_batches(draw, with_old: bool):
    k = draw(st.integers(1, 3))
    data_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    cond_dim = draw(st.integers(0, 2))
    group, _ = draw(grouped(max_groups=3))
    batch = group.shape[0]
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    model = TinyVelocity(data_shape, cond_dim, seed=seed)
    est = ELBOSurrogate(k, sharing=draw(st.sampled_from(SHARING_SCOPES)), weighting=draw(st.sampled_from(["adaptive_x", "x", "v"])))
    sample = torch.randn((batch, *data_shape), generator=generator)
    cond = torch.randn(batch, cond_dim, generator=generator) if cond_dim else None
    pairs = est.sample_pairs(sample, group=group, generator=generator)
    reward = torch.randn(batch, generator=generator)
    entries = {"sample": sample, "advantage": group_advantage(reward, group, soft_clip=3.0), "pairs": pairs}
    if cond is not None:
        entries["cond"] = cond
    if with_old:
        old_model = copy.deepcopy(model)
        with torch.no_grad():
            old_model.net.weight.add_(0.01)
            old = est.evaluate(old_model, sample, cond, pairs)
        entries.update(old_log_prob=old["log_prob"].mean(1), old_x_pred=old["x_pred"])
    return model, est, TensorDict(entries, batch_size=[batch]), (batch, k, data_shape, cond_dim)


def _malform_elbo_batch(draw, kind, td, dims, required):
    """Apply one malformation to a V-GRPO / DiffusionNFT batch; return (batch, errors, pattern, signature bits)."""
    batch, k, data_shape, cond_dim = dims
    if kind == "missing_key":
        missing = draw(st.sampled_from(required + ["pairs.t", "pairs.noise"]))
        if missing.startswith("pairs."):
            leaf = missing.split(".")[1]
            td = td.clone()
            td["pairs"] = td["pairs"].exclude(leaf)
            return td, KeyError, rf"no entry '{leaf}'", [missing]
        return td.exclude(missing), KeyError, rf"The batch has no entry '{missing}'", [missing]
    if kind == "empty":
        return td[:0], ValueError, r"sample is an empty batch", []
    if kind == "advantage_shape":
        shape = draw(st.sampled_from([(batch, 1), (batch, 2), (batch, k)]))
        td = td.clone()
        td["advantage"] = torch.zeros(shape)
        return td, ValueError, r"advantage .*must be \[B\]", [shape[1:]]
    if kind == "sample_dtype":
        td = td.clone()
        td["sample"] = td["sample"].round().to(draw(st.sampled_from([torch.long, torch.int32, torch.uint8])))
        return td, ValueError, r"sample must be a floating-point tensor", []
    # The rest changes a size TensorDict itself would refuse: use an unbatched container.
    flat = TensorDict(dict(td.items()), batch_size=[])
    if kind == "pairs_data":
        other_shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3).filter(lambda s: tuple(s) != data_shape))
        flat["pairs"] = ELBOSurrogate(k, sharing="none").sample_pairs(torch.zeros(batch, *other_shape))
        return flat, ValueError, r"pairs\['noise'\] must be \(B, K, \*D\)", [len(other_shape)]
    if kind == "pairs_batch":
        other = draw(st.sampled_from([batch - 1, batch + 1, batch + 2]))
        flat["pairs"] = ELBOSurrogate(k, sharing="none").sample_pairs(torch.zeros(other, *data_shape))
        return flat, ValueError, rf"pairs\['t'\] must be \(B, K\) with B={batch}", [other - batch]
    if kind == "pairs_k":
        extra = draw(st.integers(1, 2))
        flat["pairs"] = TensorDict({"t": td["pairs", "t"], "noise": torch.randn(batch, k + extra, *data_shape)}, batch_size=[batch])
        return flat, ValueError, r"pairs\['noise'\] must be \(B, K, \*D\)", [extra]
    if kind == "pairs_type":
        flat["pairs"] = td["pairs", "t"]
        return flat, TypeError, r"pairs must be the TensorDict", []
    if kind == "pairs_device":
        flat["pairs"] = td["pairs"].to("meta")
        # The loss checks every batch entry against the model's device before the estimator sees it.
        return flat, ValueError, r"pairs \(the (stored )?timestep-noise pairs\) is on meta but the model is on cpu", []
    if kind == "cond_batch" and cond_dim:
        flat["cond"] = torch.zeros(batch + draw(st.sampled_from([-1, 1, 3])), cond_dim)
        return flat, ValueError, rf"cond must have batch size {batch}", []
    return None


@FUZZ_LOSS
@given(data=st.data())
def test_fuzz_vgrpo_loss(data):
    draw = data.draw
    model, est, td, dims = draw(elbo_batches(with_old=True))
    batch, k, data_shape, cond_dim = dims
    kind = draw(st.sampled_from(LOSS_MALFORMATIONS))
    on_policy = draw(st.booleans())
    behaviour_kl_coef = None if on_policy else draw(st.sampled_from([None, 0.0, 0.3]))
    ref_kl_coef = draw(st.sampled_from([None, 1.0]))
    kwargs = dict(clip_range=draw(st.sampled_from([0.01, (0.005, 0.03), 0.2])), behaviour_kl_coef=behaviour_kl_coef,
                  ref_model=None if ref_kl_coef is None else copy.deepcopy(model), ref_kl_coef=ref_kl_coef,
                  on_policy=on_policy, unconditional=cond_dim == 0)
    sig = ["VGRPOLoss", kind, batch, k, len(data_shape), cond_dim, on_policy, behaviour_kl_coef is not None, ref_kl_coef is not None]
    if on_policy:
        td = td.exclude("old_log_prob")
    if behaviour_kl_coef is None:
        td = td.exclude("old_x_pred")

    if kind == "bad_constructor":
        name = draw(st.sampled_from(["clip_range", "behaviour_kl_coef", "ref_kl_coef"]))
        value = draw(st.sampled_from(
            {"clip_range": [-0.1, 1.0, float("nan"), (0.1,), (0.1, 0.1, 0.1), (0.1, -1.0), "0.1", (float("nan"), 0.1)],
             "behaviour_kl_coef": [float("nan"), -0.1, float("inf"), -float("inf")],
             "ref_kl_coef": [float("nan"), -1.0, float("inf")]}[name]))
        kwargs[name] = value
        if name == "ref_kl_coef":
            kwargs["ref_model"] = copy.deepcopy(model)
        record("vgrpo", *sig, name, value)
        expect_error(lambda: VGRPOLoss(model, est, **kwargs), (ValueError, TypeError), rf"{name} must")
        return
    loss = VGRPOLoss(model, est, **kwargs)
    required = [key for key in loss.in_keys]
    malformed = None
    if kind == "old_log_prob_shape" and not on_policy:
        bad = td.clone()
        shape = draw(st.sampled_from([(batch, 1), (batch, k)]))
        bad["old_log_prob"] = torch.zeros(shape)
        malformed = bad, ValueError, r"old_log_prob \(.*\) must be \[B\]", [shape[1:]]
    elif kind == "old_x_pred_shape" and behaviour_kl_coef is not None:
        bad = td.clone()
        bad["old_x_pred"] = torch.zeros(batch, k, *data_shape, 2)
        malformed = bad, ValueError, r"old_x_pred \(.*\) must be \[B, K, \*D\]", []
    elif kind not in ("valid", "unknown_option", "old_log_prob_shape", "old_x_pred_shape"):
        malformed = _malform_elbo_batch(draw, kind, td, dims, required)
    if malformed is None:
        record("vgrpo", "VGRPOLoss", "valid", *sig[2:])
        out = loss(td)
        assert_finite(out)
        assert set(loss.out_keys) <= set(out.keys())
        return
    bad, errors, pattern, extra = malformed
    record("vgrpo", *sig, *extra)
    expect_error(lambda: loss(bad), errors, pattern)


@FUZZ_LOSS
@given(data=st.data())
def test_fuzz_diffusion_nft_loss(data):
    draw = data.draw
    model, est, td, dims = draw(elbo_batches(with_old=False))
    batch, k, data_shape, cond_dim = dims
    kind = draw(st.sampled_from(LOSS_MALFORMATIONS))
    ref_kl_coef = draw(st.sampled_from([None, 1e-4]))
    kwargs = dict(strength=draw(st.sampled_from([1.0, 0.1, 0.5])), advantage_max=draw(st.sampled_from([5.0, 1.0])),
                  ref_model=None if ref_kl_coef is None else copy.deepcopy(model), ref_kl_coef=ref_kl_coef, unconditional=cond_dim == 0)
    sig = ["DiffusionNFTLoss", kind, batch, k, len(data_shape), cond_dim, ref_kl_coef is not None]
    old_model = copy.deepcopy(model)
    if kind == "bad_constructor":
        name = draw(st.sampled_from(["strength", "advantage_max", "ref_kl_coef"]))
        value = draw(st.sampled_from(BAD_NUMBERS + ["1"]))
        kwargs[name] = value
        if name == "ref_kl_coef":
            if value == 0.0:
                value = kwargs[name] = -0.5
            kwargs["ref_model"] = copy.deepcopy(model)
        record("nft", *sig, name, value)
        expect_error(lambda: DiffusionNFTLoss(model, old_model, est, **kwargs), (ValueError, TypeError), rf"{name}( must|=)")
        return
    loss = DiffusionNFTLoss(model, old_model, est, **kwargs)
    malformed = None
    if kind not in ("valid", "unknown_option", "old_log_prob_shape", "old_x_pred_shape"):
        malformed = _malform_elbo_batch(draw, kind, td, dims, list(loss.in_keys))
    if malformed is None:
        record("nft", "DiffusionNFTLoss", "valid", *sig[2:])
        out = loss(td)
        assert_finite(out)
        return
    bad, errors, pattern, extra = malformed
    record("nft", *sig, *extra)
    expect_error(lambda: loss(bad), errors, pattern)


@FUZZ_LOSS
@given(data=st.data())
def test_fuzz_flow_grpo_loss(data):
    draw = data.draw
    batch = draw(st.integers(1, 4))
    data_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    cond_dim = draw(st.integers(0, 2))
    num_steps = draw(st.integers(1, 3))
    noise_level = draw(st.sampled_from([0.7, 0.3, 1.0]))
    reduction = draw(st.sampled_from(LOG_PROB_REDUCTIONS))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    model = TinyVelocity(data_shape, cond_dim, seed=seed)
    cond = torch.randn(batch, cond_dim, generator=generator) if cond_dim else None
    with torch.no_grad():
        _, traj = sample_sde(model, torch.randn((batch, *data_shape), generator=generator), time_grid(num_steps, shift=3.0),
                             cond, noise_level=noise_level, generator=generator, log_prob_reduction=reduction)
    steps = traj.shape[1]
    rows = traj.exclude("log_prob")
    rows["old_log_prob"] = traj["log_prob"]
    rows["advantage"] = torch.randn(batch, generator=generator)[:, None].expand(batch, steps)
    if cond is not None:
        rows["cond"] = cond[:, None].expand(batch, steps, cond_dim)
    flatten = draw(st.booleans())
    rows = rows.reshape(-1) if flatten else rows
    n = batch * steps
    ref_kl_coef = draw(st.sampled_from([None, 0.01]))
    kwargs = dict(clip_range=draw(st.sampled_from([1e-4, 0.2])), noise_level=noise_level, log_prob_reduction=reduction,
                  advantage_clip=5.0, ref_model=None if ref_kl_coef is None else copy.deepcopy(model), ref_kl_coef=ref_kl_coef,
                  unconditional=cond_dim == 0)
    kind = draw(st.sampled_from(["valid", "missing_key", "empty", "z_next_shape", "t_shape", "advantage_shape",
                                 "old_log_prob_shape", "bad_constructor", "unknown_option"]))
    sig = ["FlowGRPOLoss", kind, batch, steps, len(data_shape), cond_dim, flatten, reduction, ref_kl_coef is not None]

    if kind in ("bad_constructor", "unknown_option"):
        if kind == "unknown_option":
            name, value = "log_prob_reduction", draw(unknown(LOG_PROB_REDUCTIONS))
            pattern = re.escape(f"Unknown log-prob reduction {value!r}")
        else:
            name = draw(st.sampled_from(["clip_range", "noise_level", "advantage_clip", "ref_kl_coef"]))
            value = draw(st.sampled_from({"clip_range": [-1e-4, 1.0, float("nan"), (1e-4,)],
                                          "noise_level": [0.0, -0.7, float("nan"), float("inf")],
                                          "advantage_clip": [0.0, -5.0, float("nan")],
                                          "ref_kl_coef": [float("nan"), -0.01, float("inf")]}[name]))
            pattern = rf"{name} must"
            if name == "ref_kl_coef":
                kwargs["ref_model"] = copy.deepcopy(model)
        kwargs[name] = value
        record("flow_grpo", *sig, name, value)
        expect_error(lambda: FlowGRPOLoss(model, **kwargs), (ValueError, TypeError), pattern)
        return

    loss = FlowGRPOLoss(model, **kwargs)
    flat = rows.reshape(-1)
    errors, pattern = ValueError, None
    bad = rows
    if kind == "missing_key":
        missing = draw(st.sampled_from(list(loss.in_keys)))
        bad, errors, pattern = rows.exclude(missing), KeyError, rf"The batch has no entry '{missing}'"
        sig.append(missing)
    elif kind == "empty":
        bad, pattern = flat[:0], r"batch of transitions is empty"
    elif kind == "z_next_shape":
        bad = flat.clone()
        other = draw(st.sampled_from([(1,), (*data_shape, 2), (math.prod(data_shape) + 1,)]))
        bad["z_next"] = torch.zeros(n, *other)
        pattern = r"z_next \(.*\) must have the shape of z"
        sig.append(len(other))
    elif kind == "t_shape":
        bad = flat.clone()
        name = draw(st.sampled_from(["t", "t_next"]))
        bad[name] = bad[name][:, None].expand(n, draw(st.integers(1, 3))).contiguous()
        pattern = rf"{name} must hold one time per transition"
        sig.append(name)
    elif kind in ("advantage_shape", "old_log_prob_shape"):
        name = kind.removesuffix("_shape")
        bad = flat.clone()
        bad[name] = bad[name][:, None].expand(n, draw(st.integers(1, 2))).contiguous()
        pattern = rf"{name} \(.*\) .*must have one entry per transition"
    record("flow_grpo", *sig)
    if pattern is None:
        out = loss(rows)
        assert_finite(out)
    else:
        expect_error(lambda: loss(bad), errors, pattern)


# ------------------------------------------------------------------------------------------ samplers


@FUZZ
@given(data=st.data())
def test_fuzz_samplers(data):
    draw = data.draw
    kind = draw(st.sampled_from(["valid", "time_grid_args", "bad_grid", "z_dtype", "z_type", "unknown_method",
                                 "unknown_path", "noise_level", "sde_steps", "unknown_reduction"]))
    entry = draw(st.sampled_from(["euler", "heun", "dpmpp_2m", "ode", "sde"]))
    batch, data_shape = draw(st.integers(1, 3)), tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    num_steps, shift = draw(st.integers(1, 4)), draw(st.sampled_from([1.0, 3.0, 0.5]))
    sig = ["sampler", entry, kind, num_steps, len(data_shape)]
    if kind == "time_grid_args":
        name = draw(st.sampled_from(["num_steps", "shift", "t_max", "t_min"]))
        value = draw(st.sampled_from({"num_steps": [0, -2, 2.5, "4"], "shift": BAD_NUMBERS, "t_max": [1.5, float("nan"), 0.0, -0.5],
                                      "t_min": [-0.1, float("nan"), 1.0, 2.0]}[name]))
        record("samplers", "time_grid", kind, name, value)
        expect_error(lambda: time_grid(**{"num_steps": 3, name: value}), (ValueError, TypeError), rf"{name}")
        return
    grid = time_grid(num_steps, shift=shift)
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    z = torch.randn((batch, *data_shape), generator=generator, dtype=draw(st.sampled_from([torch.float32, torch.float64])))
    model = TinyVelocity(data_shape)
    kwargs, method, path = {}, draw(st.sampled_from(tuple(ODE_SOLVERS))), "rectified_flow"
    errors, pattern = ValueError, None
    if kind == "bad_grid":
        how = draw(st.sampled_from(["nan", "increasing", "repeated", "above_one", "below_zero", "short"]))
        grid = list(grid)
        if how == "nan":
            grid[draw(st.integers(0, len(grid) - 1))] = float("nan")
        elif how == "increasing":
            grid = grid[::-1]
        elif how == "repeated":
            grid.insert(1, grid[0] if draw(st.booleans()) else grid[-1])
        elif how == "above_one":
            grid[0] = 1.0 + draw(st.floats(1e-3, 5))
        elif how == "below_zero":
            grid[-1] = -draw(st.floats(1e-3, 5))
        else:
            grid = grid[:1] if draw(st.booleans()) else []
        pattern = r"grid must be a strictly decreasing sequence"
        sig.append(how)
    elif kind == "z_dtype":
        z = z.round().to(draw(st.sampled_from([torch.long, torch.int32, torch.bool])))
        pattern = r"noise \(the initial state at grid\[0\]\) must be a floating-point tensor"
    elif kind == "z_type":
        z, errors, pattern = z.tolist(), TypeError, r"noise must be a torch.Tensor"
    elif kind == "unknown_method":
        entry, method = "ode", draw(unknown(ODE_SOLVERS))
        pattern = re.escape(f"Unknown ODE solver {method!r}")
    elif kind == "unknown_path":
        entry, path = "dpmpp_2m", draw(unknown(PATHS))
        pattern = re.escape(f"Unknown path {path!r}")
    elif kind == "noise_level":
        entry, kwargs["noise_level"] = "sde", draw(st.sampled_from([0.0, -0.5, float("nan"), float("inf")]))
        pattern = r"noise_level must be > 0"
    elif kind == "sde_steps":
        entry = "sde"
        kwargs["sde_steps"] = draw(st.sampled_from([[], [num_steps], [-1], [0, num_steps + 2]]))
        pattern = r"sde_steps must be a non-empty subset"
    elif kind == "unknown_reduction":
        entry, kwargs["log_prob_reduction"] = "sde", draw(unknown(LOG_PROB_REDUCTIONS))
        pattern = re.escape(f"Unknown log-prob reduction {kwargs['log_prob_reduction']!r}")
    sig[1] = entry

    def call():
        if entry == "euler":
            return sample_euler(model, z, grid)
        if entry == "heun":
            return sample_heun(model, z, grid)
        if entry == "dpmpp_2m":
            return sample_dpmpp_2m(model, z, grid, path=path)
        if entry == "ode":
            return sample_ode(model, z, grid, method=method)
        return sample_sde(model, z, grid, generator=generator, **kwargs)

    record("samplers", *sig)
    if pattern is None:
        with torch.no_grad():
            out = call()
        assert_finite(out)
    else:
        expect_error(call, errors, pattern)


# --------------------------------------------------------------------------------- objectives, control


@FUZZ
@given(data=st.data())
def test_fuzz_objectives(data):
    draw = data.draw
    kind = draw(st.sampled_from(["kl_estimator", "log_prob_reduction", "kl_reduction", "soft_clip_eta", "x_space_kl_shapes", "valid"]))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=4)))
    x = torch.randn(shape)
    if kind == "kl_estimator":
        name = draw(unknown(KL_ESTIMATORS))
        call, errors, pattern = (lambda: kl_estimate(x, name)), ValueError, re.escape(f"Unknown KL estimator {name!r}")
    elif kind == "log_prob_reduction":
        name = draw(unknown(LOG_PROB_REDUCTIONS))
        call, errors, pattern = (lambda: gaussian_log_prob(x, x, 1.0, name)), ValueError, re.escape(f"Unknown log-prob reduction {name!r}")
    elif kind == "kl_reduction":
        name = draw(unknown(LOG_PROB_REDUCTIONS))
        call, errors, pattern = (lambda: gaussian_kl_same_std(x, x, 1.0, name)), ValueError, re.escape(f"Unknown KL reduction {name!r}")
    elif kind == "soft_clip_eta":
        eta = draw(st.sampled_from(BAD_NUMBERS + ["3"]))
        call, errors, pattern = (lambda: soft_clip(x, eta)), (ValueError, TypeError), r"soft-clip eta must"
        shape = shape + (eta,)
    elif kind == "x_space_kl_shapes":
        other = tuple(draw(st.lists(st.integers(1, 3), min_size=2, max_size=4).filter(lambda s: tuple(s) != shape)))
        call, errors, pattern = (lambda: x_space_kl(x, torch.randn(other))), ValueError, r"x-space KL needs equal shapes"
        shape = shape + other
    else:
        record("objectives", kind, shape)
        for out in (kl_estimate(x.clamp(-5, 5), draw(st.sampled_from(KL_ESTIMATORS))), soft_clip(x, draw(st.floats(0.1, 10))),
                    x_space_kl(x, x + 1) if x.ndim >= 2 else x):
            assert_finite(out)
        return
    record("objectives", kind, shape)
    expect_error(call, errors, pattern)


@FUZZ
@given(data=st.data())
def test_fuzz_control(data):
    draw = data.draw
    kind = draw(st.sampled_from(["schedule_steps", "sde_window", "ema_decay", "ema_lists", "adaptive_kl", "old_policy_decay", "valid"]))
    bad_int = st.sampled_from([0, -1, 2.5, "3", None])
    if kind == "schedule_steps":
        cls, steps = draw(st.sampled_from([Linear, Cosine])), draw(bad_int)
        record("control", kind, cls.__name__, steps)
        expect_error(lambda: cls(1.0, 0.0, steps), ValueError, r"steps must be a positive integer")
    elif kind == "sde_window":
        name = draw(st.sampled_from(["num_steps", "size", "shift_interval", "stride"]))
        value = draw(bad_int)
        kwargs = {"num_steps": 5, "size": 2, **{name: value}}
        record("control", kind, name, value)
        expect_error(lambda: SDEWindow(**kwargs), ValueError, rf"{name} must be a positive integer")
    elif kind == "ema_decay":
        decay = draw(st.sampled_from([float("nan"), -0.1, 1.5, float("inf")]))
        record("control", kind, decay)
        expect_error(lambda: ema_update_([torch.zeros(2)], [torch.ones(2)], decay), ValueError, r"decay must be in \[0, 1\]")
    elif kind == "ema_lists":
        a, b = draw(st.integers(0, 3)), draw(st.integers(0, 3))
        if a == b:
            b += 1
        record("control", kind, a, b)
        expect_error(lambda: ema_update_([torch.zeros(1)] * a, [torch.zeros(1)] * b, 0.5), ValueError, rf"matching parameter lists, got {a} and {b}")
    elif kind == "adaptive_kl":
        name = draw(st.sampled_from(["init_coef", "target"]))
        value = draw(st.sampled_from(NON_FINITE + [-1.0] + ([0.0] if name == "target" else [])))
        kwargs = {"init_coef": 0.1, "target": 0.1, name: value}
        record("control", kind, name, value)
        expect_error(lambda: AdaptiveKLController(**kwargs), ValueError, r"init_coef >= 0 and target > 0")
    elif kind == "old_policy_decay":
        name = draw(st.sampled_from(["rate", "max_decay"]))
        value = draw(st.sampled_from([float("nan"), -0.1, float("inf")] + ([1.5] if name == "max_decay" else [])))
        record("control", kind, name, value)
        expect_error(lambda: OldPolicyDecay(**{name: value}), ValueError, rf"{name} must be")
    else:
        steps = draw(st.integers(1, 50))
        record("control", kind, steps)
        for schedule in (Linear(1.0, 0.0, steps), Cosine(1.0, 0.0, steps)):
            assert_finite([schedule(s) for s in range(-1, steps + 2)])
        decay = OldPolicyDecay(draw(st.floats(0, 0.1)), draw(st.floats(0, 1)))
        target, source = [torch.zeros(3)], [torch.ones(3)]
        ema_update_(target, source, decay(steps))
        assert_finite(target)
        assert list(SDEWindow(5, draw(st.integers(1, 5)))(steps))


# ---------------------------------------------------------------------------------------------- config

FLOAT_RULES = {  # key -> out-of-range values (NaN/inf are refused for every float key)
    "optim.lr": ["0", "-1e-4"],
    "optim.weight_decay": ["-0.1"],
    "optim.max_grad_norm": ["0", "-1"],
    "rollout.shift": ["0", "-3"],
    "advantage.soft_clip": ["0", "-3"],
    "advantage.clip": ["0", "-5"],
    "vgrpo.clip_range": ["1", "1.5", "-0.01", "0.01,-0.01", "1,0.01", "(0.01,nan)", "0.01,inf"],
    "vgrpo.behaviour_kl_coef": ["-0.3"],
    "vgrpo.ref_kl_coef": ["-1"],
    "flow_grpo.noise_level": ["0", "-0.7"],
    "flow_grpo.clip_range": ["-1e-4", "1", "1e-4,-1e-4"],
    "flow_grpo.ref_kl_coef": ["-0.01"],
    "diffusion_nft.strength": ["0", "-1"],
    "diffusion_nft.decay_rate": ["-0.001"],
    "diffusion_nft.decay_max": ["1.5", "-0.1"],
    "diffusion_nft.ref_kl_coef": ["-1e-4"],
    "diffusion_nft.timestep_fraction": ["0", "1.5"],
    "flow_grpo.timestep_fraction": ["0", "1.5"],
    "flow_grpo.cfg_scale": ["0", "-1"],
    "optim.ema_decay": ["1.5", "-0.1"],
    "advantage.eps": ["-1e-4"],
}
INT_RULES = {  # key -> out-of-range values
    "iterations": ["0", "-1"], "prompts_per_iteration": ["0"], "group_size": ["1", "0"], "checkpoint_every": ["0"],
    "reward_retries": ["-1"], "rollout.num_steps": ["0"], "optim.epochs": ["0"], "optim.minibatch_size": ["0"],
    "optim.max_nonfinite_steps": ["0"], "vgrpo.num_pairs": ["0", "-4"], "vgrpo.chunk_size": ["0"],
    "flow_grpo.window_size": ["0", "1000"], "flow_grpo.window_shift_interval": ["0"],
    "optim.minibatches": ["0"], "optim.ema_every": ["0"], "diffusion_nft.decay_flat": ["-1"],
    "eval.every": ["-1"], "eval.per_prompt": ["0"], "eval.num_steps": ["0"],
    "model.lora_rank": ["0"], "model.lora_alpha": ["-8"], "model.max_sequence_length": ["-1"], "model.batch_size": ["0"],
}
STR_RULES = {"model.image_size": ["100", "0", "512x", "16x-16", "axb", "1x2x3"]}  # key -> malformed values
RULES = {**FLOAT_RULES, **INT_RULES, **STR_RULES}


def _base(key: str) -> TrainConfig:
    """The testbed config of the algorithm that uses ``key`` (a shared key: V-GRPO's, which reads them all)."""
    section = getattr(TrainConfig(), key.partition(".")[0], None)
    return build_config(section.algorithms[0] if isinstance(section, AlgorithmSection) else "vgrpo", None, "testbed", [])


def _field_kind(key: str):
    config = _base(key)
    section, _, name = key.rpartition(".")
    value = getattr(getattr(config, section) if section else config, name)
    field_type = TrainConfig.__dataclass_fields__ if not section else type(getattr(config, section)).__dataclass_fields__
    annotation = str(field_type[name].type)
    return value, annotation


@FUZZ
@given(data=st.data())
def test_fuzz_config_overrides(data):
    draw = data.draw
    keys = valid_keys()
    kind = draw(st.sampled_from(["out_of_range", "non_finite", "wrong_type", "unknown_option", "unknown_key",
                                 "unknown_section", "no_equals", "from_dict_type", "valid"]))
    key = draw(st.sampled_from(keys))
    value, annotation = _field_kind(key)
    base = "int" if annotation.startswith("int") else "float" if annotation.startswith("float") else "str" if annotation.startswith("str") else "bool"
    if kind == "out_of_range" and key in RULES:
        text = draw(st.sampled_from(RULES[key]))
    elif kind == "non_finite" and base == "float":
        text = draw(st.sampled_from(["nan", "inf", "-inf", "NaN", "Infinity"]))
    elif kind == "wrong_type" and base in ("int", "float"):
        text = draw(st.sampled_from(["fast", "", "1,5", "0x"] + (["1.5", "1e3", "nan"] if base == "int" else [])))
    elif kind == "unknown_option":
        key = draw(st.sampled_from(sorted(OPTIONS) + ["algo"]))
        text = draw(unknown(OPTIONS.get(key, ("vgrpo", "flow_grpo", "diffusion_nft"))).filter(lambda s: "=" not in s))
        record("config", kind, key, text == "")
        name = "algorithm" if key == "algo" else key
        expect_error(lambda: apply_overrides(_base(key), [f"{key}={text}"]), ValueError, rf"Unknown {re.escape(name)} {re.escape(repr(text))}")
        return
    elif kind == "unknown_key":
        bad_key = key + draw(st.text(string.ascii_lowercase + "_", min_size=1, max_size=4).filter(lambda t: key + t not in keys))
        record("config", kind, key)
        expect_error(lambda: apply_overrides(TrainConfig(), [f"{bad_key}=1"]), ValueError, rf"Unknown config key '{re.escape(bad_key)}'")
        return
    elif kind == "unknown_section":
        section = draw(st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(lambda s: s not in {"rollout", "optim", "advantage", "vgrpo", "flow_grpo", "diffusion_nft", "eval",
                                                                              "model", "distributed"}))
        record("config", kind, len(section))
        expect_error(lambda: apply_overrides(TrainConfig(), [f"{section}.{key.rpartition('.')[2]}=1"]), ValueError, rf"Unknown config (section|key) '{re.escape(section)}")
        return
    elif kind == "no_equals":
        record("config", kind, key)
        expect_error(lambda: apply_overrides(TrainConfig(), [key]), ValueError, r"must look like key=value")
        return
    elif kind == "from_dict_type":
        # A string is the right type for a str field (e.g. task="x"; unknown task names are refused when the
        # trainer loads the task), so "x" is a wrong type only for the other fields.
        wrong = draw(st.sampled_from([[], {}, True] + ([] if base == "str" else ["x"]) + ([1.5] if base == "int" else [])
                                     + ([3] if base == "str" else [])))
        section, _, name = key.rpartition(".")
        payload = _base(key).to_dict()
        (payload[section] if section else payload)[name] = wrong
        record("config", kind, key, type(wrong).__name__)
        if base == "bool" and isinstance(wrong, bool):
            return
        expect_error(lambda: TrainConfig.from_dict(payload), ValueError, rf"{re.escape(key)}")
        return
    else:
        kind = "valid"
    if kind == "valid":
        text = "none" if value is None else str(value)
        record("config", kind, key)
        config = apply_overrides(_base(key), [f"{key}={text}"])
        assert config == _base(key)
        return
    record("config", kind, key, text)
    expect_error(lambda: apply_overrides(_base(key), [f"{key}={text}"]), ValueError, re.escape(key))


# ------------------------------------------------------------------------------------------- the count


FUZZ_RUNNERS = {
    "advantages": test_fuzz_group_advantage_and_statistics, "elbo": test_fuzz_elbo_surrogate,
    "vgrpo": test_fuzz_vgrpo_loss, "flow_grpo": test_fuzz_flow_grpo_loss, "nft": test_fuzz_diffusion_nft_loss,
    "samplers": test_fuzz_samplers, "objectives": test_fuzz_objectives, "control": test_fuzz_control,
    "config": test_fuzz_config_overrides,
}


def test_zz_distinct_fuzz_cases(tmp_path_factory, request):
    """More than MIN_DISTINCT_CASES distinct case signatures were tried, whatever the test order or selection:
    the fuzz tests that have not run in this session run here first (each is derandomized, so it tries the same
    cases whenever it runs, and the count is the same in any order)."""
    assert set(FUZZ_RUNNERS) == FUZZ_TESTS
    for name, run in FUZZ_RUNNERS.items():
        if name not in RAN:
            run()
    assert RAN == FUZZ_TESTS
    per_test = Counter(signature[0] for signature in CASES)
    report = {
        "distinct_cases": len(CASES),
        "examples": sum(CASES.values()),
        "per_entry_point": dict(sorted(per_test.items())),
        "minimum": MIN_DISTINCT_CASES,
    }
    path = tmp_path_factory.getbasetemp() / "fuzz_public_api_cases.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"\nfuzz_public_api: {len(CASES)} distinct bad/valid input cases over {sum(CASES.values())} examples "
          f"({dict(sorted(per_test.items()))}); written to {path}")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"fuzz_public_api: {len(CASES)} distinct cases tried (minimum {MIN_DISTINCT_CASES})")
    assert len(CASES) > MIN_DISTINCT_CASES, report
    assert min(per_test.values()) >= 30, report  # every entry point was fuzzed, not only a few
