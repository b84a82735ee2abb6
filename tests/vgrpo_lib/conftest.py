"""Shared small models for the vgrpo_lib tests (exposed as fixtures so that no test imports this file)."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from vgrpo_lib.elbo import ELBOSurrogate
from vgrpo_lib.samplers import sample_sde, time_grid


class MLPVelocity(nn.Module):
    """A small velocity model ``v = MLP([z, t, cond])`` following the protocol ``model(z, t, cond) -> v``.

    ``z`` may have any data shape; it is flattened for the MLP and the output reshaped back.
    ``cond`` is a ``[B, cond_dim]`` tensor (or None when ``cond_dim == 0``).
    """

    def __init__(self, data_shape=(4,), cond_dim: int = 0, hidden: int = 16, seed: int = 0, dtype=torch.float32):
        super().__init__()
        self.data_shape = tuple(data_shape)
        self.cond_dim = cond_dim
        dim = 1
        for d in self.data_shape:
            dim *= d
        generator = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(dim + 1 + cond_dim, hidden), nn.Tanh(), nn.Linear(hidden, dim))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        self.to(dtype)
        self.calls = 0

    def forward(self, z, t, cond=None):
        self.calls += 1
        parts = [z.flatten(1), t[:, None].to(z.dtype)]
        if self.cond_dim:
            parts.append(cond)
        return self.net(torch.cat(parts, 1)).view_as(z)


@pytest.fixture
def make_model():
    """Factory: ``make_model(data_shape=(4,), cond_dim=0, hidden=16, seed=0, dtype=torch.float32)``."""
    return MLPVelocity


@pytest.fixture
def perturb():
    """Return a deep copy of a model with every parameter shifted by ``scale * N(0, 1)`` (fixed seed)."""
    import copy

    def _perturb(model: nn.Module, scale: float = 0.05, seed: int = 1) -> nn.Module:
        other = copy.deepcopy(model)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(scale * torch.randn(p.shape, generator=generator, dtype=p.dtype))
        return other

    return _perturb


@pytest.fixture
def batches(make_model):
    """Complete batches for the three losses."""
    model = make_model(data_shape=(3,), cond_dim=2)
    est = ELBOSurrogate(num_pairs=2, sharing="none")
    sample = torch.randn(4, 3)
    pairs = est.sample_pairs(sample)
    with torch.no_grad():
        old = est.evaluate(model, sample, torch.zeros(4, 2), pairs)
    vgrpo = TensorDict(
        {
            "sample": sample,
            "cond": torch.zeros(4, 2),
            "advantage": torch.ones(4),
            "pairs": pairs,
            "old_log_prob": old["log_prob"].mean(1),
            "old_x_pred": old["x_pred"],
        },
        batch_size=[4],
    )
    with torch.no_grad():
        _, traj = sample_sde(model, torch.randn(4, 3), time_grid(3), torch.zeros(4, 2))
    traj["cond"] = torch.zeros(4, 3, 2)
    traj["advantage"] = torch.ones(4, 3)
    traj["old_log_prob"] = traj.pop("log_prob")
    nft = vgrpo.exclude("old_log_prob", "old_x_pred")
    return model, est, vgrpo, traj, nft
