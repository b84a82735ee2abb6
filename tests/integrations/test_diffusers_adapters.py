"""SD3 / FLUX adapters, time grids, LoRA policies and one loss step per algorithm, on tiny random diffusers models."""

import numpy as np
import pytest
import torch
from tensordict import TensorDict

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,  # noqa: E402
                       FluxTransformer2DModel, SD3Transformer2DModel)

from vgrpo_lib.integrations.diffusers_adapters import (AdapterView, FluxVelocity, classifier_free_guidance,  # noqa: E402
                                             SD3Velocity, add_behaviour_adapter, add_lora, behaviour_policy,
                                             copy_adapter, decode_latents, ema_adapter, encode_prompts_sd3,
                                             flux_mu, flux_sigma_grid, latent_shape, lora_parameters,
                                             load_flux_dev, load_sd35_medium, pack_latents, reference_policy,
                                             sd3_sigma_grid, sigma_grid_from_scheduler_config, unpack_latents,
                                             upcast_trainable_parameters)
from vgrpo_lib.integrations.rewards import MissingWeightsError  # noqa: E402

B, C, H, W, L = 4, 4, 8, 8, 5


def tiny_sd3():
    torch.manual_seed(0)
    return SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=C, num_layers=2, attention_head_dim=8,
                                 num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                                 pooled_projection_dim=8, out_channels=C, pos_embed_max_size=16)


def tiny_flux(guidance_embeds=True):
    torch.manual_seed(0)
    return FluxTransformer2DModel(patch_size=1, in_channels=4 * C, num_layers=1, num_single_layers=1,
                                  attention_head_dim=8, num_attention_heads=2, joint_attention_dim=16,
                                  pooled_projection_dim=8, guidance_embeds=guidance_embeds, axes_dims_rope=(2, 2, 4))


def inputs(batch=B, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, C, H, W, generator=g)
    t = torch.rand(batch, generator=g)
    cond = TensorDict({"prompt_embeds": torch.randn(batch, L, 16, generator=g),
                       "pooled_prompt_embeds": torch.randn(batch, 8, generator=g)}, batch_size=[batch])
    return x, t, cond


ADAPTERS = {"sd3": lambda: SD3Velocity(tiny_sd3()), "flux": lambda: FluxVelocity(tiny_flux(), guidance_scale=3.5)}


def test_sd3_adapter_is_the_transformer_at_timestep_t_times_1000():
    transformer = tiny_sd3()
    x, t, cond = inputs()
    v = SD3Velocity(transformer)(x, t, cond)
    assert v.shape == x.shape
    direct = transformer(hidden_states=x, timestep=t * 1000, encoder_hidden_states=cond["prompt_embeds"],
                         pooled_projections=cond["pooled_prompt_embeds"], return_dict=False)[0]
    assert torch.equal(v, direct)


@pytest.mark.parametrize("guidance_embeds", [True, False])
def test_flux_adapter_matches_the_pipeline_packing_ids_and_timestep(guidance_embeds):
    transformer = tiny_flux(guidance_embeds)
    x, t, cond = inputs()
    v = FluxVelocity(transformer, guidance_scale=3.5)(x, t, cond)
    assert v.shape == x.shape
    vae_scale = 8  # the pipeline helpers take pixel sizes; H x W latents are 8H x 8W images
    direct = transformer(
        hidden_states=FluxPipeline._pack_latents(x, B, C, H, W),
        timestep=(t * 1000) / 1000,
        guidance=torch.full((B,), 3.5) if guidance_embeds else None,
        pooled_projections=cond["pooled_prompt_embeds"],
        encoder_hidden_states=cond["prompt_embeds"],
        txt_ids=torch.zeros(L, 3),
        img_ids=FluxPipeline._prepare_latent_image_ids(B, H // 2, W // 2, "cpu", torch.float32),
        return_dict=False,
    )[0]
    assert torch.equal(v, FluxPipeline._unpack_latents(direct, H * vae_scale, W * vae_scale, vae_scale))


def test_flux_guidance_comes_from_cond_when_given():
    model = FluxVelocity(tiny_flux(), guidance_scale=3.5)
    x, t, cond = inputs()
    default = model(x, t, cond)
    cond["guidance"] = torch.full((B,), 3.5)
    assert torch.equal(model(x, t, cond), default)
    cond["guidance"] = torch.full((B,), 7.0)
    assert not torch.allclose(model(x, t, cond), default)


def test_flux_pack_unpack_round_trip():
    x = torch.randn(2, 16, 6, 10)
    packed = pack_latents(x)
    assert packed.shape == (2, 3 * 5, 64)
    assert torch.equal(packed, FluxPipeline._pack_latents(x, 2, 16, 6, 10))
    assert torch.equal(unpack_latents(packed, 6, 10), x)
    with pytest.raises(ValueError, match="even"):
        pack_latents(torch.randn(1, 4, 5, 4))


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_cfg_batching_equals_two_separate_calls(family):
    model = ADAPTERS[family]()
    x, t, cond = inputs()
    uncond = inputs(batch=1, seed=7)[2]
    guided = classifier_free_guidance(model, uncond, guidance_scale=4.5)(x, t, cond)
    v_cond, v_uncond = model(x, t, cond), model(x, t, uncond.expand(B).clone())
    torch.testing.assert_close(guided, v_uncond + 4.5 * (v_cond - v_uncond), rtol=1e-5, atol=1e-5)


def test_adapters_reject_missing_conditioning():
    model = ADAPTERS["sd3"]()
    x, t, cond = inputs()
    with pytest.raises(ValueError, match="text-conditioned"):
        model(x, t, None)
    with pytest.raises(KeyError, match="pooled_prompt_embeds"):
        model(x, t, cond.exclude("pooled_prompt_embeds"))


@pytest.mark.parametrize("steps,shift", [(10, 3.0), (40, 3.0), (7, 1.0)])
def test_sd3_sigma_grid_matches_the_scheduler(steps, shift):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(steps)
    grid = sd3_sigma_grid(steps, shift)
    assert len(grid) == steps + 1 and grid[0] == 1.0 and grid[-1] == 0.0
    torch.testing.assert_close(torch.tensor(grid, dtype=torch.float32), scheduler.sigmas, rtol=0, atol=1e-6)
    assert sigma_grid_from_scheduler_config(scheduler.config, steps) == grid


@pytest.mark.parametrize("steps,seq_len", [(16, 4096), (16, 1024), (5, 256)])
def test_flux_sigma_grid_matches_the_scheduler_with_dynamic_shift(steps, seq_len):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=flux_mu(seq_len))
    grid = flux_sigma_grid(steps, seq_len)
    torch.testing.assert_close(torch.tensor(grid, dtype=torch.float32), scheduler.sigmas, rtol=0, atol=1e-6)
    assert sigma_grid_from_scheduler_config(scheduler.config, steps, image_seq_len=seq_len) == grid
    with pytest.raises(ValueError, match="image_seq_len"):
        sigma_grid_from_scheduler_config(scheduler.config, steps)


def test_latent_shape_and_vae_decode_with_scaling_and_shift():
    assert latent_shape(512, 768) == (16, 64, 96)
    with pytest.raises(ValueError, match="multiple of 16"):
        latent_shape(520, 512)
    torch.manual_seed(0)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=C, block_out_channels=(8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        layers_per_block=1, norm_num_groups=4, scaling_factor=1.5, shift_factor=0.1)
    z = torch.randn(2, C, 4, 4)
    images = decode_latents(vae, z)
    assert images.shape == (2, 3, 8, 8) and images.min() >= 0 and images.max() <= 1
    expected = (vae.decode(z / 1.5 + 0.1).sample / 2 + 0.5).clamp(0, 1)
    torch.testing.assert_close(images, expected)


def test_prompt_encoding_goes_through_the_pipeline_encoder():
    class RecordingPipe:
        def encode_prompt(self, **kwargs):
            self.kwargs = kwargs
            n = len(kwargs["prompt"])
            return torch.ones(n, 3, 16), None, torch.zeros(n, 8), None

    pipe = RecordingPipe()
    cond = encode_prompts_sd3(pipe, ["a", "b"], max_sequence_length=77)
    assert cond.batch_size == torch.Size([2]) and cond["prompt_embeds"].shape == (2, 3, 16)
    assert pipe.kwargs["do_classifier_free_guidance"] is False and pipe.kwargs["max_sequence_length"] == 77


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_lora_trains_only_adapters_and_the_reference_stays_the_base(family):
    model = ADAPTERS[family]()
    x, t, cond = inputs()
    with torch.no_grad():
        base = model(x, t, cond)
    add_lora(model.transformer, r=4, alpha=8)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".default." in n for n in trainable)
    with torch.no_grad():
        assert torch.equal(model(x, t, cond), base), "LoRA B starts at zero"

    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    target = torch.randn_like(x) - x  # eps - x, a flow-matching target
    torch.nn.functional.mse_loss(model(x, t, cond), target).backward()
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)
    optimizer.step()

    with torch.no_grad():
        trained = model(x, t, cond)
        with reference_policy(model) as reference:
            ref = reference(x, t, cond)
    assert not torch.allclose(trained, base)
    assert torch.equal(ref, base)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == trainable, "the views restore grads"
    torch.testing.assert_close(AdapterView(model, None)(x, t, cond), base, rtol=0, atol=0)


def test_behaviour_adapter_copy_and_ema():
    model = ADAPTERS["sd3"]()
    transformer = model.transformer
    add_lora(transformer, r=4, alpha=8)
    with torch.no_grad():
        for p in lora_parameters(transformer).values():
            p.normal_()
    add_behaviour_adapter(transformer)
    assert transformer.active_adapters() == ["default"]
    assert not any(p.requires_grad for p in lora_parameters(transformer, "old").values())
    x, t, cond = inputs()
    old_view = AdapterView(model)
    with torch.no_grad():
        assert torch.equal(old_view(x, t, cond), model(x, t, cond)), "the behaviour adapter starts as a copy"

    trained, old = lora_parameters(transformer), lora_parameters(transformer, "old")
    before = {k: p.detach().clone() for k, p in old.items()}
    with torch.no_grad():
        for p in trained.values():
            p.add_(1.0)
    with torch.no_grad():
        with behaviour_policy(model) as behaviour:
            v_old = behaviour(x, t, cond)
        assert torch.equal(v_old, old_view(x, t, cond))
        assert not torch.allclose(v_old, model(x, t, cond))
    ema_adapter(transformer, decay=0.75)
    for key, p in old.items():
        torch.testing.assert_close(p, 0.75 * before[key] + 0.25 * trained[key])
    copy_adapter(transformer)
    assert all(torch.equal(old[k], trained[k]) for k in old)
    assert [n for n, p in transformer.named_parameters() if p.requires_grad] == [
        n for n in dict(transformer.named_parameters()) if "lora_" in n and ".default." in n]


def test_upcast_keeps_lora_in_fp32_on_a_bf16_model():
    model = SD3Velocity(tiny_sd3().to(torch.bfloat16), autocast_dtype=torch.bfloat16)
    add_lora(model.transformer, r=4, alpha=8)
    upcast_trainable_parameters(model.transformer)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if not p.requires_grad)
    x, t, cond = inputs()
    v = model(x, t, cond)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()
    v.square().mean().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("loader", [load_sd35_medium, load_flux_dev])
def test_presets_say_which_checkpoint_is_missing_offline(loader, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(MissingWeightsError) as info:
        loader()
    name = "stable-diffusion-3.5-medium" if loader is load_sd35_medium else "FLUX.1-dev"
    assert name in str(info.value) and "weights" in str(info.value)


def _lora_policy(family):
    model = ADAPTERS[family]()
    add_lora(model.transformer, r=4, alpha=8)
    with torch.no_grad():
        for p in lora_parameters(model.transformer).values():
            p.normal_(std=0.1)
    add_behaviour_adapter(model.transformer)
    return model


def _rollout(model, grid, generator):
    """One group-structured rollout through the adapter: 2 prompts x 2 samples, rewards, advantages."""
    from vgrpo_lib import GroupAdvantage, sample_euler

    _, _, cond = inputs(batch=2)
    cond = cond.repeat_interleave(2, dim=0)
    group = torch.tensor([0, 0, 1, 1])
    noise = torch.randn(B, C, H, W, generator=generator)
    with torch.no_grad():
        sample = sample_euler(AdapterView(model), noise, grid, cond)
    reward = -sample.flatten(1).square().mean(1)
    return noise, sample, cond, group, GroupAdvantage()(reward, group)


def _step_changes_only_lora(model, loss):
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    optimizer.zero_grad()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n and ".default." in n for n in changed)


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_one_vgrpo_iteration_through_the_adapter(family):
    from vgrpo_lib import ELBOSurrogate, VGRPOLoss

    model = _lora_policy(family)
    g = torch.Generator().manual_seed(0)
    _, sample, cond, group, advantage = _rollout(model, sd3_sigma_grid(4), g)
    estimator = ELBOSurrogate(num_pairs=2, sharing="group")
    pairs = estimator.sample_pairs(sample, group=group, generator=g)
    old_log_prob = estimator(AdapterView(model), sample, cond, pairs)
    batch = TensorDict({"sample": sample, "cond": cond, "advantage": advantage, "pairs": pairs,
                        "old_log_prob": old_log_prob}, batch_size=[B])
    loss = VGRPOLoss(model, estimator, clip_range=0.01, ref_model=AdapterView(model, None), ref_kl_coef=0.1)
    out = loss(batch)
    assert out["ratio_mean"].item() == pytest.approx(1.0, abs=1e-6), "theta == theta_old right after the copy"
    _step_changes_only_lora(model, out["loss_objective"] + out["loss_ref_kl"])


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_one_flow_grpo_iteration_through_the_adapter(family):
    from vgrpo_lib import FlowGRPOLoss, sample_sde

    model = _lora_policy(family)
    g = torch.Generator().manual_seed(0)
    noise, _, cond, _, advantage = _rollout(model, sd3_sigma_grid(4), g)
    with torch.no_grad():
        _, steps = sample_sde(AdapterView(model), noise, sd3_sigma_grid(4), cond, generator=g)
    num_steps = steps.batch_size[1]
    batch = steps.exclude("log_prob").update({
        "old_log_prob": steps["log_prob"],
        "advantage": advantage[:, None].expand(B, num_steps),
        "cond": cond.unsqueeze(1).expand(B, num_steps).clone(),
    })
    out = FlowGRPOLoss(model, ref_model=AdapterView(model, None), ref_kl_coef=0.04)(batch)
    torch.testing.assert_close(out["ratio_mean"], torch.tensor(1.0), rtol=0, atol=1e-5)
    _step_changes_only_lora(model, out["loss_objective"] + out["loss_ref_kl"])


@pytest.mark.parametrize("family", ["sd3", "flux"])
def test_one_diffusion_nft_iteration_through_the_adapter(family):
    from vgrpo_lib import DiffusionNFTLoss, ELBOSurrogate

    model = _lora_policy(family)
    g = torch.Generator().manual_seed(0)
    _, sample, cond, _, advantage = _rollout(model, flux_sigma_grid(4, image_seq_len=(H // 2) * (W // 2)), g)
    estimator = ELBOSurrogate(num_pairs=2, sharing="none")
    batch = TensorDict({"sample": sample, "cond": cond, "advantage": advantage,
                        "pairs": estimator.sample_pairs(sample, generator=g)}, batch_size=[B])
    loss = DiffusionNFTLoss(model, AdapterView(model), estimator, strength=1.0, ref_model=AdapterView(model, None),
                            ref_kl_coef=1e-4)
    out = loss(batch)
    _step_changes_only_lora(model, out["loss_objective"] + out["loss_ref_kl"])
