"""Inputs at the edges: rewards too large for float32 statistics, and batches on another device than the model."""

from __future__ import annotations

import copy

import pytest
import torch

from vgrpo_lib import DiffusionNFTLoss, FlowGRPOLoss, VGRPOLoss, group_advantage, group_statistics


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
def losses_and_batches(batches):
    """The three losses with complete batches (conftest's ``batches``; V-GRPO without its behaviour KL)."""
    model, est, vgrpo, flow, nft = batches
    return model, {
        "vgrpo": (VGRPOLoss(model, est), vgrpo.exclude("old_x_pred")),
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


class _MovesInputs(torch.nn.Module):
    """A model that declares ``moves_inputs`` (like the diffusers ``LoRAPolicy``, whose GPU transformer takes the
    trainer's CPU batches): its first parameter is on another device (meta) than the batch it is given."""

    moves_inputs = True

    def __init__(self, inner):
        super().__init__()
        self.elsewhere = torch.nn.Parameter(torch.zeros((), device="meta"))
        self.inner = inner

    def forward(self, x_t, t, cond):
        return self.inner(x_t, t, cond)


@pytest.mark.parametrize("algo", ["vgrpo", "flow_grpo"])
def test_a_model_that_moves_its_inputs_takes_a_batch_on_another_device(batches, algo):
    model, est, vgrpo, flow, _ = batches
    loss, batch = (VGRPOLoss(_MovesInputs(model), est), vgrpo.exclude("old_x_pred")) if algo == "vgrpo" else (
        FlowGRPOLoss(_MovesInputs(model)), flow)
    expected = (VGRPOLoss(model, est) if algo == "vgrpo" else FlowGRPOLoss(model))(batch)
    torch.testing.assert_close(loss(batch)["loss_objective"], expected["loss_objective"])


@pytest.mark.parametrize("algo", ["vgrpo", "flow_grpo", "diffusion_nft"])
def test_a_model_on_another_device_than_the_batch_is_named(losses_and_batches, algo):
    model, losses = losses_and_batches
    loss, batch = losses[algo]
    model.to("meta")
    with pytest.raises(ValueError, match=r"is on cpu but the model is on meta"):
        loss(batch)
