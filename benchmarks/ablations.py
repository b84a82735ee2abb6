"""Training-level ablations and the regime map: which estimator choices matter, and where.

Each cell is a short V-GRPO training run on the testbed (the testbed preset without the KL to the base policy,
so estimator effects are not masked), repeated over seeds. Two sets:

- ``paper``: the paper's ablations on one task: each variance-reduction technique removed in turn, the naive
  estimator, K = 2/4/8, eps/v/x/adaptive_x weighting, and step control (soft clip vs ratio clip with several
  steps per rollout vs KL to the behaviour policy).
- ``regime``: where estimator variance starts to matter: naive vs V-GRPO across tasks (``digit`` vs ``pair``:
  dimension and composition; ``style``: a weak, preference-like reward), group size, K, learning rate and
  gradient steps per rollout, and bf16 autocast (``precision=bfloat16``; without bf16 hardware the CPU emulates
  it, about 15x slower, so the cell is slow but its numbers are what bf16 arithmetic gives).

A cell's verdict compares its naive run with its V-GRPO run at the same settings: ``collapses`` when V-GRPO
itself ends below the base policy's reward (then no comparison of the two is meaningful), ``diverges`` when the
naive reward ends below the base policy's, ``lags`` when the naive final reward is lower by more than ``MARGIN``
(in units of the V-GRPO reward gain over the base policy), ``naive better`` when it is higher by more than that,
otherwise ``keeps up``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.run_dir import atomic_write_text
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.errors import UsageError

__all__ = [
    "NAIVE", "BASE", "MARGIN", "EVALUATION_EXTRAS", "PAPER_SET", "REGIME_CELLS", "run_cell", "verdict", "run_ablations",
    "reverdict",
    "markdown",
]

NAIVE = ["vgrpo.sharing=none", "vgrpo.timesteps=uniform", "vgrpo.weighting=v"]
BASE = ["vgrpo.ref_kl_coef=none", "optim.lr=3e-4", "eval.every=0"]
MARGIN = 0.2
# A cell's statistics of the last evaluation, by their names in the report: recorded where the task evaluates them.
EVALUATION_EXTRAS = {"final_accuracy": "accuracy", "diversity": "diversity"}

PAPER_SET = {
    "vgrpo": [],
    "naive": NAIVE,
    "without_sharing": ["vgrpo.sharing=none"],
    "without_stratified": ["vgrpo.timesteps=uniform"],
    "without_adaptive (v)": ["vgrpo.weighting=v"],
    "k2": ["vgrpo.num_pairs=2"],
    "k8": ["vgrpo.num_pairs=8"],
    "weighting_eps": ["vgrpo.weighting=eps"],
    "weighting_x": ["vgrpo.weighting=x"],
    "antithetic (ours)": ["vgrpo.noise=antithetic"],
    "ratio_clip_4_steps": ["advantage.soft_clip=none", "optim.minibatch_size=32", "vgrpo.clip_range=0.01"],
    "kl_behaviour_4_steps": ["advantage.soft_clip=none", "optim.minibatch_size=32", "vgrpo.behaviour_kl_coef=0.3"],
    # The same step control at a third of the learning rate: 4 steps per rollout at lr 3e-4 move the policy
    # about as far per rollout as one step at 1e-3, which is unstable for every estimator.
    "ratio_clip_4_steps_lr1e-4": ["advantage.soft_clip=none", "optim.minibatch_size=32", "optim.lr=1e-4"],
    "kl_behaviour_4_steps_lr1e-4": ["advantage.soft_clip=none", "optim.minibatch_size=32", "vgrpo.behaviour_kl_coef=0.3",
                                    "optim.lr=1e-4"],
    "soft_clip_4_steps_lr1e-4": ["optim.minibatch_size=32", "optim.lr=1e-4"],
}

REGIME_CELLS = {
    "digit": ["task=digit"],
    "pair": ["task=pair", "eval.per_prompt=4"],
    "style": ["task=style"],
    "digit_group4": ["task=digit", "group_size=4", "prompts_per_iteration=32"],
    "digit_k1": ["task=digit", "vgrpo.num_pairs=1"],
    "digit_lr1e-3": ["task=digit", "optim.lr=1e-3"],
    "digit_4_steps": ["task=digit", "optim.minibatch_size=32", "advantage.soft_clip=none"],
    "digit_4_steps_lr1e-4": ["task=digit", "optim.minibatch_size=32", "advantage.soft_clip=none", "optim.lr=1e-4"],
    "digit_bf16": ["task=digit", "precision=bfloat16"],
}


def run_cell(out: Path, name: str, overrides: list[str], seeds: int, iterations: int, *, task: str | None = None,
             preset: str = "testbed") -> dict:
    """V-GRPO at ``preset`` on ``task`` (the preset's default for None) with ``BASE`` and ``overrides``, per seed."""
    finals, bases, extras = [], [], {key: [] for key in EVALUATION_EXTRAS}
    for seed in range(seeds):
        config = build_config("vgrpo", task, preset, BASE + [f"iterations={iterations}", f"seed={seed}", *overrides])
        trainer = Trainer(config, out / "runs" / f"{name.replace(' ', '_')}_seed{seed}", progress=False)
        trainer.train()
        tail = [m["reward_mean"] for m in trainer.metrics[-3:]]
        finals.append(sum(tail) / len(tail))
        for key, values in extras.items():
            if EVALUATION_EXTRAS[key] in trainer.evaluations[-1]:
                values.append(trainer.evaluations[-1][EVALUATION_EXTRAS[key]])
        bases.append(trainer.evaluations[0]["reward_mean"])
    stats = lambda values: {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}  # noqa: E731
    result = {"final_reward": stats(finals), "base_reward": statistics.mean(bases), "overrides": overrides}
    # A task without an accuracy or a diversity (a user's task, e.g. a 2-D toy) has no such entry.
    result |= {key: stats(values) for key, values in extras.items() if len(values) == seeds}
    accuracy = f"  accuracy {result['final_accuracy']['mean']:.3f}" if "final_accuracy" in result else ""
    print(f"{name:<28} final reward {result['final_reward']['mean']:.3f} +- {result['final_reward']['std']:.3f}"
          f"{accuracy}", flush=True)
    return result


def verdict(naive: dict, vgrpo: dict) -> str:
    if vgrpo["final_reward"]["mean"] < vgrpo["base_reward"]:
        return "collapses"
    gain = max(vgrpo["final_reward"]["mean"] - vgrpo["base_reward"], 1e-6)
    if naive["final_reward"]["mean"] < naive["base_reward"]:
        return "diverges"
    difference = vgrpo["final_reward"]["mean"] - naive["final_reward"]["mean"]
    if difference > MARGIN * gain:
        return "lags"
    if -difference > MARGIN * gain:
        return "naive better"
    return "keeps up"


def _selected(cells: dict[str, list[str]], names: list[str] | None) -> dict[str, list[str]]:
    """The cells named in ``names`` (all of them for None); an unknown name is refused with the valid ones."""
    if names is None:
        return cells
    unknown = [name for name in names if name not in cells]
    if unknown:
        raise UsageError(f"Unknown cell(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(map(repr, cells))}.")
    return {name: cells[name] for name in names}


def run_ablations(out: str | Path, *, which: str = "paper", seeds: int = 2, quick: bool = False, task: str = "digit",
                  cells: list[str] | None = None, preset: str = "testbed", overrides: list[str] | None = None) -> dict:
    """Run the ``paper`` set (on ``task`` at ``preset``, e.g. ``mnist-sd3``) or the testbed's ``regime`` map, or
    only the named ``cells`` of it; ``overrides`` (``key=value``) apply to every run before each cell's own."""
    out = Path(out)
    iterations = 20 if quick else 40
    names, common = cells, list(overrides or [])
    if which == "paper":
        cells = {name: run_cell(out, name, [*common, *cell], seeds, iterations, task=task, preset=preset)
                 for name, cell in _selected(PAPER_SET, names).items()}
        report = {"set": "paper", "task": task, "preset": preset, "seeds": seeds, "iterations": iterations,
                  "cells": cells}
    elif which == "regime" and preset != "testbed":
        raise UsageError(f"The regime map runs on the testbed's tasks; preset {preset!r} applies to the paper set.")
    elif which == "regime":
        cells = {}
        for name, cell in _selected(REGIME_CELLS, names).items():
            vgrpo = run_cell(out, f"{name}/vgrpo", [*common, *cell], seeds, iterations)
            naive = run_cell(out, f"{name}/naive", [*common, *cell, *NAIVE], seeds, iterations)
            cells[name] = {"vgrpo": vgrpo, "naive": naive, "verdict": verdict(naive, vgrpo)}
        report = {"set": "regime", "seeds": seeds, "iterations": iterations, "margin": MARGIN, "cells": cells}
    else:
        raise UsageError(f"Unknown ablation set {which!r}; expected 'paper' or 'regime'.")
    atomic_write_text(out / f"{which}.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out / f"{which}.md", markdown(report))
    return report


def reverdict(path: str | Path) -> dict:
    """Recompute the verdicts of a saved regime report (``regime.json``) with the current :func:`verdict` and
    rewrite it and its markdown beside it; the measured numbers are untouched."""
    path = Path(path)
    report = json.loads(path.read_text())
    for cell in report["cells"].values():
        cell["verdict"] = verdict(cell["naive"], cell["vgrpo"])
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    atomic_write_text(path.with_suffix(".md"), markdown(report))
    return report


def markdown(report: dict) -> str:
    lines = [f"{report['set']} set, {report['seeds']} seed(s), {report['iterations']} iterations (mean +- std).", ""]
    if report["set"] == "paper":
        lines += ["| variant | final reward | accuracy | diversity |", "|---|---|---|---|"]
        for name, cell in report["cells"].items():
            lines.append(f"| {name} | {_pm(cell['final_reward'])} | {_pm(cell.get('final_accuracy'))} | "
                         f"{_pm(cell.get('diversity'))} |")
    else:
        lines += ["| cell | V-GRPO reward | naive reward | verdict |", "|---|---|---|---|"]
        for name, cell in report["cells"].items():
            lines.append(f"| {name} | {_pm(cell['vgrpo']['final_reward'])} | {_pm(cell['naive']['final_reward'])} | "
                         f"{cell['verdict']} |")
    return "\n".join(lines) + "\n"


def _pm(stat: dict | None) -> str:
    return "—" if stat is None else f"{stat['mean']:.3f} ± {stat['std']:.3f}"
