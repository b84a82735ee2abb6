"""The shared machinery of the diffusers adapters: the protocol wrapper and classifier-free guidance.

Every algorithm in vgrpo_lib talks to a network through one protocol,

    model(x_t, t, cond) -> v        x_t: (B, *D), t: (B,) in [0, 1] (1 = noise), v: like x_t,

under the rectified-flow convention z_t = (1 - t) x + t eps with velocity target eps - x. The
diffusers transformers of SD3 and FLUX speak that convention too, but each with its own calling
details (timestep scale, token packing, position ids, guidance embedding). `FlowTransformerAdapter`
holds what they have in common (the wrapped transformer, dtype handling, bf16 autocast, input checks) and the
subclasses in sd3.py, flux.py, flux2.py, qwen_image.py and wan.py translate the call; `GuidanceEmbeddingAdapter`
adds the guidance-embedding input of the guidance-distilled ones (FLUX.1-dev, FLUX.2-dev).
`classifier_free_guidance` adds CFG with precomputed unconditional prompt embeddings.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from tensordict import TensorDict

from vgrpo_lib.samplers import classifier_free_guidance as vgrpo_classifier_free_guidance

__all__ = ["FlowTransformerAdapter", "GuidanceEmbeddingAdapter", "classifier_free_guidance"]


class FlowTransformerAdapter(nn.Module):
    """Base class: a diffusers flow transformer presented as `model(x_t, t, cond) -> v`.

    Args:
        transformer: the diffusers transformer (registered as a submodule, so `.parameters()`,
            `.to()`, `state_dict()` and peft adapters all go through to it).
        autocast_dtype: when set (usually `torch.bfloat16`), the forward runs under
            `torch.autocast` with this dtype on the input's device; the returned velocity is cast
            back to the dtype of `x_t`, so the losses keep computing in float32.

    Inputs are cast to the transformer's storage dtype (`transformer.dtype`) before the call; this
    lets a bf16 checkpoint with fp32 LoRA parameters (see `lora.upcast_trainable_parameters`) take
    fp32 latents from the sampler.
    """

    casts_inputs = True  # the core's dtype check (a float64 sample with a float32 model) leaves it to the cast above

    def __init__(self, transformer: nn.Module, autocast_dtype: torch.dtype | None = None):
        super().__init__()
        self.transformer = transformer
        self.autocast_dtype = autocast_dtype

    @property
    def config(self):
        """The wrapped transformer's diffusers config (patch size, channels, guidance_embeds...)."""
        return self.transformer.config

    def _autocast(self, device: torch.device):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    @staticmethod
    def _check_inputs(x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None, keys: tuple[str, ...],
                      layout: str = "(B, C, H, W)"):
        if x_t.ndim != layout.count(",") + 1:
            raise ValueError(f"x_t must be unpacked latents {layout}; got shape {tuple(x_t.shape)}")
        if t.shape != (x_t.shape[0],):
            raise ValueError(f"t must have shape (B,) = ({x_t.shape[0]},); got {tuple(t.shape)}")
        if cond is None:
            raise ValueError(f"this model is text-conditioned: cond must be a TensorDict with keys {list(keys)}")
        missing = [k for k in keys if k not in cond.keys()]
        if missing:
            raise KeyError(f"cond lacks {missing}; it has {sorted(cond.keys())}")


class GuidanceEmbeddingAdapter(FlowTransformerAdapter):
    """A `FlowTransformerAdapter` for transformers whose config may have `guidance_embeds` (FLUX.1, FLUX.2,
    Qwen-Image): a guidance-distilled checkpoint takes the guidance scale as an input embedding, not a second forward.

    Args:
        transformer, autocast_dtype: see `FlowTransformerAdapter`.
        guidance_scale: the value fed to the guidance embedding (the pipeline's raw scale, e.g. FLUX.1-dev 3.5,
            FLUX.2-dev 4.0) when the config has `guidance_embeds`; ignored otherwise. A per-sample
            `cond["guidance"]` (B,) overrides it.
    """

    def __init__(self, transformer: nn.Module, guidance_scale: float, autocast_dtype: torch.dtype | None = None):
        super().__init__(transformer, autocast_dtype)
        self.guidance_scale = guidance_scale

    def _guidance(self, t: torch.Tensor, cond: TensorDict) -> torch.Tensor | None:
        """The (B,) float32 guidance input: `cond["guidance"]` when present, else `guidance_scale` for every
        sample; None for a transformer without a guidance embedding."""
        if not self.transformer.config.guidance_embeds:
            return None
        if "guidance" in cond.keys():
            return cond["guidance"].to(torch.float32)
        return torch.full_like(t, self.guidance_scale, dtype=torch.float32)


def classifier_free_guidance(model: nn.Module, uncond: TensorDict, guidance_scale: float) -> nn.Module:
    """Classifier-free guidance with precomputed unconditional embeddings: `v = v_u + scale (v_c - v_u)`.

    A thin layer over `vgrpo_lib.samplers.classifier_free_guidance`, which runs the conditional and
    the unconditional halves as one batch of 2B (as the SD3 pipeline does) instead of two calls.

    Args:
        model: a protocol model `model(x_t, t, cond) -> v`.
        uncond: the unconditional conditioning (e.g. `encode_prompts_sd3(pipe, [""])`) as a
            TensorDict with batch size (1,) (broadcast to every sample) or (B,), with tensors of the
            conditional ones' shapes apart from the batch dimension (the SD3 and FLUX encoders pad
            to a fixed length, so they match). Entries of `cond` that `uncond` lacks (a FLUX
            per-sample "guidance") are shared by both halves.
        guidance_scale: the CFG scale; 1.0 returns `model` itself.

    The paper's V-GRPO rollouts use no CFG; Flow-GRPO's original SD3 recipe uses scale 4.5.
    """

    def null_cond(cond: TensorDict) -> TensorDict:
        null = uncond.to(cond.device)
        if null.batch_size[0] == 1:
            null = null.expand(cond.batch_size[0])
        return cond.clone().update(null.clone())

    return vgrpo_classifier_free_guidance(model, null_cond, guidance_scale)
