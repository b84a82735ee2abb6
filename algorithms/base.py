"""What an algorithm plugs into the shared trainer loop (:mod:`vgrpo_lib.algorithms.trainer`).

The loop owns prompts, rewards, advantages, minibatching, optimisation, logging and checkpoints. An
algorithm owns only what makes it different:

- ``rollout``: how samples are generated (and what is recorded on the way);
- ``prepare``: what is computed once per rollout before the gradient steps (pairs and old surrogates;
  per-transition rows; nothing), its model forwards row by row in ``prepare_forward``, which the trainer runs in
  micro-batches of ``optim.micro_batch_size`` rows;
- ``loss``: the TorchRL loss module applied to a minibatch;
- ``after_iteration``: old-policy updates;
- ``nfe``: model evaluations per sample per iteration, for cost accounting and the NFE budget of a comparison
  (``nfe_varies_with`` names the config key when it changes as the run trains).

An algorithm is built from the config, the policies it asked for (:class:`vgrpo_lib.algorithms.policies.Policies`:
``needs_reference`` / ``needs_behaviour``), the sample shape and the rollout time grid (the task's; see
:func:`vgrpo_lib.algorithms.tasks.rollout_grid`).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.policies import Policies
from vgrpo_lib.integrations.distributed import Shard
from vgrpo_lib.samplers import nfe_per_sample, sample_ode

__all__ = ["Algorithm", "FreshPairsAlgorithm"]


class Algorithm:
    """Base class. Subclasses set ``name`` and ``loss_module`` and override what differs."""

    name = "algorithm"

    def __init__(self, config: TrainConfig, policies: Policies, sample_shape: tuple[int, ...], grid: list[float]):
        self.config, self.sample_shape, self.grid = config, tuple(sample_shape), list(grid)
        self.policy, self.reference, self.behaviour = policies.trained, policies.reference, policies.behaviour
        self.loss_module: nn.Module | None = None
        # This process's block of the global batch (of the current process group: single-process without one).
        # Batch-sized random draws go through it (drawn globally, block kept) so that W processes reproduce one.
        self.shard = Shard.current()

    @staticmethod
    def needs_reference(config: TrainConfig) -> bool:
        """Whether the algorithm needs a frozen copy of the base policy (a KL to it is configured)."""
        return False

    @staticmethod
    def needs_behaviour(config: TrainConfig) -> bool:
        """Whether the algorithm needs a soft-updated behaviour policy (:class:`vgrpo_lib.algorithms.policies.BehaviourPolicy`)."""
        return False

    @property
    def single_step(self) -> bool:
        """Exactly one gradient step per rollout (one epoch, one minibatch)."""
        optim = self.config.optim
        batch = self.config.prompts_per_iteration * self.config.trained_per_group
        one_minibatch = optim.minibatches in (None, 1) and (optim.minibatch_size is None or optim.minibatch_size >= batch)
        return optim.epochs == 1 and one_minibatch

    def rollout_model(self, iteration: int) -> nn.Module:
        """The policy that generates the rollout of ``iteration`` (the behaviour policy)."""
        return self.policy

    @torch.no_grad()
    def rollout(self, cond, group: torch.Tensor, generator: torch.Generator, iteration: int) -> TensorDict:
        """Deterministic ODE rollout from Gaussian noise: ``"sample"`` ``[N, *D]`` in model space."""
        noise = self.shard.randn((group.shape[0], *self.sample_shape), generator)
        sample = sample_ode(self.rollout_model(iteration), noise, self.grid, cond, method=self.config.rollout.solver)
        return TensorDict({"sample": sample, "cond": cond, "group": group}, batch_size=[group.shape[0]])

    def prepare(self, batch: TensorDict, generator: torch.Generator) -> TensorDict:
        """Training rows from a scored rollout (with ``"advantage"``); default: the rollout itself. The rows' model
        forwards are left to :meth:`prepare_forward`."""
        return batch

    def prepare_forward(self, rows: TensorDictBase) -> dict[str, torch.Tensor]:
        """The prepare phase's model forwards, without gradient, on ``rows`` (``[n]``, a micro-batch of
        :meth:`prepare`'s rows): the entries they add to those rows, each with n rows (V-GRPO: the behaviour policy's
        surrogates). The trainer calls it where :meth:`nfe` counts prepare evaluations, on micro-batches of
        ``optim.micro_batch_size`` rows (:mod:`vgrpo_lib.algorithms.autotune` says why the update's size fits),
        so its entries must depend on each row alone. Default: none."""
        return {}

    def prepared(self, rows: TensorDictBase) -> None:
        """Called with the prepare phase's rows (this process's block), their :meth:`prepare_forward` entries
        included, before the gradient steps (V-GRPO measures the noise of its pairs there). Default: nothing."""

    def metrics(self) -> dict[str, float]:
        """The algorithm's own entries of the iteration's metrics row (V-GRPO's adaptive K). Default: none."""
        return {}

    def loss(self, minibatch: TensorDictBase, generator: torch.Generator) -> TensorDictBase:
        """The loss module's output on ``minibatch`` (rows of :meth:`prepare`): ``loss_*`` and diagnostics."""
        return self.loss_module(minibatch)

    def after_iteration(self, iteration: int, grad_steps: int) -> None:
        """Called once the gradient steps of ``iteration`` are done; ``grad_steps``: gradient steps taken so far
        in the run (this iteration's included)."""

    @property
    def nfe_varies_with(self) -> str | None:
        """The config key by which :meth:`nfe` changes from iteration to iteration as the run trains, or None
        when every iteration costs the same (the default)."""
        return None

    def nfe(self) -> dict[str, int]:
        """Model evaluations per sample and iteration: ``rollout``, ``prepare`` (no grad) and ``update`` (with
        grad, forward+backward counted once)."""
        return {"rollout": nfe_per_sample(self.config.rollout.solver, self.config.rollout.num_steps), "prepare": 0, "update": 0}

    def state_dict(self) -> dict:
        """Algorithm state beyond the policy and optimizer: the behaviour policy when there is one (DiffusionNFT's
        old policy, AWM's soft-updated copy)."""
        return {} if self.behaviour is None else {"old_policy": self.behaviour.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        if self.behaviour is not None:
            self.behaviour.load_state_dict(state["old_policy"])


class FreshPairsAlgorithm(Algorithm):
    """An algorithm whose loss draws its timestep-noise pairs at every gradient step (``self.estimator``) and whose
    soft-updated behaviour copy, where it has one, moves toward the policy by ``self.decay(grad_steps)`` after each
    iteration: DiffusionNFT, AWM and DGPO. Subclasses set ``estimator``, ``decay`` and ``loss_module``."""

    def loss(self, minibatch: TensorDictBase, generator: torch.Generator) -> TensorDictBase:
        """The loss on timestep-noise pairs drawn for this gradient step: drawn for the global minibatch on every
        process (with its group ids when the estimator shares pairs within groups), block kept."""
        group = self.shard.all_gather(minibatch["group"]) if self.estimator.sharing == "group" else None
        pairs = self.estimator.sample_pairs(self.shard.global_like(minibatch["sample"]), group, generator=generator)
        minibatch["pairs"] = self.shard.local(pairs)
        return self.loss_module(minibatch)

    def after_iteration(self, iteration: int, grad_steps: int) -> None:
        if self.behaviour is not None:
            self.behaviour.update_(self.decay(grad_steps))
