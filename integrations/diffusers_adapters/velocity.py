"""The shared machinery of the diffusers adapters: the protocol wrapper and classifier-free guidance.

Every algorithm in vgrpo_lib talks to a network through one protocol,

    model(x_t, t, cond) -> v        x_t: (B, *D), t: (B,) in [0, 1] (1 = noise), v: like x_t,

under the rectified-flow convention z_t = (1 - t) x + t eps with velocity target eps - x. The
diffusers transformers of SD3 and FLUX speak that convention too, but each with its own calling
details (timestep scale, token packing, position ids, guidance embedding). `FlowTransformerAdapter`
holds what the two have in common (the wrapped transformer, dtype handling, bf16 autocast) and the
subclasses in sd3.py and flux.py translate the call.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from tensordict import TensorDict


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
    def _check_inputs(x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None, keys: tuple[str, ...]):
        if x_t.ndim != 4:
            raise ValueError(f"x_t must be unpacked latents (B, C, H, W); got shape {tuple(x_t.shape)}")
        if t.shape != (x_t.shape[0],):
            raise ValueError(f"t must have shape (B,) = ({x_t.shape[0]},); got {tuple(t.shape)}")
        if cond is None:
            raise ValueError(f"this model is text-conditioned: cond must be a TensorDict with keys {list(keys)}")
        missing = [k for k in keys if k not in cond.keys()]
        if missing:
            raise KeyError(f"cond lacks {missing}; it has {sorted(cond.keys())}")


class ClassifierFreeGuidance(nn.Module):
    """Classifier-free guidance in one batched forward: `v = v_u + scale * (v_c - v_u)`.

    Wraps any protocol model. The conditional and unconditional halves go through the network as
    one batch of 2B (as the SD3 pipeline does), which is faster than two calls and gives the same
    numbers up to kernel-level batch effects.

    Args:
        model: a protocol model `model(x_t, t, cond) -> v`.
        uncond: the unconditional conditioning (e.g. the encoded empty prompt) as a TensorDict with
            batch size (1,) (broadcast to every sample) or (B,). Its tensors must have the same
            shapes as the conditional ones apart from the batch dimension (the SD3 and FLUX prompt
            encoders pad to a fixed length, so they do).
        guidance_scale: the CFG scale; 1.0 returns the conditional velocity (and still pays for the
            uncond half; unwrap the model instead to save it).

    The paper's V-GRPO rollouts use no CFG; Flow-GRPO's original SD3 recipe uses scale 4.5.
    """

    def __init__(self, model: nn.Module, uncond: TensorDict, guidance_scale: float):
        super().__init__()
        self.model = model
        self.uncond = uncond
        self.guidance_scale = guidance_scale

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        batch = x_t.shape[0]
        uncond = self.uncond.to(x_t.device)
        if uncond.batch_size[0] == 1:
            uncond = uncond.expand(batch)
        both = torch.cat([uncond, cond.select(*uncond.keys())], dim=0)
        v = self.model(torch.cat([x_t, x_t]), torch.cat([t, t]), both)
        v_uncond, v_cond = v.chunk(2)
        return v_uncond + self.guidance_scale * (v_cond - v_uncond)
