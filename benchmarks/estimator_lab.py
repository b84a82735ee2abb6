"""The estimator lab: how noisy is each ELBO-surrogate design on real rollouts (the testbed's or a pipeline's)?

For each estimator configuration (``ESTIMATORS``) on the testbed's base policy and one rollout of B prompts x
G samples with their real rewards and advantages, over R independent draws of timestep-noise pairs:

- ``cv``, ``within_group_cv``, ``mc_noise_share``, ``rank_agreement`` (see :mod:`vgrpo_lib.benchmarks.estimator_stats`);
- ``log_ratio_variance``: variance over draws of ``s_theta' - s_theta`` between the policy and a nearby one
  (one small gradient step away), with common pairs: what the importance ratio sees; ``log_ratio_mean_abs`` the
  size of that log-ratio (mean over samples of its mean over draws, absolute) and ``log_ratio_relative_variance``
  the variance relative to it (``variance / mean_abs^2``: noise to signal, comparable across weightings whose
  surrogates differ in scale);
- ``gradient_cosine`` (with its jackknife SE) and ``gradient_relative_variance`` of the policy gradient
  ``grad -(1/N) sum_i A_i s_theta(o_i)`` between draws: a lower CV is not the same as a less noisy gradient,
  so the gradient is measured directly;
- cost: model rows per sample (= K, the NFE of one surrogate evaluation) and seconds per evaluation.

The configurations marked "(ours)" go beyond the paper, at equal NFE: an importance-sampled timestep density
from a pilot on the same rollout (:func:`pilot_importance_density`) and antithetic noise couples
(``ELBOSurrogate(noise="antithetic")``), alone and together.

Plus a ground-truth check (:mod:`vgrpo_lib.benchmarks.ground_truth`): on a 2-D model whose exact log-likelihood is
computable, the rank correlation of each estimator's log-ratio with the exact one.

Writes ``OUT/estimators.json`` (``{"estimators": {name: {...}}, "setup": {...}, "ground_truth": {...}}``) and
``OUT/estimators.png``.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.run_dir import atomic_write_text, pyplot, save_figure
from vgrpo_lib.algorithms.tasks import load_task, repeat_each, rollout_grid
from vgrpo_lib.benchmarks.estimator_stats import (
    coefficient_of_variation,
    gradient_agreement,
    mc_noise_share,
    within_group_cv,
    within_group_rank_agreement,
)
from vgrpo_lib.benchmarks.ground_truth import ground_truth_check
from vgrpo_lib import ELBOSurrogate, GroupAdvantage
from vgrpo_lib.samplers import sample_ode
from vgrpo_lib.timesteps import Uniform, variance_optimal_density

VGRPO = dict(num_pairs=4, timesteps="stratified", sharing="group", weighting="adaptive_x")
NAIVE = dict(num_pairs=4, timesteps="uniform", sharing="none", weighting="v")
PILOT = "pilot"  # placeholder timesteps: the importance density measured on the rollout (pilot_importance_density)
IMPORTANCE = {**VGRPO, "timesteps": PILOT}
ANTITHETIC = {**VGRPO, "noise": "antithetic"}

ESTIMATORS: dict[str, dict] = {
    "naive": NAIVE,
    "vgrpo": VGRPO,
    "vgrpo_without_sharing": {**VGRPO, "sharing": "none"},
    "vgrpo_without_stratified": {**VGRPO, "timesteps": "uniform"},
    "vgrpo_without_adaptive": {**VGRPO, "weighting": "v"},
    "vgrpo_batch_sharing": {**VGRPO, "sharing": "batch"},
    **{f"vgrpo_k{k}": {**VGRPO, "num_pairs": k} for k in (1, 2, 8)},
    **{f"vgrpo_weighting_{w}": {**VGRPO, "weighting": w} for w in ("eps", "x", "elbo")},  # "v": vgrpo_without_adaptive
    # Our options beyond the paper, at the paper's K = 4 (equal NFE) unless the name says otherwise.
    "vgrpo_importance (ours)": IMPORTANCE,
    "vgrpo_antithetic (ours)": ANTITHETIC,
    "vgrpo_antithetic_k8 (ours)": {**ANTITHETIC, "num_pairs": 8},
    "vgrpo_antithetic_importance (ours)": {**ANTITHETIC, "timesteps": PILOT},
}
QUICK = ("naive", "vgrpo", "vgrpo_without_sharing", "vgrpo_without_stratified", "vgrpo_without_adaptive",
         "vgrpo_k2", "vgrpo_k8", "vgrpo_weighting_eps", "vgrpo_weighting_x", "vgrpo_importance (ours)",
         "vgrpo_antithetic (ours)", "vgrpo_antithetic_importance (ours)")


def rollout(config: TrainConfig, prompts: int, group_size: int, steps: int, seed: int):
    """One CFG-free rollout of the base policy of ``config``'s task (any task of :mod:`vgrpo_lib.algorithms.tasks`: the
    testbed's or a pipeline's) on its rollout grid, with rewards and group advantages."""
    task = load_task(config.task, config.model)
    policy = task.load_policy()
    generator = torch.Generator().manual_seed(seed)
    prompt_list = repeat_each(task.sample_prompts(prompts, generator), group_size)
    cond = task.condition(prompt_list)
    group = torch.arange(prompts).repeat_interleave(group_size)
    device = next(policy.parameters()).device
    with torch.no_grad():
        noise = torch.randn((group.shape[0], *task.sample_shape), generator=generator).to(device)
        sample = sample_ode(policy, noise, rollout_grid(task, replace(config.rollout, num_steps=steps)), cond)
        reward = task.reward()(task.decode(sample), prompt_list).to(device)
    group = group.to(device)
    return policy, sample, cond, group, GroupAdvantage()(reward, group)


def nearby_policy(policy, estimator: ELBOSurrogate, sample, cond, group, advantage, lr: float, seed: int):
    """The policy after one Adam step of the V-GRPO objective: a realistic 'nearby' policy for log-ratios."""
    nearby = copy.deepcopy(policy)
    optimizer = torch.optim.Adam(nearby.parameters(), lr=lr)
    pairs = estimator.sample_pairs(sample, group, torch.Generator().manual_seed(seed))
    (-(advantage * estimator(nearby, sample, cond, pairs)).mean()).backward()
    optimizer.step()
    return nearby.requires_grad_(False)


def policy_gradient(estimator, policy, sample, cond, group, advantage, generator) -> torch.Tensor:
    """Flattened ``grad -(1/N) sum_i A_i s_theta(o_i)`` for one draw of pairs."""
    params = [p for p in policy.parameters() if p.requires_grad]
    pairs = estimator.sample_pairs(sample, group, generator)
    grads = torch.autograd.grad(-(advantage * estimator(policy, sample, cond, pairs)).mean(), params)
    return torch.cat([g.flatten() for g in grads]).double()


def pilot_importance_density(policy, sample, cond, group, advantage, *, bins: int = 8, draws: int = 2, seed: int = 0):
    """Our estimator option: measure the policy gradient's second moment with all K pairs inside each of
    ``bins`` time bins, then sample timesteps from ``q propto sqrt(E ||g||^2)`` with importance weights
    (:func:`vgrpo_lib.timesteps.variance_optimal_density`). The pilot costs ``bins * draws`` gradient passes."""
    generator = torch.Generator().manual_seed(seed)
    moments = []
    for b in range(bins):
        estimator = ELBOSurrogate(**{**VGRPO, "timesteps": Uniform(b / bins, (b + 1) / bins, stratified=True)})
        grads = [policy_gradient(estimator, policy, sample, cond, group, advantage, generator) for _ in range(draws)]
        moments.append(sum(g.square().sum().item() for g in grads) / draws)
    return variance_optimal_density(moments), moments


def measure(estimator, policy, nearby, sample, cond, group, advantage, draws: int, gradient_draws: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    values, log_ratios, seconds = [], [], []
    with torch.no_grad():
        for _ in range(draws):
            pairs = estimator.sample_pairs(sample, group, generator)
            start = time.perf_counter()
            value = estimator(policy, sample, cond, pairs)
            seconds.append(time.perf_counter() - start)
            values.append(value)
            log_ratios.append(estimator(nearby, sample, cond, pairs) - value)
    values, log_ratios = torch.stack(values).double(), torch.stack(log_ratios).double()
    gradients = [policy_gradient(estimator, policy, sample, cond, group, advantage, generator) for _ in range(gradient_draws)]
    return {
        "num_pairs": estimator.num_pairs,
        "cv": coefficient_of_variation(values),
        "within_group_cv": within_group_cv(values, group),
        "mc_noise_share": mc_noise_share(values, group),
        "rank_agreement": within_group_rank_agreement(values, group),
        "log_ratio_variance": log_ratios.var(0).mean().item(),
        "log_ratio_mean_abs": log_ratios.mean(0).abs().mean().item(),
        "log_ratio_relative_variance": (log_ratios.var(0).mean() / log_ratios.mean(0).abs().mean().square()).item(),
        **gradient_agreement(torch.stack(gradients)),
        "nfe_per_sample": estimator.num_pairs,
        "seconds_per_evaluation": sorted(seconds)[len(seconds) // 2],
    }


def run_lab(out: str | Path, *, quick: bool = False, task: str = "digit", seed: int = 0, names=None,
            preset: str = "testbed", overrides: list[str] | None = None) -> dict:
    """Measure every estimator (``names``; default all, ``QUICK`` with ``quick``) on one rollout of ``task`` under
    ``preset`` (``testbed``, or a pipeline preset such as ``mnist-sd3``) with config ``overrides`` (``key=value``,
    e.g. ``model.path=...``) and write the report (module doc)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prompts, group_size, draws, gradient_draws = (4, 8, 16, 6) if quick else (8, 16, 32, 12)
    run_config = build_config("vgrpo", task, preset, list(overrides or []))
    policy, sample, cond, group, advantage = rollout(run_config, prompts, group_size, steps=20, seed=seed)
    nearby = nearby_policy(policy, ELBOSurrogate(**VGRPO), sample, cond, group, advantage, lr=1e-4, seed=seed + 1)
    names = dict.fromkeys((*(names or (QUICK if quick else ESTIMATORS)), "vgrpo_importance (ours)"))
    density, moments = pilot_importance_density(policy, sample, cond, group, advantage, seed=seed + 3)
    configs = {name: ESTIMATORS[name] for name in names}
    configs = {name: {**c, "timesteps": density} if c["timesteps"] == PILOT else c for name, c in configs.items()}
    results = {}
    for name, config in configs.items():
        results[name] = {"config": {k: (v if isinstance(v, (int, str)) else repr(v)) for k, v in config.items()}} | measure(
            ELBOSurrogate(**config), policy, nearby, sample, cond, group, advantage, draws, gradient_draws, seed + 2
        )
        print(f"{name:<36} within-group CV {results[name]['within_group_cv']:.4f}  "
              f"gradient cosine {results[name]['gradient_cosine']:.3f} +- {results[name]['gradient_cosine_se']:.3f}",
              flush=True)
    results["vgrpo_importance (ours)"]["pilot_bin_second_moments"] = moments
    # The pilot density belongs to the testbed policy, not to the ground truth's 2-D model: left out there.
    ground_truth = ground_truth_check(
        {name: config for name, config in configs.items() if ESTIMATORS[name]["timesteps"] != PILOT}
    )
    report = {
        "setup": {"task": run_config.task, "preset": preset, "prompts": prompts, "group_size": group_size, "draws": draws,
                  "gradient_draws": gradient_draws, "seed": seed, "rollout_steps": 20},
        "estimators": results,
        "ground_truth": ground_truth,
    }
    atomic_write_text(out / "estimators.json", json.dumps(report, indent=2) + "\n")
    plot_lab(results, out / "estimators.png")
    return report


def plot_lab(results: dict, path: Path) -> None:
    plt = pyplot()
    names = list(results)
    panels = [("within_group_cv", "within-group CV (lower is better)"),
              ("gradient_cosine", "gradient cosine between draws, +- jackknife SE (higher is better)"),
              ("log_ratio_variance", "log-ratio variance (lower is better)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 0.35 * len(names) + 1.5))
    for axis, (key, title) in zip(axes, panels):
        error = [results[n][f"{key}_se"] for n in names] if f"{key}_se" in results[names[0]] else None
        axis.barh(names, [results[n][key] for n in names], xerr=error)
        axis.set_title(title, fontsize=9)
        axis.invert_yaxis()
    for axis in axes[1:]:
        axis.set_yticklabels([])
    fig.tight_layout()
    save_figure(fig, path)
