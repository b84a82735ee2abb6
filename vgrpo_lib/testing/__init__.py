"""Test helpers for your own models and estimators (and the project's own tests).

- Tiny velocity models that follow the protocol ``model(x_t, t, cond) -> v``: :class:`MLPVelocity` (any data
  shape, optional ``(B, C)`` condition, deterministic init from a seed) and :class:`ToyVelocity` (2-D points, or
  ``dim``-D, with time features: the flow-matching toy of the tutorials and the ground-truth check).
- :func:`perturb`: a nearby copy of a model (a stand-in for the policy after a few gradient steps).
- A 2-D flow-matching toy (the tutorials' model): :func:`ring_data` (a mixture of 8 Gaussians on a circle),
  :func:`pretrain_flow_matching` (minus the v-weighted ELBO surrogate, the flow-matching loss),
  :func:`pretrained_ring_model` (a :class:`ToyVelocity` pretrained on the ring in seconds) and
  :func:`target_reward` (a reward that prefers one of the ring's modes).
- :func:`make_loss_batches`: complete batches for :class:`~vgrpo_lib.losses.VGRPOLoss`,
  :class:`~vgrpo_lib.losses.FlowGRPOLoss` and :class:`~vgrpo_lib.losses.DiffusionNFTLoss` on a tiny model.
- :mod:`vgrpo_lib.testing.strategies`: hypothesis strategies for groups, rewards, sample batches and estimator
  configurations (needs the ``test`` extra: ``pip install 'vgrpo-lib[test]'``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from tensordict import TensorDict
from torch import nn

from vgrpo_lib.batches import flow_grpo_batch, vgrpo_batch
from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.samplers import sample_sde, time_grid

__all__ = [
    "LossBatches",
    "MLPVelocity",
    "ToyVelocity",
    "make_loss_batches",
    "perturb",
    "pretrain_flow_matching",
    "pretrained_ring_model",
    "ring_data",
    "target_reward",
]


class MLPVelocity(nn.Module):
    """A small velocity model ``v = MLP([z, t, cond])`` following the protocol ``model(z, t, cond) -> v``.

    ``z`` may have any data shape ``(B, *data_shape)``; it is flattened for the MLP and the output reshaped back.
    ``t`` is ``(B,)``; ``cond`` is a ``(B, cond_dim)`` tensor (ignored, may be None, when ``cond_dim == 0``).
    The weights are drawn from ``N(0, 0.5^2)`` with ``seed`` (the same model for the same arguments); ``calls``
    counts the forwards (e.g. to check that K pairs cost one batched forward).
    """

    def __init__(self, data_shape: Sequence[int] = (4,), cond_dim: int = 0, hidden: int = 16, seed: int = 0,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.data_shape = tuple(data_shape)
        self.cond_dim = cond_dim
        dim = math.prod(self.data_shape)
        generator = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(dim + 1 + cond_dim, hidden), nn.Tanh(), nn.Linear(hidden, dim))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        self.to(dtype)
        self.calls = 0

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond: torch.Tensor | None = None) -> torch.Tensor:
        """``v`` with the shape of ``z`` ``(B, *data_shape)``; counts the call."""
        self.calls += 1
        parts = [z.flatten(1), t[:, None].to(z.dtype)]
        if self.cond_dim:
            parts.append(cond)
        return self.net(torch.cat(parts, 1)).view_as(z)


class ToyVelocity(nn.Module):
    """``v(z, t)`` for ``dim``-D points ``(B, dim)``: an MLP on ``(z, sin/cos features of pi t and 2 pi t)``;
    ``cond`` is ignored (an unconditional model: build the losses with ``unconditional=True``). Initialised by
    torch's global generator (seed it with ``torch.manual_seed``)."""

    def __init__(self, width: int = 128, dim: int = 2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 4, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(),
                                 nn.Linear(width, dim))

    def forward(self, z: torch.Tensor, t: torch.Tensor, cond=None) -> torch.Tensor:
        """``v`` ``(B, dim)`` at points ``z`` ``(B, dim)`` and times ``t`` ``(B,)``; ``cond`` is ignored."""
        angles = math.pi * t[:, None] * torch.tensor([1.0, 2.0], dtype=z.dtype)
        return self.net(torch.cat([z, angles.sin(), angles.cos()], dim=1))


def perturb(model: nn.Module, scale: float = 0.05, seed: int = 1) -> nn.Module:
    """A deep copy of ``model`` with every parameter shifted by ``scale * N(0, 1)`` (drawn with ``seed``)."""
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return other


def ring_data(n: int, generator: torch.Generator, right_weight: float = 1.0, dim: int = 2) -> torch.Tensor:
    """``n`` points ``(n, dim)`` from 8 Gaussians (std 0.25) on a circle of radius 2 in the first two coordinates,
    N(0, 0.25^2) in the others; ``right_weight`` up-weights the centres with x > 0."""
    angles = torch.arange(8) * (2 * math.pi / 8)
    centres = torch.stack([2 * angles.cos(), 2 * angles.sin()], 1)
    weights = torch.where(centres[:, 0] > 0.1, right_weight, 1.0)
    index = torch.multinomial(weights / weights.sum(), n, replacement=True, generator=generator)
    centres = torch.cat([centres[index], torch.zeros(n, dim - 2)], 1)
    return centres + 0.25 * torch.randn(n, dim, generator=generator)


def pretrain_flow_matching(model: nn.Module, data: Callable[[torch.Generator], torch.Tensor], steps: int,
                           generator: torch.Generator, lr: float = 2e-3) -> nn.Module:
    """Flow-matching pretraining of an unconditional ``model`` for ``steps`` Adam steps; ``data(generator)`` draws
    one batch ``(N, *D)`` of training points. The loss is minus the v-weighted, single-pair ELBO surrogate (the
    rectified-flow regression of ``v`` onto ``noise - x``). Returns ``model``, trained in place."""
    estimator = ELBOSurrogate(num_pairs=1, timesteps="uniform", sharing="none", weighting="v")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        x = data(generator)
        loss = -estimator(model, x, None, estimator.sample_pairs(x, generator=generator)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def pretrained_ring_model(steps: int = 400, width: int = 64, seed: int = 0, batch: int = 256) -> ToyVelocity:
    """A :class:`ToyVelocity` (2-D, ``width`` hidden units) pretrained by flow matching on :func:`ring_data` for
    ``steps`` Adam steps of ``batch`` points (lr 2e-3), all seeded by ``seed``: a base policy whose ODE samples
    spread over the 8 modes. About 2 s per 100 steps on one CPU core at the defaults."""
    torch.manual_seed(seed)
    model = ToyVelocity(width=width)
    return pretrain_flow_matching(model, lambda g: ring_data(batch, g), steps, torch.Generator().manual_seed(seed))


def target_reward(points: torch.Tensor, target: Sequence[float] = (2.0, 0.0), width: float = 1.0) -> torch.Tensor:
    """``exp(-||x - target||^2 / (2 width^2))`` for points ``(N, 2)``: 1 at ``target`` (by default the ring's mode at
    (2, 0)), about 0.31 at the neighbouring modes, near 0 elsewhere. Returns ``(N,)``."""
    target = torch.as_tensor(target, dtype=points.dtype)
    return torch.exp(-(points - target).square().sum(-1) / (2 * width**2))


class LossBatches(NamedTuple):
    """What :func:`make_loss_batches` returns: a model, an estimator and one complete batch per loss."""

    model: MLPVelocity
    estimator: ELBOSurrogate
    vgrpo: TensorDict
    flow_grpo: TensorDict
    nft: TensorDict


def make_loss_batches(generator: torch.Generator | None = None, data_shape: Sequence[int] = (3,)) -> LossBatches:
    """Complete batches of 4 samples ``(4, *data_shape)`` (default ``(4, 3)``; a video latent ``(C, F, H, W)`` works
    alike) with a ``(4, 2)`` zero condition on ``MLPVelocity(data_shape, cond_dim=2)`` and
    ``ELBOSurrogate(num_pairs=2, sharing="none")``: ``vgrpo`` ``(4,)`` (with ``old_log_prob`` and ``old_x_pred``,
    advantages 1), ``flow_grpo`` ``(4, 3)`` (3 SDE transitions, advantages 1) and ``nft`` ``(4,)``. Random draws use
    ``generator`` (None: torch's global generator); shapes with the same number of elements draw the same numbers."""
    data_shape = tuple(data_shape)
    model = MLPVelocity(data_shape=data_shape, cond_dim=2)
    estimator = ELBOSurrogate(num_pairs=2, sharing="none")
    sample = torch.randn(4, *data_shape, generator=generator)
    cond, advantage = torch.zeros(4, 2), torch.ones(4)
    vgrpo = vgrpo_batch(estimator, sample, cond, advantage, behaviour=model, generator=generator, keep_x_pred=True)
    with torch.no_grad():
        noise = torch.randn(4, *data_shape, generator=generator)
        _, records = sample_sde(model, noise, time_grid(3), cond, generator=generator)
    nft = vgrpo.exclude("old_log_prob", "old_x_pred")
    return LossBatches(model, estimator, vgrpo, flow_grpo_batch(records, advantage, cond), nft)
