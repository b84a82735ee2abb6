"""The estimator lab: how noisy is each ELBO-surrogate design on real rollouts (the testbed's, a pipeline's or
your own task's: ``run_lab(out, task=my_task)``)?

For each estimator configuration (``ESTIMATORS``, :mod:`vgrpo_lib.benchmarks.estimator_designs`) on the task's
base policy and one rollout of B prompts x G samples with their real rewards and advantages, over R independent
draws of timestep-noise pairs, :func:`vgrpo_lib.diagnostics.measure_estimator` reports:

- ``cv``, ``within_group_cv``, ``mc_noise_share``, ``rank_agreement`` of the surrogate;
- ``log_ratio_variance``: variance over draws of ``s_theta' - s_theta`` between the policy and a nearby one
  (one small gradient step away, :func:`vgrpo_lib.diagnostics.nearby_policy`), with common pairs: what the
  importance ratio sees; ``log_ratio_mean_abs`` the size of that log-ratio (mean over samples of its mean over
  draws, absolute), ``log_ratio_relative_variance`` the variance relative to it (``variance / mean_abs^2``: noise
  to signal, comparable across weightings whose surrogates differ in scale), ``log_ratio_rank_agreement`` and
  ``log_ratio_ess``;
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

import json
from dataclasses import replace
from pathlib import Path

import torch

from vgrpo_lib import ELBOSurrogate, GroupAdvantage
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.run_dir import atomic_write_text, pyplot, save_figure
from vgrpo_lib.algorithms.tasks import load_task, repeat_each, rollout_grid
from vgrpo_lib.benchmarks.estimator_designs import ESTIMATORS, PILOT, QUICK, VGRPO, without_pilot
from vgrpo_lib.benchmarks.ground_truth import ground_truth_check
from vgrpo_lib.diagnostics import measure_estimator, nearby_policy, policy_gradient
from vgrpo_lib.samplers import sample_ode
from vgrpo_lib.timesteps import Uniform, variance_optimal_density

__all__ = ["ESTIMATORS", "QUICK", "pilot_importance_density", "plot_lab", "rollout", "run_lab"]


def rollout(task, config: TrainConfig, prompts: int, group_size: int, steps: int, seed: int):
    """One CFG-free rollout of ``task``'s base policy (``task.load_policy()``; any object of the task protocol:
    a registered task's or your own) on its rollout grid under ``config``, with rewards and group advantages:
    ``(policy, sample (N, *D), cond, group (N,), advantage (N,))`` for ``N = prompts * group_size``."""
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


def run_lab(out: str | Path, *, quick: bool = False, task: str | object = "digit", seed: int = 0, names=None,
            preset: str = "testbed", overrides: list[str] | None = None, ground_truth: bool = True) -> dict:
    """Measure every estimator (``names``; default all, ``QUICK`` with ``quick``) on one rollout of ``task`` under
    ``preset`` (``testbed``, or a pipeline preset such as ``mnist-sd3``) with config ``overrides`` (``key=value``,
    e.g. ``model.path=...``) and write the report (module doc).

    ``task`` is a registered task's name, the import path of your task's factory (``"pkg.module:make_task"``, as
    on the command line) or your own task object. An object needs only the members that a rollout uses (see
    :mod:`vgrpo_lib.algorithms.tasks`): ``sample_shape``, ``sample_prompts``, ``condition``, ``load_policy`` (the
    model measured), ``decode``, ``reward`` and optionally ``time_grid``: ``run_lab(out, task=my_task, quick=True)``.
    ``ground_truth=False`` leaves out the ground-truth check (a 2-D model of its own, about two CPU minutes); the
    report's ``"ground_truth"`` is then None."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prompts, group_size, draws, gradient_draws = (4, 8, 16, 6) if quick else (8, 16, 32, 12)
    named = isinstance(task, str)
    run_config = build_config("vgrpo", task if named else None, preset, list(overrides or []))
    task_object = load_task(run_config.task, run_config.model) if named else task
    policy, sample, cond, group, advantage = rollout(task_object, run_config, prompts, group_size, steps=20, seed=seed)
    nearby = nearby_policy(policy, ELBOSurrogate(**VGRPO), sample, cond, group, advantage, lr=1e-4, seed=seed + 1)
    names = dict.fromkeys((*(names or (QUICK if quick else ESTIMATORS)), "vgrpo_importance (ours)"))
    density, moments = pilot_importance_density(policy, sample, cond, group, advantage, seed=seed + 3)
    configs = {name: ESTIMATORS[name] for name in names}
    configs = {name: {**c, "timesteps": density} if c["timesteps"] == PILOT else c for name, c in configs.items()}
    results = {}
    for name, config in configs.items():
        results[name] = {"config": {k: (v if isinstance(v, (int, str)) else repr(v)) for k, v in config.items()}} | (
            measure_estimator(ELBOSurrogate(**config), policy, sample, cond, group, advantage, nearby=nearby,
                              draws=draws, gradient_draws=gradient_draws, seed=seed + 2)
        )
        print(f"{name:<36} within-group CV {results[name]['within_group_cv']:.4f}  "
              f"gradient cosine {results[name]['gradient_cosine']:.3f} +- {results[name]['gradient_cosine_se']:.3f}",
              flush=True)
    results["vgrpo_importance (ours)"]["pilot_bin_second_moments"] = moments
    # The pilot density belongs to the testbed policy, not to the ground truth's 2-D model: left out there.
    exact = ground_truth_check(without_pilot(configs)) if ground_truth else None
    report = {
        "setup": {"task": run_config.task if named else type(task).__name__, "preset": preset, "prompts": prompts,
                  "group_size": group_size, "draws": draws,
                  "gradient_draws": gradient_draws, "seed": seed, "rollout_steps": 20},
        "estimators": results,
        "ground_truth": exact,
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
