"""vgrpo_lib.batches: each loss's batch from its sampler's output in one call (Flow-GRPO, V-GRPO, DiffusionNFT)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from tensordict import TensorDict

from vgrpo_lib import (
    DiffusionNFTLoss,
    ELBOSurrogate,
    FlowGRPOLoss,
    GroupAdvantage,
    OldPolicyDecay,
    VGRPOLoss,
    sample_sde,
    time_grid,
)
from vgrpo_lib.batches import OldPolicy, expand_steps, flow_grpo_batch, vgrpo_batch
from vgrpo_lib.testing import MLPVelocity, perturb
from vgrpo_lib.testing.strategies import estimators, sample_batches

PROPERTIES = settings(max_examples=30, deadline=None, derandomize=True, database=None)


def _records(cond_dim=2, record_mean=False, steps=4, batch=6):
    model = MLPVelocity(data_shape=(3,), cond_dim=cond_dim)
    generator = torch.Generator().manual_seed(0)
    cond = torch.randn(batch, cond_dim, generator=generator) if cond_dim else None
    with torch.no_grad():
        _, records = sample_sde(model, torch.randn(batch, 3, generator=generator), time_grid(steps), cond,
                                generator=generator, record_mean=record_mean)
    return model, cond, records


def test_expand_steps_repeats_rows_as_a_view():
    value = torch.arange(6.0).view(3, 2)
    expanded = expand_steps(value, 4)
    assert expanded.shape == (3, 4, 2) and expanded.data_ptr() == value.data_ptr()
    assert all(torch.equal(expanded[:, s], value) for s in range(4))
    td = expand_steps(TensorDict({"a": value}, batch_size=[3]), 4)
    assert td.batch_size == (3, 4) and torch.equal(td["a"][:, 2], value)


def test_flow_grpo_batch_renames_and_broadcasts():
    model, cond, records = _records()
    advantage = torch.arange(6.0)
    batch = flow_grpo_batch(records, advantage, cond)
    assert batch.batch_size == (6, 4)
    assert set(batch.keys()) == {"z", "z_next", "t", "t_next", "old_log_prob", "advantage", "cond"}
    assert torch.equal(batch["old_log_prob"], records["log_prob"])
    assert torch.equal(batch["advantage"], advantage[:, None].expand(6, 4))
    assert torch.equal(batch["cond"], cond[:, None].expand(6, 4, 2))
    # On the behaviour policy's own transitions the ratio is exactly 1, flattened or not.
    for rows in (batch, batch.reshape(-1)):
        out = FlowGRPOLoss(model)(rows)
        assert out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-5)


def test_flow_grpo_batch_keeps_the_first_steps_the_step_means_and_no_cond():
    model, _, records = _records(cond_dim=0, record_mean=True)
    batch = flow_grpo_batch(records, torch.ones(6), None, num_steps=3)
    assert batch.batch_size == (6, 3) and "cond" not in batch.keys()
    assert torch.equal(batch["old_mean"], records["mean"][:, :3])
    assert torch.equal(batch["t"], records["t"][:, :3])
    FlowGRPOLoss(model, unconditional=True)(batch.reshape(-1))


def test_flow_grpo_batch_names_bad_input():
    _, cond, records = _records()
    with pytest.raises(ValueError, match=r"advantage must be \(B,\) = \(6,\)"):
        flow_grpo_batch(records, torch.ones(6, 1), cond)
    with pytest.raises(ValueError, match="cond must have one row per sample"):
        flow_grpo_batch(records, torch.ones(6), cond[:5])
    with pytest.raises(ValueError, match=r"sample_sde's \(B, S\) TensorDict"):
        flow_grpo_batch(records.reshape(-1), torch.ones(24), cond)
    with pytest.raises(KeyError, match="'log_prob'"):
        flow_grpo_batch(records.exclude("log_prob"), torch.ones(6), cond)


def test_vgrpo_batch_holds_the_behaviour_surrogate_on_group_shared_pairs():
    model = MLPVelocity(data_shape=(3,), cond_dim=2)
    estimator = ELBOSurrogate(num_pairs=3)
    generator = torch.Generator().manual_seed(0)
    sample, cond = torch.randn(6, 3, generator=generator), torch.randn(6, 2, generator=generator)
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    advantage = GroupAdvantage()(torch.arange(6.0), group)
    batch = vgrpo_batch(estimator, sample, cond, advantage, group=group, behaviour=model, generator=generator,
                        keep_x_pred=True)
    assert batch.batch_size == (6,) and batch["pairs"].batch_size == (6, 3)
    assert set(batch.keys()) == {"sample", "cond", "group", "advantage", "pairs", "old_log_prob", "old_x_pred"}
    assert torch.equal(batch["pairs", "t"][0], batch["pairs", "t"][2])  # group sharing
    assert not torch.equal(batch["pairs", "t"][0], batch["pairs", "t"][3])
    with torch.no_grad():
        torch.testing.assert_close(batch["old_log_prob"], estimator(model, sample, cond, batch["pairs"]))
    assert batch["old_x_pred"].shape == (6, 3, 3)
    out = VGRPOLoss(model, estimator, behaviour_kl_coef=0.1)(batch)
    assert out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-5)
    # Given pairs are used as they are; without a behaviour policy there is no old_log_prob (on-policy loss).
    on_policy = vgrpo_batch(estimator, sample, None, advantage, pairs=batch["pairs"])
    assert set(on_policy.keys()) == {"sample", "advantage", "pairs"} and on_policy["pairs"] is batch["pairs"]
    VGRPOLoss(MLPVelocity(data_shape=(3,)), estimator, on_policy=True, unconditional=True)(on_policy)


def test_vgrpo_batch_names_bad_input():
    estimator, sample = ELBOSurrogate(2), torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"advantage must be \(B,\) = \(4,\)"):
        vgrpo_batch(estimator, sample, None, torch.ones(3))
    with pytest.raises(ValueError, match="pass behaviour="):
        vgrpo_batch(estimator, sample, None, torch.ones(4), keep_x_pred=True)
    with pytest.raises(ValueError, match="group must have"):
        vgrpo_batch(estimator, sample, None, torch.ones(4), group=torch.zeros(3, dtype=torch.long))


@PROPERTIES
@given(estimator=estimators(), batch=sample_batches(cond_dim=2))
def test_vgrpo_batch_feeds_the_loss_for_any_estimator(estimator, batch):
    model = MLPVelocity(data_shape=batch["sample"].shape[1:], cond_dim=2)
    n = batch.shape[0]
    rows = vgrpo_batch(estimator, batch["sample"], batch["cond"], torch.linspace(-1, 1, n), group=batch["group"],
                       behaviour=model, generator=torch.Generator().manual_seed(0))
    assert rows["pairs"].batch_size == (n, estimator.num_pairs) and rows["old_log_prob"].shape == (n,)
    out = VGRPOLoss(model, estimator)(rows)
    assert torch.isfinite(out["loss_objective"]) and out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-4)


def test_old_policy_is_a_frozen_copy_that_trails_the_model():
    model = MLPVelocity(data_shape=(3,))
    old, decay = OldPolicy(model), OldPolicyDecay(rate=0.1, max_decay=0.5)
    assert all(not p.requires_grad for p in old.model.parameters())
    z, t = torch.randn(4, 3), torch.rand(4)
    torch.testing.assert_close(old(z, t), model(z, t))
    start = [p.detach().clone() for p in old.model.parameters()]
    with torch.no_grad():
        for p, q in zip(model.parameters(), perturb(model, scale=0.5).parameters()):
            p.copy_(q)
    assert decay(3) == pytest.approx(0.3)  # min(0.1 * 3, 0.5)
    old.update_(decay(3))
    for p_old, p_start, p_new in zip(old.model.parameters(), start, model.parameters()):
        torch.testing.assert_close(p_old, 0.3 * p_start + 0.7 * p_new)
    old.update_(decay(0))  # decay 0: a hard copy
    assert all(torch.equal(p, q) for p, q in zip(old.model.parameters(), model.parameters()))
    DiffusionNFTLoss(model, old, ELBOSurrogate(2, sharing="none"), unconditional=True)(
        TensorDict({"sample": z, "advantage": torch.ones(4), "pairs": ELBOSurrogate(2, sharing="none").sample_pairs(z)},
                   batch_size=[4]))
    with pytest.raises(TypeError, match="nn.Module"):
        OldPolicy(lambda z, t, c: z)
