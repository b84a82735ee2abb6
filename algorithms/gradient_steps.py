"""How one rollout's rows become gradient steps (``optim.*``).

Each epoch samples the rows without replacement from a TorchRL replay buffer in minibatches of
``optim.minibatch_size`` rows (each process takes its share of a global minibatch) or ``optim.minibatches`` equal
shares; one minibatch covering every row is not shuffled (the order is irrelevant to the step, and a multi-process
run then matches a single one). A minibatch's gradient (accumulated by ``accumulate``, see
:mod:`vgrpo_lib.algorithms.micro_batches`) is clipped to ``optim.max_grad_norm`` and applied. A step whose loss or gradient is
not finite is skipped (weights and optimizer untouched) and counted; ``optim.max_nonfinite_steps`` in a row abort
the run, as do non-finite weights or optimizer state after a step (:class:`~vgrpo_lib.algorithms.errors.DivergenceError`).
The EMA of the weights (when kept) follows every step taken. With ``optim.max_kl`` the remaining epochs are
skipped once an epoch's mean ``approx_kl_k3`` exceeds it (:func:`vgrpo_lib.control.exceeds_kl`, PPO's early stop).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement

from vgrpo_lib.algorithms.config import OptimConfig
from vgrpo_lib.algorithms.errors import DivergenceError
from vgrpo_lib.algorithms.policies import WeightEMA
from vgrpo_lib.integrations.distributed import all_finite, all_reduce_metrics, full_tensor
from vgrpo_lib.control import exceeds_kl

__all__ = ["global_means", "GradientSteps"]


def global_means(outputs: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The mean over steps of each logged value, combined over processes (identical on every rank).

    Values may sit on two devices (a GPU policy's ``grad_norm`` beside losses computed on the trainer's CPU
    batches): all are gathered on the first value's device, the losses' (the ``.tolist()`` syncs anyway)."""
    keys = list(outputs[0])
    device = outputs[0][keys[0]].device
    steps = torch.stack([torch.stack([o[key].float().to(device) for key in keys]) for o in outputs])  # [steps, keys]
    return dict(zip(keys, all_reduce_metrics(steps, keys).mean(0).tolist()))


class GradientSteps:
    """``steps(rows, generator, counters, iteration) -> metrics``: the gradient steps of one iteration.

    Args:
        optim: the run's ``optim`` section.
        optimizer: over the trained parameters.
        accumulate: ``accumulate(minibatch) -> losses``: backpropagates a minibatch's loss, returns its values.
        world_size: processes sharing each global minibatch.
        ema: the EMA of the weights, updated after each step taken (None: off).

    ``counters`` (``grad_steps``, ``skipped_steps``, ``nonfinite_in_a_row``) are updated in place; the metrics are
    the means over the steps of the losses, diagnostics and ``grad_norm``, combined over processes.
    """

    def __init__(self, optim: OptimConfig, optimizer: torch.optim.Optimizer,
                 accumulate: Callable[[TensorDictBase], dict[str, torch.Tensor]], world_size: int = 1,
                 ema: WeightEMA | None = None):
        self.optim, self.optimizer, self.accumulate, self.world_size, self.ema = optim, optimizer, accumulate, world_size, ema

    def __call__(self, rows: TensorDictBase, generator: torch.Generator, counters: dict, iteration: int) -> dict[str, float]:
        optim = self.optim
        if optim.minibatch_size is not None:
            minibatch = optim.minibatch_size // self.world_size
        else:
            minibatch = -(-rows.shape[0] // (optim.minibatches or 1))
        buffer = ReplayBuffer(
            storage=LazyTensorStorage(rows.shape[0]),
            sampler=SamplerWithoutReplacement(drop_last=False, shuffle=minibatch < rows.shape[0]),
            batch_size=minibatch,
        )
        buffer.set_rng(generator)
        buffer.extend(rows)
        outputs, epochs = [], 0
        while epochs < optim.epochs:
            epoch = [self._step(minibatch, counters, iteration) for minibatch in buffer]
            outputs, epochs = outputs + epoch, epochs + 1
            stop = optim.max_kl is not None and epochs < optim.epochs  # (checked only when epochs remain)
            if stop and exceeds_kl(global_means(epoch)["approx_kl_k3"], optim.max_kl):
                break
        return global_means(outputs) | ({} if optim.max_kl is None else {"epochs_run": epochs})

    def _step(self, minibatch: TensorDictBase, counters: dict, iteration: int) -> dict[str, torch.Tensor]:
        """One gradient step on ``minibatch`` (skipped when its loss or gradient is not finite)."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.optimizer.zero_grad(set_to_none=True)
        losses = self.accumulate(minibatch)
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(params, self.optim.max_grad_norm))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            self._check_finite_state(counters["grad_steps"] + 1, iteration)
            counters["grad_steps"] += 1
            counters["nonfinite_in_a_row"] = 0
            if self.ema is not None:
                self.ema.update(counters["grad_steps"])
        else:
            self.optimizer.zero_grad(set_to_none=True)
            counters["skipped_steps"] += 1
            counters["nonfinite_in_a_row"] += 1
            if counters["nonfinite_in_a_row"] >= self.optim.max_nonfinite_steps:
                raise DivergenceError(
                    f"The policy diverged: {counters['nonfinite_in_a_row']} gradient steps in a row had a "
                    f"non-finite loss or gradient (iteration {iteration}); lower optim.lr or check the reward."
                )
        return {k: v.detach() for k, v in losses.items()} | {"grad_norm": grad_norm.detach()}

    def _check_finite_state(self, step: int, iteration: int) -> None:
        """Raise :class:`DivergenceError` unless the weights and the optimizer state are finite (after a step)."""
        state = [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
        tensors = [p for group in self.optimizer.param_groups for p in group["params"]] + state
        if not all_finite(tensors):
            raise DivergenceError(
                f"The policy diverged: its weights or optimizer state are not finite after gradient step "
                f"{step} (iteration {iteration}, optim.lr={self.optim.lr:g}); nothing of this state was saved. "
                f"Lower optim.lr."
            )
