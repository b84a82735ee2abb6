"""DGPO (Luo, Hu and Tang, ICLR 2026): the loss against the official formula, its invariants, the algorithm in the
shared trainer and its official settings.

The official formula is transcribed here from Luo-Yihong/DGPO, scripts/train_sd3_dgpo.py (commit 01ceb4b):
``compute_group_dgpo_loss_allreduce`` (one process: the all-reduce of the group sums is the identity) and the
training loop of ``main`` (the v-MSE ``dsm_loss``, the ``clip_dsm`` gradient stop against the soft-updated copy,
the KL ``beta * mean (model_v - ref_v)^2``; each of the M trained timesteps is one accumulation step, so the
gradient step averages over them).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from vgrpo_lib import DGPOLoss, ELBOSurrogate, dgpo_group_weight
from vgrpo_lib.algorithms.presets import OFFICIAL, build_config
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.timesteps import DiscreteGrid


def official_dgpo_step(model_v, ref_v, target_v, advantages, group_ids, beta_dpo, group_size, old_v=None,
                       clip_range=None, kl_ref_v=None, kl_beta=0.0):
    """The official loss of ONE trained timestep, ``[B, *D]`` inputs (transcribed; see the module docstring)."""
    batch = model_v.shape[0]
    dsm_loss = (target_v - model_v).square().reshape(batch, -1).mean(dim=1)
    if old_v is not None:
        old_dsm_loss = (target_v - old_v).square().reshape(batch, -1).mean(dim=1)
        ratio = torch.exp(-dsm_loss + old_dsm_loss)
        should_clip = torch.where(advantages > 0, ratio > 1.0 + clip_range, ratio < 1.0 - clip_range)
        dsm_loss = torch.where(should_clip, dsm_loss.detach(), dsm_loss)
    ref_dsm_loss = (target_v - ref_v).square().reshape(batch, -1).mean(dim=1).detach()
    per_sample_term = advantages * beta_dpo * (dsm_loss.detach() - ref_dsm_loss) / group_size
    _, index = torch.unique(group_ids, return_inverse=True)
    group_sums = torch.zeros(int(index.max()) + 1, dtype=per_sample_term.dtype).scatter_add_(0, index, per_sample_term)
    weights = torch.sigmoid(group_sums)[index]
    loss = (weights.detach() * advantages * dsm_loss).mean()
    if kl_beta > 0:
        loss = loss + kl_beta * (model_v - kl_ref_v).square().reshape(batch, -1).mean(dim=1).mean()
    return loss


class Linear(torch.nn.Module):
    """A tiny conditional velocity model on ``[B, 3, 2]`` samples."""

    def __init__(self, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(6, 6, generator=generator, dtype=torch.float64) * 0.3)
        self.time = torch.nn.Parameter(torch.randn(6, generator=generator, dtype=torch.float64))

    def forward(self, z, t, cond):
        flat = z.flatten(1)
        return (flat @ self.weight + t[:, None] * self.time + cond).view_as(z)


def _batch(seed: int, groups: int = 3, group_size: int = 4, pairs: int = 3):
    generator = torch.Generator().manual_seed(seed)
    batch = groups * group_size
    sample = torch.randn(batch, 3, 2, generator=generator, dtype=torch.float64)
    group = torch.arange(groups).repeat_interleave(group_size)
    reward = torch.randn(batch, generator=generator, dtype=torch.float64)
    advantage = (reward - reward.view(groups, -1).mean(1).repeat_interleave(group_size)) * 2
    cond = torch.randn(batch, 6, generator=generator, dtype=torch.float64)
    estimator = ELBOSurrogate(pairs, DiscreteGrid([1.0, 0.9, 0.75, 0.6, 0.4]), sharing="group", weighting="v")
    td = TensorDict({"sample": sample, "cond": cond, "advantage": advantage, "group": group}, batch_size=[batch])
    td["pairs"] = estimator.sample_pairs(sample, group, generator)
    return estimator, td


def _official_over_pairs(td, model, ref, beta, group_size, old_model=None, clip_range=None, kl_beta=0.0):
    """The official step loss averaged over the K pairs (the M accumulated timesteps)."""
    losses = []
    for k in range(td["pairs"].shape[1]):
        t, noise, x = td["pairs", "t"][:, k], td["pairs", "noise"][:, k], td["sample"]
        xt = (1 - t)[:, None, None] * x + t[:, None, None] * noise
        extra = {}
        with torch.no_grad():
            ref_v = ref(xt, t, td["cond"])
            if old_model is not None:
                extra = {"old_v": old_model(xt, t, td["cond"]), "clip_range": clip_range}
        if kl_beta:
            extra |= {"kl_ref_v": ref_v, "kl_beta": kl_beta}
        losses.append(official_dgpo_step(model(xt, t, td["cond"]), ref_v, noise - x, td["advantage"], td["group"],
                                         beta, group_size, **extra))
    return torch.stack(losses).mean()


def _gradient(loss, model):
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [1.0, 100.0])
def test_the_loss_and_its_gradient_equal_the_official_formula(seed, beta):
    estimator, td = _batch(seed)
    model, ref = Linear(seed), Linear(seed + 10)
    ours = DGPOLoss(model, estimator, ref, beta=beta)(td)["loss_objective"]
    official = _official_over_pairs(td, model, ref, beta, group_size=4)
    torch.testing.assert_close(ours, official, rtol=1e-12, atol=1e-14)
    for a, b in zip(_gradient(ours, model), _gradient(_official_over_pairs(td, model, ref, beta, 4), model)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("seed", [0, 3])
def test_the_clip_and_the_kl_equal_the_official_formula(seed):
    """With the copy far enough from the policy that some pairs clip and the KL to the base (coefficients exact in the
    loss's float32 buffers)."""
    estimator, td = _batch(seed)
    model, ref, old = Linear(seed), Linear(seed + 10), Linear(seed + 20)
    loss = DGPOLoss(model, estimator, ref, beta=50.0, old_model=old, clip_range=0.0625, ref_model=ref, ref_kl_coef=0.25)
    out = loss(td)
    assert 0 < out["clip_fraction_active"].item() < 1
    ours = out["loss_objective"] + out["loss_ref_kl"]
    official = _official_over_pairs(td, model, ref, 50.0, 4, old_model=old, clip_range=0.0625, kl_beta=0.25)
    torch.testing.assert_close(ours, official, rtol=1e-12, atol=1e-14)
    for a, b in zip(_gradient(ours, model), _gradient(
            _official_over_pairs(td, model, ref, 50.0, 4, old_model=old, clip_range=0.0625, kl_beta=0.25), model)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    pairs=st.integers(1, 3),
    beta=st.floats(0.1, 200.0),
    seed=st.integers(0, 2**16),
)
def test_the_group_weight_is_the_sigmoid_of_the_groups_advantage_weighted_gap(sizes, pairs, beta, seed):
    """Groups of any size in any order: w_gk = sigmoid(beta / |g| sum_{i in g} A_i (l_ik - l^ref_ik))."""
    generator = torch.Generator().manual_seed(seed)
    group = torch.tensor([g for g, n in enumerate(sizes) for _ in range(n)])
    group = group[torch.randperm(group.numel(), generator=generator)] * 7  # arbitrary labels, shuffled
    advantage = torch.randn(group.numel(), generator=generator, dtype=torch.float64)
    loss, ref_loss = (torch.rand(group.numel(), pairs, generator=generator, dtype=torch.float64) for _ in range(2))
    weight = dgpo_group_weight(advantage, loss, ref_loss, group, beta)
    for i in range(group.numel()):
        members = group == group[i]
        gap = (advantage[members, None] * (loss[members] - ref_loss[members])).sum(0) / members.sum()
        torch.testing.assert_close(weight[i], torch.sigmoid(beta * gap), rtol=1e-12, atol=1e-15)
    # Negating a group's advantages swaps its positive and negative members: w -> 1 - w.
    torch.testing.assert_close(dgpo_group_weight(-advantage, loss, ref_loss, group, beta), 1 - weight)


def test_the_gradient_is_the_group_dpo_loss_gradient():
    """The surrogate's gradient is (1 / beta) times the gradient of mean_{g, k} -log sigmoid(R(G+) - R(G-)) =
    softplus(beta / |g| sum_{i in g} A_i (l_ik - l^ref_ik)) (equal group sizes): DGPO's group-level DPO loss."""
    estimator, td = _batch(4)
    model, ref = Linear(4), Linear(14)
    beta = 30.0
    surrogate = DGPOLoss(model, estimator, ref, beta=beta)(td)["loss_objective"]
    inputs = estimator.noised(td["sample"], td["cond"], td["pairs"])
    loss, _ = estimator.pair_loss(estimator.predict(model, inputs), inputs)
    with torch.no_grad():
        ref_loss, _ = estimator.pair_loss(estimator.predict(ref, inputs), inputs)
    score = (td["advantage"][:, None] * (loss - ref_loss)).view(3, 4, -1).mean(1)  # [groups, K]
    dpo = torch.nn.functional.softplus(beta * score).mean() / beta
    for a, b in zip(_gradient(surrogate, model), _gradient(dpo, model)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_zero_advantages_give_zero_loss_and_gradient_and_the_reference_itself_weighs_one_half():
    estimator, td = _batch(5)
    model = Linear(5)
    zero = td.clone()
    zero["advantage"] = torch.zeros_like(td["advantage"])
    out = DGPOLoss(model, estimator, Linear(15))(zero)
    assert out["loss_objective"].item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in _gradient(out["loss_objective"], model))
    # theta == reference: every group weighs 1/2, the loss is half the advantage-weighted matching loss (AWM's).
    out = DGPOLoss(model, estimator, model)(td)
    assert out["preference_weight"].item() == 0.5 and out["reference_gap"].item() == 0.0
    inputs = estimator.noised(td["sample"], td["cond"], td["pairs"])
    matching, _ = estimator.pair_loss(estimator.predict(model, inputs), inputs)
    torch.testing.assert_close(out["loss_objective"], 0.5 * (td["advantage"][:, None] * matching).mean())


def test_the_loss_is_invariant_to_the_order_of_the_rows():
    estimator, td = _batch(6)
    model, ref = Linear(6), Linear(16)
    loss = DGPOLoss(model, estimator, ref, beta=80.0, old_model=Linear(26), clip_range=0.05)
    permutation = torch.randperm(td.shape[0], generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(loss(td[permutation])["loss_objective"], loss(td)["loss_objective"], rtol=1e-12, atol=0)


def test_on_policy_the_clip_is_inert_and_bad_inputs_are_named():
    estimator, td = _batch(7)
    model = Linear(7)
    out = DGPOLoss(model, estimator, Linear(17), old_model=model, clip_range=1e-6)(td)
    assert out["clip_fraction"].item() == 0.0 and out["ratio_max"].item() == 1.0
    with pytest.raises(ValueError, match="old_model"):
        DGPOLoss(model, estimator, model, clip_range=0.01)
    with pytest.raises(ValueError, match="ref_model and ref_kl_coef"):
        DGPOLoss(model, estimator, model, ref_kl_coef=0.1)
    with pytest.raises(ValueError, match="beta"):
        DGPOLoss(model, estimator, model, beta=0.0)
    with pytest.raises(KeyError, match="group"):
        DGPOLoss(model, estimator, model)(td.exclude("group"))
    loss = DGPOLoss(model, estimator, model)
    loss.set_keys(group="prompt")
    assert "prompt" in loss.in_keys and torch.isfinite(loss(td.rename_key_("group", "prompt"))["loss_objective"])


# --- the algorithm in the shared trainer ---------------------------------------------------------------------------


def test_dgpo_trains_end_to_end_with_group_shared_pairs_on_the_first_grid_steps(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("dgpo", "dgpo.last_trained_step=3", "dgpo.num_pairs=3"), tmp_path / "run",
                      progress=False)
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    trainer.train()
    assert [row["iteration"] for row in trainer.metrics] == [0, 1]
    assert not all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    assert trainer.metrics[0]["preference_weight"] == 0.5  # the policy starts as the base
    algorithm = trainer.algorithm
    pairs = algorithm.estimator.sample_pairs(torch.zeros(4, *algorithm.sample_shape), torch.tensor([0, 0, 1, 1]),
                                             torch.Generator().manual_seed(0))
    assert torch.equal(pairs[0].to_tensordict()["noise"], pairs[1]["noise"])  # shared within a group
    assert not torch.equal(pairs[1]["noise"], pairs[2]["noise"])
    assert bool(torch.isin(pairs["t"], torch.tensor(algorithm.grid[:4])).all())
    assert all(len(set(row.tolist())) == 3 for row in pairs["t"])  # distinct timesteps
    # Policy, base (the preference and nothing else: no KL) and the copy (the clip), 3 pairs each.
    assert trainer.metrics[-1]["nfe_update"] == 9


@pytest.mark.parametrize(
    "overrides, update_nfe",
    [
        # README Mode 2a: CFG-free rollout, the frozen base with CFG 4.5 in the preference and the KL, clip 1e-5:
        # 4 pairs x (policy + base with CFG (2) + copy).
        (["dgpo.reference_cfg_scale=4.5", "dgpo.ref_kl_coef=1e-3", "dgpo.clip_range=1e-5"], 16),
        # Mode 2b: the soft-updated copy as the preference's reference (use_ema_ref), beta 2000: policy + copy.
        (["dgpo.preference_reference=copy", "dgpo.beta=2000", "dgpo.clip_range=1e-5"], 8),
        # Mode 1 (the default): rollout CFG 4.5, which doubles the rollout's evaluations.
        (["dgpo.rollout_cfg_scale=4.5"], 12),
    ],
)
def test_the_official_modes_train(overrides, update_nfe, tiny_config, tmp_path):
    trainer = Trainer(tiny_config("dgpo", *overrides), tmp_path / "run", progress=False)
    trainer.train()
    row = trainer.metrics[-1]
    assert np.isfinite(row["loss_objective"]) and row["nfe_update"] == update_nfe
    assert row["nfe_rollout"] == 6 * (2 if "dgpo.rollout_cfg_scale=4.5" in overrides else 1)
    assert (trainer.algorithm.reference is None) == ("dgpo.preference_reference=copy" in overrides)


def test_rollouts_come_from_the_copy_after_copy_rollout_after(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("dgpo", "dgpo.copy_rollout_after=3", "dgpo.clip_range=none"), tmp_path / "r",
                      progress=False)
    algorithm = trainer.algorithm
    assert algorithm.rollout_model(3) is algorithm.policy and algorithm.rollout_model(4) is algorithm.behaviour
    plain = Trainer(tiny_config("dgpo", "dgpo.clip_range=none"), tmp_path / "p", progress=False)
    assert plain.algorithm.behaviour is None and plain.algorithm.loss_module.clip_range is None


def test_dgpo_resumes_exactly_with_its_soft_updated_copy(straight_and_resumed):
    overrides = ["iterations=4", "checkpoint_every=2", "dgpo.decay_rate=0.2", "dgpo.clip_range=0.001"]
    straight, resumed = straight_and_resumed("dgpo", overrides, until=2)
    copies = straight.algorithm.state_dict()["old_policy"], resumed.algorithm.state_dict()["old_policy"]
    assert all(torch.equal(a, b) for a, b in zip(copies[0].values(), copies[1].values()))
    # The copy lags once its decay is > 0 (0.2 * 3 capped at 0.3 in the last update): the ratio leaves 1.
    assert straight.metrics[-1]["ratio_max"] > 1.0 or straight.metrics[-1]["ratio_min"] < 1.0


def test_dgpo_raises_the_reward_on_the_8x8_digits(tiny_config, tmp_path):
    """Seeded, 12 iterations of 32 samples at lr 1e-3 (as the peers' test in test_peers.py): measured gain of the mean
    training reward (last three iterations minus first three) 0.125 (seed 1: 0.236); we require 0.05."""
    config = tiny_config("dgpo", "iterations=12", "prompts_per_iteration=8", "checkpoint_every=12", "optim.lr=1e-3")
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.train()
    rewards = [row["reward_mean"] for row in trainer.metrics]
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.05


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["dgpo.last_trained_step=6"], r"dgpo.last_trained_step must be < rollout.num_steps=6"),
        (["dgpo.num_pairs=6"], r"dgpo.num_pairs=6 distinct timesteps need dgpo.last_trained_step >= 5"),
        (["optim.minibatches=2"], "whole groups"),
        (["optim.minibatch_size=8"], "whole groups"),
        (["optim.micro_batch_size=6"], r"multiple of group_size=4"),
        (["advantage.downsample=2", "optim.micro_batch_size=3"],
         r"multiple of advantage.downsample=2 \(the samples of each group it trains on\), got 3"),
        (["dgpo.preference_reference=ema"], "Unknown dgpo.preference_reference 'ema'"),
        (["dgpo.clip_range=none", "optim.max_kl=0.1"], "set dgpo.clip_range"),
        (["dgpo.clip_range=none", "schedule.clip_range=linear:end=0,steps=2"], "needs dgpo.clip_range set"),
    ],
)
def test_dgpo_settings_are_checked_naming_the_key(overrides, message, tiny_config):
    with pytest.raises(ValueError, match=message):
        tiny_config("dgpo", *overrides)


def test_cfg_needs_a_task_with_an_unconditional_condition(tiny_config):
    from vgrpo_lib.algorithms.dgpo import DGPO
    from vgrpo_lib.algorithms.policies import Policies

    for key in ("rollout_cfg_scale", "reference_cfg_scale"):
        with pytest.raises(ValueError, match=rf"dgpo.{key}=4.5 needs a task with an unconditional condition"):
            DGPO(tiny_config("dgpo", f"dgpo.{key}=4.5"), Policies(torch.nn.Linear(2, 2)), (2,), [1.0, 0.5, 0.0])


def test_the_official_preset_holds_the_official_settings():
    config = build_config("dgpo", None, "official", ["task=digits8", "rollout.num_steps=10"])
    c = config.dgpo
    assert (c.num_pairs, c.last_trained_step, c.beta, c.preference_reference, c.weighting) == (4, 4, 100.0, "base", "v")
    assert (c.clip_range, c.ref_kl_coef, c.decay_rate, c.decay_max, c.copy_rollout_after) == (0.01, 0.02, 0.001, 0.3, 500)
    assert (c.rollout_cfg_scale, c.reference_cfg_scale, config.rollout.solver) == (4.5, 1.0, "dpmpp_2m")
    assert (config.advantage.scale, config.advantage.eps, config.advantage.clip) == ("group", 1e-4, 5.0)
    assert (config.optim.ema_decay, config.optim.ema_every, config.optim.weight_decay) == (0.9, 8, 1e-4)
    assert "dgpo" in OFFICIAL
    sd3 = build_config("dgpo", None, "official-sd3.5-medium", [])
    assert (sd3.group_size, sd3.prompts_per_iteration, sd3.optim.lr, sd3.rollout.num_steps) == (16, 8, 3e-4, 10)
    assert (sd3.model.lora_rank, sd3.model.lora_alpha) == (64, 128)


def test_dgpo_is_a_comparison_variant_at_the_official_settings_without_base_kl_or_rollout_cfg():
    from vgrpo_lib.benchmarks.compare import VARIANTS, build

    assert set(VARIANTS["dgpo"].step_controls) == {"one_step", "two_epochs", "one_step_beta10"}
    for control, (epochs, beta) in {"one_step": (1, 100.0), "two_epochs": (2, 100.0), "one_step_beta10": (1, 10.0)}.items():
        config = build("dgpo", "digits8", 100, 1e-3, control, [])
        assert (config.optim.epochs, config.optim.minibatches, config.dgpo.beta) == (epochs, 1, beta)
        assert (config.dgpo.ref_kl_coef, config.dgpo.rollout_cfg_scale, config.dgpo.clip_range) == (None, 1.0, 0.01)
