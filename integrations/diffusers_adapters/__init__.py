"""diffusers SD3 / FLUX transformers as vgrpo_lib velocity models, with LoRA policies and presets.

- `SD3Velocity`, `FluxVelocity`: `model(x_t, t, cond) -> v` on unpacked latents (B, C, H, W),
  t in [0, 1] (1 = noise), cond a TensorDict of prompt embeddings.
- `classifier_free_guidance`: CFG with encoded empty-prompt embeddings, cond + uncond in one batched forward.
- `sd3_sigma_grid`, `flux_sigma_grid`, `sigma_grid_from_scheduler_config`: the pipelines' time grids.
- `latent_shape`, `decode_latents`, `encode_prompts_sd3`, `encode_prompts_flux`: the pipeline plumbing.
- `add_lora`, `add_behaviour_adapter`, `copy_adapter`, `ema_adapter`, `reference_policy`,
  `behaviour_policy`, `AdapterView`: trained / old / reference policies on one transformer.
- `load_sd35_medium`, `load_flux_dev`: real checkpoints by name (clear error when missing).
- Wan 2.1 / 2.2 text-to-video (wan.py): `WanVelocity` on video latents (B, C, F, H, W), `WanExperts` (Wan 2.2's two
  experts, switched by the boundary), `load_wan` -> `WanPolicy`, `wan_sigma_grid`, `decode_videos` / `encode_videos`.
"""

from .flux import FluxVelocity, encode_prompts_flux, latent_image_ids, pack_latents, unpack_latents
from .latents import decode_latents, latent_shape, vae_scale_factor
from .lora import (ATTENTION_TARGET_MODULES, AdapterView, adapter_active, adapters_disabled, add_behaviour_adapter,
                   add_lora, behaviour_policy, copy_adapter, ema_adapter, lora_parameters, reference_policy,
                   upcast_trainable_parameters)
from .presets import FLUX1_DEV, SD35_MEDIUM, DiffusersPolicy, load_flux_dev, load_policy, load_sd35_medium
from .schedules import flux_mu, flux_sigma_grid, sd3_sigma_grid, shift_sigmas, sigma_grid_from_scheduler_config
from .sd3 import SD3Velocity, encode_prompts_sd3
from .velocity import FlowTransformerAdapter, classifier_free_guidance
from .wan import (WAN21_T2V, WAN_LORA_TARGET_MODULES, WanExperts, WanPolicy, WanVelocity, decode_videos,
                  encode_prompts_wan, encode_videos, load_wan, wan_latent_shape, wan_sigma_grid,
                  wan_sigma_grid_from_scheduler_config)

__all__ = [
    "ATTENTION_TARGET_MODULES", "AdapterView", "DiffusersPolicy", "FLUX1_DEV",
    "FlowTransformerAdapter", "FluxVelocity", "SD35_MEDIUM", "SD3Velocity", "adapter_active", "adapters_disabled",
    "add_behaviour_adapter", "add_lora", "behaviour_policy", "classifier_free_guidance", "copy_adapter", "decode_latents", "ema_adapter",
    "encode_prompts_flux", "encode_prompts_sd3", "flux_mu", "flux_sigma_grid", "latent_image_ids", "latent_shape",
    "load_flux_dev", "load_policy", "load_sd35_medium", "lora_parameters", "pack_latents", "reference_policy",
    "sd3_sigma_grid", "shift_sigmas", "sigma_grid_from_scheduler_config", "unpack_latents",
    "upcast_trainable_parameters", "vae_scale_factor",
    "WAN21_T2V", "WAN_LORA_TARGET_MODULES", "WanExperts", "WanPolicy", "WanVelocity", "decode_videos",
    "encode_prompts_wan", "encode_videos", "load_wan", "wan_latent_shape", "wan_sigma_grid",
    "wan_sigma_grid_from_scheduler_config",
]
