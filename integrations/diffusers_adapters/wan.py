"""Wan 2.1 / 2.2 text-to-video: `WanTransformer3DModel` as a velocity model on video latents, and its pipeline plumbing.

    policy = load_wan("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", frames=33, device="cuda")
    cond = policy.encode_prompts(["a cat surfing"])            # TensorDict[1]: UMT5 tokens (1, 512, 4096)
    shape = policy.latent_shape(480, 832)                      # (16, 9, 60, 104): (C, F, H, W)
    grid = policy.sigma_grid(num_steps=20)                     # the UniPC scheduler's flow sigmas, 1 -> 0
    v = policy.model(x_t, t, cond)                             # x_t (B, 16, 9, 60, 104), t (B,) in [0, 1]
    videos = policy.decode(latents)                            # (B, 3, 33, 480, 832) in [0, 1]

What the adapter translates (checked against `WanPipeline.__call__` in diffusers 0.42):
- latents are `(B, C, F, H, W)`: F latent frames from `1 + (frames - 1) / 4` video frames (the causal VAE keeps the
  first frame and compresses the rest 4x in time), H and W the pixel size / 8; the transformer patchifies
  `(1, 2, 2)` internally. The core (vgrpo_lib) reduces over all data dimensions, so it takes them as any `(B, *D)`.
- time: the pipeline passes the scheduler's `timestep = sigma * 1000` (UniPC with `use_flow_sigmas`: sigmas shifted
  by `flow_shift`); our `t` is the sigma, so the adapter multiplies by `num_train_timesteps`. UniPC rounds its
  timesteps down to integers and starts at `1 - 1e-6`; the adapter passes the exact `1000 t`.
- the prediction: Wan's "flow_prediction" is `d z / d sigma = eps - x` (UniPC's `x0 = z - sigma * output`,
  FlowMatchEuler's `z + (sigma_next - sigma) * output`): the library's velocity, with the same sign.
- conditioning: `encoder_hidden_states` = UMT5 token embeddings `(B, L, 4096)`, zero past each prompt's tokens
  (`pipe.encode_prompt`), encoded once per prompt.
- Wan 2.2 A14B has two experts: `transformer` for `1000 t >= boundary_ratio * 1000` (high noise) and
  `transformer_2` below (low noise). `WanExperts` routes each row of a batch to its expert, so a batch of ELBO pairs
  at mixed times calls each expert once; LoRA adapters go on both, switched together. (UniPC's integer timesteps
  can make the pipeline switch one step later than the exact `1000 t` when a grid time lies within 1/1000 above
  the boundary.)
- Wan 2.2 TI2V-5B (`expand_timesteps`) takes one timestep per token: `(B, F * H/2 * W/2)`, all equal for text-to-video.
- the VAE works on `(vae_latent - latents_mean) / latents_std` per channel; `decode` undoes that as the pipeline does,
  `encode` applies it (the posterior's mode).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from collections.abc import Mapping, Sequence

import torch
from tensordict import TensorDict
from torch import nn

from vgrpo_lib.extras import require_extra
from vgrpo_lib.integrations.packed_weights import unpacked_folder
from vgrpo_lib.integrations.rewards.loading import load_weights, resolve_local_files_only

from .latents import latent_channel_statistics
from .lora import add_behaviour_adapter, add_lora, upcast_trainable_parameters
from .presets import absent_components
from .schedules import shift_sigmas, sigma_grid_from_scheduler_config
from .velocity import FlowTransformerAdapter

__all__ = [
    "WAN21_T2V", "WAN_COND_KEYS", "WAN_LORA_TARGET_MODULES", "WanExperts", "WanPolicy", "WanVelocity", "decode_videos",
    "encode_prompts_wan", "encode_videos", "load_wan", "wan_latent_shape", "wan_sigma_grid",
    "wan_sigma_grid_from_scheduler_config",
]

WAN21_T2V = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
WAN_COND_KEYS = ("prompt_embeds",)
# Every projection of a Wan block: self-attention (attn1), cross-attention to the text (attn2) and the feed-forward
# layer, the module names of diffusers' WanTransformerBlock.
WAN_LORA_TARGET_MODULES = (
    "attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
    "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0",
    "ffn.net.0.proj", "ffn.net.2",
)


class WanExperts(nn.Module):
    """Wan 2.2's two experts as one transformer: each row goes to `high_noise` (the pipeline's `transformer`) when
    its timestep is at least `boundary_timestep` (`boundary_ratio * num_train_timesteps`), else to `low_noise`
    (`transformer_2`), as `WanPipeline` switches them along a rollout.

    It offers the peft adapter methods the LoRA helpers call (`add_adapter`, `set_adapter`, `disable_adapters`, ...)
    and applies each to both experts, so the trained, behaviour and reference policies switch on both together.
    """

    def __init__(self, high_noise: nn.Module, low_noise: nn.Module, boundary_timestep: float):
        super().__init__()
        self.high_noise, self.low_noise = high_noise, low_noise
        self.boundary_timestep = float(boundary_timestep)

    @property
    def experts(self) -> tuple[nn.Module, nn.Module]:
        return self.high_noise, self.low_noise

    @property
    def config(self):
        return self.high_noise.config

    @property
    def dtype(self) -> torch.dtype:
        return self.high_noise.dtype

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                return_dict: bool = False, **kwargs) -> tuple[torch.Tensor]:
        """The expert's output for each row: `hidden_states` `(B, C, F, H, W)`, `timestep` `(B,)` (or `(B, N)`, one
        per token), `encoder_hidden_states` `(B, L, D)`. Returns a 1-tuple like a diffusers model with
        `return_dict=False`."""
        high = (timestep if timestep.ndim == 1 else timestep[:, 0]) >= self.boundary_timestep
        outputs = []
        for expert, rows in ((self.high_noise, high), (self.low_noise, ~high)):
            if rows.any():
                outputs.append((rows, expert(hidden_states=hidden_states[rows], timestep=timestep[rows],
                                             encoder_hidden_states=encoder_hidden_states[rows], return_dict=False,
                                             **kwargs)[0]))
        if len(outputs) == 1:
            return (outputs[0][1],)
        first = outputs[0][1]
        merged = first.new_empty((hidden_states.shape[0], *first.shape[1:]))
        for rows, value in outputs:
            merged[rows] = value
        return (merged,)

    # -- peft's adapter API, on both experts --------------------------------------------------------------------

    @property
    def peft_config(self) -> dict:
        return getattr(self.high_noise, "peft_config", {})

    def add_adapter(self, config, adapter_name: str = "default") -> None:
        for expert in self.experts:
            expert.add_adapter(copy.deepcopy(config), adapter_name=adapter_name)

    def set_adapter(self, adapter_name: str | list[str]) -> None:
        for expert in self.experts:
            expert.set_adapter(adapter_name)

    def active_adapters(self) -> list[str]:
        return self.high_noise.active_adapters()

    def disable_adapters(self) -> None:
        for expert in self.experts:
            expert.disable_adapters()

    def enable_adapters(self) -> None:
        for expert in self.experts:
            expert.enable_adapters()

    def enable_gradient_checkpointing(self) -> None:
        for expert in self.experts:
            expert.enable_gradient_checkpointing()


class WanVelocity(FlowTransformerAdapter):
    """`WanTransformer3DModel` (or `WanExperts`) presented as `model(x_t, t, cond) -> v` on video latents.

    Args:
        transformer: a `WanTransformer3DModel` or `WanExperts` (possibly with peft LoRA adapters).
        num_train_timesteps: the scheduler's timestep scale (1000).
        expand_timesteps: one timestep per token (Wan 2.2 TI2V-5B, the pipeline config's `expand_timesteps`).
        autocast_dtype: see `FlowTransformerAdapter`.

    Call:
        x_t: (B, C, F, H, W) latents (C = 16 for Wan 2.1, 48 for TI2V-5B), t: (B,) in [0, 1],
        cond: TensorDict[B] with "prompt_embeds" (B, L, 4096). Returns v: (B, C, F, H, W) in the dtype of x_t.
    """

    def __init__(self, transformer: nn.Module, num_train_timesteps: int = 1000, expand_timesteps: bool = False,
                 autocast_dtype: torch.dtype | None = None):
        super().__init__(transformer, autocast_dtype)
        self.num_train_timesteps = num_train_timesteps
        self.expand_timesteps = expand_timesteps

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None) -> torch.Tensor:
        self._check_inputs(x_t, t, cond, WAN_COND_KEYS, layout="(B, C, F, H, W)")
        dtype = self.transformer.dtype
        timestep = t * self.num_train_timesteps
        if self.expand_timesteps:
            patch_t, patch_h, patch_w = self.config.patch_size
            _, _, frames, height, width = x_t.shape
            timestep = timestep[:, None].expand(-1, (frames // patch_t) * (height // patch_h) * (width // patch_w))
        with self._autocast(x_t.device):
            v = self.transformer(
                hidden_states=x_t.to(dtype),
                timestep=timestep,
                encoder_hidden_states=cond["prompt_embeds"].to(dtype),
                return_dict=False,
            )[0]
        return v.to(x_t.dtype)


@torch.no_grad()
def encode_prompts_wan(pipe, prompts: Sequence[str], max_sequence_length: int = 512) -> TensorDict:
    """Encode prompts with the pipeline's UMT5 encoder (`pipe.encode_prompt`, no negative prompt).

    Returns TensorDict[B] with "prompt_embeds" (B, max_sequence_length, d_model) on the pipeline's execution device,
    zero past each prompt's tokens (as `WanPipeline` passes them). Encode once per prompt and reuse: the encoder is
    frozen in all three algorithms.
    """
    prompt_embeds, _ = pipe.encode_prompt(prompt=list(prompts), do_classifier_free_guidance=False,
                                          max_sequence_length=max_sequence_length)
    return TensorDict({"prompt_embeds": prompt_embeds}, batch_size=[len(prompts)], device=prompt_embeds.device)


def wan_latent_shape(frames: int, height: int, width: int, latent_channels: int = 16, temporal_factor: int = 4,
                     spatial_factor: int = 8, patch_size: Sequence[int] = (1, 2, 2)) -> tuple[int, int, int, int]:
    """(C, F, H, W) of the latent of a video of `frames` frames of `height` x `width` pixels.

    `frames - 1` must be a multiple of `temporal_factor` (the VAE's `scale_factor_temporal`: 4), and the sizes
    multiples of `spatial_factor * patch` (8 x 2 = 16); the latent has `1 + (frames - 1) / temporal_factor` frames.
    """
    if frames < 1 or (frames - 1) % temporal_factor:
        raise ValueError(f"model.frames={frames}: Wan videos have 4k + 1 frames (frames - 1 a multiple of the VAE's "
                         f"temporal factor {temporal_factor}), e.g. 1, 5, 33, 81")
    _, patch_h, patch_w = patch_size
    if height % (spatial_factor * patch_h) or width % (spatial_factor * patch_w):
        raise ValueError(f"video size {height}x{width} must be a multiple of {spatial_factor * patch_h}x"
                         f"{spatial_factor * patch_w} (vae scale {spatial_factor} x patch {patch_h}x{patch_w})")
    return latent_channels, 1 + (frames - 1) // temporal_factor, height // spatial_factor, width // spatial_factor


def wan_sigma_grid(num_steps: int, flow_shift: float = 3.0, num_train_timesteps: int = 1000) -> list[float]:
    """The Wan pipeline's time grid (UniPC with `use_flow_sigmas`): num_steps + 1 values from 1.0 down to 0.0.

    `num_steps` points of `linspace(1, 1/num_train_timesteps, num_steps + 1)` (the last dropped), shifted by
    `s -> flow_shift s / (1 + (flow_shift - 1) s)`, then 0. `flow_shift`: 3.0 at 480p, 5.0 at 720p (the
    WanPipeline docstring); UniPC's first value is `1 - 1e-6` (a guard for its log-SNR), here exactly 1.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; got {num_steps}")
    step = (1.0 / num_train_timesteps - 1.0) / num_steps
    return shift_sigmas([1.0 + i * step for i in range(num_steps)], flow_shift) + [0.0]


def wan_sigma_grid_from_scheduler_config(config: Mapping, num_steps: int) -> list[float]:
    """The grid of a Wan pipeline's scheduler: UniPC / DPM-Solver with flow sigmas (`wan_sigma_grid` with the
    config's `flow_shift`), or a `FlowMatchEulerDiscreteScheduler` (the SD3 kind of grid). A ValueError names the
    options these grids do not reproduce."""
    if "use_flow_sigmas" not in config:  # FlowMatchEulerDiscreteScheduler, the type WanPipeline declares
        return sigma_grid_from_scheduler_config(config, num_steps)
    unsupported = [k for k in ("use_dynamic_shifting", "shift_terminal", "use_karras_sigmas", "use_exponential_sigmas",
                               "use_beta_sigmas") if config.get(k)]
    if not config.get("use_flow_sigmas"):
        unsupported.append("use_flow_sigmas=False")
    if config.get("prediction_type") != "flow_prediction":
        unsupported.append(f"prediction_type={config.get('prediction_type')!r}")
    if config.get("final_sigmas_type", "zero") != "zero":
        unsupported.append(f"final_sigmas_type={config.get('final_sigmas_type')!r}")
    if unsupported:
        raise ValueError(f"Wan scheduler options not reproduced by the flow-sigma grid: {unsupported}")
    return wan_sigma_grid(num_steps, config.get("flow_shift", 1.0), config.get("num_train_timesteps", 1000))


def decode_videos(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Decode (B, C, F, h, w) diffusion latents to (B, 3, frames, H, W) float32 videos in [0, 1].

    Undoes the latent normalisation as `WanPipeline` does (`vae_latent = latents * latents_std + latents_mean`),
    decodes in the VAE's dtype and maps [-1, 1] to [0, 1]. Run it under `torch.no_grad()` for rewards.
    """
    z = latents.to(vae.dtype)
    mean, std = latent_channel_statistics(vae, z)
    videos = vae.decode(z * std + mean, return_dict=False)[0]
    return (videos.float() / 2 + 0.5).clamp(0, 1)


def encode_videos(vae: nn.Module, videos: torch.Tensor) -> torch.Tensor:
    """Encode (B, 3, frames, H, W) videos in [0, 1] to (B, C, F, h, w) diffusion latents: the posterior's mode,
    normalised `(vae_latent - latents_mean) / latents_std` (the inverse of `decode_videos` up to the VAE's error)."""
    pixels = (videos * 2 - 1).to(vae.device, vae.dtype)
    z = vae.encode(pixels).latent_dist.mode()
    mean, std = latent_channel_statistics(vae, z)
    return ((z - mean) / std).float()


@dataclass
class WanPolicy:
    """A loaded `WanPipeline`, the protocol model wrapping its transformer(s), the video length and the helpers
    around them (the interface of :class:`~vgrpo_lib.integrations.diffusers_adapters.presets.DiffusersPolicy`,
    with videos)."""

    pipe: object
    model: WanVelocity
    frames: int = 81
    family: str = "wan"
    lora_target_modules: tuple[str, ...] = field(default=WAN_LORA_TARGET_MODULES)

    def encode_prompts(self, prompts: Sequence[str], max_sequence_length: int | None = None) -> TensorDict:
        """TensorDict[B] of UMT5 prompt embeddings (`max_sequence_length` tokens; None: the pipeline's 512)."""
        return encode_prompts_wan(self.pipe, prompts, 512 if max_sequence_length is None else max_sequence_length)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int, int]:
        """(C, F, h, w) of the latent of a `frames` x height x width video."""
        vae, transformer = self.pipe.vae, self.model.transformer
        return wan_latent_shape(self.frames, height, width, vae.config.z_dim, vae.config.scale_factor_temporal,
                                vae.config.scale_factor_spatial, transformer.config.patch_size)

    def sigma_grid(self, num_steps: int, height: int | None = None, width: int | None = None) -> list[float]:
        """The scheduler's time grid (num_steps + 1 values, 1 -> 0); Wan's does not depend on the resolution."""
        return wan_sigma_grid_from_scheduler_config(self.pipe.scheduler.config, num_steps)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, F, h, w) latents -> (B, 3, frames, H, W) videos in [0, 1]."""
        return decode_videos(self.pipe.vae, latents)

    @torch.no_grad()
    def encode(self, videos: torch.Tensor) -> torch.Tensor:
        """(B, 3, frames, H, W) videos in [0, 1] -> (B, C, F, h, w) latents (`encode_videos`)."""
        return encode_videos(self.pipe.vae, videos)


def load_wan(name_or_path: str = WAN21_T2V, frames: int = 81, device: str | torch.device | None = None,
             dtype: torch.dtype = torch.bfloat16, lora_rank: int | None = None, lora_alpha: int = 64,
             behaviour_adapter: bool = True, autocast: bool = True, local_files_only: bool | None = None) -> WanPolicy:
    """Load a `WanPipeline` (Wan 2.1, or Wan 2.2 with `transformer_2`) by hub name or local path and wrap it.

    Args:
        name_or_path: hub name or local directory of a diffusers Wan text-to-video pipeline.
        frames: video frames per sample (4k + 1; WanPipeline's default 81).
        device: where to put the pipeline (None: leave on the CPU).
        dtype: storage dtype of the pretrained weights.
        lora_rank: add a trainable LoRA adapter of this rank on `WAN_LORA_TARGET_MODULES` of every expert (None: no
            adapter; the task adds its own).
        lora_alpha, behaviour_adapter, autocast, local_files_only: as in
            :func:`~vgrpo_lib.integrations.diffusers_adapters.presets.load_policy`.

    A pipeline whose `transformer_2` is set without a `boundary_ratio` runs `transformer` alone, as WanPipeline does;
    one with only `transformer_2` is refused (a ValueError naming the missing component).
    """
    require_extra("diffusers", f"Loading the Wan pipeline {name_or_path!r}")
    from diffusers import WanPipeline

    local = resolve_local_files_only(local_files_only)
    folder = str(unpacked_folder(name_or_path))  # a hub name, or a plain folder, as it is
    pipe = load_weights(lambda: WanPipeline.from_pretrained(folder, torch_dtype=dtype, local_files_only=local,
                                                            **absent_components(folder)),
                        name_or_path, "the Wan policy")
    pipe.register_to_config(_name_or_path=str(name_or_path))  # a packed folder, not its unpacked cache copy
    if device is not None:
        pipe.to(device)
    if pipe.transformer is None:
        raise ValueError(f"{name_or_path}: the pipeline has no `transformer` (only `transformer_2`); the Wan adapter "
                         f"needs the high-noise expert `transformer`")
    for module in (pipe.vae, pipe.text_encoder, pipe.transformer, pipe.transformer_2):
        if module is not None:
            module.requires_grad_(False)
    num_train_timesteps = pipe.scheduler.config.get("num_train_timesteps", 1000)
    transformer = pipe.transformer
    if pipe.transformer_2 is not None and pipe.config.boundary_ratio is not None:
        transformer = WanExperts(pipe.transformer, pipe.transformer_2, pipe.config.boundary_ratio * num_train_timesteps)
    if lora_rank is not None:
        add_lora(transformer, r=lora_rank, alpha=lora_alpha, target_modules=WAN_LORA_TARGET_MODULES)
        upcast_trainable_parameters(transformer)
        if behaviour_adapter:
            add_behaviour_adapter(transformer)
    model = WanVelocity(transformer, num_train_timesteps, bool(pipe.config.get("expand_timesteps", False)),
                        autocast_dtype=torch.bfloat16 if autocast else None)
    return WanPolicy(pipe=pipe, model=model, frames=frames)
