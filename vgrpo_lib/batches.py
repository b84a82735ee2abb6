"""Rollout-to-batch helpers: each loss's training batch from its sampler's output in one call.

The losses read TensorDict batches with fixed keys (remappable with ``set_keys``); these helpers build them from
what the samplers return, so that a training loop of your own needs no renaming or broadcasting by hand:

- :func:`flow_grpo_batch`: :func:`~vgrpo_lib.samplers.sample_sde`'s ``(B, S)`` transition records ->
  :class:`~vgrpo_lib.losses.FlowGRPOLoss`'s ``(B, S)`` batch (``log_prob`` renamed ``old_log_prob``, the
  per-sample ``advantage`` ``(B,)`` and ``cond`` ``(B, ...)`` broadcast over the S steps);
- :func:`vgrpo_batch`: ODE samples ``(B, *D)`` -> :class:`~vgrpo_lib.losses.VGRPOLoss`'s ``(B,)`` batch (the
  timestep-noise ``pairs`` ``(B, K)`` and the behaviour policy's surrogate ``old_log_prob`` ``(B,)`` on them);
- :class:`OldPolicy`: DiffusionNFT's old policy, a frozen copy of the trained model that trails it by soft updates
  ``theta_old <- d theta_old + (1 - d) theta`` with ``d`` from :class:`~vgrpo_lib.control.OldPolicyDecay` of the
  gradient steps taken (:class:`~vgrpo_lib.losses.DiffusionNFTLoss`'s batch is ``sample``, ``cond``,
  ``advantage`` and fresh ``pairs`` each step: :meth:`~vgrpo_lib.elbo.ELBOSurrogate.sample_pairs`).

Example (Flow-GRPO in your own loop):
    >>> final, records = sample_sde(model, noise, time_grid(10), cond, generator=g)    # records: (B, S)
    >>> advantage = GroupAdvantage()(reward_fn(final), group)                           # (B,)
    >>> loss = FlowGRPOLoss(model)(flow_grpo_batch(records, advantage, cond).reshape(-1))
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from vgrpo_lib._checks import check_tensor
from vgrpo_lib.control import ema_update_
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.protocols import Condition, VelocityModel

__all__ = ["OldPolicy", "expand_steps", "flow_grpo_batch", "old_surrogate", "vgrpo_batch"]


def expand_steps(value: torch.Tensor | TensorDictBase, num_steps: int) -> torch.Tensor | TensorDictBase:
    """Repeat each row ``num_steps`` times along a new second dimension: ``(B, ...) -> (B, num_steps, ...)`` (a view;
    a Tensor or a TensorDict)."""
    if isinstance(value, TensorDictBase):
        return value.unsqueeze(1).expand(value.shape[0], num_steps)
    return value.unsqueeze(1).expand(value.shape[0], num_steps, *value.shape[1:])


def _check_rows(name: str, value, rows: int) -> None:
    shape = tuple(value.shape) if hasattr(value, "shape") else None
    if shape is None or len(shape) == 0 or shape[0] != rows:
        raise ValueError(f"{name} must have one row per sample ({rows}), got shape {shape}.")


def flow_grpo_batch(
    trajectory: TensorDictBase, advantage: torch.Tensor, cond: Condition = None, *, num_steps: int | None = None
) -> TensorDict:
    """Flow-GRPO's training batch from :func:`~vgrpo_lib.samplers.sample_sde`'s records.

    Args:
        trajectory: the records ``(B, S)``: ``"z"``, ``"z_next"`` ``(B, S, *D)``, ``"t"``, ``"t_next"`` ``(B, S)``,
            ``"log_prob"`` ``(B, S)`` (the behaviour policy's log-density of each transition) and, with
            ``record_mean=True``, ``"mean"`` ``(B, S, *D)``.
        advantage: ``(B,)``, one per sample (every transition of a sample carries its sample's advantage).
        cond: the samples' conditioning, a Tensor or TensorDict with batch size B, or None (unconditional model:
            build the loss with ``unconditional=True``).
        num_steps: train only the first ``num_steps`` recorded transitions (Flow-GRPO's ``timestep_fraction``);
            None: all S.

    Returns:
        A TensorDict ``(B, S')`` with ``"z"``, ``"z_next"``, ``"t"``, ``"t_next"``, ``"old_log_prob"`` (renamed from
        ``"log_prob"``), ``"old_mean"`` (from ``"mean"``, when recorded), ``"advantage"`` ``(B, S')`` and ``"cond"``
        ``(B, S', ...)`` (broadcast views). :class:`~vgrpo_lib.losses.FlowGRPOLoss` takes it as it is or flattened
        (``.reshape(-1)``: one row per transition, for minibatches).
    """
    if not isinstance(trajectory, TensorDictBase) or trajectory.batch_dims != 2:
        shape = f" with batch size {tuple(trajectory.shape)}" if isinstance(trajectory, TensorDictBase) else ""
        raise ValueError(f"trajectory must be sample_sde's (B, S) TensorDict of records, got "
                         f"{type(trajectory).__name__}{shape}.")
    if "log_prob" not in trajectory.keys():
        raise KeyError(f"trajectory has no entry 'log_prob' (sample_sde's records); present: "
                       f"{sorted(trajectory.keys())}.")
    check_tensor("advantage", advantage)
    batch = trajectory.shape[0]
    if tuple(advantage.shape) != (batch,):
        raise ValueError(f"advantage must be (B,) = ({batch},), one per sample, got {tuple(advantage.shape)}.")
    if cond is not None:
        _check_rows("cond", cond, batch)
    if num_steps is not None:
        trajectory = trajectory[:, :num_steps]
    steps = trajectory.shape[1]
    rows = trajectory.exclude("log_prob", "mean")
    rows["old_log_prob"] = trajectory["log_prob"]
    if "mean" in trajectory.keys():
        rows["old_mean"] = trajectory["mean"]
    rows["advantage"] = expand_steps(advantage, steps)
    if cond is not None:
        rows["cond"] = expand_steps(cond, steps)
    return rows


def vgrpo_batch(
    estimator: ELBOSurrogate,
    sample: torch.Tensor,
    cond: Condition,
    advantage: torch.Tensor,
    *,
    group: torch.Tensor | None = None,
    behaviour: VelocityModel | None = None,
    pairs: TensorDictBase | None = None,
    generator: torch.Generator | None = None,
    keep_x_pred: bool = False,
) -> TensorDict:
    """V-GRPO's training batch from ODE samples: pairs and the behaviour policy's surrogates on them.

    Args:
        estimator: the :class:`~vgrpo_lib.elbo.ELBOSurrogate` that the loss uses.
        sample: ``(B, *D)`` final samples of the rollout (any ODE solver).
        cond: their conditioning (Tensor or TensorDict with batch size B), or None (unconditional model: build the
            loss with ``unconditional=True``).
        advantage: ``(B,)``, e.g. :class:`~vgrpo_lib.advantages.GroupAdvantage` of the rewards.
        group: ``(B,)`` prompt-group ids; the estimator's ``sharing="group"`` gives a group's members the same pairs.
        behaviour: the policy that generated the samples (the model before this rollout's gradient steps): its
            surrogate on the pairs, computed without gradient, is ``"old_log_prob"``. None: leave it out (one
            gradient step per rollout: build the loss with ``on_policy=True``, where the ratio is exactly 1).
        pairs: ``(B, K)`` pairs to use (None: drawn here with ``estimator.sample_pairs(sample, group, generator)``).
        generator: for drawing the pairs.
        keep_x_pred: also store the behaviour policy's x-predictions ``"old_x_pred"`` ``(B, K, *D)`` (what
            ``VGRPOLoss(behaviour_kl_coef=...)`` reads).

    Returns:
        A TensorDict ``(B,)`` with ``"sample"``, ``"cond"`` (when given), ``"group"`` (when given), ``"advantage"``,
        ``"pairs"`` ``(B, K)`` and, with ``behaviour``, ``"old_log_prob"`` ``(B,)`` (and ``"old_x_pred"``).
    """
    check_tensor("sample", sample)
    check_tensor("advantage", advantage)
    batch = sample.shape[0] if sample.ndim else 0
    if tuple(advantage.shape) != (batch,):
        raise ValueError(f"advantage must be (B,) = ({batch},), one per sample, got {tuple(advantage.shape)}.")
    if keep_x_pred and behaviour is None:
        raise ValueError("keep_x_pred=True stores the behaviour policy's x-predictions: pass behaviour=.")
    if pairs is None:
        pairs = estimator.sample_pairs(sample, group, generator)
    entries = {"sample": sample, "advantage": advantage, "pairs": pairs}
    if cond is not None:
        _check_rows("cond", cond, batch)
        entries["cond"] = cond
    if group is not None:
        _check_rows("group", group, batch)
        entries["group"] = group
    entries |= old_surrogate(estimator, behaviour, sample, cond, pairs, keep_x_pred) if behaviour is not None else {}
    return TensorDict(entries, batch_size=[batch])


@torch.no_grad()
def old_surrogate(
    estimator: ELBOSurrogate, behaviour: VelocityModel, sample: torch.Tensor, cond: Condition, pairs: TensorDictBase,
    keep_x_pred: bool = False, keep_per_pair: bool = False,
) -> dict[str, torch.Tensor]:
    """The behaviour policy's entries of a V-GRPO batch, without gradient: ``"old_log_prob"`` ``(B,)`` (its
    surrogate, the mean over the K pairs), with ``keep_x_pred`` ``"old_x_pred"`` ``(B, K, *D)`` and with
    ``keep_per_pair`` its per-pair terms ``"old_pair_log_prob"`` ``(B, K)`` (what
    :func:`vgrpo_lib.diagnostics.pair_noise` measures the noise from)."""
    old = estimator.evaluate(behaviour, sample, cond, pairs)
    return ({"old_log_prob": old["log_prob"].mean(dim=1)} | ({"old_x_pred": old["x_pred"]} if keep_x_pred else {})
            | ({"old_pair_log_prob": old["log_prob"]} if keep_per_pair else {}))


class OldPolicy:
    """DiffusionNFT's old policy: a frozen deep copy of ``model`` that trails it by soft updates.

        theta_old <- d theta_old + (1 - d) theta

    Call it like the model (it is the rollout policy and the loss's ``old_model``) and :meth:`update_` once per
    iteration, after the gradient steps, with ``d`` from a ``step -> d`` schedule of the gradient steps taken so far
    (DiffusionNFT's :class:`~vgrpo_lib.control.OldPolicyDecay`, official type 1: ``min(0.001 step, 0.5)``; ``d = 0``:
    a hard copy). The trainer's DiffusionNFT and AWM hold theirs as this class too
    (:class:`vgrpo_lib.algorithms.policies.CopiedBehaviour`, which adds sharding and checkpoints).

    Example:
        >>> old, decay = OldPolicy(model), OldPolicyDecay()
        >>> loss_module = DiffusionNFTLoss(model, old, estimator)
        >>> ...  # rollout with old, gradient steps on model
        >>> old.update_(decay(grad_steps))
    """

    def __init__(self, model: nn.Module):
        if not isinstance(model, nn.Module):
            raise TypeError(f"OldPolicy copies an nn.Module, got {type(model).__name__}.")
        self.source = model
        self.model = copy.deepcopy(model).requires_grad_(False)

    def __call__(self, x_t: torch.Tensor, t: torch.Tensor, cond=None) -> torch.Tensor:
        return self.model(x_t, t, cond)

    def update_(self, decay: float) -> None:
        """``theta_old <- decay * theta_old + (1 - decay) * theta``, parameter by parameter."""
        ema_update_(self._parameters(self.model), self._parameters(self.source), decay)

    @staticmethod
    def _parameters(model: nn.Module):
        """The parameters the soft update pairs up (a subclass under FSDP2 pairs its local shards)."""
        return model.parameters()
