"""Qwen-Image: `QwenImageTransformer2DModel` as a velocity model, its prompt encoder, VAE and true CFG.

What the adapter translates (checked against diffusers 0.42's `QwenImagePipeline.__call__`):
- latents: `AutoencoderKLQwenImage` is a video autoencoder; an image is one frame, (B, 16, 1, H/8, W/8), and the
  pipeline normalises it per channel with the config's `latents_mean` / `latents_std`. vgrpo_lib's sample is the
  normalised latent without the frame axis, (B, 16, h, w); the transformer sees 2x2 patch tokens
  (B, h/2 * w/2, 64) in FLUX.1's layout (`flux.pack_latents`), and `img_shapes` [(1, h/2, w/2)] per sample for
  its 3-axis RoPE.
- time: the pipeline passes `timestep / 1000`, the sigma; the transformer's time projection scales by 1000.
- text: Qwen2.5-VL's last hidden state of the prompt inside the pipeline's chat template, with the template's
  first `prompt_template_encode_start_idx` (34) tokens dropped, through the pipeline's own `encode_prompt`. Its
  length varies with the prompt; `encode_prompts_qwen_image` pads every prompt to `max_sequence_length` with a
  mask ("prompt_embeds_mask") so that prompts cache and batch as fixed-size rows, and the adapter cuts a batch
  back to its longest prompt before the forward (the pipeline pads to the batch's longest the same way: the
  padding is masked out of the attention, and the text RoPE positions of the real tokens do not change).
- guidance: Qwen-Image is not guidance-distilled (`guidance_embeds=False`). The pipeline runs *true* CFG only
  when a `negative_prompt` is given and `true_cfg_scale > 1` (default 4.0): `v = v_neg + s (v_c - v_neg)`,
  rescaled per token to the norm of `v_c` (`true_cfg_qwen_image`). vgrpo_lib's training rollouts and the
  V-GRPO / DiffusionNFT losses are CFG-free; Flow-GRPO's `flow_grpo.cfg_scale` uses plain CFG against the
  empty prompt (no norm rescale); evaluation uses true CFG when the task has a negative prompt
  (`model.negative_prompt`, `model.true_cfg_scale`).
- grid: FLUX.1's resolution-dependent exponential shift with Qwen-Image's config (base/max shift 0.5/0.9
  over 256/8192 tokens) and its `shift_terminal` (0.02), through `sigma_grid_from_scheduler_config`.
"""

from __future__ import annotations

import torch
from torch import nn
from tensordict import TensorDict

from vgrpo_lib.samplers import ClassifierFreeGuidance

from .flux import pack_latents, unpack_latents
from .latents import latent_channel_statistics, latent_shape
from .velocity import GuidanceEmbeddingAdapter, classifier_free_guidance

__all__ = [
    "QWEN_IMAGE_COND_KEYS", "QWEN_IMAGE_LORA_TARGET_MODULES", "NormRescaledGuidance", "QwenImageVelocity",
    "decode_qwen_image", "encode_images_qwen_image", "encode_prompts_qwen_image", "qwen_image_latent_shape",
    "true_cfg_qwen_image",
]

QWEN_IMAGE_COND_KEYS = ("prompt_embeds", "prompt_embeds_mask")

# The attention projections of both streams and both streams' MLPs: VeRL-Omni's Qwen-Image list
# (examples/flowgrpo_trainer/qwen_image/run_qwen_image_ocr_lora.sh). Flow-Factory's default lists
# `img_mlp.net.2.proj`, which diffusers 0.42 names `img_mlp.net.2` (a Linear).
QWEN_IMAGE_LORA_TARGET_MODULES = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2",
)


class QwenImageVelocity(GuidanceEmbeddingAdapter):
    """`QwenImageTransformer2DModel` presented as `model(x_t, t, cond) -> v` on unpacked latents.

    Args:
        transformer: a `QwenImageTransformer2DModel` (possibly with peft LoRA adapters).
        guidance_scale: see `GuidanceEmbeddingAdapter`; used only by a guidance-distilled config
            (`guidance_embeds`), Qwen-Image itself has none.
        autocast_dtype: see `FlowTransformerAdapter`.

    Call:
        x_t: (B, 16, h, w) normalised latents (h, w even), t: (B,) in [0, 1],
        cond: TensorDict[B] with "prompt_embeds" (B, L, joint_attention_dim) and "prompt_embeds_mask" (B, L)
        (1 for a token, 0 for padding). Returns v: (B, 16, h, w) in the dtype of x_t.
    """

    def __init__(self, transformer: nn.Module, guidance_scale: float = 1.0, autocast_dtype: torch.dtype | None = None):
        super().__init__(transformer, guidance_scale, autocast_dtype)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None) -> torch.Tensor:
        self._check_inputs(x_t, t, cond, QWEN_IMAGE_COND_KEYS)
        batch, _, height, width = x_t.shape
        dtype = self.transformer.dtype
        mask = cond["prompt_embeds_mask"]
        length = max(int(mask.sum(dim=1).max()), 1)  # the batch's longest prompt: the rest is padding
        with self._autocast(x_t.device):
            tokens = self.transformer(
                hidden_states=pack_latents(x_t.to(dtype)),
                timestep=t.to(dtype),
                guidance=self._guidance(t, cond),
                encoder_hidden_states=cond["prompt_embeds"][:, :length].to(dtype),
                encoder_hidden_states_mask=mask[:, :length].to(torch.long),
                img_shapes=[[(1, height // 2, width // 2)]] * batch,
                return_dict=False,
            )[0]
        return unpack_latents(tokens, height, width).to(x_t.dtype)


@torch.no_grad()
def encode_prompts_qwen_image(pipe, prompts: list[str], max_sequence_length: int = 512) -> TensorDict:
    """Encode prompts with the Qwen-Image pipeline's own Qwen2.5-VL encoder and prompt template.

    Args:
        pipe: a `QwenImagePipeline`.
        prompts: B strings.
        max_sequence_length: tokens kept per prompt (the pipeline's default, 512; at most 1024); every prompt is
            padded to it.

    Returns:
        TensorDict[B] with "prompt_embeds" (B, max_sequence_length, hidden) and "prompt_embeds_mask"
        (B, max_sequence_length), int64, 1 for a token and 0 for padding.
    """
    embeds, mask = pipe.encode_prompt(prompt=list(prompts), max_sequence_length=max_sequence_length)
    batch, length, hidden = embeds.shape
    if mask is None:  # the pipeline drops an all-ones mask
        mask = torch.ones(batch, length, dtype=torch.long, device=embeds.device)
    padded = embeds.new_zeros(batch, max_sequence_length, hidden)
    padded[:, :length] = embeds
    padded_mask = torch.zeros(batch, max_sequence_length, dtype=torch.long, device=embeds.device)
    padded_mask[:, :length] = mask
    return TensorDict({"prompt_embeds": padded, "prompt_embeds_mask": padded_mask}, batch_size=[batch],
                      device=embeds.device)


def _patch_norms(v: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> the norm of each 2x2 patch token over its 4C values, broadcast back to (B, C, h, w)."""
    b, c, h, w = v.shape
    norms = v.view(b, c, h // 2, 2, w // 2, 2).square().sum(dim=(1, 3, 5), keepdim=True).sqrt()
    return norms.expand(b, c, h // 2, 2, w // 2, 2).reshape(b, c, h, w)


class NormRescaledGuidance(ClassifierFreeGuidance):
    """Qwen-Image's true CFG: ``v_neg + scale (v_c - v_neg)`` rescaled per patch token to the norm of ``v_c``
    (``QwenImagePipeline.__call__``), both branches in one batched forward. Build it with `true_cfg_qwen_image`."""

    def forward(self, z, t, cond):
        both = self.model(torch.cat([z, z]), torch.cat([t, t]), torch.cat([cond, self.null_cond(cond)]))
        v_cond, v_negative = both.chunk(2)
        if self.detach_uncond:
            v_negative = v_negative.detach()
        combined = v_negative + self.scale * (v_cond - v_negative)
        return combined * (_patch_norms(v_cond) / _patch_norms(combined))


def true_cfg_qwen_image(model: nn.Module, negative: TensorDict, true_cfg_scale: float) -> nn.Module:
    """`model` under Qwen-Image's true CFG against the encoded `negative` prompt (a TensorDict of batch (1,) or (B,),
    e.g. `encode_prompts_qwen_image(pipe, [" "])`); `true_cfg_scale <= 1` returns `model` itself, as the pipeline
    then runs no CFG."""
    if true_cfg_scale <= 1.0:
        return model
    plain = classifier_free_guidance(model, negative, true_cfg_scale)
    return NormRescaledGuidance(plain.model, plain.null_cond, plain.scale)


def qwen_image_latent_shape(vae: nn.Module, height: int, width: int) -> tuple[int, int, int]:
    """(16, H/8, W/8) for a `height` x `width` image (the VAE's scale is 2 ** len(temperal_downsample)); sizes must
    be multiples of twice the scale (16), as the latent tiles into 2x2 tokens."""
    return latent_shape(height, width, vae.config.z_dim, scale_factor=2 ** len(vae.temperal_downsample))


def decode_qwen_image(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Decode (B, 16, h, w) normalised latents to (B, 3, H, W) float32 images in [0, 1], as the pipeline does: add
    the frame axis, undo the per-channel normalisation, decode, take the frame, map [-1, 1] to [0, 1]."""
    z = latents[:, :, None].to(vae.dtype)
    mean, std = latent_channel_statistics(vae, z)
    images = vae.decode(z * std + mean, return_dict=False)[0][:, :, 0]
    return (images.float() / 2 + 0.5).clamp(0, 1)


def encode_images_qwen_image(vae: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) images in [0, 1] -> (B, 16, H/8, W/8) normalised latents (the posterior mode); the inverse of
    `decode_qwen_image` up to the autoencoder's error."""
    z = vae.encode((images * 2 - 1)[:, :, None].to(vae.dtype)).latent_dist.mode()
    mean, std = latent_channel_statistics(vae, z)
    return ((z - mean) / std)[:, :, 0]
