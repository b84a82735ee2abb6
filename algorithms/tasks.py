"""Where the trainer gets its task (prompts, base policy, reward, evaluation) from.

A task is any object with this protocol (the testbed's :class:`integrations.testbed.tasks.Task` is one):

    sample_shape                       (C, H, W) of a sample in model space (pixels or latents)
    sample_prompts(n, generator)       n prompts (a LongTensor of ids, or a list of strings)
    condition(prompts)                 the model's conditioning for those prompts (Tensor or TensorDict)
    load_policy()                      a fresh trainable velocity model
    reference_policy(policy)           a frozen reference (a copy; LoRA: the adapters disabled)
    decode(samples)                    model space -> images in [0, 1] for the reward
    reward()                           reward(images, prompts) -> (N,)
    eval_prompts(per_prompt), sample(policy, prompts, num_steps, generator), evaluate(images, prompts)

The embedded testbed provides every task that runs anywhere. The paper's SD3.5-Medium and FLUX.1-dev
settings are presets whose tasks need those models; they fail here with a message saying what is missing.
"""

from __future__ import annotations

import torch

from integrations.testbed.data import to_images, to_model_space
from integrations.testbed.tasks import TASKS, Task, get_task

__all__ = ["load_task", "repeat_each", "to_images", "to_model_space", "Task", "TASKS"]

HUB_TASKS = {
    "sd3.5-medium": "stabilityai/stable-diffusion-3.5-medium",
    "flux.1-dev": "black-forest-labs/FLUX.1-dev",
}


def repeat_each(prompts, times: int):
    """Each prompt ``times`` times in a row (a group per prompt): Tensor rows or list items."""
    if isinstance(prompts, torch.Tensor):
        return prompts.repeat_interleave(times, dim=0)
    return [prompt for prompt in prompts for _ in range(times)]


def load_task(name: str) -> Task:
    """A testbed task by name; the hub-model tasks raise a clear error when their model is not available."""
    if name in HUB_TASKS:
        raise RuntimeError(
            f"Task {name!r} trains {HUB_TASKS[name]}, whose weights are not available on this machine "
            "(no hub downloads at run time). Use the diffusers adapters in integrations.diffusers_adapters on a "
            f"machine that has the model, or a testbed task: {', '.join(TASKS)}."
        )
    return get_task(name)
