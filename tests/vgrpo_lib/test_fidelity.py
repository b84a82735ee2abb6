"""Fidelity to the official baselines: the library against the official formulas, transcribed here from

- Flow-GRPO: github.com/yifan123/flow_grpo (commit ac4c86e): ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py``
  (``sde_step_with_logprob``), ``scripts/train_sd3.py`` (the GRPO loss, KL, ``approx_kl`` and ``clipfrac`` logs
  inside ``main``), ``flow_grpo/stat_tracking.py`` (``PerPromptStatTracker.update``), ``flow_grpo/ema.py``
  (``EMAModuleWrapper``);
- DiffusionNFT: github.com/NVlabs/DiffusionNFT (commit 24af555): ``scripts/train_nft_sd3.py`` (``return_decay`` and
  the loss inside ``main``).

Each transcription keeps the official arithmetic (numpy where the official uses numpy) on random tensors; the
library must agree to float64 rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vgrpo_lib import DiffusionNFTLoss, ELBOSurrogate, FlowGRPOLoss, group_advantage
from vgrpo_lib.control import OldPolicyDecay, ema_update_
from vgrpo_lib.objectives import NFT_ADVANTAGE_MODES
from vgrpo_lib.samplers import ClassifierFreeGuidance, sample_sde, time_grid
from vgrpo_lib.sde import gaussian_log_prob, sde_step_mean_std
from vgrpo_lib.timesteps import GridSubset

F64 = torch.float64


# ------------------------------------------------------------------------------------- official transcriptions


def official_sde_step_with_logprob(model_output, sigma, sigma_prev, sigma_max, sample, prev_sample, noise_level=0.7):
    """flow_grpo/diffusers_patch/sd3_sde_with_logprob.py, ``sde_step_with_logprob`` (sigmas given directly)."""
    sigma = sigma.view(-1, *[1] * (sample.ndim - 1))
    sigma_prev = sigma_prev.view(-1, *[1] * (sample.ndim - 1))
    dt = sigma_prev - sigma
    std_dev_t = torch.sqrt(sigma / (1 - torch.where(sigma == 1, sigma_max, sigma))) * noise_level
    prev_sample_mean = sample * (1 + std_dev_t**2 / (2 * sigma) * dt) + model_output * (
        1 + std_dev_t**2 * (1 - sigma) / (2 * sigma)) * dt
    log_prob = (
        -((prev_sample.detach() - prev_sample_mean) ** 2) / (2 * ((std_dev_t * torch.sqrt(-1 * dt)) ** 2))
        - torch.log(std_dev_t * torch.sqrt(-1 * dt))
        - torch.log(torch.sqrt(2 * torch.as_tensor(math.pi)))
    )
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
    return prev_sample, log_prob, prev_sample_mean, std_dev_t


def official_grpo_loss(log_prob, old_log_prob, advantages, clip_range, adv_clip_max, beta, mean, ref_mean, std_dev_t):
    """scripts/train_sd3.py, ``main``: the per-timestep GRPO loss, its KL and the logged diagnostics."""
    advantages = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))
    kl_loss = ((mean - ref_mean) ** 2).mean(dim=tuple(range(1, mean.ndim)), keepdim=True) / (2 * std_dev_t**2)
    kl_loss = torch.mean(kl_loss)
    return {
        "loss": policy_loss + beta * kl_loss,
        "policy_loss": policy_loss,
        "kl_loss": kl_loss,
        "approx_kl": 0.5 * torch.mean((log_prob - old_log_prob) ** 2),
        "clipfrac": torch.mean((torch.abs(ratio - 1.0) > clip_range).float()),
    }


def official_stat_tracker(prompts, rewards, global_std):
    """flow_grpo/stat_tracking.py, ``PerPromptStatTracker.update`` (type 'grpo', a fresh tracker)."""
    prompts = np.array(prompts)
    rewards = np.array(rewards, dtype=np.float64)
    advantages = np.empty_like(rewards) * 0.0
    for prompt in np.unique(prompts):
        prompt_rewards = rewards[prompts == prompt]
        mean = np.mean(prompt_rewards, axis=0, keepdims=True)
        if global_std:
            std = np.std(rewards, axis=0, keepdims=True) + 1e-4
        else:
            std = np.std(prompt_rewards, axis=0, keepdims=True) + 1e-4
        advantages[prompts == prompt] = (prompt_rewards - mean) / std
    return advantages


def official_return_decay(step, decay_type):
    """DiffusionNFT scripts/train_nft_sd3.py, ``return_decay``."""
    flat, uprate, uphold = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}[decay_type]
    if step < flat:
        return 0.0
    return min((step - flat) * uprate, uphold)


def official_nft_loss(x0, xt, t, old_prediction, forward_prediction, ref_prediction, advantages, adv_clip_max,
                      strength, kl_beta, adv_mode):
    """DiffusionNFT scripts/train_nft_sd3.py, ``main``: the loss of one timestep (``config.beta`` = strength,
    ``config.train.beta`` = the KL coefficient)."""
    t_expanded = t.view(-1, *([1] * (len(x0.shape) - 1)))
    advantages_clip = torch.clamp(advantages, -adv_clip_max, adv_clip_max)
    if adv_mode == "positive_only":
        advantages_clip = torch.clamp(advantages_clip, 0, adv_clip_max)
    elif adv_mode == "negative_only":
        advantages_clip = torch.clamp(advantages_clip, -adv_clip_max, 0)
    elif adv_mode == "one_only":
        advantages_clip = torch.where(advantages_clip > 0, torch.ones_like(advantages_clip), torch.zeros_like(advantages_clip))
    elif adv_mode == "binary":
        advantages_clip = torch.sign(advantages_clip)
    normalized_advantages_clip = (advantages_clip / adv_clip_max) / 2.0 + 0.5
    r = torch.clamp(normalized_advantages_clip, 0, 1)
    positive_prediction = strength * forward_prediction + (1 - strength) * old_prediction.detach()
    implicit_negative_prediction = (1.0 + strength) * old_prediction.detach() - strength * forward_prediction
    x0_prediction = xt - t_expanded * positive_prediction
    with torch.no_grad():
        weight_factor = (torch.abs(x0_prediction.double() - x0.double())
                         .mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001))
    positive_loss = ((x0_prediction - x0) ** 2 / weight_factor).mean(dim=tuple(range(1, x0.ndim)))
    negative_x0_prediction = xt - t_expanded * implicit_negative_prediction
    with torch.no_grad():
        negative_weight_factor = (torch.abs(negative_x0_prediction.double() - x0.double())
                                  .mean(dim=tuple(range(1, x0.ndim)), keepdim=True).clip(min=0.00001))
    negative_loss = ((negative_x0_prediction - x0) ** 2 / negative_weight_factor).mean(dim=tuple(range(1, x0.ndim)))
    ori_policy_loss = r * positive_loss / strength + (1.0 - r) * negative_loss / strength
    policy_loss = (ori_policy_loss * adv_clip_max).mean()
    kl_div_loss = ((forward_prediction - ref_prediction) ** 2).mean(dim=tuple(range(1, x0.ndim)))
    return policy_loss, torch.mean(kl_div_loss), policy_loss + kl_beta * torch.mean(kl_div_loss)


class OfficialEMA:
    """flow_grpo/ema.py, ``EMAModuleWrapper`` (``step`` and ``get_current_decay``)."""

    def __init__(self, parameters, decay, update_step_interval):
        self.ema_parameters = [p.clone().detach() for p in parameters]
        self.decay, self.update_step_interval = decay, update_step_interval

    def get_current_decay(self, optimization_step):
        return min((1 + optimization_step) / (10 + optimization_step), self.decay)

    @torch.no_grad()
    def step(self, parameters, optimization_step):
        one_minus_decay = 1 - self.get_current_decay(optimization_step)
        if (optimization_step + 1) % self.update_step_interval == 0:
            for ema_parameter, parameter in zip(self.ema_parameters, parameters, strict=True):
                ema_parameter.add_(one_minus_decay * (parameter - ema_parameter))


# ------------------------------------------------------------------------------------------------- Flow-GRPO


@pytest.fixture
def transitions(make_model):
    """A 10-step SDE rollout of 6 samples (8-dim, 3-dim condition), one row per transition."""
    model = make_model(data_shape=(8,), cond_dim=3, dtype=F64)
    g = torch.Generator().manual_seed(3)
    cond = torch.randn(6, 3, generator=g, dtype=F64)
    with torch.no_grad():
        _, trajectory = sample_sde(model, torch.randn(6, 8, generator=g, dtype=F64), time_grid(10), cond, generator=g)
    trajectory["cond"] = cond[:, None].expand(6, 10, 3).clone()
    trajectory["advantage"] = (3 * torch.randn(6, generator=g, dtype=F64))[:, None].expand(6, 10).clone()
    trajectory["old_log_prob"] = trajectory["log_prob"] + 2e-4 * torch.randn(6, 10, generator=g, dtype=F64)
    return model, trajectory.reshape(-1)


def test_sde_step_and_log_prob_match_official(make_model):
    """Mean, std and the mean-reduced log-density of one step, on the grid's first step (sigma = 1, the official
    guard uses sigma_max = sigmas[1]) and inner steps."""
    g = torch.Generator().manual_seed(0)
    grid = torch.tensor(time_grid(10), dtype=F64)
    t, t_next = grid[:-1].repeat(3), grid[1:].repeat(3)
    z, v, z_next = (torch.randn(30, 4, 5, generator=g, dtype=F64) for _ in range(3))
    mean, std = sde_step_mean_std(z, v, t, t_next, 0.7)
    _, log_prob, official_mean, std_dev_t = official_sde_step_with_logprob(v, t, t_next, grid[1], z, z_next)
    torch.testing.assert_close(mean, official_mean)
    torch.testing.assert_close(std, std_dev_t * torch.sqrt(t - t_next).view(-1, 1, 1))
    torch.testing.assert_close(gaussian_log_prob(z_next, mean, std, "mean"), log_prob)


@pytest.mark.parametrize("kl_form", ["flow_grpo", "exact"])
def test_flow_grpo_loss_kl_and_diagnostics_match_official(transitions, perturb, kl_form):
    """The library's loss with kl_form="flow_grpo" is the official loss (same beta); "exact" divides the same
    KL by the step length |dt|."""
    model, rows = transitions
    reference = perturb(model, scale=0.2)
    rows["advantage"][0] = 9.0  # beyond adv_clip_max = 5 (FlowGRPOLoss's advantage_clip, 5 by default)
    beta, clip_range = 0.04, 1e-4
    out = FlowGRPOLoss(model, clip_range=clip_range, ref_model=reference, ref_kl_coef=beta, kl_form=kl_form)(rows)
    v = model(rows["z"], rows["t"], rows["cond"])
    with torch.no_grad():
        v_ref = reference(rows["z"], rows["t"], rows["cond"])
    t, t_next = rows["t"], rows["t_next"]
    _, log_prob, mean, std_dev_t = official_sde_step_with_logprob(v, t, t_next, t_next[0], rows["z"], rows["z_next"])
    _, _, ref_mean, _ = official_sde_step_with_logprob(v_ref, t, t_next, t_next[0], rows["z"], rows["z_next"])
    official = official_grpo_loss(log_prob, rows["old_log_prob"], rows["advantage"], clip_range, 5, beta, mean,
                                  ref_mean, std_dev_t)
    torch.testing.assert_close(out["loss_objective"], official["policy_loss"])
    torch.testing.assert_close(out["approx_kl_sq"], official["approx_kl"])
    torch.testing.assert_close(out["clip_fraction"], official["clipfrac"])
    assert 0 < official["clipfrac"].item() < 1  # the check is not vacuous
    per_row = ((mean - ref_mean) ** 2).mean(dim=1) / (2 * std_dev_t.flatten() ** 2)
    if kl_form == "flow_grpo":
        torch.testing.assert_close(out["ref_kl"], official["kl_loss"].detach())
        torch.testing.assert_close(out["loss_objective"] + out["loss_ref_kl"], official["loss"])
    else:
        torch.testing.assert_close(out["ref_kl"], (per_row / (t - t_next)).mean().detach())


def test_flow_grpo_cfg_training_detaches_the_unconditional_branch(make_model):
    """Official compute_log_prob with train.cfg: v = v_u.detach() + 4.5 (v_c - v_u), so the gradient of any
    loss of v is 4.5 x its gradient through v_c alone."""
    model = make_model(data_shape=(4,), cond_dim=2, dtype=F64)
    g = torch.Generator().manual_seed(1)
    z, t, cond = torch.randn(5, 4, generator=g, dtype=F64), torch.rand(5, generator=g, dtype=F64), torch.randn(5, 2, generator=g, dtype=F64)
    guided = ClassifierFreeGuidance(model, torch.zeros_like, 4.5, detach_uncond=True)
    weights = torch.randn(5, 4, generator=g, dtype=F64)
    params = list(model.parameters())
    got = torch.autograd.grad((guided(z, t, cond) * weights).sum(), params)
    expected = torch.autograd.grad((4.5 * model(z, t, cond) * weights).sum(), params)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("global_std", [True, False])
def test_advantages_match_the_official_stat_tracker(global_std):
    """scale="batch" / "group" with eps 1e-4 are the official global-std / per-prompt-std advantages; a multi-reward
    batch normalises the weighted sum of the rewards (the official multi_score 'avg')."""
    g = torch.Generator().manual_seed(2)
    group = torch.arange(6).repeat_interleave(8)[torch.randperm(48, generator=g)]
    rewards = torch.rand(48, 2, generator=g, dtype=F64)
    rewards[group == 3] = 0.25  # a group of equal rewards: advantage 0 in both
    weights = (1.0, 0.5)
    total = rewards @ torch.tensor(weights, dtype=F64)
    official = official_stat_tracker([f"prompt {i}" for i in group.tolist()], total.numpy(), global_std)
    scale = "batch" if global_std else "group"
    torch.testing.assert_close(group_advantage(total, group, scale=scale, eps=1e-4), torch.from_numpy(official))
    multi = group_advantage(rewards, group, scale=scale, eps=1e-4, weights=weights, multi_reward="sum_then_normalize")
    torch.testing.assert_close(multi, torch.from_numpy(official))


def test_weight_ema_matches_official(make_model):
    """vgrpo_lib.algorithms.policies.WeightEMA against EMAModuleWrapper (decay 0.9, every 8 steps) over 20 gradient steps
    of random parameter changes, with the step count the official passes (global_step after the increment)."""
    from vgrpo_lib.algorithms.policies import WeightEMA

    model = make_model(data_shape=(4,), dtype=F64)
    ours = WeightEMA(model.parameters(), 0.9, every=8)
    official = OfficialEMA(list(model.parameters()), 0.9, 8)
    g = torch.Generator().manual_seed(4)
    for step in range(1, 21):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g, dtype=F64))
        ours.update(step)
        official.step(list(model.parameters()), step)
    for a, b in zip(ours.average, official.ema_parameters):
        torch.testing.assert_close(a, b)
    assert not torch.equal(ours.average[0], next(model.parameters()))
    before = [p.detach().clone() for p in model.parameters()]
    with ours.swapped_in():
        for p, a in zip(model.parameters(), official.ema_parameters):
            torch.testing.assert_close(p.detach(), a)
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)


# ---------------------------------------------------------------------------------------------- DiffusionNFT


@pytest.mark.parametrize("decay_type, settings", [(0, (0.0, 0.0, 0)), (1, (0.001, 0.5, 0)), (2, (0.0075, 0.999, 75))])
def test_old_policy_decay_matches_official_return_decay(decay_type, settings):
    decay = OldPolicyDecay(*settings)
    for step in range(0, 400):
        assert decay(step) == pytest.approx(official_return_decay(step, decay_type), abs=1e-15)
    assert OldPolicyDecay()(1) == 0.001  # the first update (after one gradient step) already keeps 0.1%


@pytest.mark.parametrize("adv_mode", NFT_ADVANTAGE_MODES)
@pytest.mark.parametrize("strength", [1.0, 0.1])
def test_nft_loss_matches_official(make_model, perturb, adv_mode, strength):
    """One training timestep per sample (K = 1) so that the official per-timestep loss is the library's."""
    model = make_model(data_shape=(2, 3), cond_dim=2, dtype=F64)
    old, reference = perturb(model, scale=0.1, seed=1), perturb(model, scale=0.3, seed=2)
    g = torch.Generator().manual_seed(5)
    sample = torch.randn(7, 2, 3, generator=g, dtype=F64)
    cond = torch.randn(7, 2, generator=g, dtype=F64)
    advantage = torch.tensor([6.0, -7.0, 2.0, -1.5, 0.0, 0.3, -0.2], dtype=F64)
    estimator = ELBOSurrogate(num_pairs=1, timesteps=GridSubset(time_grid(10)[:-1]), sharing="none")
    pairs = estimator.sample_pairs(sample, generator=g)
    batch = TensorDict({"sample": sample, "cond": cond, "advantage": advantage, "pairs": pairs}, [7])
    loss = DiffusionNFTLoss(model, old, estimator, strength=strength, advantage_max=5.0, adv_mode=adv_mode,
                            ref_model=reference, ref_kl_coef=1e-4)
    out = loss(batch)
    t, noise = pairs["t"][:, 0].to(F64), pairs["noise"][:, 0]
    xt = (1 - t.view(-1, 1, 1)) * sample + t.view(-1, 1, 1) * noise
    forward = model(xt, t, cond)
    with torch.no_grad():
        old_prediction, ref_prediction = old(xt, t, cond), reference(xt, t, cond)
    policy_loss, kl, total = official_nft_loss(sample, xt, t, old_prediction, forward, ref_prediction, advantage, 5.0,
                                               strength, 1e-4, adv_mode)
    torch.testing.assert_close(out["loss_objective"], policy_loss)
    torch.testing.assert_close(out["ref_kl"], kl.detach())
    torch.testing.assert_close(out["loss_objective"] + out["loss_ref_kl"], total)


def test_grid_subset_draws_distinct_grid_points_like_a_permutation():
    """The official trains the first int(10 * 0.99) = 9 entries of a per-sample permutation of the 10 timesteps."""
    grid = time_grid(10)[:-1]
    t = GridSubset(grid)(4000, 9, generator=torch.Generator().manual_seed(0), dtype=F64)
    assert t.shape == (4000, 9)
    grid_t = torch.tensor(grid, dtype=F64)
    assert bool((t[..., None] == grid_t).any(-1).all())  # every draw is a grid point
    assert all(len(set(row)) == 9 for row in t.tolist())  # distinct within a sample
    # each grid point is left out of a sample with probability 1/10 (binomial SE 0.0047 on 4000 samples)
    left_out = 1.0 - (t[..., None] == grid_t).any(1).double().mean(0)
    assert bool(((left_out - 0.1).abs() < 0.025).all())
    with pytest.raises(ValueError, match="distinct points"):
        GridSubset(grid)(2, 11)
