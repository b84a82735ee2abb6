"""Stable Diffusion 3 / 3.5: `SD3Transformer2DModel` as a velocity model, and its prompt encoder.

What the adapter translates (checked against `StableDiffusion3Pipeline.__call__`):
- time: the pipeline passes `timestep = sigma * num_train_timesteps` (0..1000); our `t` is the
  sigma itself, so the adapter multiplies by `num_train_timesteps` (1000 for every SD3 scheduler).
- conditioning: `encoder_hidden_states` = the joint CLIP-L/CLIP-G/T5 token embeddings
  `(B, L, joint_attention_dim)`, `pooled_projections` = the pooled CLIP embeddings
  `(B, pooled_projection_dim)`; both come from `pipe.encode_prompt`.
- latents are passed through as (B, C, H, W); the transformer patchifies internally.
"""

from __future__ import annotations

import torch
from torch import nn
from tensordict import TensorDict

from .velocity import FlowTransformerAdapter

__all__ = ["SD3_COND_KEYS", "SD3Velocity", "encode_prompts_sd3"]

SD3_COND_KEYS = ("prompt_embeds", "pooled_prompt_embeds")


class SD3Velocity(FlowTransformerAdapter):
    """`SD3Transformer2DModel` presented as `model(x_t, t, cond) -> v`.

    Args:
        transformer: an `SD3Transformer2DModel` (possibly with peft LoRA adapters).
        num_train_timesteps: the scheduler's timestep scale (1000 for SD3 / SD3.5).
        autocast_dtype: see `FlowTransformerAdapter`.

    Call:
        x_t: (B, C, H, W) latents (C = 16 for SD3.5), t: (B,) in [0, 1],
        cond: TensorDict[B] with "prompt_embeds" (B, L, 4096) and "pooled_prompt_embeds" (B, 2048).
        Returns v: (B, C, H, W) in the dtype of x_t.
    """

    def __init__(self, transformer: nn.Module, num_train_timesteps: int = 1000, autocast_dtype: torch.dtype | None = None):
        super().__init__(transformer, autocast_dtype)
        self.num_train_timesteps = num_train_timesteps

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: TensorDict | None) -> torch.Tensor:
        self._check_inputs(x_t, t, cond, SD3_COND_KEYS)
        dtype = self.transformer.dtype
        with self._autocast(x_t.device):
            v = self.transformer(
                hidden_states=x_t.to(dtype),
                timestep=t * self.num_train_timesteps,
                encoder_hidden_states=cond["prompt_embeds"].to(dtype),
                pooled_projections=cond["pooled_prompt_embeds"].to(dtype),
                return_dict=False,
            )[0]
        return v.to(x_t.dtype)


@torch.no_grad()
def encode_prompts_sd3(pipe, prompts: list[str], max_sequence_length: int = 256) -> TensorDict:
    """Encode prompts with the SD3 pipeline's own three text encoders.

    Args:
        pipe: a `StableDiffusion3Pipeline` (its text encoders on the target device).
        prompts: B strings; encode `[""]` for the unconditional embedding used by CFG.
        max_sequence_length: T5 token length (the pipeline's default, 256).

    Returns:
        TensorDict[B] with "prompt_embeds" (B, 77 + max_sequence_length, 4096) and
        "pooled_prompt_embeds" (B, 2048), on the pipeline's execution device.

    Encode once per prompt and reuse the result for the G images of its group and for every
    gradient step: the encoders are frozen in all three algorithms.
    """
    prompt_embeds, _, pooled, _ = pipe.encode_prompt(
        prompt=list(prompts),
        prompt_2=None,
        prompt_3=None,
        do_classifier_free_guidance=False,
        max_sequence_length=max_sequence_length,
    )
    return TensorDict(
        {"prompt_embeds": prompt_embeds, "pooled_prompt_embeds": pooled},
        batch_size=[len(prompts)],
        device=prompt_embeds.device,
    )
