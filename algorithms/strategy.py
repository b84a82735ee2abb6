"""How the trainer is spread over processes (``distributed.strategy``; see :mod:`vgrpo_lib.integrations.distributed`).

Launched with torchrun, every process trains its block of whole prompt groups of the global batch and DDP
(``ddp``) or FSDP2 (``fsdp2``) averages the gradients; rank 0 alone evaluates and writes files.

    check_split(config, shard)                                  # the batch divides over the processes, or ValueError
    policies = build_policies(task, policy, algorithm_class, config)
    prompts, cond, group = local_prompts(task, config, shard, generator)
"""

from __future__ import annotations

import torch
from torch import nn

from vgrpo_lib.algorithms.autotune import AUTO, KEYS
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.errors import UsageError
from vgrpo_lib.algorithms.policies import Policies, make_behaviour
from vgrpo_lib.algorithms.step_control import ResettableReference
from vgrpo_lib.algorithms.tasks import repeat_each
from vgrpo_lib.integrations.distributed import Shard, shard_frozen, shard_groups, wrap_model

__all__ = ["check_split", "build_policies", "local_prompts"]


def check_split(config: TrainConfig, shard: Shard) -> None:
    """ValueError unless the prompt groups (and ``optim.minibatch_size``) divide over the processes; a
    :class:`UsageError` for a micro-batch size searched (``auto``) with several processes."""
    shard_groups(config.prompts_per_iteration, shard.world_size, shard.rank)
    if config.optim.minibatch_size is not None:
        shard.check_divisible("optim.minibatch_size", config.optim.minibatch_size)
    tuned = [KEYS[phase] for phase, value in (("rollout", config.rollout.micro_batch_size),
                                              ("update", config.optim.micro_batch_size)) if value == AUTO]
    if tuned and shard.world_size > 1:
        raise UsageError(f"{' and '.join(tuned)}={AUTO} searches in one process; with {shard.world_size} processes "
                         f"each would pick its own size and one that ran out of memory would leave the others waiting: "
                         f"set the size (a one-process run records the one that fits).")


def build_policies(task, policy: nn.Module, algorithm_class, config: TrainConfig) -> Policies:
    """The policies ``algorithm_class`` asks for, prepared for the strategy: the trained ``policy`` wrapped (DDP's
    constructor is a collective; FSDP2 shards ``policy`` in place, so an optimizer built afterwards holds the local
    shards), the frozen reference and behaviour versions made from the unwrapped policy, then sharded with it."""
    reference = task.reference_policy(policy) if algorithm_class.needs_reference(config) else None
    if config.schedule.reference_reset is not None and isinstance(reference, ResettableReference):
        reference.hold_resets()  # a LoRA reference's adapter, added before FSDP2 shards the transformer with it
    behaviour = make_behaviour(task, policy) if algorithm_class.needs_behaviour(config) else None
    strategy = config.distributed.strategy
    policies = Policies(wrap_model(policy, strategy), shard_frozen(reference, strategy), behaviour,
                        null_cond=getattr(task, "null_cond", None))
    if behaviour is not None:
        behaviour.shard(strategy)
    return policies


def local_prompts(task, config: TrainConfig, shard: Shard, generator: torch.Generator):
    """This process's prompt groups (every rank draws the global prompts and keeps its block): the prompt of each
    sample, its conditioning and its group id."""
    prompts = task.sample_prompts(config.prompts_per_iteration, generator)
    block = shard_groups(config.prompts_per_iteration, shard.world_size, shard.rank)
    prompts = repeat_each(prompts[block], config.group_size)
    group = torch.arange(config.prompts_per_iteration)[block].repeat_interleave(config.group_size)
    return prompts, task.condition(prompts), group
