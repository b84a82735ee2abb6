"""Image-set metrics shared by every task (the embedded testbed's and the hub models'): model-agnostic, pure torch.

    from vgrpo_lib.integrations.metrics import diversity

    diversity(images, prompt_ids)        # mean pairwise RMS distance between images of the same prompt
"""

from __future__ import annotations

import torch

__all__ = ["diversity"]


@torch.no_grad()
def diversity(images: torch.Tensor, prompts: torch.Tensor) -> float:
    """Mean pairwise RMS distance ``sqrt(mean_pixels (a - b)^2)`` between images sharing a prompt.

    ``images`` ``(B, ...)``, ``prompts`` ``(B,)`` or ``(B, S)``. Each prompt with >= 2 images gives the
    mean over its distinct pairs; the result averages those per-prompt means (NaN if no prompt repeats).
    Mode collapse drives it to 0.
    """
    flat = images.reshape(images.shape[0], -1)
    keys = prompts.reshape(prompts.shape[0], -1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    per_prompt = []
    for group in inverse.unique():
        members = flat[inverse == group]
        n = members.shape[0]
        if n < 2:
            continue
        dist = torch.cdist(members, members) / flat.shape[1] ** 0.5
        per_prompt.append(dist.sum() / (n * (n - 1)))
    return torch.stack(per_prompt).mean().item() if per_prompt else float("nan")
