"""diffusers SD3 / FLUX / FLUX.2 / Qwen-Image transformers as vgrpo_lib velocity models, with LoRA policies and presets.

- `SD3Velocity`, `FluxVelocity`, `Flux2Velocity`: `model(x_t, t, cond) -> v` on unpacked latents (B, C, H, W),
  t in [0, 1] (1 = noise), cond a TensorDict of prompt embeddings.
- FLUX.2 (flux2.py): `encode_prompts_flux2`, `flux2_sigma_grid` (empirical mu), `decode_flux2` /
  `encode_images_flux2` (batch-norm latent normalisation), `FLUX2_LORA_TARGET_MODULES` (fused single-stream
  projections included).
- Qwen-Image (qwen_image.py): `QwenImageVelocity`, `encode_prompts_qwen_image` (padded, with a mask),
  `decode_qwen_image` / `encode_images_qwen_image` (one-frame video VAE, per-channel normalisation),
  `true_cfg_qwen_image` (the pipeline's norm-rescaled true CFG against a negative prompt).
- `classifier_free_guidance`: CFG with encoded empty-prompt embeddings, cond + uncond in one batched forward.
- `sd3_sigma_grid`, `flux_sigma_grid`, `sigma_grid_from_scheduler_config`: the pipelines' time grids.
- `latent_shape`, `decode_latents`, `latent_channel_statistics`, `encode_prompts_sd3`, `encode_prompts_flux`: the
  pipeline plumbing; `FlowTransformerAdapter` / `GuidanceEmbeddingAdapter`: the base classes of the velocity models.
- `add_lora`, `add_adapter_copy`, `add_behaviour_adapter`, `copy_adapter`, `ema_adapter`, `reference_policy`,
  `behaviour_policy`, `AdapterView`, `AdapterReference` (resettable, GARDO's reset): trained / old / reference
  policies on one transformer.
- `load_sd35_medium`, `load_flux_dev`: real checkpoints by name (clear error when missing); `load_policy(path,
  family)` for any row of `FAMILIES` (`PipelineFamily`: what differs between pipeline kinds).
- Wan 2.1 / 2.2 text-to-video (wan.py): `WanVelocity` on video latents (B, C, F, H, W), `WanExperts` (Wan 2.2's two
  experts, switched by the boundary), `load_wan` -> `WanPolicy`, `wan_sigma_grid`, `decode_videos` / `encode_videos`.
"""

from .flux import FluxVelocity, encode_prompts_flux, latent_image_ids, pack_latents, unpack_latents
from .flux2 import (FLUX2_LORA_TARGET_MODULES, Flux2Velocity, decode_flux2, encode_images_flux2, encode_prompts_flux2,
                    flux2_empirical_mu, flux2_sigma_grid)
from .latents import decode_latents, latent_channel_statistics, latent_shape, vae_scale_factor
from .lora import (ATTENTION_TARGET_MODULES, AdapterReference, AdapterView, adapter_active, adapters_disabled,
                   add_adapter_copy, add_behaviour_adapter, add_lora, behaviour_policy, copy_adapter, ema_adapter,
                   lora_parameters, reference_policy, upcast_trainable_parameters)
from .presets import (FAMILIES, FLUX1_DEV, FLUX2_DEV, FLUX2_KLEIN, QWEN_IMAGE, SD35_MEDIUM, DiffusersPolicy, PipelineFamily,
                      load_flux_dev, load_policy, load_sd35_medium)
from .qwen_image import (QWEN_IMAGE_LORA_TARGET_MODULES, QwenImageVelocity, decode_qwen_image, encode_images_qwen_image,
                         encode_prompts_qwen_image, true_cfg_qwen_image)
from .schedules import (flux_mu, flux_sigma_grid, sd3_sigma_grid, shift_sigmas, sigma_grid_from_scheduler_config,
                        stretch_to_terminal)
from .sd3 import SD3Velocity, encode_prompts_sd3
from .velocity import FlowTransformerAdapter, GuidanceEmbeddingAdapter, classifier_free_guidance
from .wan import (WAN21_T2V, WAN_LORA_TARGET_MODULES, WanExperts, WanPolicy, WanVelocity, decode_videos,
                  encode_prompts_wan, encode_videos, load_wan, wan_latent_shape, wan_sigma_grid,
                  wan_sigma_grid_from_scheduler_config)

__all__ = [
    "ATTENTION_TARGET_MODULES", "AdapterReference", "AdapterView", "DiffusersPolicy", "FAMILIES", "FLUX1_DEV", "FLUX2_DEV", "FLUX2_KLEIN",
    "FLUX2_LORA_TARGET_MODULES", "FlowTransformerAdapter", "Flux2Velocity", "GuidanceEmbeddingAdapter", "FluxVelocity", "PipelineFamily", "QWEN_IMAGE",
    "QWEN_IMAGE_LORA_TARGET_MODULES", "QwenImageVelocity", "SD35_MEDIUM", "SD3Velocity", "adapter_active", "adapters_disabled",
    "add_adapter_copy", "add_behaviour_adapter", "add_lora", "behaviour_policy", "classifier_free_guidance", "copy_adapter", "decode_flux2", "decode_latents", "decode_qwen_image", "ema_adapter",
    "encode_images_flux2", "encode_images_qwen_image", "encode_prompts_flux", "encode_prompts_flux2",
    "encode_prompts_qwen_image", "encode_prompts_sd3", "flux2_empirical_mu",
    "flux2_sigma_grid", "flux_mu", "flux_sigma_grid", "latent_channel_statistics", "latent_image_ids", "latent_shape",
    "load_flux_dev", "load_policy", "load_sd35_medium", "lora_parameters", "pack_latents", "reference_policy",
    "sd3_sigma_grid", "shift_sigmas", "sigma_grid_from_scheduler_config", "stretch_to_terminal", "true_cfg_qwen_image",
    "unpack_latents",
    "upcast_trainable_parameters", "vae_scale_factor",
    "WAN21_T2V", "WAN_LORA_TARGET_MODULES", "WanExperts", "WanPolicy", "WanVelocity", "decode_videos",
    "encode_prompts_wan", "encode_videos", "load_wan", "wan_latent_shape", "wan_sigma_grid",
    "wan_sigma_grid_from_scheduler_config",
]
