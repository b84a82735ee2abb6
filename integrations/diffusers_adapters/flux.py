"""FLUX.1: `FluxTransformer2DModel` as a velocity model, latent packing, and its prompt encoder.

What the adapter translates (checked against `FluxPipeline.__call__`):
- latents: FLUX works on a token sequence of 2x2 latent patches. The pipeline keeps latents
  packed, (B, H/2 * W/2, 4C); vgrpo_lib keeps them unpacked, (B, C, H, W), like every other model,
  so the adapter packs on the way in and unpacks on the way out (`pack_latents` /
  `unpack_latents`, the same layout as `FluxPipeline._pack_latents`).
- positions: `img_ids` (H/2 * W/2, 3) holds (0, row, col) of each patch for the rotary embedding,
  `txt_ids` (L, 3) is all zeros; both are built from the shapes at each call.
- time: the pipeline passes `timestep / 1000`, i.e. the sigma in [0, 1], and the transformer
  multiplies by 1000 internally; so our `t` goes in unchanged.
- guidance: FLUX.1-dev is guidance-distilled (`config.guidance_embeds=True`): the guidance scale is
  an input embedding, not a second forward. The pipeline passes the raw scale (3.5 by default);
  the adapter does the same, from `cond["guidance"]` (B,) when present, else `guidance_scale`.
"""

from __future__ import annotations

import torch
from torch import nn
from tensordict import TensorDict

from .velocity import GuidanceEmbeddingAdapter

__all__ = [
    "FLUX_COND_KEYS", "pack_latents", "unpack_latents", "latent_image_ids", "FluxVelocity", "encode_prompts_flux",
]

FLUX_COND_KEYS = ("prompt_embeds", "pooled_prompt_embeds")


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H/2 * W/2, 4C): one token per 2x2 patch, channels-major inside a token."""
    b, c, h, w = latents.shape
    if h % 2 or w % 2:
        raise ValueError(f"FLUX latents need even height and width; got {h}x{w}")
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, H/2 * W/2, 4C) -> (B, C, H, W), the inverse of `pack_latents`; height/width in latent pixels."""
    b, n, c4 = tokens.shape
    if n != (height // 2) * (width // 2):
        raise ValueError(f"{n} tokens do not tile a {height}x{width} latent in 2x2 patches")
    x = tokens.view(b, height // 2, width // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c4 // 4, height, width)


def latent_image_ids(height: int, width: int, device=None, dtype=torch.float32) -> torch.Tensor:
    """Position ids of the packed tokens, (H/2 * W/2, 3) rows (0, row, col); height/width in latent pixels."""
    h, w = height // 2, width // 2
    ids = torch.zeros(h, w, 3, device=device, dtype=dtype)
    ids[..., 1] = torch.arange(h, device=device, dtype=dtype)[:, None]
    ids[..., 2] = torch.arange(w, device=device, dtype=dtype)[None, :]
    return ids.reshape(h * w, 3)


class FluxVelocity(GuidanceEmbeddingAdapter):
    """`FluxTransformer2DModel` presented as `model(x_t, t, cond) -> v` on unpacked latents.

    Args:
        transformer: a `FluxTransformer2DModel` (possibly with peft LoRA adapters).
        guidance_scale: see `GuidanceEmbeddingAdapter` (FLUX.1-dev: 3.5 in the pipeline; FLUX.1-schnell has no
            guidance embedding).
        autocast_dtype: see `FlowTransformerAdapter`.

    Call:
        x_t: (B, C, H, W) latents (C = 16, H and W even), t: (B,) in [0, 1],
        cond: TensorDict[B] with "prompt_embeds" (B, L, 4096) and "pooled_prompt_embeds" (B, 768),
        optionally "guidance" (B,). Returns v: (B, C, H, W) in the dtype of x_t.
    """

    def __init__(self, transformer: nn.Module, guidance_scale: float = 3.5, autocast_dtype: torch.dtype | None = None):
        super().__init__(transformer, guidance_scale, autocast_dtype)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None) -> torch.Tensor:
        self._check_inputs(x_t, t, cond, FLUX_COND_KEYS)
        _, _, height, width = x_t.shape
        dtype = self.transformer.dtype
        prompt_embeds = cond["prompt_embeds"].to(dtype)
        with self._autocast(x_t.device):
            tokens = self.transformer(
                hidden_states=pack_latents(x_t.to(dtype)),
                timestep=t.to(dtype),
                guidance=self._guidance(t, cond),
                pooled_projections=cond["pooled_prompt_embeds"].to(dtype),
                encoder_hidden_states=prompt_embeds,
                txt_ids=torch.zeros(prompt_embeds.shape[1], 3, device=x_t.device, dtype=dtype),
                img_ids=latent_image_ids(height, width, device=x_t.device, dtype=dtype),
                return_dict=False,
            )[0]
        return unpack_latents(tokens, height, width).to(x_t.dtype)


@torch.no_grad()
def encode_prompts_flux(pipe, prompts: list[str], max_sequence_length: int = 512) -> TensorDict:
    """Encode prompts with the FLUX pipeline's own encoders (CLIP-L pooled + T5-XXL tokens).

    Args:
        pipe: a `FluxPipeline`.
        prompts: B strings.
        max_sequence_length: T5 token length (the pipeline's default, 512).

    Returns:
        TensorDict[B] with "prompt_embeds" (B, max_sequence_length, 4096) and
        "pooled_prompt_embeds" (B, 768). The pipeline's `text_ids` are all zeros and are rebuilt by
        `FluxVelocity`, so they are not stored.
    """
    prompt_embeds, pooled, _ = pipe.encode_prompt(
        prompt=list(prompts), prompt_2=None, max_sequence_length=max_sequence_length
    )
    return TensorDict(
        {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled},
        batch_size=[len(prompts)],
        device=prompt_embeds.device,
    )
