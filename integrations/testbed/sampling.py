"""Draw images from a testbed policy with the core library's ODE samplers.

``sample_images`` starts from Gaussian noise at ``t = 1`` and integrates the probability-flow ODE
to ``t = 0`` with ``vgrpo_lib.samplers.sample_ode``, optionally with classifier-free guidance
(``cfg_scale > 1`` mixes in the null-prompt velocity), then maps model space back to images.
"""

from __future__ import annotations

import torch
from torch import nn

from vgrpo_lib.integrations.testbed.data import to_images
from vgrpo_lib.integrations.testbed.models import NULL_ID
from vgrpo_lib.samplers import classifier_free_guidance, sample_ode, time_grid

__all__ = ["null_prompts", "sample_images"]


def null_prompts(cond: torch.Tensor) -> torch.Tensor:
    """The null ("no prompt") condition with the shape of ``cond``: every id set to ``NULL_ID``."""
    return torch.full_like(cond, NULL_ID)


@torch.no_grad()
def sample_images(
    policy: nn.Module,
    prompts: torch.Tensor,
    *,
    num_steps: int = 20,
    cfg_scale: float = 1.0,
    method: str = "euler",
    shift: float = 1.0,
    generator: torch.Generator | None = None,
    chunk_size: int = 500,
) -> torch.Tensor:
    """Sample one image per prompt: ``prompts`` int64 ``(B,)`` or ``(B, S)`` -> images ``(B, *policy.image_shape)``
    in ``[0, 1]``, on the policy's device.

    ``num_steps`` solver steps on ``time_grid(num_steps, shift)``; ``cfg_scale = 1`` is CFG-free
    (the setting RL trains and evaluates in); ``method`` is any ``sample_ode`` solver. All the noise
    is drawn up front on the CPU from ``generator``, so a seed gives the same images on any device
    and for any ``chunk_size``; rows are integrated ``chunk_size`` at a time to bound memory.
    """
    device = next(policy.parameters()).device
    noise = torch.randn((prompts.shape[0], *policy.image_shape), generator=generator).to(device)
    prompts = prompts.to(device)
    model = classifier_free_guidance(policy, null_prompts, cfg_scale)
    grid = time_grid(num_steps, shift=shift)
    out = [sample_ode(model, z, grid, c, method=method) for z, c in zip(noise.split(chunk_size), prompts.split(chunk_size))]
    return to_images(torch.cat(out))
