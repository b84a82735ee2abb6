"""Where the trainer gets its task (prompts, base policy, reward, evaluation) from, and what a task is.

A task is any object with the members of :class:`TaskProtocol` (no base class; the module
:mod:`vgrpo_lib.integrations.tasks.protocol` lists each member with its shapes):

    sample_shape                       D, the shape of one sample in model space (pixels, latents, 2-D points)
    sample_prompts(n, generator)       n prompts (a LongTensor of ids, or a list of strings)
    condition(prompts)                 the model's conditioning for those prompts (Tensor, TensorDict or None)
    load_policy()                      a fresh trainable velocity model (an nn.Module, :class:`vgrpo_lib.protocols.VelocityModel`)
    reference_policy(policy)           a frozen reference (a copy; LoRA: the adapters disabled)
    decode(samples)                    model space -> what the reward reads (images in [0, 1])
    reward()                           reward(decoded, prompts) -> (N,)
    eval_prompts(per_prompt), sample(policy, prompts, num_steps, generator), evaluate(images, prompts)
    evaluation_metrics                 {key: label} of the headline numbers of ``evaluate`` (checked for
                                       finiteness, plotted in reward.png, the first shown while training)
    write_samples(images, prompts, path, title)   a sample grid PNG, one row per prompt labelled with it

and optionally:

    time_grid(num_steps)               the task's own rollout grid (used when ``rollout.shift`` is None)
    behaviour_policy(policy)           a soft-updated frozen policy (default: a copy, see vgrpo_lib.algorithms.policies)
    null_cond(cond)                    the unconditional condition (classifier-free guidance)
    export_policy(policy, directory)   write the policy for other tools (``vgrpo export``, :mod:`vgrpo_lib.algorithms.export`)
                                       and return the model card's ``base_model`` and ``usage``
    labels(prompts)                    what each string prompt asks for (``vgrpo sample`` saves it)

:func:`check_task` checks an object at the start of every run and names every missing member in one error.
Three ways to give the trainer a task, none of which edits the project:

    Trainer(config, run_dir, task=my_task)                         # any object satisfying the protocol
    register_task("toy2d", make_toy2d, "a 2-D toy"); config.task = "toy2d"
    vgrpo train --task my_package.my_module:make_task ...          # an import path to a factory (saved with the run)

Tasks are built by name or import path by :func:`load_task` (:func:`vgrpo_lib.integrations.tasks.build_task`). The
embedded testbed provides tasks that run anywhere, and so does the shipped MNIST-SD3 pipeline
(``mnist-sd3/digit``, ``mnist-sd3/ocr``) through the hub path. The paper's SD3.5-Medium and FLUX.1-dev settings are
presets whose tasks (:class:`vgrpo_lib.integrations.tasks.hub.DiffusersTask`) need those models locally
(``model.path`` or the Hugging Face cache) and a prompt file (``model.prompts``), configured by the ``model``
section of the run config; without them they fail with a message saying what is missing.
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from vgrpo_lib.algorithms.config import ModelConfig, RolloutConfig, parse_image_size
from vgrpo_lib.integrations.tasks import (
    OPTIONAL_MEMBERS, REQUIRED_MEMBERS, TaskProtocol, TaskProtocolError, build_task, check_task, register_task,
    task_names,
)
from vgrpo_lib.integrations.testbed.data import to_images, to_model_space
from vgrpo_lib.integrations.testbed.tasks import TASKS, get_task
from vgrpo_lib.errors import UsageError
from vgrpo_lib.samplers import time_grid

__all__ = ["OPTIONAL_MEMBERS", "REQUIRED_MEMBERS", "TASKS", "TaskProtocol", "TaskProtocolError", "check_task",
           "get_task", "load_task", "register_task", "repeat_each", "rollout_grid", "task_names", "to_images",
           "to_model_space"]


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


def load_task(name: str, model: ModelConfig | None = None) -> TaskProtocol:
    """The task ``name``: a registered name (a testbed task, or a diffusers task configured by ``model``, the run
    config's ``model`` section) or the import path ``"package.module:factory"`` of a user's factory (called with no
    argument, or with the model settings as a dict when it has a required parameter), checked against
    :class:`TaskProtocol`. One-line errors (:func:`vgrpo_lib.integrations.tasks.build_task`) for an unknown name, a bad
    import path, a result that is no task, or missing weights; a :class:`~vgrpo_lib.errors.UsageError` naming them
    when ``model`` sets keys for a testbed task (which has no model section)."""
    settings = asdict(model or ModelConfig())
    if name in task_names("testbed"):
        defaults = asdict(ModelConfig())
        given = [f"model.{key}={value}" for key, value in settings.items() if value != defaults[key]]
        if given:
            raise UsageError(f"{', '.join(given)}: the testbed task {name!r} has no model section (its policy is the "
                             f"shipped MLP); the model keys configure the diffusers tasks. Drop them.")
    for key in ("image_size", "eval_image_size"):
        settings[key] = None if settings[key] is None else parse_image_size(settings[key])
    return build_task(name, settings)
