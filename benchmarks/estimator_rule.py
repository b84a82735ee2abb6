"""Choosing the estimator before training (issue 30.5): a short pilot on the base policy, and a rule.

Group-shared pairs help on the MNIST testbed and cost on the custom-task tutorial's 2-D toy
(``docs/results/regime-map.md``). Which case a model is in can be measured before training, on a few rollouts
of its base policy at the training batch shape (prompts x group size), without a gradient step:

- ``gradient_cosine`` of each design in ``PILOT_DESIGNS``: the mean cosine between independent estimates of the
  policy gradient ``grad -(1/N) sum_i A_i s_theta(o_i)`` (:func:`vgrpo_lib.diagnostics.gradient_agreement`;
  1 = no Monte-Carlo noise in the direction);
- ``sharing_noise_factor`` (:func:`sharing_noise_factor`): how much sharing the pairs within a group changes the
  noise of the advantage-weighted objective ``sum_i A_i s(o_i)``, below 1 when it cancels noise, above 1 when it
  adds noise. With zero-sum advantages the group's common noise cancels, but noise shared by samples of *equal*
  sign of advantage adds up: on a 2-D toy the samples of one mode respond alike to a shared noise;
- ``noise_correlation`` (:func:`within_group_noise_correlation`): the plain within-group correlation of the
  surrogates' Monte-Carlo noise under shared pairs (what sharing exploits; positive on every task measured, so
  alone it does not say whether sharing helps);
- ``within_group_cv`` (:func:`vgrpo_lib.diagnostics.within_group_cv`; sharing lowers it on every task measured,
  so it does not decide either) and ``flat_group_share``, the share of groups whose rewards are all equal.

:func:`recommend_estimator` turns the pilot's gradient agreements into config overrides (the rule and where its
thresholds come from are in its docstring); :func:`run_pilot` measures and recommends for a task, what
``vgrpo estimators --recommend`` runs. Results: ``results/regime-rule/``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from vgrpo_lib import ELBOSurrogate
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.run_dir import atomic_write_text
from vgrpo_lib.algorithms.tasks import load_task
from vgrpo_lib.benchmarks.estimator_designs import ESTIMATORS
from vgrpo_lib.benchmarks.estimator_lab import rollout
from vgrpo_lib.diagnostics import gradient_agreement, policy_gradient, within_group_cv

__all__ = [
    "AGREEMENT_TARGET",
    "PILOT_DESIGNS",
    "SHARING_MARGIN",
    "flat_group_share",
    "pilot_measurements",
    "recommend_estimator",
    "run_pilot",
    "sharing_noise_factor",
    "within_group_noise_correlation",
]

PILOT_DESIGNS = ("naive", "vgrpo", "vgrpo_without_sharing", "vgrpo_k8")
"""Designs of :data:`vgrpo_lib.benchmarks.estimator_designs.ESTIMATORS` the pilot measures; the rule reads
``vgrpo`` and ``vgrpo_without_sharing`` (K = 4), the other two are reported."""

SHARING_MARGIN = 0.0
"""Group sharing is kept unless the pilot's gradient cosine without it exceeds the cosine with it by more than this.
Measured differences (without - with), one rollout each: -0.05 to -0.11 on the MNIST testbed's digit task,
+0.06 to +0.13 on the 2-D toy (3 rollouts each, ``results/regime-rule/``)."""

AGREEMENT_TARGET = 0.7
"""K = 8 is recommended when the chosen design's gradient cosine at K = 4 is below this. Measured: on digit
K = 4 (cosine 0.58) -> K = 8 (0.73) raised the final reward 0.951 -> 0.984; on the toy, with sharing, 0.80 -> 0.86
gave 0.929 -> 0.941 and without sharing (cosine 0.90 at K = 4) 0.955 -> 0.959, within the seed spread."""


def _check_surrogates(draws: torch.Tensor, per_sample: torch.Tensor, name: str) -> None:
    """``draws`` must be ``(R, N)`` with R >= 2 and ``per_sample`` (called ``name``) ``(N,)``."""
    if not isinstance(draws, torch.Tensor) or draws.ndim != 2 or draws.shape[0] < 2:
        shape = getattr(draws, "shape", type(draws))
        raise ValueError(f"draws must be an (R, N) tensor with R >= 2 draws, got {shape}.")
    if not isinstance(per_sample, torch.Tensor) or tuple(per_sample.shape) != (draws.shape[1],):
        shape = getattr(per_sample, "shape", type(per_sample))
        raise ValueError(f"{name} must be an (N,) = ({draws.shape[1]},) tensor, got {shape}.")


def sharing_noise_factor(draws: torch.Tensor, advantage: torch.Tensor) -> float:
    """``Var_r(sum_i A_i s_ri) / sum_i A_i^2 Var_r(s_ri)`` for surrogates ``draws`` ``(R, N)`` under group-shared
    pairs and advantages ``A`` ``(N,)``: the noise of the advantage-weighted objective relative to what independent
    pairs (same marginal draw per sample, no covariance between samples) would give. 1 + the advantage-weighted
    sum of the within-group noise covariances over the independent noise; below 1 sharing cancels noise."""
    _check_surrogates(draws, advantage, "advantage")
    draws, advantage = draws.double(), advantage.double()
    independent = (advantage.square() * draws.var(0)).sum()
    return ((draws @ advantage).var() / independent.clamp_min(1e-30)).item()


def within_group_noise_correlation(draws: torch.Tensor, group: torch.Tensor) -> float:
    """Mean correlation, over draws, of the Monte-Carlo noise of two different samples of one group (all pairs
    ``i != j`` of every group), for surrogates ``draws`` ``(R, N)`` and ``group`` ``(N,)``; near 0 under
    independent pairs, up to 1 when shared pairs move every member's surrogate alike."""
    _check_surrogates(draws, group, "group")
    noise = draws.double() - draws.double().mean(0)
    unit = noise / noise.norm(dim=0).clamp_min(1e-30)
    correlation = unit.T @ unit
    same = (group[:, None] == group[None, :]) & ~torch.eye(len(group), dtype=torch.bool, device=group.device)
    if not same.any():
        raise ValueError("within_group_noise_correlation needs a group with at least two samples.")
    return correlation[same].mean().item()


def flat_group_share(advantage: torch.Tensor, group: torch.Tensor) -> float:
    """Share of the groups whose advantages ``(N,)`` are all 0 (equal rewards: no signal from that group)."""
    labels = torch.unique(group)
    return sum(bool((advantage[group == g] == 0).all()) for g in labels) / len(labels)


def pilot_measurements(task, *, prompts: int, group_size: int, rollout_steps: int, rollouts: int = 3,
                       gradient_draws: int = 8, surrogate_draws: int = 32, seed: int = 0,
                       config: TrainConfig | None = None) -> dict:
    """The pilot on ``task``'s base policy: ``rollouts`` rollouts of ``prompts`` x ``group_size`` samples (the
    training batch shape) with ``rollout_steps`` ODE steps, each measured with every design of
    :data:`PILOT_DESIGNS` over ``gradient_draws`` gradient and ``surrogate_draws`` surrogate draws of pairs.

    ``task`` is a task object (``sample_shape``, ``sample_prompts``, ``condition``, ``load_policy``, ``decode``,
    ``reward``, see :func:`vgrpo_lib.benchmarks.estimator_lab.rollout`); ``config`` the TrainConfig whose rollout
    settings apply (the task's testbed defaults for None). Returns ``{"rollouts": [{design: {statistic: value},
    "flat_group_share": x}, ...], "mean": {design: {statistic: mean over rollouts}, "flat_group_share": x}}``."""
    for name, value, least in (("rollouts", rollouts, 1), ("gradient_draws", gradient_draws, 2),
                               ("surrogate_draws", surrogate_draws, 2)):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"pilot_measurements' {name} must be an integer >= {least}, got {value!r}.")
    if config is None:
        config = build_config("vgrpo", None, "testbed", [])
    per_rollout = []
    for index in range(rollouts):
        policy, sample, cond, group, advantage = rollout(task, config, prompts, group_size, rollout_steps, seed + index)
        row: dict = {"flat_group_share": flat_group_share(advantage, group)}
        for name in PILOT_DESIGNS:
            estimator = ELBOSurrogate(**ESTIMATORS[name])
            generator = torch.Generator().manual_seed(seed + 1000 + index)
            gradients = torch.stack([policy_gradient(estimator, policy, sample, cond, group, advantage, generator)
                                     for _ in range(gradient_draws)])
            with torch.no_grad():
                draws = torch.stack([estimator(policy, sample, cond, estimator.sample_pairs(sample, group, generator))
                                     for _ in range(surrogate_draws)])
            row[name] = {**gradient_agreement(gradients), "within_group_cv": within_group_cv(draws.double(), group),
                         "sharing_noise_factor": sharing_noise_factor(draws, advantage),
                         "noise_correlation": within_group_noise_correlation(draws, group)}
        per_rollout.append(row)
    mean: dict = {"flat_group_share": sum(r["flat_group_share"] for r in per_rollout) / rollouts}
    for name in PILOT_DESIGNS:
        mean[name] = {key: sum(r[name][key] for r in per_rollout) / rollouts for key in per_rollout[0][name]}
    return {"rollouts": per_rollout, "mean": mean}


def _cosine(measurements: dict, design: str) -> float:
    try:
        value = measurements[design]["gradient_cosine"]
    except (KeyError, TypeError):
        raise ValueError(f"recommend_estimator needs measurements[{design!r}]['gradient_cosine'] (a pilot's mean), "
                         f"got the keys {sorted(measurements) if isinstance(measurements, dict) else measurements!r}.")
    if not isinstance(value, (int, float)) or math.isnan(value) or not -1.0 <= value <= 1.0:
        raise ValueError(f"measurements[{design!r}]['gradient_cosine'] must be a cosine in [-1, 1], got {value!r}.")
    return float(value)


def recommend_estimator(measurements: dict, *, sharing_margin: float = SHARING_MARGIN,
                        agreement_target: float = AGREEMENT_TARGET) -> dict[str, str | int]:
    """Config overrides ``{"vgrpo.sharing": "group" | "none", "vgrpo.num_pairs": 4 | 8}`` from a pilot's gradient
    agreements (``measurements``: ``{design: {"gradient_cosine": c}}`` with ``vgrpo`` and ``vgrpo_without_sharing``,
    e.g. :func:`pilot_measurements`' ``"mean"``).

    The rule (``c_group``, ``c_none``: gradient cosine between independent draws at K = 4, with and without
    group-shared pairs):

    1. ``vgrpo.sharing=none`` when ``c_none - c_group > sharing_margin`` (0: whichever design's gradient agrees
       better; a tie keeps the paper's group sharing), else ``group``. The pilot measured +0.10 (0.902 - 0.800) on
       the 2-D toy, where training without sharing ends higher (0.955 +- 0.010 against 0.929 +- 0.013, 5 seeds),
       and -0.08 (0.494 - 0.576) on the testbed's digit task, where it ends lower (0.860 +- 0.158 against
       0.951 +- 0.026, 3 seeds).
    2. ``vgrpo.num_pairs=8`` when the chosen design's cosine ``c`` is below ``agreement_target`` (0.7), else 4.
       Doubling K doubles the per-draw signal-to-noise ratio, so the cosine becomes about ``2c / (1 + c)``
       (checked: digit 0.576 -> predicted 0.731, measured 0.733; toy 0.800 -> 0.889, measured 0.859). The
       threshold is the least certain part: K = 8 trained better on digit (0.984 against 0.951; cosine 0.58 at
       K = 4) and only within noise on the toy (with sharing 0.941 against 0.929, cosine 0.80; without sharing
       0.959 against 0.955, cosine 0.90), at twice the surrogate's NFE.

    Timesteps and weighting stay at V-GRPO's defaults (stratified, adaptive x): on digit the estimator lab's cosine
    falls without them (0.48 and 0.47 against 0.55) and training does not (0.963 and 0.946 against 0.951,
    ``docs/results/estimator-lab.md``, ``docs/results/ablations.md``), so a pilot's cosine is no guide for them.
    The rule is monotone: a larger
    ``c_none - c_group`` never turns sharing back on, a lower cosine never lowers K.
    """
    for name, value in (("sharing_margin", sharing_margin), ("agreement_target", agreement_target)):
        if not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"recommend_estimator's {name} must be a number, got {value!r}.")
    with_sharing, without_sharing = _cosine(measurements, "vgrpo"), _cosine(measurements, "vgrpo_without_sharing")
    sharing = "none" if without_sharing - with_sharing > sharing_margin else "group"
    chosen = without_sharing if sharing == "none" else with_sharing
    num_pairs = 8 if chosen < agreement_target else 4
    return {"vgrpo.sharing": sharing, "vgrpo.num_pairs": num_pairs}


def run_pilot(out: str | Path, *, task: str | object = "digit", preset: str = "testbed",
              overrides: list[str] | None = None, rollouts: int = 3, seed: int = 0) -> dict:
    """Measure :func:`pilot_measurements` on ``task`` (a registered task's name, the import path of a task's
    factory, or a task object) at the training batch shape of ``preset`` with ``overrides`` (``key=value``; e.g.
    ``prompts_per_iteration=4 group_size=16``), recommend with :func:`recommend_estimator`, and write
    ``OUT/pilot.json`` (``{"setup", "rollouts", "mean", "recommendation"}``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    named = isinstance(task, str)
    config = build_config("vgrpo", task if named else None, preset, list(overrides or []))
    task_object = load_task(config.task, config.model) if named else task
    setup = {"task": config.task if named else type(task).__name__, "preset": preset,
             "overrides": list(overrides or []), "prompts": config.prompts_per_iteration,
             "group_size": config.group_size, "rollout_steps": config.rollout.num_steps, "rollouts": rollouts,
             "seed": seed}
    pilot = pilot_measurements(task_object, prompts=config.prompts_per_iteration, group_size=config.group_size,
                               rollout_steps=config.rollout.num_steps, rollouts=rollouts, seed=seed, config=config)
    report = {"setup": setup, **pilot, "recommendation": recommend_estimator(pilot["mean"])}
    atomic_write_text(out / "pilot.json", json.dumps(report, indent=2) + "\n")
    return report
