"""Load SD3.5-Medium, FLUX.1-dev, FLUX.2 (dev, klein) or Qwen-Image as a LoRA-adapted velocity model with its helpers.

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

What differs between the pipeline kinds (`family`) is one row of `FAMILIES`: the diffusers pipeline class, the
velocity adapter, the prompt encoder, the latent shape, the time grid, the decoder and the LoRA target modules.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tensordict import TensorDict

from vgrpo_lib.extras import require_extra
from vgrpo_lib.integrations.packed_weights import unpacked_folder
from vgrpo_lib.integrations.rewards.loading import load_weights, resolve_local_files_only

from .flux import FluxVelocity, encode_prompts_flux
from .flux2 import FLUX2_LORA_TARGET_MODULES, Flux2Velocity, decode_flux2, encode_prompts_flux2, flux2_latent_shape, flux2_sigma_grid
from .latents import decode_latents, latent_shape, vae_scale_factor
from .lora import ATTENTION_TARGET_MODULES, add_behaviour_adapter, add_lora, upcast_trainable_parameters
from .qwen_image import (QWEN_IMAGE_LORA_TARGET_MODULES, QwenImageVelocity, decode_qwen_image, encode_prompts_qwen_image,
                         qwen_image_latent_shape, true_cfg_qwen_image)
from .schedules import sigma_grid_from_scheduler_config
from .sd3 import SD3Velocity, encode_prompts_sd3
from .velocity import FlowTransformerAdapter, classifier_free_guidance

__all__ = [
    "SD35_MEDIUM", "FLUX1_DEV", "FLUX2_DEV", "FLUX2_KLEIN", "QWEN_IMAGE", "FAMILIES", "DiffusersPolicy", "PipelineFamily",
    "absent_components", "load_policy", "load_sd35_medium", "load_flux_dev",
]

SD35_MEDIUM = "stabilityai/stable-diffusion-3.5-medium"
FLUX1_DEV = "black-forest-labs/FLUX.1-dev"
FLUX2_DEV = "black-forest-labs/FLUX.2-dev"
FLUX2_KLEIN = "black-forest-labs/FLUX.2-klein-base-4B"
QWEN_IMAGE = "Qwen/Qwen-Image"


def _vae_latent_shape(vae, height: int, width: int) -> tuple[int, int, int]:
    return latent_shape(height, width, vae.config.latent_channels, vae_scale_factor(vae))


def _patch_token_grid(scheduler_config, num_steps: int, sample_shape: tuple[int, ...]) -> list[float]:
    """The scheduler's grid for a latent tiled in 2x2 patch tokens (SD3, FLUX.1, Qwen-Image)."""
    _, h, w = sample_shape
    return sigma_grid_from_scheduler_config(scheduler_config, num_steps, image_seq_len=(h // 2) * (w // 2))


def _flux2_grid(scheduler_config, num_steps: int, sample_shape: tuple[int, ...]) -> list[float]:
    """FLUX.2's grid: one token per latent pixel of the (128, h, w) latent."""
    _, h, w = sample_shape
    return flux2_sigma_grid(scheduler_config, num_steps, image_seq_len=h * w)


@dataclass(frozen=True)
class PipelineFamily:
    """How vgrpo_lib drives one kind of diffusers text-to-image pipeline.

    Attributes:
        pipeline: the diffusers pipeline class name (``"Flux2Pipeline"``).
        velocity: the protocol adapter class wrapping the pipeline's transformer.
        encode: ``encode(pipe, prompts, **kwargs) -> TensorDict[B]`` of prompt embeddings (kwargs:
            ``max_sequence_length``).
        latent_shape: ``latent_shape(vae, height, width) -> (C, h, w)`` of the diffusion latent.
        sigma_grid: ``sigma_grid(scheduler_config, num_steps, (C, h, w)) -> [1, ..., 0]``, the pipeline's time grid.
        decode: ``decode(vae, latents (B, C, h, w)) -> images (B, 3, H, W)`` in [0, 1].
        lora_target_modules: what ``add_lora`` adapts (module-name suffixes, or one regular expression).
        guidance: ``guidance(model, negative_cond, scale) -> model``, the pipeline's CFG against an encoded negative
            prompt (plain CFG; Qwen-Image's norm-rescaled true CFG), used by evaluation with a negative prompt.
    """

    pipeline: str
    velocity: type[FlowTransformerAdapter]
    encode: Callable[..., TensorDict]
    latent_shape: Callable[..., tuple[int, int, int]] = _vae_latent_shape
    sigma_grid: Callable[..., list[float]] = _patch_token_grid
    decode: Callable[..., torch.Tensor] = decode_latents
    lora_target_modules: str | Sequence[str] = ATTENTION_TARGET_MODULES
    guidance: Callable[..., torch.nn.Module] = classifier_free_guidance


_FLUX2 = dict(velocity=Flux2Velocity, encode=encode_prompts_flux2, latent_shape=flux2_latent_shape,
              sigma_grid=_flux2_grid, decode=decode_flux2, lora_target_modules=FLUX2_LORA_TARGET_MODULES)

FAMILIES: dict[str, PipelineFamily] = {
    "sd3": PipelineFamily("StableDiffusion3Pipeline", SD3Velocity, encode_prompts_sd3),
    "flux": PipelineFamily("FluxPipeline", FluxVelocity, encode_prompts_flux),
    "flux2": PipelineFamily("Flux2Pipeline", **_FLUX2),
    "flux2-klein": PipelineFamily("Flux2KleinPipeline", **_FLUX2),
    "qwen-image": PipelineFamily("QwenImagePipeline", QwenImageVelocity, encode_prompts_qwen_image,
                                 latent_shape=qwen_image_latent_shape, decode=decode_qwen_image,
                                 lora_target_modules=QWEN_IMAGE_LORA_TARGET_MODULES, guidance=true_cfg_qwen_image),
}
"""The pipeline kinds ``load_policy`` knows, by ``family`` name."""


@dataclass
class DiffusersPolicy:
    """A loaded pipeline, the protocol model wrapping its transformer, and the helpers around it."""

    pipe: object
    model: FlowTransformerAdapter
    family: str

    @property
    def spec(self) -> PipelineFamily:
        """This pipeline kind's row of `FAMILIES`."""
        return FAMILIES[self.family]

    @property
    def lora_target_modules(self) -> str | Sequence[str]:
        """The modules a LoRA adapter of this pipeline's transformer adapts."""
        return self.spec.lora_target_modules

    def encode_prompts(self, prompts: list[str], **kwargs) -> TensorDict:
        """TensorDict[B] of prompt embeddings, through the pipeline's own text encoders (kwargs:
        ``max_sequence_length``)."""
        return self.spec.encode(self.pipe, prompts, **kwargs)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(C, h, w) of the latent for a height x width image."""
        return self.spec.latent_shape(self.pipe.vae, height, width)

    def sigma_grid(self, num_steps: int, height: int, width: int) -> list[float]:
        """The pipeline scheduler's time grid (num_steps + 1 values, 1 -> 0) at this resolution."""
        return self.spec.sigma_grid(self.pipe.scheduler.config, num_steps, self.latent_shape(height, width))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) latents -> (B, 3, H, W) images in [0, 1]."""
        return self.spec.decode(self.pipe.vae, latents)


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
        family: a key of `FAMILIES`: "sd3", "flux", "flux2", "flux2-klein" or "qwen-image".
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
    import diffusers

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(map(repr, FAMILIES))}; got {family!r}")
    spec = FAMILIES[family]
    pipeline_class = getattr(diffusers, spec.pipeline)
    local = resolve_local_files_only(local_files_only)
    folder = str(unpacked_folder(name_or_path))  # a hub name, or a plain folder, as it is
    absent = absent_components(folder)
    if without_t5:
        if family != "sd3":
            raise ValueError(f"without_t5 applies to SD3 pipelines (T5 is FLUX's main text encoder); family {family!r}")
        absent.update(text_encoder_3=None, tokenizer_3=None)
    pipe = load_weights(lambda: pipeline_class.from_pretrained(folder, torch_dtype=dtype, local_files_only=local,
                                                               **absent),
                        name_or_path, f"the {family.upper()} policy")
    pipe.register_to_config(_name_or_path=str(name_or_path))  # a packed folder, not its unpacked cache copy
    if device is not None:
        pipe.to(device)
    transformer = pipe.transformer
    transformer.requires_grad_(False)
    for module in (pipe.vae, *(getattr(pipe, n, None) for n in ("text_encoder", "text_encoder_2", "text_encoder_3"))):
        if module is not None:
            module.requires_grad_(False)
    if lora_rank is not None:
        add_lora(transformer, r=lora_rank, alpha=lora_alpha, target_modules=spec.lora_target_modules)
        upcast_trainable_parameters(transformer)
        if behaviour_adapter:
            add_behaviour_adapter(transformer)
    model = spec.velocity(transformer, autocast_dtype=torch.bfloat16 if autocast else None, **adapter_kwargs)
    return DiffusersPolicy(pipe=pipe, model=model, family=family)


def load_sd35_medium(name_or_path: str = SD35_MEDIUM, **kwargs) -> DiffusersPolicy:
    """Stable Diffusion 3.5 Medium (the paper's GenEval / OCR / preference curriculum model)."""
    return load_policy(name_or_path, "sd3", **kwargs)


def load_flux_dev(name_or_path: str = FLUX1_DEV, guidance_scale: float = 3.5, **kwargs) -> DiffusersPolicy:
    """FLUX.1-dev (the paper's HPS/PickScore/ImageReward model), distilled guidance 3.5 by default."""
    return load_policy(name_or_path, "flux", guidance_scale=guidance_scale, **kwargs)
