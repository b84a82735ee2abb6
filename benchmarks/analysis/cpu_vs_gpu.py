"""The mnist-sd3 V-GRPO main job on the H200 (``results/gpu-run/mnist_sd3_vgrpo/``) against the same job on 2 CPU
cores (``results/mnist-sd3/main-digit/``): seconds per iteration by phase, the training-reward trajectories, the
held-out evaluations.

    python -m vgrpo_lib.benchmarks.analysis.cpu_vs_gpu > results/gpu-run/cpu_vs_gpu.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.analysis import results_parser

__all__ = ["cpu_vs_gpu", "main"]


def cpu_vs_gpu(results: Path) -> str:
    """The comparison of the two runs under ``results``."""
    runs = {"H200": results / "gpu-run" / "mnist_sd3_vgrpo", "2 CPU cores": results / "mnist-sd3" / "main-digit"}
    lines: list[str] = []

    def out(text: str = "") -> None:
        lines.extend(text.split("\n"))

    metrics = {name: RunDir(run).read_rows("metrics.csv") for name, run in runs.items()}  # metrics.csv or its .gz
    out("median seconds per iteration (iterations 1-299; iteration 0 holds CUDA's start-up):")
    out(f"{'phase':<14}" + "".join(f"{name:>14}" for name in runs) + f"{'CPU / H200':>12}")
    for phase in ITERATION_PHASES:
        medians = [statistics.median(float(r[phase]) for r in m[1:]) for m in metrics.values()]
        out(f"{phase:<14}" + "".join(f"{v:>14.3f}" for v in medians) + f"{medians[1] / medians[0]:>12.1f}")
    wall = {name: float(m[-1]["train_seconds"]) for name, m in metrics.items()}
    out("training seconds (sum of iterations, evaluations excluded): "
          + ", ".join(f"{name} {seconds:.0f}" for name, seconds in wall.items()))

    gpu, cpu = ([float(r["reward_mean"]) for r in m] for m in metrics.values())
    gaps = [abs(g - c) for g, c in zip(gpu, cpu)]
    out(f"\ntraining reward, H200 - CPU, over {len(gaps)} iterations: max |difference| {max(gaps):.4f}, "
          f"mean {statistics.mean(gaps):.4f} (the noise is drawn on the CPU from the same seeds on both; "
          f"the runs differ by float rounding in the model)")

    out("\nheld-out evaluations (iteration: accuracy H200 / CPU, judge H200 / CPU):")
    evals = {name: RunDir(run).read_jsonl("eval.jsonl") for name, run in runs.items()}
    for g, c in zip(*evals.values()):
        out(f"  {g['iteration']:>3}: {g['accuracy']:.3f} / {c['accuracy']:.3f}   "
              f"{g['judge_accuracy']:.3f} / {c['judge_accuracy']:.3f}")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(cpu_vs_gpu(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
