"""The versions of the policy an algorithm works with.

    Policies(trained, reference=None, behaviour=None, null_cond=None)

- ``trained``: the policy being optimised (wrapped for multi-process training: DDP or FSDP2);
- ``reference``: the frozen base policy, for KL terms (the task's ``reference_policy``: a copy on the testbed,
  the same transformer with its LoRA adapters switched off for a diffusers task);
- ``behaviour``: a frozen policy that trails the trained one by soft updates (DiffusionNFT's old policy), a
  :class:`BehaviourPolicy`. Tasks may provide their own (``task.behaviour_policy(policy)``: a second LoRA
  adapter in the same transformer for a diffusers task); otherwise it is a :class:`CopiedBehaviour`;
- ``null_cond``: the task's ``cond -> unconditional cond`` (``task.null_cond``), from which an algorithm builds
  the classifier-free-guided version of a policy; None where the task has none.

:class:`WeightEMA` keeps an exponential moving average of the trained weights (evaluated in their place).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from vgrpo_lib.integrations.distributed import load_model_state_dict, local_parameters, model_state_dict, shard_frozen
from vgrpo_lib.batches import OldPolicy
from vgrpo_lib.control import EMAWarmupDecay, ema_update_

__all__ = ["BehaviourPolicy", "CopiedBehaviour", "make_behaviour", "Policies", "WeightEMA"]


class BehaviourPolicy(Protocol):
    """A frozen velocity model ``(x_t, t, cond) -> v`` that follows the trained policy by soft updates."""

    def __call__(self, x_t: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor: ...

    def update_(self, decay: float) -> None:
        """``theta_old <- decay * theta_old + (1 - decay) * theta`` (``decay = 0``: a hard copy)."""

    def shard(self, strategy: str) -> None:
        """Prepare for multi-process training with ``strategy`` (after the trained policy is wrapped)."""

    def state_dict(self) -> dict:
        """The behaviour weights, full (gathered under FSDP2), for a checkpoint."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


class CopiedBehaviour(OldPolicy):
    """A behaviour policy held as a frozen deep copy of the trained policy (made before it is wrapped): the core's
    :class:`vgrpo_lib.batches.OldPolicy`, made shardable and checkpointable.

    Under FSDP2 the copy is sharded like the trained policy, so the soft update is a local operation on
    matching shards and the state dict is gathered like the trained policy's.
    """

    _parameters = staticmethod(local_parameters)

    def shard(self, strategy: str) -> None:
        """Shard the copy like the trained policy (FSDP2); DDP keeps it whole."""
        self.model = shard_frozen(self.model, strategy)

    def state_dict(self) -> dict:
        """The copy's full weights."""
        return model_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        load_model_state_dict(self.model, state)


def make_behaviour(task, policy: nn.Module) -> BehaviourPolicy:
    """The task's own behaviour policy when it has one (``task.behaviour_policy``), else a copy."""
    make = getattr(task, "behaviour_policy", None)
    return make(policy) if make is not None else CopiedBehaviour(policy)


@dataclass
class Policies:
    """What an :class:`vgrpo_lib.algorithms.base.Algorithm` is built with (see the module doc)."""

    trained: nn.Module
    reference: object | None = None
    behaviour: BehaviourPolicy | None = None
    null_cond: Callable | None = None


class WeightEMA:
    """An exponential moving average of the trained parameters, as the official Flow-GRPO and DiffusionNFT keep
    (``EMAModuleWrapper``): after gradient step ``s`` (1-based count of steps taken), when ``(s + 1) % every == 0``
    (Flow-GRPO: every 8, DiffusionNFT: every 1), ``ema <- d ema + (1 - d) theta`` with
    ``d = min((1 + s) / (10 + s), max_decay)`` (:class:`vgrpo_lib.control.EMAWarmupDecay`). Evaluation runs on the
    average (:meth:`swapped_in`); training continues on the raw weights. ``offload``: the average lives in CPU memory
    (the trained weights are copied to it for each update, and it is copied into them for evaluation), so a GPU
    holds no second set of trained weights.
    """

    def __init__(self, parameters, max_decay: float, every: int = 1, offload: bool = False):
        self.parameters = [p for p in parameters if p.requires_grad]
        self.offload = offload
        self.average = [p.detach().to("cpu", copy=True) if offload else p.detach().clone() for p in self.parameters]
        self.decay, self.every = EMAWarmupDecay(max_decay), every

    def update(self, step: int) -> None:
        """After gradient step ``step`` (1-based): average in the current weights when the step is due."""
        if (step + 1) % self.every == 0:
            source = [p.detach().cpu() for p in self.parameters] if self.offload else self.parameters
            ema_update_(self.average, source, self.decay(step))

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The average in the parameters' place inside the block, the trained values restored after it."""
        if self.offload:
            with self._copied_in():
                yield
            return
        with torch.no_grad():
            for param, average in zip(self.parameters, self.average):
                param.data, average.data = average.data, param.data
        try:
            yield
        finally:
            with torch.no_grad():
                for param, average in zip(self.parameters, self.average):
                    param.data, average.data = average.data, param.data

    @contextmanager
    def _copied_in(self) -> Iterator[None]:
        """:meth:`swapped_in` of an offloaded average: copied into the parameters, the trained values kept on the
        CPU meanwhile."""
        with torch.no_grad():
            trained = [p.detach().to("cpu", copy=True) for p in self.parameters]
            for param, average in zip(self.parameters, self.average):
                param.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for param, value in zip(self.parameters, trained):
                    param.copy_(value)

    def state_dict(self) -> dict:
        """The averaged parameters (copies)."""
        return {"average": [a.clone() for a in self.average]}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        for average, saved in zip(self.average, state["average"], strict=True):
            average.copy_(saved)
