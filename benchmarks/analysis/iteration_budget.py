"""Where an iteration's time and signal go, per algorithm, on the MNIST-SD3 comparisons (issue 30, item 1): from
the reported runs' own tables (``runs/<run>/metrics.csv``, ``eval.jsonl``, ``config.json``, each read as stored:
``NAME.gz`` too), no training.

    python -m vgrpo_lib.benchmarks.analysis.iteration_budget > results/iteration-budget/budget.txt

Per comparison (``COMPARISONS``) and per algorithm at its chosen setting (``protocol.json``'s ``chosen``), over
the reported seeds (median and the seeds' range):

- seconds per iteration by phase (the trainer's ``rollout_s``, ``reward_s``, ``prepare_s``, ``update_s``; "other"
  is ``iteration_s`` minus their sum), means over iterations from ``WARM_UP`` on;
- NFE per sample per iteration by phase (``nfe_rollout``, ``nfe_prepare``, ``nfe_update``) and gradient steps;
- the held-out evaluation reward (``eval.jsonl``) from iteration 0 to the end, its gain per 1,000 NFE per sample
  and per training minute, over each half of the run, and to the comparison's held-out target;
- the training reward's gain beside it (mean of the first and of the last ``SMOOTH`` iterations);
- the step-control diagnostics (means over iterations of the means over each iteration's gradient steps):
  clip fraction and the share whose gradient the clip removes, the ratio's largest distance from 1, approx KL
  (k3), the KL terms and their coefficients from ``config.json``, the gradient norm against ``max_grad_norm``,
  the share of prompt groups without signal (equal rewards), and V-GRPO's / FPO's surrogate mean.

Then each comparison's tuning runs (seed 100) of V-GRPO and DiffusionNFT: the held-out gain per step control and
learning rate; the GenEval runs at 150 iterations on one GPU (``results/gpu-geneval/``); and the noise of the
surrogate's policy gradient between draws of the K pairs on each task's base policy, from the estimator lab's
reports ``results/iteration-budget/estimators-TASK.json`` (``vgrpo_lib.benchmarks.estimator_lab``; made by
``results/iteration-budget/lab.sh``, the trainer logs no surrogate noise).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.benchmarks.analysis import results_parser
from vgrpo_lib.benchmarks.compare.protocol import run_name

__all__ = ["COMPARISONS", "RunBudget", "iteration_budget", "main", "run_budget"]

COMPARISONS = (  # (what the block is called, the comparison's folder under results/, whether its tuning is shown)
    ("digit", "compare-mnist-sd3-digit", True),
    ("digit, peers", "compare-mnist-sd3-digit-peers", False),  # V-GRPO's runs are digit's (links)
    ("digit, settings selected by the held-out target", "compare-mnist-sd3-digit-heldout", False),  # digit's tuning
    ("ocr", "compare-mnist-sd3-ocr", True),
    ("ocr, settings selected by the held-out target", "compare-mnist-sd3-ocr-heldout", False),  # ocr's tuning
    ("geneval", "compare-mnist-sd3-geneval", True),
)
GPU_GENEVAL = {  # run-name prefix in results/gpu-geneval/runs: (algorithm, setting); the first three are the choices
    "vgrpo": ("vgrpo", "paper_soft_clip, lr 0.001"),  # of compare-mnist-sd3-geneval
    "diffusion_nft": ("diffusion_nft", "two_minibatches, lr 0.001"),
    "flow_grpo": ("flow_grpo", "two_minibatches, lr 0.0001"),
    "flow_grpo_two_epochs_lr0.001": ("flow_grpo", "two_epochs, lr 0.001"),
}
LAB_TASKS = ("digit", "ocr", "geneval")
LAB_DESIGNS = ("vgrpo", "vgrpo_k8", "naive")
TUNED = ("vgrpo", "diffusion_nft")  # algorithms whose tuning sweep is shown
PHASES = ("rollout", "reward", "prepare", "update")
OTHER_SHOWN = 0.005  # seconds of iteration_s outside the four phases from which "other" is shown
WARM_UP = 2  # iterations left out of the seconds (the first ones carry one-off costs)
SMOOTH = 3  # iterations averaged at each end of the training reward
ALGORITHM_SECTIONS_SKIPPED = ("advantage", "distributed", "eval", "log", "model", "optim", "rollout", "schedule")


@dataclass(frozen=True)
class RunBudget:
    """One run's budget: ``seconds`` and ``nfe`` per phase (``PHASES`` + ``"other"`` / ``"total"``) per iteration,
    ``steps`` gradient steps per iteration, the held-out ``evaluations`` ``[(iteration, nfe, train_seconds,
    reward)]`` (iteration 0 first), the training reward at the start, middle and end (means of ``SMOOTH``
    iterations), ``diagnostics`` (name: mean over iterations) and ``settings`` (the step-control values of
    ``config.json``)."""

    seconds: dict[str, float]
    nfe: dict[str, float]
    steps: float
    evaluations: list[tuple[int, float, float, float]]
    training_start: float
    training_middle: float
    training_end: float
    diagnostics: dict[str, float]
    settings: dict[str, object]

    @property
    def heldout_gain(self) -> float:
        return self.evaluations[-1][3] - self.evaluations[0][3]

    def gain_rate(self, first: int, last: int, per: str) -> float:
        """Held-out reward gained between evaluations ``first`` and ``last`` (indices), per 1,000 NFE per sample
        (``per="knfe"``) or per training minute (``per="minute"``)."""
        (_, nfe0, s0, r0), (_, nfe1, s1, r1) = self.evaluations[first], self.evaluations[last]
        return (r1 - r0) / ((nfe1 - nfe0) / 1000 if per == "knfe" else (s1 - s0) / 60)

    def to_target(self, target: float) -> tuple[float, float] | None:
        """``(nfe, train_seconds)`` of the first evaluation at or above ``target``; None if none reaches it."""
        return next(((nfe, seconds) for _, nfe, seconds, reward in self.evaluations if reward >= target), None)


def _step_control_settings(config: dict) -> dict[str, object]:
    """The clip ranges and KL coefficients of the run's algorithm sections, and the optimizer's gradient clip."""
    settings: dict[str, object] = {}
    for section, values in config.items():
        if isinstance(values, dict) and section not in ALGORITHM_SECTIONS_SKIPPED:
            settings |= {key: value for key, value in values.items() if "clip_range" in key or "kl_coef" in key}
    return settings | {"max_grad_norm": config["optim"]["max_grad_norm"], "soft_clip": config["advantage"]["soft_clip"]}


def _diagnostics(rows: list[dict]) -> dict[str, float]:
    means = {key: statistics.mean(float(row[key]) for row in rows)
             for key in ("clip_fraction", "clip_fraction_active", "approx_kl_k3", "zero_std_fraction",
                         "advantage_abs_mean", "behaviour_kl", "ref_kl")
             if key in rows[0]}
    means |= {key: statistics.mean(abs(float(row[key])) for row in rows) for key in rows[0]
              if key.startswith("loss_")}
    if "ratio_max" in rows[0]:
        means["ratio_distance"] = statistics.mean(max(float(r["ratio_max"]) - 1, 1 - float(r["ratio_min"]))
                                                  for r in rows)
    norms = [float(row["grad_norm"]) for row in rows]
    means |= {"grad_norm": statistics.median(norms), "grad_norm_max": max(norms)}
    if "surrogate" in rows[0]:
        means |= {"surrogate_first": float(rows[0]["surrogate"]), "surrogate_last": float(rows[-1]["surrogate"])}
    return means


def run_budget(run: Path) -> RunBudget:
    """The :class:`RunBudget` of the run folder ``run`` (its config and tables may be stored as ``NAME.gz``)."""
    folder = RunDir(run)
    rows = folder.read_rows("metrics.csv")
    if len(rows) <= WARM_UP + SMOOTH:
        raise ValueError(f"{run}/metrics.csv has {len(rows)} iterations, fewer than the {WARM_UP + SMOOTH + 1} read.")
    timed = rows[WARM_UP:]
    seconds = {p: statistics.mean(float(r[f"{p}_s"]) for r in timed) for p in PHASES}
    total = statistics.mean(float(r["iteration_s"]) for r in timed)
    seconds |= {"other": total - sum(seconds.values()), "total": total}
    nfe = {p: statistics.mean(float(r[f"nfe_{p}"]) for r in rows) for p in ("rollout", "prepare", "update")}
    nfe["total"] = sum(nfe.values())
    evaluations = [(e["iteration"], float(e["nfe_cumulative"]), float(e["train_seconds"]), float(e["reward_mean"]))
                   for e in folder.read_jsonl("eval.jsonl")]
    if evaluations[0][0] != 0:
        raise ValueError(f"{run}/eval.jsonl starts at iteration {evaluations[0][0]}, not at the base policy's 0.")
    rewards = [float(r["reward_mean"]) for r in rows]
    return RunBudget(
        seconds=seconds, nfe=nfe, steps=float(rows[-1]["grad_steps"]) / len(rows), evaluations=evaluations,
        training_start=statistics.mean(rewards[:SMOOTH]),
        training_middle=statistics.mean(rewards[len(rewards) // 2 - SMOOTH // 2:][:SMOOTH]),
        training_end=statistics.mean(rewards[-SMOOTH:]),
        diagnostics=_diagnostics(rows),
        settings=_step_control_settings(folder.read_config()),
    )


def _spread(values: Sequence[float], fmt: str) -> str:
    """``median (min-max)`` of ``values``, each formatted by ``fmt``; the one value alone when all are equal."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return format(mid, fmt) if low == high else f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"


def _percent(values: Sequence[float]) -> str:
    return _spread([100 * v for v in values], ".0f") + "%"


def _algorithm_block(label: str, runs: list[RunBudget], target: float | None) -> list[str]:
    def each(get: Callable[[RunBudget], float], fmt: str) -> str:
        return _spread([get(run) for run in runs], fmt)

    first = runs[0]
    mid, last = len(first.evaluations) // 2, first.evaluations[-1][0]
    phases = (*PHASES, "other") if any(abs(run.seconds["other"]) >= OTHER_SHOWN for run in runs) else PHASES
    lines = [
        f"{label}: {len(runs)} seeds",
        "  s / iteration      " + "  ".join(f"{p} {each(lambda r, p=p: r.seconds[p], '.2f')}" for p in phases)
        + f"  total {each(lambda r: r.seconds['total'], '.2f')}",
        "  share of seconds   " + "  ".join(f"{p} {_percent([r.seconds[p] / r.seconds['total'] for r in runs])}"
                                            for p in phases),
        "  NFE / sample / it  " + "  ".join(f"{p} {first.nfe[p]:g}" for p in ("rollout", "prepare", "update", "total"))
        + f" (rollout {100 * first.nfe['rollout'] / first.nfe['total']:.0f}%); gradient steps / it {first.steps:g}",
        f"  held-out reward    {each(lambda r: r.evaluations[0][3], '.3f')} -> "
        f"{each(lambda r: r.evaluations[-1][3], '.3f')} at iteration {last}: gain "
        f"{each(lambda r: r.heldout_gain, '+.3f')}",
        f"    gain per 1,000 NFE {each(lambda r: r.gain_rate(0, -1, 'knfe'), '.3f')}, per minute "
        f"{each(lambda r: r.gain_rate(0, -1, 'minute'), '.3f')}, per 10 iterations "
        f"{each(lambda r: 10 * r.heldout_gain / last, '.3f')}, per 10 gradient steps "
        f"{each(lambda r: 10 * r.heldout_gain / (r.steps * last), '.3f')}",
        f"    per 1,000 NFE by half: iterations 0-{first.evaluations[mid][0]} "
        f"{each(lambda r: r.gain_rate(0, mid, 'knfe'), '.3f')}, {first.evaluations[mid][0]}-{last} "
        f"{each(lambda r: r.gain_rate(mid, -1, 'knfe'), '.3f')}",
    ]
    if target is not None:
        reached = [(run, hit) for run in runs if (hit := run.to_target(target)) is not None]
        line = f"    held-out target {target:.3f}: reached on {len(reached)} of {len(runs)}"
        if reached:
            line += (f", at {_spread([hit[0] for _, hit in reached], '.0f')} NFE, "
                     f"{_spread([hit[1] for _, hit in reached], '.0f')} s; gain to it per 1,000 NFE "
                     + _spread([(target - run.evaluations[0][3]) / hit[0] * 1000 for run, hit in reached], ".3f"))
        lines.append(line)
    lines.append(f"  training reward    {each(lambda r: r.training_start, '.3f')} -> "
                 f"{each(lambda r: r.training_end, '.3f')} (means of the first and last {SMOOTH} iterations): gain "
                 f"{each(lambda r: r.training_end - r.training_start, '+.3f')}; by half (the middle {SMOOTH} "
                 f"iterations between) {each(lambda r: r.training_middle - r.training_start, '+.3f')}, "
                 f"{each(lambda r: r.training_end - r.training_middle, '+.3f')}")
    return lines + _step_control_lines(runs)


def _step_control_lines(runs: list[RunBudget]) -> list[str]:
    def each(key: str, fmt: str) -> str:
        return _spread([run.diagnostics[key] for run in runs], fmt)

    diagnostics, settings = runs[0].diagnostics, runs[0].settings
    lines = ["  step control       " + ", ".join(f"{key} {value}" for key, value in sorted(settings.items()))]
    if "clip_fraction" in diagnostics and max(run.diagnostics["ratio_distance"] for run in runs) == 0:
        lines.append("    ratio 1 at every step (one gradient step per rollout, on-policy): the clip cannot act")
    elif "clip_fraction" in diagnostics:
        lines.append(f"    ratio: clip fraction {each('clip_fraction', '.3f')}, gradient removed "
                     f"{each('clip_fraction_active', '.3f')}, largest |ratio - 1| {each('ratio_distance', '.2e')}, "
                     f"approx KL k3 {each('approx_kl_k3', '.1e')}")
    kl_terms = [key for key in ("behaviour_kl", "ref_kl") if key in diagnostics]
    if kl_terms:
        lines.append("    KL: " + ", ".join(f"{key} {each(key, '.2e')} (its loss term {each('loss_' + key, '.2e')})"
                                             for key in kl_terms)
                     + f" against |loss_objective| {each('loss_objective', '.2e')}")
    lines.append(f"    gradient norm {each('grad_norm', '.3f')} (largest {each('grad_norm_max', '.3f')}; clipped at "
                 f"{settings['max_grad_norm']}), groups without signal "
                 f"{_percent([r.diagnostics['zero_std_fraction'] for r in runs])}, "
                 f"|advantage| {each('advantage_abs_mean', '.2f')}")
    if "surrogate_first" in diagnostics:
        lines.append(f"    surrogate mean (minus the weighted denoising loss of its own samples): first iteration "
                     f"{each('surrogate_first', '.3f')}, last {each('surrogate_last', '.3f')}")
    return lines


def _summary_row(task: str, algorithm: str, runs: list[RunBudget]) -> str:
    last = runs[0].evaluations[-1][0]
    cells = [statistics.median(r.nfe["total"] for r in runs), statistics.median(r.seconds["total"] for r in runs),
             statistics.median(r.heldout_gain for r in runs),
             statistics.median(10 * r.heldout_gain / last for r in runs),
             statistics.median(10 * r.heldout_gain / (r.steps * last) for r in runs),
             statistics.median(r.gain_rate(0, -1, "knfe") for r in runs),
             statistics.median(r.gain_rate(0, -1, "minute") for r in runs)]
    return (f"{task:<16}{algorithm:<48}{cells[0]:>5.0f}{cells[1]:>7.2f}" + f"{cells[2]:>+8.3f}"
            + "".join(f"{c:>9.3f}" for c in cells[3:]))


def _comparison_block(label: str, folder: Path, show_tuning: bool, summary: list[str]) -> list[str]:
    protocol = json.loads(read_stored_text(folder / "protocol.json"))
    target = protocol["heldout"]["target"]
    lines = [f"== {label} ({folder.name}; {protocol['budget'][0]}; held-out target {target:.3f}, base "
             f"{protocol['heldout']['base']:.3f}, ceiling {protocol['heldout']['ceiling']:.3f}) =="]
    for algorithm, chosen in protocol["chosen"].items():
        runs = [run_budget(folder / "runs" / run_name(algorithm, chosen["step_control"], chosen["lr"], seed))
                for seed in protocol["reported_seeds"]]
        setting = f"{algorithm} ({chosen['step_control']}, lr {chosen['lr']:g})"
        lines += _algorithm_block(setting, runs, target)
        summary.append(_summary_row(folder.name.removeprefix("compare-mnist-sd3-"), setting, runs))
    return lines + (_tuning_lines(folder, protocol) if show_tuning else []) + [""]


def _tuning_lines(folder: Path, protocol: dict) -> list[str]:
    rates = protocol["learning_rates"]
    lines = [f"tuning seed {protocol['tuning_seed']}: held-out gain at the end (per 1,000 NFE) by step control and "
             f"learning rate " + ", ".join(f"{lr:g}" for lr in rates)]
    for algorithm in (a for a in TUNED if a in protocol["chosen"]):
        for control in protocol["step_controls"][algorithm]:
            cells = []
            for lr in rates:
                run = run_budget(folder / "runs" / run_name(algorithm, control, lr, protocol["tuning_seed"]))
                cells.append(f"{run.heldout_gain:+.3f} ({run.gain_rate(0, -1, 'knfe'):.3f})")
            lines.append(f"  {algorithm + ' ' + control:<32}" + "  ".join(f"{cell:<17}" for cell in cells).rstrip())
    return lines


def _gpu_geneval_block(results: Path, summary: list[str]) -> list[str]:
    folder, protocol_folder = results / "gpu-geneval" / "runs", results / "compare-mnist-sd3-geneval"
    target = json.loads(read_stored_text(protocol_folder / "protocol.json"))["heldout"]["target"]
    lines = [f"== geneval at 150 iterations on one GPU (gpu-geneval; 15 runs side by side, so shared-GPU seconds, not "
             f"a clean timing; the held-out target of {protocol_folder.name}) =="]
    for prefix, (algorithm, setting) in GPU_GENEVAL.items():
        runs = [run_budget(folder / f"{prefix}_seed{seed}") for seed in range(5)]
        lines += _algorithm_block(f"{algorithm} ({setting})", runs, target)
        summary.append(_summary_row("geneval GPU 150", f"{algorithm} ({setting})", runs))
    return lines + [""]


def _lab_lines(results: Path) -> list[str]:
    """The estimator lab on each task's base policy (``iteration-budget/estimators-TASK.json``)."""
    reports = {task: results / "iteration-budget" / f"estimators-{task}.json" for task in LAB_TASKS}
    lines = ["== the surrogate's noise on each task's base policy (estimator lab: one rollout, independent draws of "
             "the K pairs) ==",
             "  gradient cosine between two draws (+- SE): the share of the per-draw gradient's squared norm that is "
             "signal; MC noise share: of the surrogate's within-group variance"]
    for task, path in reports.items():
        report = json.loads(path.read_text())
        setup = report["setup"]
        lines.append(f"  {task} ({setup['prompts']} prompts x {setup['group_size']}, {setup['draws']} draws, "
                     f"{setup['gradient_draws']} gradient draws)")
        for design in LAB_DESIGNS:
            e = report["estimators"][design]
            lines.append(f"    {design:<10} K {e['num_pairs']}: gradient cosine {e['gradient_cosine']:.3f} +- "
                         f"{e['gradient_cosine_se']:.3f}, gradient relative variance "
                         f"{e['gradient_relative_variance']:.2f}, within-group CV {e['within_group_cv']:.4f}, MC noise "
                         f"share {e['mc_noise_share']:.2f}")
    return lines + [""]


def iteration_budget(results: Path) -> str:
    """The report of :mod:`this module <vgrpo_lib.benchmarks.analysis.iteration_budget>` on ``results``."""
    lines = [
        "Where an iteration's time and signal go on MNIST-SD3 (issue 30 item 1), from the comparisons' reported runs.",
        "Cells: median over the reported seeds (min-max). Seconds: means over iterations "
        f"{WARM_UP} on (CPU comparisons: 2 threads); the phases' sum is iteration_s, 'other' (the rest) shown from "
        f"{OTHER_SHOWN} s. NFE: transformer evaluations per sample.",
        "Held-out: the evaluation reward (CFG-free Euler ODE, fixed seeds) from iteration 0 to the end; gain per 1,000 "
        "NFE, per minute of training (train_seconds), per 10 iterations and per 10 gradient steps.",
        "Step-control diagnostics: means over iterations of the mean over each iteration's gradient steps (with two "
        "epochs the first step is on-policy, ratio about 1, so the second step's values are about twice those shown).",
        "",
    ]
    summary: list[str] = []
    for label, folder, show_tuning in COMPARISONS:
        lines += _comparison_block(label, results / folder, show_tuning, summary)
    lines += _gpu_geneval_block(results, summary)
    lines += _lab_lines(results)
    lines += ["== at a glance: medians over the reported seeds ==",
              f"{'comparison':<16}{'algorithm (setting)':<48}{'NFE':>5}{'s/it':>7}{'gain':>8}{'/10 it':>9}"
              f"{'/10 step':>9}{'/1k NFE':>9}{'/minute':>9}", *summary]
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(iteration_budget(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
