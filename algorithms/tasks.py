"""Where the trainer gets its task (prompts, base policy, reward, evaluation) from.

A task is any object with this protocol (the testbed's :class:`vgrpo_lib.integrations.testbed.tasks.Task` is one):

    sample_shape                       (C, H, W) of a sample in model space (pixels or latents)
    sample_prompts(n, generator)       n prompts (a LongTensor of ids, or a list of strings)
    condition(prompts)                 the model's conditioning for those prompts (Tensor or TensorDict)
    load_policy()                      a fresh trainable velocity model
    reference_policy(policy)           a frozen reference (a copy; LoRA: the adapters disabled)
    decode(samples)                    model space -> images in [0, 1] for the reward
    reward()                           reward(images, prompts) -> (N,)
    eval_prompts(per_prompt), sample(policy, prompts, num_steps, generator), evaluate(images, prompts)
    evaluation_metrics                 {key: label} of the headline numbers of ``evaluate`` (checked for
                                       finiteness, plotted in reward.png, the first shown while training)
    write_samples(images, prompts, path, title)   a sample grid PNG, one row per prompt labelled with it

and optionally:

    time_grid(num_steps)               the task's own rollout grid (used when ``rollout.shift`` is None)
    behaviour_policy(policy)           a soft-updated frozen policy (default: a copy, see vgrpo_lib.algorithms.policies)
    export_policy(policy, directory)   write the policy for other tools (``vgrpo export``, :mod:`vgrpo_lib.algorithms.export`)
                                       and return the model card's ``base_model`` and ``usage``

Tasks are built by name from :mod:`vgrpo_lib.integrations.task_registry`. The embedded testbed provides tasks that run
anywhere, and so does the shipped MNIST-SD3 pipeline (``mnist-sd3/digit``, ``mnist-sd3/ocr``) through the hub
path. The paper's SD3.5-Medium and FLUX.1-dev settings are presets whose tasks
(:class:`vgrpo_lib.integrations.diffusers_adapters.task.DiffusersTask`) need those models locally (``model.path`` or the
Hugging Face cache) and a prompt file (``model.prompts``), configured by the ``model`` section of the run config;
without them they fail with a message saying what is missing.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from vgrpo_lib.algorithms.config import ModelConfig, RolloutConfig, parse_image_size
from vgrpo_lib.integrations.task_registry import build_task, task_names
from vgrpo_lib.integrations.testbed.data import to_images, to_model_space
from vgrpo_lib.integrations.testbed.tasks import TASKS, Task, get_task
from vgrpo_lib.samplers import time_grid

__all__ = ["get_task", "load_task", "repeat_each", "rollout_grid", "task_names", "to_images", "to_model_space", "Task",
           "TASKS"]


def repeat_each(prompts, times: int):
    """Each prompt ``times`` times in a row (a group per prompt): Tensor rows or list items."""
    if isinstance(prompts, torch.Tensor):
        return prompts.repeat_interleave(times, dim=0)
    return [prompt for prompt in prompts for _ in range(times)]


def rollout_grid(task, rollout: RolloutConfig) -> list[float]:
    """The training rollout's time grid: ``time_grid(num_steps, shift)`` when ``rollout.shift`` is set, else the
    task's own (``task.time_grid``; uniform for tasks without one)."""
    if rollout.shift is None and hasattr(task, "time_grid"):
        return list(task.time_grid(rollout.num_steps))
    return time_grid(rollout.num_steps, shift=1.0 if rollout.shift is None else rollout.shift)


def load_task(name: str, model: ModelConfig | None = None):
    """The task registered as ``name`` (:mod:`vgrpo_lib.integrations.task_registry`): a testbed task, or a diffusers task
    configured by ``model`` (the run config's ``model`` section); a clear error when its weights are missing."""
    settings = asdict(model or ModelConfig())
    settings["image_size"] = None if settings["image_size"] is None else parse_image_size(settings["image_size"])
    return build_task(name, settings)
