"""Inputs at the edges: rewards too large for float32 statistics, and batches on another device than the model."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from vgrpo_lib import DiffusionNFTLoss, ELBOSurrogate, FlowGRPOLoss, VGRPOLoss, group_advantage, group_statistics
from vgrpo_lib.samplers import sample_sde, time_grid


@pytest.mark.parametrize("magnitude", [1.0, 2e19, 1e30, 5e37])
def test_huge_float32_rewards_keep_their_advantages(magnitude):
    # Above ~1.8e19 the square of a float32 reward overflows: the group std was inf and every advantage 0.
    reward = torch.tensor([1.0, 3.0, 2.0, 6.0], dtype=torch.float32) * magnitude
    group = torch.tensor([0, 0, 1, 1])
    advantage = group_advantage(reward, group, eps=0.0)
    assert advantage.dtype == torch.float32
    torch.testing.assert_close(advantage, torch.tensor([-1.0, 1.0, -1.0, 1.0]))  # (r - mean) / std, 2 per group
    stats = group_statistics(reward, group)
    expected_std = torch.tensor([1.0, 2.0], dtype=torch.float64) * magnitude
    torch.testing.assert_close(stats["std"], expected_std.float()) and stats["std"].dtype == torch.float32
    float64 = group_advantage(reward.double(), group, eps=0.0)
    assert float64.dtype == torch.float64 and torch.equal(float64.float(), advantage)


@pytest.fixture
def losses_and_batches(make_model):
    model = make_model(data_shape=(3,), cond_dim=2)
    est = ELBOSurrogate(num_pairs=2, sharing="none")
    sample = torch.randn(4, 3)
    pairs = est.sample_pairs(sample)
    with torch.no_grad():
        old = est.evaluate(model, sample, torch.zeros(4, 2), pairs)
    vgrpo = TensorDict({"sample": sample, "cond": torch.zeros(4, 2), "advantage": torch.ones(4), "pairs": pairs,
                        "old_log_prob": old["log_prob"].mean(1)}, batch_size=[4])
    with torch.no_grad():
        _, flow = sample_sde(model, torch.randn(4, 3), time_grid(3), torch.zeros(4, 2))
    flow["cond"], flow["advantage"] = torch.zeros(4, 3, 2), torch.ones(4, 3)
    flow["old_log_prob"] = flow.pop("log_prob")
    nft = vgrpo.exclude("old_log_prob")
    return model, {
        "vgrpo": (VGRPOLoss(model, est), vgrpo),
        "flow_grpo": (FlowGRPOLoss(model), flow),
        "diffusion_nft": (DiffusionNFTLoss(model, copy.deepcopy(model), est), nft),
    }


@pytest.mark.parametrize("algo, key", [("vgrpo", "advantage"), ("vgrpo", "old_log_prob"), ("flow_grpo", "advantage"),
                                       ("flow_grpo", "old_log_prob"), ("diffusion_nft", "advantage")])
def test_a_batch_entry_on_another_device_is_named(losses_and_batches, algo, key):
    _, losses = losses_and_batches
    loss, batch = losses[algo]
    loss(batch)  # on one device it works
    moved = batch.clone()
    moved.set(key, batch.get(key).to("meta"))
    with pytest.raises(ValueError, match=rf"^{key} \(.*\) is on meta but the model is on cpu; move the batch"):
        loss(moved)


@pytest.mark.parametrize("algo", ["vgrpo", "flow_grpo", "diffusion_nft"])
def test_a_model_on_another_device_than_the_batch_is_named(losses_and_batches, algo):
    model, losses = losses_and_batches
    loss, batch = losses[algo]
    model.to("meta")
    with pytest.raises(ValueError, match=r"is on cpu but the model is on meta"):
        loss(batch)
