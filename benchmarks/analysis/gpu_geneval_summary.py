"""The GenEval comparison at 150 iterations on one GPU, from the runs' tables: held-out GenEval overall (reward
detector and judge) per evaluation, the differences to V-GRPO at the end with bootstrap intervals, the same at an
equal number of transformer evaluations (NFE), and the six categories at the end.

    python -m vgrpo_lib.benchmarks.analysis.gpu_geneval_summary > results/gpu-geneval/summary.txt
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.analysis import results_parser

__all__ = ["difference_interval", "gpu_geneval_summary", "main"]

SEEDS = range(5)
SETTINGS = {  # run-name prefix: label
    "vgrpo": "V-GRPO (paper soft clip, lr 1e-3; chosen)",
    "diffusion_nft": "DiffusionNFT (two minibatches, lr 1e-3; chosen)",
    "flow_grpo": "Flow-GRPO (two minibatches, lr 1e-4; chosen)",
    "flow_grpo_one_step_lr0.001": "Flow-GRPO (one step, lr 1e-3)",
    "flow_grpo_two_epochs_lr0.001": "Flow-GRPO (two epochs, lr 1e-3)",
    "flow_grpo_two_minibatches_lr0.001": "Flow-GRPO (two minibatches, lr 1e-3)",
}
CATEGORIES = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
RESAMPLES, LEVEL = 10_000, 0.90


def _evaluations(runs: Path, prefix: str) -> list[list[dict]]:
    return [RunDir(runs / f"{prefix}_seed{seed}").read_jsonl("eval.jsonl") for seed in SEEDS]


def _at(runs: list[list[dict]], iteration: int, key: str) -> list[float]:
    return [next(e[key] for e in run if e["iteration"] == iteration) for run in runs]


def difference_interval(a: list[float], b: list[float], seed: int = 0) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its bootstrap interval (each list resampled on its own, fixed RNG)."""
    rng = random.Random(seed)
    draws = sorted(statistics.mean(rng.choices(a, k=len(a))) - statistics.mean(rng.choices(b, k=len(b)))
                   for _ in range(RESAMPLES))
    tail = (1 - LEVEL) / 2
    return (statistics.mean(a) - statistics.mean(b), draws[int(tail * (RESAMPLES - 1))],
            draws[int((1 - tail) * (RESAMPLES - 1))])


def gpu_geneval_summary(results: Path) -> str:
    """The report of the GenEval runs in ``results/gpu-geneval/runs``."""
    runs_dir = results / "gpu-geneval" / "runs"
    lines: list[str] = []

    def out(text: str = "") -> None:
        lines.extend(text.split("\n"))

    runs = {prefix: _evaluations(runs_dir, prefix) for prefix in SETTINGS}
    iterations = [e["iteration"] for e in runs["vgrpo"][0]]
    last = iterations[-1]
    out(f"Held-out GenEval overall by the reward detector (judge), mean of seeds {list(SEEDS)}; 87 specs x 2 images "
          f"per seed, CFG-free, 20 Euler steps")
    out(f"{'setting':<50}{'NFE/it':>7}" + "".join(f"{'it ' + str(i):>15}" for i in iterations))
    for prefix, label in SETTINGS.items():
        nfe = _at(runs[prefix], last, "nfe_cumulative")[0] / last
        cells = "".join(f"{statistics.mean(_at(runs[prefix], i, 'accuracy')):>7.3f} ({statistics.mean(_at(runs[prefix], i, 'judge_accuracy')):.3f})"
                        for i in iterations)
        out(f"{label:<50}{nfe:>7.0f}{cells}")

    out(f"\nAt iteration {last}: per seed, and V-GRPO minus each ({LEVEL:.0%} bootstrap interval, {RESAMPLES} resamples)")
    reference = runs["vgrpo"]
    for key in ("accuracy", "judge_accuracy", "reward_mean"):
        out(f"  {key}")
        for prefix, label in SETTINGS.items():
            values = _at(runs[prefix], last, key)
            line = f"    {label:<50} {statistics.mean(values):.3f} [{', '.join(f'{v:.3f}' for v in values)}]"
            if prefix != "vgrpo":
                diff, low, high = difference_interval(_at(reference, last, key), values)
                line += f"   V-GRPO - this: {diff:+.3f} [{low:+.3f}, {high:+.3f}]"
            out(line)

    budget = _at(reference, last, "nfe_cumulative")[0]
    out(f"\nAt an equal number of transformer evaluations per sample ({budget}, V-GRPO's {last} iterations): the last "
          f"evaluation of each setting within it")
    for prefix, label in SETTINGS.items():
        within = [max((e for e in run if e["nfe_cumulative"] <= budget), key=lambda e: e["iteration"]) for run in runs[prefix]]
        values = [e["accuracy"] for e in within]
        line = f"  {label:<50} iteration {within[0]['iteration']:>3}: overall {statistics.mean(values):.3f} (judge {statistics.mean(e['judge_accuracy'] for e in within):.3f})"
        if prefix != "vgrpo":
            diff, low, high = difference_interval(_at(reference, last, "accuracy"), values)
            line += f"   V-GRPO - this: {diff:+.3f} [{low:+.3f}, {high:+.3f}]"
        out(line)

    out(f"\nCategories at iteration {last}, reward detector / judge, mean of seeds (base in the first row)")
    out(f"{'':<50}" + "".join(f"{c:>16}" for c in CATEGORIES))
    rows = {"base (iteration 0)": (runs["vgrpo"], 0)} | {label: (runs[p], last) for p, label in SETTINGS.items()}
    for label, (group, iteration) in rows.items():
        out(f"{label:<50}" + "".join(
            f"{statistics.mean(_at(group, iteration, 'geneval/' + c)):>9.2f} / {statistics.mean(_at(group, iteration, 'judge_geneval/' + c)):.2f}"
            for c in CATEGORIES))

    out(f"\nTraining seconds for {last} iterations, 15 runs sharing one H200 and 16 CPU cores (one thread each; the "
          f"chosen settings in one call, Flow-GRPO's lr 1e-3 settings in a second call on another H200): not a clean "
          f"per-algorithm time, the same sharing for all")
    for prefix, label in SETTINGS.items():
        seconds = [RunDir(runs_dir / f"{prefix}_seed{s}").read_rows("metrics.csv")[-1]["train_seconds"] for s in SEEDS]
        out(f"  {label:<50} {statistics.mean(seconds):.0f} s (per iteration {statistics.mean(seconds) / last:.2f} s)")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(gpu_geneval_summary(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
