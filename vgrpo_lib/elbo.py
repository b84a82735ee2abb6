"""The ELBO surrogate of a whole sample's log-likelihood (V-GRPO, Tang et al. 2026, method.md).

    log pi_theta(o | c)  ~  s_theta(o, c) = -(1/K) sum_j l_theta(o, c; t_j, eps_j)
    l_theta(o, c; t, eps) = weighting of || NN_theta(z_t, t, c) - target ||^2,   z_t = a_t o + b_t eps

:class:`ELBOSurrogate` owns the Monte-Carlo design: how many timestep-noise pairs (``num_pairs`` = the paper's
N_MC = K), how the timesteps are drawn (``timesteps``), who shares a set of pairs (``sharing``) and how the
squared error is weighted (``weighting``). The same pairs must be used for the current and the behaviour
policy (common random numbers): draw them once with :meth:`sample_pairs`, store them with the rollout and
pass them to every evaluation.

``noise="antithetic"`` (this library's own option, beyond the paper) draws the K noises as K/2 antithetic
couples ``(eps, -eps)`` at a shared timestep, see :class:`ELBOSurrogate`.

All K pairs of all B samples go through the model as ONE batch of ``B * K`` rows (split into chunks of at
most ``chunk_size`` rows when memory asks for it), never a Python loop over pairs or samples: row ``b * K + k`` is
sample ``b`` at pair ``k`` and ``cond`` is repeated K times per sample (the model contract:
:class:`vgrpo_lib.protocols.VelocityModel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from vgrpo_lib._checks import (
    check_batch,
    check_key,
    check_model_dtype,
    check_not_empty,
    check_positive_int,
    check_same_device,
    check_tensor,
    choose,
)
from vgrpo_lib.advantages import make_groups
from vgrpo_lib.paths import Path, make_path
from vgrpo_lib.protocols import Condition, VelocityModel
from vgrpo_lib.timesteps import TimestepSampler, make_timestep_sampler
from vgrpo_lib.weighting import make_weighting

__all__ = ["SHARING_SCOPES", "NOISE_SCHEMES", "NoisedPairs", "repeat_rows", "ELBOSurrogate"]

SHARING_SCOPES = ("none", "group", "batch")
NOISE_SCHEMES = ("independent", "antithetic")



class NoisedPairs(NamedTuple):
    """The B*K model inputs of a batch of samples and their pairs, with the pieces the losses need.

    ``sample``, ``noise`` and ``z`` are ``(B, K, *D)``; ``t`` is ``(B, K)``; ``cond`` is repeated to ``B*K`` rows;
    ``weight`` ``(B, K)`` holds the pairs' importance weights (``None``: all 1).
    """

    sample: torch.Tensor
    noise: torch.Tensor
    z: torch.Tensor
    t: torch.Tensor
    cond: object
    weight: torch.Tensor | None = None


def repeat_rows(cond: Condition, repeats: int) -> Condition:
    """Repeat each row of a Tensor / TensorDict condition ``repeats`` times (``None`` passes through)."""
    if cond is None:
        return None
    return cond.repeat_interleave(repeats, dim=0)


def _group_index(group: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense ids ``0..n-1`` for arbitrary integer group labels, and ``n``."""
    groups = make_groups(group)
    return groups.index, groups.num_groups


def _check_sample(sample) -> None:
    check_tensor("sample", sample)
    if not sample.is_floating_point():
        raise ValueError(f"sample must be a floating-point tensor, got dtype {sample.dtype}.")
    check_not_empty("sample", sample)


class ELBOSurrogate:
    """Monte-Carlo ELBO surrogate ``s_theta(o, c)`` of ``log pi_theta(o | c)`` over K timestep-noise pairs.

    Args:
        num_pairs: K, pairs per sample (paper default 4; 2 converged poorly, 8 gave marginal gains).
        timesteps: a name from :data:`vgrpo_lib.timesteps.TIMESTEP_SAMPLERS` (``"stratified"``: one uniform
            draw in each of K equal strata of [0, 1], the paper's choice; the paper does not pin down whether it
            stratifies the continuous range or the sampler's shifted grid, so the continuous range is the
            default and a :class:`~vgrpo_lib.timesteps.DiscreteGrid` can be passed instead) or a sampler.
        sharing: ``"group"`` (one set of pairs per prompt group, shared by its G members: the paper),
            ``"batch"`` (one set for the whole batch, as the official code does across the global minibatch) or
            ``"none"`` (independent pairs per sample, the naive estimator).
        weighting: ``"adaptive_x"`` (default), ``"x"``, ``"v"``, ``"eps"``, ``"elbo"`` or a callable, see
            :mod:`vgrpo_lib.weighting`.
        path: the forward process (``"rectified_flow"`` default).
        chunk_size: largest number of model rows per forward (``None``: all ``B * K`` at once).
        noise: ``"independent"`` (K i.i.d. standard normal noises, the paper) or ``"antithetic"`` (ours): K/2
            i.i.d. noises, each used twice, as ``eps`` and as ``-eps``, at one shared timestep; the K/2 timesteps
            come from ``timesteps`` with K/2 pairs (so ``"stratified"`` gives K/2 strata, each holding one
            couple) and every pair keeps the sampler's importance weight. Pairs ``2j`` and ``2j + 1`` are the
            couple. Each noise is still standard normal, so the surrogate's expectation is unchanged (unbiased),
            and the couple's mean ``(l(t, eps) + l(t, -eps)) / 2`` is the even part of the per-pair loss in
            ``eps``: its odd part cancels exactly. At a fixed t the K-pair variance goes from
            ``(V_even + V_odd) / K`` to ``2 V_even / K``, a gain when the odd part carries more variance than the
            even part. That is the case the group-shared gradient sees: for a velocity error linear in ``eps``
            with the same slope for the members of a group (a model locally linear in z), ``||M_t eps +
            c_t(o)||^2``, the even term ``eps^T M_t^T M_t eps`` is common to the group and cancels against the
            zero-sum advantages, and what is left, ``2 c_t(o)^T M_t eps``, is odd. The price is K/2 instead of K
            distinct timesteps. Needs an even ``num_pairs``; the estimator lab (``vgrpo estimators``) measures
            the gain at equal NFE.

    Example:
        >>> est = ELBOSurrogate(num_pairs=4)
        >>> pairs = est.sample_pairs(samples, group=group_ids, generator=g)   # TensorDict (B, K)
        >>> with torch.no_grad():
        ...     old = est(old_model, samples, cond, pairs)                   # (B,)
        >>> log_ratio = est(model, samples, cond, pairs) - old
    """

    def __init__(
        self,
        num_pairs: int = 4,
        timesteps: str | TimestepSampler = "stratified",
        sharing: str = "group",
        weighting: str | Callable[..., torch.Tensor] = "adaptive_x",
        path: str | Path = "rectified_flow",
        chunk_size: int | None = None,
        noise: str = "independent",
    ):
        self.num_pairs = check_positive_int("num_pairs", num_pairs)
        self.timesteps = make_timestep_sampler(timesteps)
        self.sharing = choose("sharing", sharing, SHARING_SCOPES)
        self.weighting = make_weighting(weighting)
        self.path = make_path(path)
        self.chunk_size = None if chunk_size is None else check_positive_int("chunk_size", chunk_size)
        self.noise = choose("noise", noise, NOISE_SCHEMES)
        if self.noise == "antithetic" and self.num_pairs % 2:
            raise ValueError(
                f'noise="antithetic" draws the pairs as couples (eps, -eps), so num_pairs must be even, '
                f"got {num_pairs}."
            )

    def __repr__(self):
        weighting = getattr(self.weighting, "__name__", repr(self.weighting))
        return (
            f"ELBOSurrogate(num_pairs={self.num_pairs}, timesteps={self.timesteps!r}, sharing={self.sharing!r}, "
            f"weighting={weighting}, path={self.path.name!r}, chunk_size={self.chunk_size}, "
            f"noise={self.noise!r})"
        )

    def sample_pairs(
        self,
        sample: torch.Tensor,
        group: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> TensorDict:
        """Draw K timestep-noise pairs for each of the B samples.

        Args:
            sample: ``(B, *D)`` clean samples (only the shape, dtype and device are used).
            group: ``(B,)`` integer prompt-group ids; required for ``sharing="group"``.
            generator: makes the draw deterministic (it must live on ``sample``'s device).

        Returns:
            TensorDict with batch size ``(B, K)``: ``"t"`` ``(B, K)`` and ``"noise"`` ``(B, K, *D)``. Under
            ``"group"`` sharing the members of a group get identical pairs (an index of one draw per group),
            under ``"batch"`` every sample gets the same pairs. Under ``noise="antithetic"``
            ``noise[:, 2j + 1] = -noise[:, 2j]`` and ``t[:, 2j + 1] = t[:, 2j]``.
        """
        check_tensor("sample", sample)
        if sample.ndim < 2:
            raise ValueError(f"sample must be (B, *D) with at least one data dimension, got {tuple(sample.shape)}.")
        _check_sample(sample)
        batch, data_shape, k = sample.shape[0], sample.shape[1:], self.num_pairs
        if self.sharing == "group":
            if group is None:
                raise ValueError('sharing="group" needs the group ids of the samples: sample_pairs(sample, group=...).')
            check_tensor("group", group)
            check_batch("group", group, batch, ndim=1)
            check_same_device("group", group, "sample", sample)
            index, num_sets = _group_index(group)
        elif self.sharing == "batch":
            index, num_sets = torch.zeros(batch, dtype=torch.long, device=sample.device), 1
        else:
            index, num_sets = None, batch
        options = dict(generator=generator, device=sample.device, dtype=sample.dtype)
        antithetic = self.noise == "antithetic"
        draws = k // 2 if antithetic else k
        t = self.timesteps(num_sets, draws, **options)
        noise = torch.randn((num_sets, draws, *data_shape), **options)
        if antithetic:
            t = t.repeat_interleave(2, dim=1)
            noise = torch.stack([noise, -noise], dim=2).flatten(1, 2)
        if index is not None:
            t, noise = t[index], noise[index]
        pairs = TensorDict({"t": t, "noise": noise}, batch_size=[batch, k], device=sample.device)
        importance_weight = getattr(self.timesteps, "importance_weight", None)
        if importance_weight is not None:
            pairs["weight"] = importance_weight(t)
        return pairs

    def noised(self, sample: torch.Tensor, cond, pairs: TensorDictBase) -> NoisedPairs:
        """Build the ``B * K`` model inputs ``z_t = a_t x + b_t eps`` of a batch and its pairs."""
        _check_sample(sample)
        if not is_tensor_collection(pairs):
            raise TypeError(f"pairs must be the TensorDict from ELBOSurrogate.sample_pairs, got {type(pairs).__name__}.")
        for key in ("t", "noise"):
            check_key(pairs, key, "the timestep-noise pairs from ELBOSurrogate.sample_pairs")
        t, noise = pairs["t"], pairs["noise"]
        check_same_device("pairs['t']", t, "sample", sample)
        check_same_device("pairs['noise']", noise, "sample", sample)
        batch = sample.shape[0]
        if t.ndim != 2 or t.shape[0] != batch:
            raise ValueError(f"pairs['t'] must be (B, K) with B={batch}, got {tuple(t.shape)}.")
        if t.shape[1] != self.num_pairs:
            raise ValueError(
                f"pairs hold K={t.shape[1]} pairs per sample but this estimator's num_pairs is {self.num_pairs}; "
                f"draw them with its sample_pairs (or build the estimator with num_pairs={t.shape[1]})."
            )
        if noise.shape != (batch, t.shape[1], *sample.shape[1:]):
            raise ValueError(
                f"pairs['noise'] must be (B, K, *D) = {(batch, t.shape[1], *sample.shape[1:])}, got {tuple(noise.shape)}."
            )
        if cond is not None and cond.shape[0] != batch:
            raise ValueError(f"cond must have batch size {batch}, got {tuple(cond.shape)}.")
        x = sample.unsqueeze(1).expand_as(noise)
        z = self.path.add_noise(x, noise, t)
        return NoisedPairs(x, noise, z, t, repeat_rows(cond, t.shape[1]), pairs.get("weight", None))

    def predict(self, model: VelocityModel, inputs: NoisedPairs) -> torch.Tensor:
        """The model's velocity at every pair, ``(B, K, *D)``, in one batched forward (or ``chunk_size`` chunks)."""
        z_rows, t_rows = inputs.z.flatten(0, 1), inputs.t.flatten()
        check_model_dtype(model, "the sample", z_rows)
        rows = t_rows.shape[0]
        if self.chunk_size is None or self.chunk_size >= rows:
            v = model(z_rows, t_rows, inputs.cond)
        else:
            chunks = []
            for start in range(0, rows, self.chunk_size):
                stop = start + self.chunk_size
                cond = None if inputs.cond is None else inputs.cond[start:stop]
                chunks.append(model(z_rows[start:stop], t_rows[start:stop], cond))
            v = torch.cat(chunks)
        if v.shape != z_rows.shape:
            raise ValueError(f"The model returned shape {tuple(v.shape)} for inputs of shape {tuple(z_rows.shape)}.")
        return v.view_as(inputs.z)

    def pair_loss(self, v: torch.Tensor, inputs: NoisedPairs) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted denoising loss ``(B, K)`` of velocities ``v`` at ``inputs`` (times the pairs' importance
        weights, if any), and the data prediction."""
        x_pred = self.path.x_from_v(inputs.z, v, inputs.t)
        loss = self.weighting(v, inputs.sample, inputs.noise, inputs.z, inputs.t, self.path, x_pred)
        return (loss if inputs.weight is None else loss * inputs.weight), x_pred

    def evaluate(self, model: VelocityModel, sample: torch.Tensor, cond, pairs: TensorDictBase) -> TensorDict:
        """Per-pair surrogate and data predictions: TensorDict ``(B, K)`` with ``"log_prob"`` = minus the
        weighted loss and ``"x_pred"`` ``(B, K, *D)`` (what the x-space KL to the behaviour policy compares)."""
        inputs = self.noised(sample, cond, pairs)
        loss, x_pred = self.pair_loss(self.predict(model, inputs), inputs)
        return TensorDict({"log_prob": -loss, "x_pred": x_pred}, batch_size=inputs.t.shape)

    def per_pair(self, model: VelocityModel, sample: torch.Tensor, cond, pairs: TensorDictBase) -> torch.Tensor:
        """``-l_theta(o, c; t_j, eps_j)`` for every sample and pair: ``(B, K)``."""
        return self.evaluate(model, sample, cond, pairs)["log_prob"]

    def __call__(self, model: VelocityModel, sample: torch.Tensor, cond, pairs: TensorDictBase) -> torch.Tensor:
        """The surrogate log-likelihood ``s_theta(o, c)``: minus the weighted loss averaged over pairs, ``(B,)``."""
        return self.per_pair(model, sample, cond, pairs).mean(dim=1)
