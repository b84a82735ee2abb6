"""Ground truth for the ELBO surrogate: where the exact log-likelihood is computable.

On a 2-D rectified-flow model the exact ``log pi_theta(x)`` follows from the probability-flow ODE with the
exact divergence (instantaneous change of variables):

    log p_0(x) = log N(z_1; 0, I) + int_0^1 div_z v_theta(z_t, t) dt,     dz_t/dt = v_theta(z_t, t), z_0 = x

We pretrain a small velocity MLP on a ring of 8 Gaussians, take a nearby policy (a few more steps on a
re-weighted data set) and, on samples of the first, compare the exact log-ratio ``log pi' - log pi`` with each
estimator's surrogate log-ratio ``s' - s`` (common pairs). The figure of merit is the Spearman rank correlation
over samples and within groups: GRPO only needs the ELBO ratio to order samples like the true ratio.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from benchmarks.estimator_stats import spearman
from vgrpo_lib import ELBOSurrogate
from vgrpo_lib.samplers import sample_ode, time_grid


class ToyVelocity(nn.Module):
    """``v(z, t)`` for 2-D points: an MLP on ``(z, sin/cos features of t)``; ``cond`` is ignored."""

    def __init__(self, width: int = 128):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, width), nn.SiLU(), nn.Linear(width, width), nn.SiLU(), nn.Linear(width, 2))

    def forward(self, z, t, cond=None):
        angles = math.pi * t[:, None] * torch.tensor([1.0, 2.0], dtype=z.dtype)
        return self.net(torch.cat([z, angles.sin(), angles.cos()], dim=1))


def ring_data(n: int, generator: torch.Generator, right_weight: float = 1.0) -> torch.Tensor:
    """``n`` points from 8 Gaussians (std 0.25) on a circle of radius 2; ``right_weight`` up-weights x > 0."""
    angles = torch.arange(8) * (2 * math.pi / 8)
    centres = torch.stack([2 * angles.cos(), 2 * angles.sin()], 1)
    weights = torch.where(centres[:, 0] > 0.1, right_weight, 1.0)
    index = torch.multinomial(weights / weights.sum(), n, replacement=True, generator=generator)
    return centres[index] + 0.25 * torch.randn(n, 2, generator=generator)


def fit(model: nn.Module, steps: int, generator: torch.Generator, right_weight: float = 1.0, lr: float = 2e-3):
    """Flow-matching pretraining: the loss is minus the v-weighted, single-pair ELBO surrogate."""
    estimator = ELBOSurrogate(num_pairs=1, timesteps="uniform", sharing="none", weighting="v")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        x = ring_data(256, generator, right_weight)
        loss = -estimator(model, x, None, estimator.sample_pairs(x, generator=generator)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def exact_log_likelihood(model: nn.Module, x: torch.Tensor, steps: int = 100) -> torch.Tensor:
    """``log p_0(x)`` by RK4 on the joint ODE of ``(z_t, log-density)`` from ``t = 0`` to ``1``, exact divergence."""

    def field(z, t):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            v = model(z, torch.full((z.shape[0],), t, dtype=z.dtype), None)
            div = sum(torch.autograd.grad(v[:, i].sum(), z, retain_graph=i == 0)[0][:, i] for i in range(2))
        return v.detach(), div.detach()

    z, integral, h = x.clone(), torch.zeros(x.shape[0], dtype=x.dtype), 1.0 / steps
    for i in range(steps):
        t = i * h
        v1, d1 = field(z, t)
        v2, d2 = field(z + 0.5 * h * v1, t + 0.5 * h)
        v3, d3 = field(z + 0.5 * h * v2, t + 0.5 * h)
        v4, d4 = field(z + h * v3, t + h)
        z = z + h / 6 * (v1 + 2 * v2 + 2 * v3 + v4)
        integral = integral + h / 6 * (d1 + 2 * d2 + 2 * d3 + d4)
    return -0.5 * z.square().sum(1) - math.log(2 * math.pi) + integral


def ground_truth_check(estimators: dict[str, dict], *, samples: int = 256, group_size: int = 8, draws: int = 4,
                       seed: int = 0, pretrain_steps: int = 1500, finetune_steps: int = 60) -> dict:
    """Rank correlation of each estimator's log-ratio with the exact log-ratio (overall and within groups)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = fit(ToyVelocity(), pretrain_steps, generator).requires_grad_(False)
    nearby = fit(copy.deepcopy(policy).requires_grad_(True), finetune_steps, generator, right_weight=3.0, lr=5e-4)
    nearby.requires_grad_(False)
    with torch.no_grad():
        x = sample_ode(policy, torch.randn(samples, 2, generator=generator), None, time_grid(50), method="heun")
    exact = exact_log_likelihood(nearby, x) - exact_log_likelihood(policy, x)
    group = torch.arange(samples) // group_size
    results = {}
    for name, config in estimators.items():
        estimator = ELBOSurrogate(**config)
        overall, within = [], []
        with torch.no_grad():
            for _ in range(draws):
                pairs = estimator.sample_pairs(x, group, generator)
                ratio = estimator(nearby, x, None, pairs) - estimator(policy, x, None, pairs)
                overall.append(spearman(ratio, exact))
                within += [spearman(ratio[group == g], exact[group == g]) for g in torch.unique(group)]
        results[name] = {"spearman": sum(overall) / len(overall), "within_group_spearman": sum(within) / len(within)}
    return {"setup": {"samples": samples, "group_size": group_size, "draws": draws, "seed": seed,
                      "exact_log_ratio_std": exact.std().item()}, "estimators": results}
