"""The task contract: what the trainer, ``vgrpo sample`` / ``eval`` / ``export`` and the estimator lab call on a task.

    from vgrpo_lib.algorithms.tasks import TaskProtocol, check_task

    check_task(my_task)                  # returns it, or one TaskProtocolError naming every missing member
    isinstance(my_task, TaskProtocol)    # the same presence test as a bool (runtime_checkable)

Any object with these members is a task (no base class): the embedded testbed's tasks
(:class:`vgrpo_lib.integrations.testbed.tasks.Task`), the hub models' :class:`vgrpo_lib.integrations.tasks.hub.DiffusersTask`,
or a user's own (``docs/examples/custom_task.py``). ``N`` is a number of samples, ``D`` the sample shape.

Required (:data:`REQUIRED_MEMBERS`):

    sample_shape                         D = (C, H, W) (or any shape) of one sample in model space (pixels, latents, 2-D points)
    sample_prompts(n, generator)         n training prompts (a LongTensor of ids, or a list of strings)
    condition(prompts)                   the model's ``cond`` for those prompts: Tensor / TensorDict with batch n, or None
    load_policy()                        a fresh trainable velocity model: an ``nn.Module`` satisfying
                                         :class:`vgrpo_lib.protocols.VelocityModel`
    reference_policy(policy)             a frozen reference (a copy; LoRA: the adapters switched off)
    decode(samples)                      ``(N, *D)`` model space -> what the reward reads (images ``(N, 3, H, W)`` in [0, 1])
    reward()                             the reward ``reward(decoded, prompts) -> (N,)`` (or a multi-reward with
                                         ``stack -> (N, R)``, ``names`` and ``weights``)
    eval_prompts(per_prompt)             the evaluation prompts, each repeated ``per_prompt`` times consecutively
    sample(policy, prompts, num_steps, generator)   decoded samples of ``policy`` (CFG-free ODE) for ``prompts``
    evaluate(images, prompts)            ``{metric: float}`` with at least ``reward_mean`` and the evaluation metrics
    evaluation_metrics                   ``{key: label}`` of the headline numbers of ``evaluate`` (checked for
                                         finiteness, plotted in reward.png, the first shown while training)
    write_samples(images, prompts, path, title)     a sample grid PNG at ``path``, one row per prompt

Optional (:data:`OPTIONAL_MEMBERS`; used when present):

    time_grid(num_steps)                 the task's own rollout grid, ``num_steps + 1`` times from 1 to 0 (used when
                                         ``rollout.shift`` is None; default uniform)
    behaviour_policy(policy)             a soft-updated frozen policy (default: a copy, :mod:`vgrpo_lib.algorithms.policies`)
    null_cond(cond)                      the unconditional ``cond`` of the same batch (classifier-free guidance)
    export_policy(policy, directory)     write the policy for other tools (``vgrpo export``) and return the model
                                         card's ``base_model`` and ``usage``
    labels(prompts)                      what each string prompt asks for (``vgrpo sample`` saves it), or None
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["OPTIONAL_MEMBERS", "REQUIRED_MEMBERS", "TaskProtocol", "TaskProtocolError", "check_task"]


@runtime_checkable
class TaskProtocol(Protocol):
    """What the trainer calls on a task (the module docstring lists each member with its shapes)."""

    sample_shape: tuple[int, ...]
    evaluation_metrics: Mapping[str, str]

    def sample_prompts(self, num_prompts: int, generator: torch.Generator | None = None) -> Any: ...

    def condition(self, prompts: Any) -> Any: ...

    def load_policy(self) -> nn.Module: ...

    def reference_policy(self, policy: nn.Module) -> nn.Module: ...

    def decode(self, samples: torch.Tensor) -> torch.Tensor: ...

    def reward(self) -> Any: ...

    def eval_prompts(self, per_prompt: int) -> Any: ...

    def sample(self, policy: nn.Module, prompts: Any, num_steps: int = ...,
               generator: torch.Generator | None = None) -> torch.Tensor: ...

    def evaluate(self, images: torch.Tensor, prompts: Any) -> dict: ...

    def write_samples(self, images: torch.Tensor, prompts: Any, path: str | os.PathLike, title: str = "") -> Path: ...


REQUIRED_MEMBERS: dict[str, str] = {
    "sample_shape": "sample_shape",
    "sample_prompts": "sample_prompts(n, generator)",
    "condition": "condition(prompts)",
    "load_policy": "load_policy()",
    "reference_policy": "reference_policy(policy)",
    "decode": "decode(samples)",
    "reward": "reward()",
    "eval_prompts": "eval_prompts(per_prompt)",
    "sample": "sample(policy, prompts, num_steps, generator)",
    "evaluate": "evaluate(images, prompts)",
    "evaluation_metrics": "evaluation_metrics",
    "write_samples": "write_samples(images, prompts, path, title)",
}
"""Every required member: name -> how the trainer calls it (``sample_shape`` and ``evaluation_metrics`` are values)."""

OPTIONAL_MEMBERS: tuple[str, ...] = ("time_grid", "behaviour_policy", "null_cond", "export_policy", "labels")
"""Members used when a task has them."""

_VALUES = ("sample_shape", "evaluation_metrics")


class TaskProtocolError(TypeError):
    """An object given as a task lacks members of :class:`TaskProtocol` (or has them in the wrong form)."""


def check_task(task: object, source: str | None = None) -> Any:
    """``task`` itself when it has every member of :class:`TaskProtocol`; otherwise one :class:`TaskProtocolError`
    naming every missing member (and every one that should be callable and is not). ``source`` says where the
    object came from in the error (e.g. the import path of its factory)."""
    problems = [f"missing {how}" for name, how in REQUIRED_MEMBERS.items() if not hasattr(task, name)]
    problems += [f"{name} is not callable" for name in REQUIRED_MEMBERS
                 if name not in _VALUES and hasattr(task, name) and not callable(getattr(task, name))]
    problems += [f"{name} is not callable" for name in OPTIONAL_MEMBERS
                 if hasattr(task, name) and not callable(getattr(task, name))]
    if problems:
        origin = f" (from {source})" if source else ""
        raise TaskProtocolError(f"{type(task).__name__} object{origin} is not a task: {'; '.join(problems)} "
                                f"(see vgrpo_lib.algorithms.tasks.TaskProtocol).")
    if not isinstance(task.sample_shape, Sequence) or not all(isinstance(s, int) for s in task.sample_shape):
        raise TaskProtocolError(f"{type(task).__name__}.sample_shape must be a tuple of ints, got {task.sample_shape!r}.")
    if not isinstance(task.evaluation_metrics, Mapping):
        raise TaskProtocolError(f"{type(task).__name__}.evaluation_metrics must be a mapping {{key: label}}, got "
                                f"{type(task.evaluation_metrics).__name__}.")
    return task
