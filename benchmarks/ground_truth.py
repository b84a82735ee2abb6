"""Ground truth for the ELBO surrogate: where the exact log-likelihood is computable.

On a low-dimensional rectified-flow model the exact ``log pi_theta(x)`` follows from the probability-flow ODE
with the exact divergence (instantaneous change of variables):

    log p_0(x) = log N(z_1; 0, I) + int_0^1 div_z v_theta(z_t, t) dt,     dz_t/dt = v_theta(z_t, t), z_0 = x

We pretrain a small velocity MLP on a ring of 8 Gaussians (in the first two of ``dim`` coordinates; the others
are Gaussian noise of the same width, so ``dim`` changes the dimension and nothing else), take a nearby policy
(a few more steps on a re-weighted data set) and, on samples of the first, compare the exact log-ratio
``log pi' - log pi`` with each estimator's surrogate log-ratio ``s' - s`` (common pairs). The figures of merit:
the Spearman rank correlation over samples and within groups (GRPO only needs the ELBO ratio to order samples
like the true ratio; within groups is what the group-relative advantage uses), and the Monte-Carlo variance of
the estimated log-ratio relative to its own size (``log_ratio_relative_variance``: variance over draws, averaged
over samples, divided by the square of the mean over samples of its absolute mean over draws; as in the
estimator lab, since the weightings' surrogates differ in scale from each other and from the exact log-ratio).

    python -m vgrpo_lib.benchmarks.ground_truth --seeds 0 1 2 --dims 2 16 --out results/ground-truth/ground_truth.json
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from torch import nn

from vgrpo_lib import ELBOSurrogate
from vgrpo_lib.benchmarks.estimator_designs import ESTIMATORS, without_pilot
from vgrpo_lib.diagnostics import spearman
from vgrpo_lib.samplers import sample_ode, time_grid
from vgrpo_lib.testing import ToyVelocity, pretrain_flow_matching, ring_data

__all__ = ["ToyVelocity", "exact_log_likelihood", "fit", "ground_truth_check", "ground_truth_study", "main",
           "ring_data"]


def fit(model: nn.Module, steps: int, generator: torch.Generator, right_weight: float = 1.0, lr: float = 2e-3,
        dim: int = 2):
    """Flow-matching pretraining on batches of 256 :func:`~vgrpo_lib.testing.ring_data` points (``right_weight``:
    see there)."""
    return pretrain_flow_matching(model, lambda g: ring_data(256, g, right_weight, dim), steps, generator, lr=lr)


def exact_log_likelihood(model: nn.Module, x: torch.Tensor, steps: int = 100) -> torch.Tensor:
    """``log p_0(x)`` by RK4 on the joint ODE of ``(z_t, log-density)`` from ``t = 0`` to ``1``, exact divergence."""

    def field(z, t):
        with torch.enable_grad():
            z = z.detach().requires_grad_(True)
            v = model(z, torch.full((z.shape[0],), t, dtype=z.dtype), None)
            dim = z.shape[1]
            div = sum(torch.autograd.grad(v[:, i].sum(), z, retain_graph=i < dim - 1)[0][:, i] for i in range(dim))
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
    return -0.5 * z.square().sum(1) - 0.5 * x.shape[1] * math.log(2 * math.pi) + integral


def ground_truth_check(estimators: dict[str, dict], *, samples: int = 256, group_size: int = 8, draws: int = 4,
                       seed: int = 0, pretrain_steps: int = 1500, finetune_steps: int = 60, dim: int = 2) -> dict:
    """Rank correlation of each estimator's log-ratio with the exact log-ratio (overall and within groups, mean over
    ``draws`` draws of pairs) and the log-ratio's Monte-Carlo variance, absolute and relative to the
    estimated log-ratio's size, on one seed's pair of toy policies."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = fit(ToyVelocity(dim=dim), pretrain_steps, generator, dim=dim).requires_grad_(False)
    nearby = fit(copy.deepcopy(policy).requires_grad_(True), finetune_steps, generator, right_weight=3.0, lr=5e-4,
                 dim=dim)
    nearby.requires_grad_(False)
    with torch.no_grad():
        x = sample_ode(policy, torch.randn(samples, dim, generator=generator), time_grid(50), method="heun")
    exact = exact_log_likelihood(nearby, x) - exact_log_likelihood(policy, x)
    group = torch.arange(samples) // group_size
    results = {}
    for name, config in estimators.items():
        estimator = ELBOSurrogate(**config)
        overall, within, ratios = [], [], []
        with torch.no_grad():
            for _ in range(draws):
                pairs = estimator.sample_pairs(x, group, generator)
                ratio = estimator(nearby, x, None, pairs) - estimator(policy, x, None, pairs)
                ratios.append(ratio)
                overall.append(spearman(ratio, exact))
                within += [spearman(ratio[group == g], exact[group == g]) for g in torch.unique(group)]
        ratios = torch.stack(ratios).double()
        variance, size = ratios.var(0).mean().item(), ratios.mean(0).abs().mean().item()
        results[name] = {"spearman": sum(overall) / len(overall), "within_group_spearman": sum(within) / len(within),
                         "log_ratio_variance": variance, "log_ratio_mean_abs": size,
                         "log_ratio_relative_variance": variance / size**2}
    return {"setup": {"samples": samples, "group_size": group_size, "draws": draws, "seed": seed, "dim": dim,
                      "exact_log_ratio_std": exact.std().item(),
                      "exact_log_ratio_mean_abs": exact.abs().mean().item()}, "estimators": results}


# The 0.95 quantile of Student's t by degrees of freedom (two-sided 90% intervals); the normal's beyond.
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833}


def _interval(values: list[float]) -> list[float]:
    """Student-t 90% interval of the mean of ``values`` (one per seed); a single value is its own interval."""
    n = len(values)
    if n < 2:
        return [values[0], values[0]]
    mean, sd = sum(values) / n, float(torch.tensor(values, dtype=torch.float64).std())
    half = T95.get(n - 1, 1.645) * sd / math.sqrt(n)
    return [mean - half, mean + half]


def ground_truth_study(estimators: dict[str, dict], seeds=(0, 1, 2), dims=(2,), **options) -> dict:
    """:func:`ground_truth_check` on every seed and dimension, with per-estimator means and 90% intervals over
    seeds (each seed a new pair of toy policies and new samples)."""
    report = {}
    for dim in dims:
        per_seed = [ground_truth_check(estimators, seed=seed, dim=dim, **options) for seed in seeds]
        summary = {}
        for name in estimators:
            summary[name] = {}
            for key in ("spearman", "within_group_spearman", "log_ratio_variance", "log_ratio_mean_abs",
                        "log_ratio_relative_variance"):
                values = [run["estimators"][name][key] for run in per_seed]
                summary[name][key] = {"mean": sum(values) / len(values), "interval_90": _interval(values),
                                      "per_seed": values}
        report[f"dim{dim}"] = {"seeds": list(seeds), "setups": [run["setup"] for run in per_seed], "estimators": summary}
        for name, row in summary.items():
            print(f"dim {dim:<3} {name:<36} spearman {row['spearman']['mean']:.3f} "
                  f"within {row['within_group_spearman']['mean']:.3f} "
                  f"relative variance {row['log_ratio_relative_variance']['mean']:.3g}", flush=True)
    return report


def main() -> None:
    import argparse
    import json

    from vgrpo_lib.algorithms.run_dir import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--dims", type=int, nargs="+", default=[2])
    parser.add_argument("--estimators", nargs="+", default=None, help="names from vgrpo_lib.benchmarks.estimator_designs.ESTIMATORS")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    designs = {n: ESTIMATORS[n] for n in args.estimators} if args.estimators else without_pilot(ESTIMATORS)
    report = ground_truth_study(designs, seeds=tuple(args.seeds), dims=tuple(args.dims))
    atomic_write_text(Path(args.out), json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
