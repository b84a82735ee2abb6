"""Latent shapes from pixel sizes, and VAE decoding to images in [0, 1] for the rewards.

SD3 and FLUX share the 16-channel autoencoder layout: an H x W image is a (16, H/8, W/8) latent,
and the diffusion model works on normalised latents `(vae_latent - shift_factor) * scaling_factor`.
The pipelines undo that normalisation before decoding with
`vae_input = latents / scaling_factor + shift_factor`; `decode_latents` does the same, so a
vgrpo_lib rollout's final sample decodes to the image the pipeline would have shown.

The Wan video autoencoder and Qwen-Image's (a one-frame variant of it) normalise per channel instead, with the
config's `latents_mean` / `latents_std` (`latent_channel_statistics`).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["vae_scale_factor", "latent_shape", "decode_latents", "latent_channel_statistics"]


def vae_scale_factor(vae: nn.Module) -> int:
    """Pixels per latent pixel, `2 ** (len(block_out_channels) - 1)`: 8 for SD3 and FLUX."""
    return 2 ** (len(vae.config.block_out_channels) - 1)


def latent_shape(height: int, width: int, latent_channels: int = 16, scale_factor: int = 8, multiple: int = 2) -> tuple[int, int, int]:
    """(C, H, W) of the latent for an image of `height` x `width` pixels.

    Args:
        height, width: image size in pixels; each must be a multiple of `scale_factor * multiple`.
        latent_channels: the VAE's `latent_channels` (16 for SD3 and FLUX).
        scale_factor: see `vae_scale_factor` (8).
        multiple: the latent must tile into patches of this size (2 for both transformers: SD3's
            patch_size and FLUX's 2x2 token packing).
    """
    step = scale_factor * multiple
    if height % step or width % step:
        raise ValueError(f"image size {height}x{width} must be a multiple of {step} (vae scale {scale_factor} x patch {multiple})")
    return latent_channels, height // scale_factor, width // scale_factor


def decode_latents(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Decode (B, C, h, w) diffusion latents to (B, 3, H, W) float32 images in [0, 1].

    Applies the VAE config's `scaling_factor` and `shift_factor` (absent or None means 0) the way
    the SD3 and FLUX pipelines do, decodes in the VAE's dtype, and maps [-1, 1] to [0, 1]. Run it
    under `torch.no_grad()` for rewards (none of the algorithms differentiates through the reward).
    """
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    z = latents / vae.config.scaling_factor + shift
    images = vae.decode(z.to(vae.dtype), return_dict=False)[0]
    return (images.float() / 2 + 0.5).clamp(0, 1)


def latent_channel_statistics(vae: nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE config's per-channel `latents_mean` and `latents_std` as (1, z_dim, 1, 1, 1) tensors on the device and
    in the dtype of `like` (Wan's and Qwen-Image's video autoencoders: `latents = (vae_latent - mean) / std`)."""
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape).to(like.device, like.dtype)
    std = torch.tensor(vae.config.latents_std).view(shape).to(like.device, like.dtype)
    return mean, std
