"""The peers' TorchRL losses: AWMLoss, GRPOGuardLoss and FlowGRPOLoss on the CPS sampler.

Official formulas are transcribed here (never imported) with the repository, file and function they come from,
and compared with the library's losses on small random models and tensors (float64).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib import AWMLoss, FlowGRPOLoss, GRPOGuardLoss
from vgrpo_lib.samplers import sample_sde, time_grid
from vgrpo_lib.sde import gaussian_log_prob, step_mean_std

from tests.vgrpo_lib.test_losses import _assert_grads_close, _grads

B, K, D, C = 6, 3, 4, 2


# ------------------------------------------------------------------------------------------------------ AWM


@pytest.fixture
def awm_setup(make_model, perturb):
    model = make_model(data_shape=(D,), cond_dim=C, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    sample = torch.randn(B, D, generator=g, dtype=torch.float64)
    cond = torch.randn(B, C, generator=g, dtype=torch.float64)
    estimator = ELBOSurrogate(num_pairs=K, sharing="none", weighting="ghuber")
    pairs = estimator.sample_pairs(sample, generator=g)
    advantage = torch.tensor([4.0, -1.0, 0.5, -0.5, 2.0, -5.0], dtype=torch.float64)
    batch = TensorDict({"sample": sample, "cond": cond, "advantage": advantage, "pairs": pairs}, batch_size=[B])
    return model, perturb(model, seed=1), perturb(model, seed=2), estimator, batch


def _official_awm_loss(model, ema, ref, batch, adv_clip_max=5.0, advantage_max=1.0, clip_range=1.0, beta=0.001, ema_beta=1.0):
    """Transcribed from scxue/advantage_weighted_matching, advantage_weighted_matching/scripts/train_sd3_awm.py,
    ``main`` training loop with ``loss_type='exp_first'``, ``off_policy=False`` (the first step's old log-probs are
    the current ones, detached), ``kl_weight = kl_ema_weight = 'Uniform'`` and ``compute_log_prob_awm`` with
    ``weighting='ghuber'``. Timesteps and noises are the batch's pairs, laid out [T, B] as in the official code."""
    pairs = batch["pairs"]
    timesteps = pairs["t"].T.reshape(-1)  # [T * B]
    noise = pairs["noise"].transpose(0, 1).reshape(-1, D)
    clean = batch["sample"].repeat(K, 1)
    cond = batch["cond"].repeat(K, 1)
    noised = (1 - timesteps[:, None]) * clean + timesteps[:, None] * noise

    def log_prob_awm(transformer):
        model_output = transformer(noised, timesteps, cond).double()
        log_prob = -((model_output - (noise.double() - clean.double())) ** 2)
        log_prob = log_prob.mean(dim=tuple(range(1, log_prob.ndim)))
        eps = torch.tensor(1e-10, dtype=log_prob.dtype)
        log_prob = -(torch.pow(-log_prob + 1e-10, 0.25) - torch.pow(eps, 0.25)) * timesteps / 0.25
        return log_prob, model_output

    log_prob, model_output = log_prob_awm(model)
    with torch.no_grad():
        _, model_output_ref = log_prob_awm(ref)
        _, model_output_ema = log_prob_awm(ema)
    old_log_probs = log_prob.detach()
    advantages = torch.clamp(batch["advantage"], -adv_clip_max, adv_clip_max)
    advantages = advantages / adv_clip_max * advantage_max
    ratio = torch.exp(log_prob - old_log_probs)
    advantages = advantages.unsqueeze(0).repeat(K, 1).view(-1)
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    policy_loss = torch.mean(torch.maximum(unclipped_loss, clipped_loss))
    kl_loss = ((model_output - model_output_ref) ** 2).mean(dim=1).mean()
    ema_kl_loss = ((model_output - model_output_ema) ** 2).mean(dim=1).mean()
    return policy_loss + beta * kl_loss + ema_beta * ema_kl_loss, kl_loss, ema_kl_loss


def test_awm_gradient_and_kls_match_the_official_loss(awm_setup):
    """Same gradient as the official on-policy AWM step (advantages clipped to +-5 upstream, then scaled by 1/5),
    same KL values. The loss value differs by design: ours is A * l, the official -A * ratio (ratio 1)."""
    model, ema, ref, estimator, batch = awm_setup
    official, kl, ema_kl = _official_awm_loss(model, ema, ref, batch)
    model.zero_grad()
    official.backward()
    expected = _grads(model)
    loss = AWMLoss(
        model, estimator, advantage_scale=0.2, behaviour_model=ema, behaviour_kl_coef=1.0, ref_model=ref, ref_kl_coef=0.001
    )
    clipped = batch.clone()
    clipped["advantage"] = batch["advantage"].clamp(-5, 5)
    model.zero_grad()
    out = loss(clipped)
    (out["loss_objective"] + out["loss_behaviour_kl"] + out["loss_ref_kl"]).backward()
    # rtol 1e-8: the two compute z_t and the generalised Huber power in a different order of float64 operations.
    _assert_grads_close(_grads(model), expected, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(out["ref_kl"], kl.detach())
    torch.testing.assert_close(out["behaviour_kl"], ema_kl.detach())
    assert set(loss.out_keys) == {"loss_objective", "loss_behaviour_kl", "loss_ref_kl"}


def test_awm_is_minus_the_advantage_weighted_surrogate_gradient(awm_setup):
    """AWM's gradient is -(1/B) sum_i A_i grad s_theta(o_i): V-GRPO's one-step gradient with the same pairs and
    weighting (what V-GRPO adds sits in the pairs, the weighting and the ratio/trust region for later steps)."""
    model, _, _, estimator, batch = awm_setup
    model.zero_grad()
    AWMLoss(model, estimator)(batch)["loss_objective"].backward()
    got = _grads(model)
    model.zero_grad()
    surrogate = estimator(model, batch["sample"], batch["cond"], batch["pairs"])
    (-(batch["advantage"] * surrogate).mean()).backward()
    _assert_grads_close(got, _grads(model))


def test_awm_behaviour_kl_has_a_gradient_and_keys_remap(awm_setup):
    model, ema, _, estimator, batch = awm_setup
    loss = AWMLoss(model, estimator, behaviour_model=ema, behaviour_kl_coef=0.5)
    model.zero_grad()
    loss(batch)["loss_behaviour_kl"].backward()
    assert sum(p.grad.abs().sum().item() for p in model.parameters()) > 0
    loss.set_keys(sample="x", advantage="adv")
    renamed = batch.rename_key_("sample", "x").rename_key_("advantage", "adv")
    assert "x" in loss.in_keys and "adv" in loss.in_keys
    assert torch.isfinite(loss(renamed)["loss_objective"])
    with pytest.raises(ValueError, match="needs both behaviour_model and behaviour_kl_coef"):
        AWMLoss(model, estimator, behaviour_model=ema)
    with pytest.raises(ValueError, match=r"advantage must be \[B\] = \[6\]"):
        loss(renamed.set("adv", torch.zeros(B, 2, dtype=torch.float64)))


# ------------------------------------------------------------------------------------- GRPO-Guard and CPS


def _rollout(model, sde_type, noise_level, record_mean=True):
    g = torch.Generator().manual_seed(0)
    cond = torch.randn(4, C, generator=g, dtype=torch.float64)
    with torch.no_grad():
        _, traj = sample_sde(
            model, torch.randn(4, D, generator=g, dtype=torch.float64), time_grid(5), cond,
            generator=g, sde_type=sde_type, noise_level=noise_level, record_mean=record_mean,
        )
    steps = traj.shape[1]
    traj["cond"] = cond[:, None].expand(4, steps, C).clone()
    traj["advantage"] = torch.tensor([1.0, -1.0, 3.0, -0.5], dtype=torch.float64)[:, None].expand(4, steps).clone()
    traj["old_log_prob"] = traj.pop("log_prob")
    if record_mean:
        traj["old_mean"] = traj.pop("mean")
    return traj


@pytest.mark.parametrize("sde_type, noise_level", [("flow_sde", 0.7), ("cps", 0.8)])
def test_guard_on_policy_ratio_is_one_and_the_gradient_is_flow_grpos_weighted_by_the_step_std(make_model, sde_type, noise_level):
    model = make_model(data_shape=(D,), cond_dim=C, dtype=torch.float64)
    traj = _rollout(model, sde_type, noise_level)
    out = GRPOGuardLoss(model, sde_type=sde_type, noise_level=noise_level)(traj)
    assert out["ratio_min"].item() == 1.0 and out["ratio_max"].item() == 1.0 and out["clip_fraction"].item() == 0.0
    model.zero_grad()
    out["loss_objective"].backward()
    got = _grads(model)
    flat = traj.reshape(-1)
    _, std = step_mean_std(sde_type)(flat["z"], flat["z"], flat["t"], flat["t_next"], noise_level)
    weighted = traj.clone()
    weighted["advantage"] = traj["advantage"] * std.view(4, -1)
    model.zero_grad()
    FlowGRPOLoss(model, sde_type=sde_type, noise_level=noise_level)(weighted)["loss_objective"].backward()
    _assert_grads_close(got, _grads(model))


def _official_guard_policy_loss(log_prob, old_log_prob, std_dev_t, dt, mean, old_mean, adv, clip_range):
    """Transcribed from X-GenGroup/Flow-Factory, src/flow_factory/trainers/grpo.py, ``GRPOGuardTrainer.optimize``
    (advantages clamped to +-5 first, as its adv_clip_range does)."""
    adv = torch.clamp(adv, -5.0, 5.0)
    scale_factor = torch.sqrt(-dt) * std_dev_t
    mse = (mean - old_mean).flatten(1).pow(2).mean(dim=1)
    ratio = torch.exp((log_prob - old_log_prob) * scale_factor + mse / (2 * scale_factor))
    unclipped_loss = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.mean(torch.maximum(unclipped_loss, clipped_loss)), ratio


def test_guard_loss_matches_flow_factory_off_policy(make_model, perturb):
    old = make_model(data_shape=(D,), cond_dim=C, dtype=torch.float64)
    traj = _rollout(old, "flow_sde", 0.7)
    model = perturb(old, scale=0.2)
    out = GRPOGuardLoss(model, clip_range=1e-3)(traj)
    flat = traj.reshape(-1)
    mean, std = step_mean_std("flow_sde")(flat["z"], model(flat["z"], flat["t"], flat["cond"]), flat["t"], flat["t_next"], 0.7)
    log_prob = gaussian_log_prob(flat["z_next"], mean, std)
    dt = flat["t_next"] - flat["t"]
    expected, ratio = _official_guard_policy_loss(
        log_prob, flat["old_log_prob"], std.flatten() / torch.sqrt(-dt), dt, mean, flat["old_mean"], flat["advantage"], 1e-3
    )
    # rtol 1e-7: the loss's clip bounds are float32 buffers (1 +- 1e-3 rounded to float32).
    torch.testing.assert_close(out["loss_objective"], expected, rtol=1e-7, atol=1e-12)
    torch.testing.assert_close(out["ratio_max"], ratio.max(), rtol=1e-10, atol=1e-12)
    assert 0.0 < out["clip_fraction"].item() <= 1.0
    with pytest.raises(KeyError, match="old_mean"):
        GRPOGuardLoss(model)(traj.exclude("old_mean"))


def test_cps_flow_grpo_on_policy_ratio_is_exactly_one(make_model):
    """The CPS rollout's recorded log-probs equal the loss's recomputation: ratio 1, loss -mean(A)."""
    model = make_model(data_shape=(D,), cond_dim=C, dtype=torch.float64)
    traj = _rollout(model, "cps", 0.8, record_mean=False)
    assert traj.shape == (4, 4)  # the last step (to t = 0) is deterministic under CPS
    out = FlowGRPOLoss(model, sde_type="cps", noise_level=0.8)(traj)
    assert out["ratio_min"].item() == 1.0 and out["ratio_max"].item() == 1.0
    torch.testing.assert_close(out["loss_objective"], -traj["advantage"].mean())
    with pytest.raises(ValueError, match=r"noise_level must be in \(0, 1\] for sde_type='cps'"):
        FlowGRPOLoss(model, sde_type="cps", noise_level=1.2)
