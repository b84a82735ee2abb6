"""Load SD3.5-Medium or FLUX.1-dev by name as a LoRA-adapted velocity model with its helpers.

    policy = load_sd35_medium(device="cuda")                 # needs the checkpoint locally or network
    cond = policy.encode_prompts(["a photo of a cat"])
    grid = policy.sigma_grid(num_steps=40, height=512, width=512)
    shape = policy.latent_shape(512, 512)                     # (16, 64, 64)
    v = policy.model(x_t, t, cond)                           # the protocol model (trained LoRA active)
    images = policy.decode(latents)                          # (B, 3, 512, 512) in [0, 1]

The defaults follow method.md's paper settings: LoRA r=32, alpha=64 on the attention projections,
a frozen behaviour adapter "old" for the old policy, bf16 weights with fp32 LoRA parameters and
bf16 autocast. Rollout lengths (40 steps SD3.5-M, 16 FLUX) are arguments of `sigma_grid`.
When the checkpoint is not available (offline, or not in the Hugging Face cache) the loaders raise
`MissingWeightsError` naming the checkpoint; FLUX.1-dev is gated, so a download also needs an
accepted licence and a token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

from vgrpo_lib.extras import require_extra
from vgrpo_lib.integrations.rewards.loading import load_weights, resolve_local_files_only

from .flux import FluxVelocity, encode_prompts_flux
from .latents import decode_latents, latent_shape, vae_scale_factor
from .lora import add_behaviour_adapter, add_lora, upcast_trainable_parameters
from .schedules import sigma_grid_from_scheduler_config
from .sd3 import SD3Velocity, encode_prompts_sd3
from .velocity import FlowTransformerAdapter

__all__ = [
    "SD35_MEDIUM", "FLUX1_DEV", "DiffusersPolicy", "absent_components", "load_policy", "load_sd35_medium",
    "load_flux_dev",
]

SD35_MEDIUM = "stabilityai/stable-diffusion-3.5-medium"
FLUX1_DEV = "black-forest-labs/FLUX.1-dev"


@dataclass
class DiffusersPolicy:
    """A loaded pipeline, the protocol model wrapping its transformer, and the helpers around it."""

    pipe: object
    model: FlowTransformerAdapter
    family: str

    def encode_prompts(self, prompts: list[str]) -> TensorDict:
        """TensorDict[B] of prompt embeddings, through the pipeline's own text encoders."""
        encode = encode_prompts_sd3 if self.family == "sd3" else encode_prompts_flux
        return encode(self.pipe, prompts)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(C, h, w) of the latent for a height x width image."""
        vae = self.pipe.vae
        return latent_shape(height, width, vae.config.latent_channels, vae_scale_factor(vae))

    def sigma_grid(self, num_steps: int, height: int, width: int) -> list[float]:
        """The pipeline scheduler's time grid (num_steps + 1 values, 1 -> 0) at this resolution."""
        _, h, w = self.latent_shape(height, width)
        return sigma_grid_from_scheduler_config(self.pipe.scheduler.config, num_steps, image_seq_len=(h // 2) * (w // 2))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) latents -> (B, 3, H, W) images in [0, 1]."""
        return decode_latents(self.pipe.vae, latents)


def absent_components(path: str) -> dict[str, None]:
    """``{name: None}`` for each component a local pipeline folder's ``model_index.json`` records as absent
    (``[null, null]``, e.g. ``text_encoder_3`` of an SD3 pipeline saved without T5). diffusers refuses to load such
    a folder unless those components are passed explicitly; empty for a hub id."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return {}
    entries = json.loads(index.read_text())
    return {name: None for name, value in entries.items()
            if not name.startswith("_") and isinstance(value, list) and value and value[0] is None}


def load_policy(name_or_path: str, family: str, device: str | torch.device | None = None,
                dtype: torch.dtype = torch.bfloat16, lora_rank: int | None = 32, lora_alpha: int = 64,
                behaviour_adapter: bool = True, autocast: bool = True, local_files_only: bool | None = None,
                without_t5: bool = False,
                **adapter_kwargs) -> DiffusersPolicy:
    """Load a diffusers pipeline by hub name or local path and wrap its transformer.

    Args:
        name_or_path: hub name or local directory of a diffusers pipeline.
        family: "sd3" or "flux".
        device: where to put the pipeline (None: leave on the CPU).
        dtype: storage dtype of the pretrained weights.
        lora_rank: add a trainable LoRA adapter of this rank (None: no adapter; the whole
            transformer stays frozen and the caller decides what to train).
        lora_alpha: LoRA alpha.
        behaviour_adapter: also add the frozen "old" adapter for the behaviour policy.
        autocast: run the transformer under bf16 autocast.
        local_files_only: None: only when HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set.
        without_t5: SD3 only: load without the T5 encoder (``text_encoder_3=None``, the memory saving diffusers
            documents for SD3); its part of the prompt embedding is then ``max_sequence_length`` zero tokens.
        adapter_kwargs: passed to the adapter (e.g. FLUX `guidance_scale`).
    """
    require_extra("diffusers", f"Loading the {family.upper()} pipeline {name_or_path!r}")
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    if family not in ("sd3", "flux"):
        raise ValueError(f"family must be 'sd3' or 'flux'; got {family!r}")
    pipeline_class = StableDiffusion3Pipeline if family == "sd3" else FluxPipeline
    local = resolve_local_files_only(local_files_only)
    absent = absent_components(name_or_path)
    if without_t5:
        if family != "sd3":
            raise ValueError(f"without_t5 applies to SD3 pipelines (T5 is FLUX's main text encoder); family {family!r}")
        absent.update(text_encoder_3=None, tokenizer_3=None)
    pipe = load_weights(lambda: pipeline_class.from_pretrained(name_or_path, torch_dtype=dtype, local_files_only=local,
                                                               **absent),
                        name_or_path, f"the {family.upper()} policy")
    if device is not None:
        pipe.to(device)
    transformer = pipe.transformer
    transformer.requires_grad_(False)
    for module in (pipe.vae, *(getattr(pipe, n, None) for n in ("text_encoder", "text_encoder_2", "text_encoder_3"))):
        if module is not None:
            module.requires_grad_(False)
    if lora_rank is not None:
        add_lora(transformer, r=lora_rank, alpha=lora_alpha)
        upcast_trainable_parameters(transformer)
        if behaviour_adapter:
            add_behaviour_adapter(transformer)
    adapter_class = SD3Velocity if family == "sd3" else FluxVelocity
    model = adapter_class(transformer, autocast_dtype=torch.bfloat16 if autocast else None, **adapter_kwargs)
    return DiffusersPolicy(pipe=pipe, model=model, family=family)


def load_sd35_medium(name_or_path: str = SD35_MEDIUM, **kwargs) -> DiffusersPolicy:
    """Stable Diffusion 3.5 Medium (the paper's GenEval / OCR / preference curriculum model)."""
    return load_policy(name_or_path, "sd3", **kwargs)


def load_flux_dev(name_or_path: str = FLUX1_DEV, guidance_scale: float = 3.5, **kwargs) -> DiffusersPolicy:
    """FLUX.1-dev (the paper's HPS/PickScore/ImageReward model), distilled guidance 3.5 by default."""
    return load_policy(name_or_path, "flux", guidance_scale=guidance_scale, **kwargs)
