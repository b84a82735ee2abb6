"""FLUX.2 (dev and klein): `Flux2Transformer2DModel` as a velocity model, its latents, prompt encoder and grid.

What the adapter translates (checked against diffusers 0.42's `Flux2Pipeline.__call__` and
`Flux2KleinPipeline.__call__`):
- latents: the VAE (`AutoencoderKLFlux2`) gives 32 channels at H/8; the pipeline patchifies 2x2 into 128
  channels at H/16 and normalises them by the VAE's batch-norm running statistics (`vae.bn`). It draws its
  noise in that space, (B, 128, H/16, W/16), and hands the transformer one token per latent pixel,
  (B, H/16 * W/16, 128) (`_pack_latents`). vgrpo_lib's sample is the (B, 128, h, w) tensor; the adapter
  flattens it on the way in and restores it on the way out. `decode_flux2` undoes the normalisation and the
  patchify before the VAE decoder, `encode_images_flux2` is its inverse.
- positions: four-axis RoPE ids (t, h, w, l): image tokens (0, row, col, 0), text tokens (0, 0, 0, index),
  rebuilt from the shapes at each call.
- time: the pipeline passes `timestep / 1000`, i.e. the sigma; the transformer multiplies by 1000 itself.
- guidance: FLUX.2-dev is guidance-distilled (`guidance_embeds=True`; the pipeline's default scale is 4.0).
  klein has no guidance embedding; its base checkpoints run true CFG against the empty prompt when
  `guidance_scale > 1` (`is_distilled=False`), the step-distilled ones none. Training rollouts here are
  CFG-free; Flow-GRPO's `flow_grpo.cfg_scale` adds CFG with the empty prompt for klein base.
- text: dev encodes with Mistral Small 3.1 (`Mistral3ForConditionalGeneration`, a system message and the
  processor's chat template) and stacks the hidden states of layers (10, 20, 30); klein with Qwen3
  (`Qwen3ForCausalLM`, its chat template without thinking) and layers (9, 18, 27). Both pad to
  `max_sequence_length` (512) and pass no attention mask, so the padding is part of the condition and the
  length must stay the pipeline's to reproduce it. The pipelines' own `encode_prompt` does all of this.
- grid: sigmas `linspace(1, 1/N, N)` under the exponential shift with FLUX.2's empirical mu, which depends
  on the number of image tokens and on N (`flux2_empirical_mu`).
"""

from __future__ import annotations

import torch
from torch import nn
from tensordict import TensorDict

from .latents import latent_shape, vae_scale_factor
from .schedules import sigma_grid_from_scheduler_config
from .velocity import GuidanceEmbeddingAdapter

__all__ = [
    "FLUX2_COND_KEYS", "FLUX2_LORA_TARGET_MODULES", "Flux2Velocity", "decode_flux2", "encode_images_flux2",
    "encode_prompts_flux2", "flux2_empirical_mu", "flux2_image_ids", "flux2_latent_shape", "flux2_sigma_grid",
    "flux2_text_ids",
]

FLUX2_COND_KEYS = ("prompt_embeds",)

# Every linear layer of the attention and feed-forward paths. The single-stream blocks fuse q, k, v and the MLP
# input into `attn.to_qkv_mlp_proj` and have one output projection `attn.to_out` (a Linear, where the double-stream
# blocks have the list `attn.to_out` holding `to_out.0`), so the SD3 / FLUX.1 attention list misses them. The
# single-stream blocks' `to_out` must not match the double-stream list, hence one regular expression (peft matches a
# string target against each module's full name).
FLUX2_LORA_TARGET_MODULES = (
    r".*transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|to_add_out)"
    r"|ff\.linear_in|ff\.linear_out|ff_context\.linear_in|ff_context\.linear_out)"
    r"|.*single_transformer_blocks\.\d+\.attn\.(to_qkv_mlp_proj|to_out)"
)


def flux2_empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """FLUX.2's shift parameter mu for `image_seq_len` image tokens and `num_steps` sampler steps.

    Two lines fitted by Black Forest Labs (`compute_empirical_mu` in diffusers' FLUX.2 pipeline): mu at 10 and at
    200 steps, each linear in the token count, and linear interpolation in the number of steps between them;
    above 4300 tokens the 200-step line alone.
    """
    mu_200 = 0.00016927 * image_seq_len + 0.45666666
    if image_seq_len > 4300:
        return float(mu_200)
    mu_10 = 8.73809524e-05 * image_seq_len + 1.89833333
    slope = (mu_200 - mu_10) / 190.0
    return float(mu_200 + slope * (num_steps - 200.0))


def flux2_sigma_grid(scheduler_config, num_steps: int, image_seq_len: int) -> list[float]:
    """The FLUX.2 pipelines' time grid: num_steps + 1 values from 1.0 down to 0.0.

    Args:
        scheduler_config: the pipeline scheduler's config (`FlowMatchEulerDiscreteScheduler`, dynamic shifting).
        num_steps: sampler steps N.
        image_seq_len: image tokens, h * w of the (B, 128, h, w) latent (4096 at 1024 x 1024 pixels).
    """
    mu = flux2_empirical_mu(image_seq_len, num_steps)
    return sigma_grid_from_scheduler_config(scheduler_config, num_steps, image_seq_len, mu=mu)


def flux2_image_ids(height: int, width: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """RoPE ids of the image tokens, (h * w, 4) rows (0, row, col, 0), row-major like the pipeline's."""
    ids = torch.zeros(height, width, 4, device=device, dtype=dtype)
    ids[..., 1] = torch.arange(height, device=device, dtype=dtype)[:, None]
    ids[..., 2] = torch.arange(width, device=device, dtype=dtype)[None, :]
    return ids.reshape(height * width, 4)


def flux2_text_ids(length: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """RoPE ids of the text tokens, (L, 4) rows (0, 0, 0, index)."""
    ids = torch.zeros(length, 4, device=device, dtype=dtype)
    ids[:, 3] = torch.arange(length, device=device, dtype=dtype)
    return ids


class Flux2Velocity(GuidanceEmbeddingAdapter):
    """`Flux2Transformer2DModel` presented as `model(x_t, t, cond) -> v` on (B, 128, h, w) latents.

    Args:
        transformer: a `Flux2Transformer2DModel` (possibly with peft LoRA adapters).
        guidance_scale: see `GuidanceEmbeddingAdapter` (FLUX.2-dev: 4.0, the pipeline's default; klein has no
            guidance embedding).
        autocast_dtype: see `FlowTransformerAdapter`.

    Call:
        x_t: (B, C, h, w) normalised patchified latents (C = 128 = transformer `in_channels`), t: (B,) in [0, 1],
        cond: TensorDict[B] with "prompt_embeds" (B, L, joint_attention_dim), optionally "guidance" (B,).
        Returns v: (B, C, h, w) in the dtype of x_t.
    """

    def __init__(self, transformer: nn.Module, guidance_scale: float = 4.0, autocast_dtype: torch.dtype | None = None):
        super().__init__(transformer, guidance_scale, autocast_dtype)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None) -> torch.Tensor:
        self._check_inputs(x_t, t, cond, FLUX2_COND_KEYS)
        batch, channels, height, width = x_t.shape
        dtype = self.transformer.dtype
        prompt_embeds = cond["prompt_embeds"].to(dtype)
        tokens = x_t.to(dtype).reshape(batch, channels, height * width).transpose(1, 2)
        with self._autocast(x_t.device):
            out = self.transformer(
                hidden_states=tokens,
                timestep=t.to(dtype),
                guidance=self._guidance(t, cond),
                encoder_hidden_states=prompt_embeds,
                txt_ids=flux2_text_ids(prompt_embeds.shape[1], device=x_t.device),
                img_ids=flux2_image_ids(height, width, device=x_t.device),
                return_dict=False,
            )[0]
        return out.transpose(1, 2).reshape(batch, channels, height, width).to(x_t.dtype)


@torch.no_grad()
def encode_prompts_flux2(pipe, prompts: list[str], max_sequence_length: int = 512) -> TensorDict:
    """Encode prompts with the FLUX.2 pipeline's own text encoder (dev: Mistral3, klein: Qwen3).

    Args:
        pipe: a `Flux2Pipeline` or `Flux2KleinPipeline`.
        prompts: B strings.
        max_sequence_length: tokens per prompt, padded (the pipelines' default, 512).

    Returns:
        TensorDict[B] with "prompt_embeds" (B, max_sequence_length, joint_attention_dim). The pipeline's
        `text_ids` are rebuilt by `Flux2Velocity`, so they are not stored.
    """
    prompt_embeds, _ = pipe.encode_prompt(prompt=list(prompts), max_sequence_length=max_sequence_length)
    return TensorDict({"prompt_embeds": prompt_embeds}, batch_size=[len(prompts)], device=prompt_embeds.device)


def flux2_latent_shape(vae: nn.Module, height: int, width: int) -> tuple[int, int, int]:
    """(C, h, w) of the normalised patchified latent of a `height` x `width` image: (4 latent_channels, H/16, W/16)
    for the 8x VAE. Sizes must be multiples of 2 x the VAE's scale factor (16)."""
    channels, latent_height, latent_width = latent_shape(height, width, vae.config.latent_channels,
                                                          scale_factor=vae_scale_factor(vae))
    return 4 * channels, latent_height // 2, latent_width // 2


def _batch_norm_statistics(vae: nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps).to(like.device, like.dtype)
    return mean, std


def decode_flux2(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Decode (B, 4C, h, w) normalised patchified latents to (B, 3, 16h, 16w) float32 images in [0, 1], as the
    pipeline does: undo the batch-norm normalisation, unpatchify 2x2, decode, map [-1, 1] to [0, 1]."""
    mean, std = _batch_norm_statistics(vae, latents)
    z = latents * std + mean
    b, c4, h, w = z.shape
    z = z.reshape(b, c4 // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c4 // 4, 2 * h, 2 * w)
    images = vae.decode(z.to(vae.dtype), return_dict=False)[0]
    return (images.float() / 2 + 0.5).clamp(0, 1)


def encode_images_flux2(vae: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) images in [0, 1] -> (B, 4C, H/16, W/16) normalised patchified latents (the posterior mode, as
    the pipeline encodes its reference images); the inverse of `decode_flux2` up to the autoencoder's error."""
    z = vae.encode((images * 2 - 1).to(vae.dtype)).latent_dist.mode()
    b, c, h, w = z.shape
    z = z.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, 4 * c, h // 2, w // 2)
    mean, std = _batch_norm_statistics(vae, z)
    return (z - mean) / std
