"""Seconds per iteration of the three main jobs and their per-phase split (the sentence "One V-GRPO iteration of
the preset costs ..." of docs/results/mnist-sd3.md): means over iterations, the first two left out (warm-up).

    python -m vgrpo_lib.benchmarks.analysis.main_job_phases > results/mnist-sd3/phases.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.analysis import results_parser

__all__ = ["PHASES", "main", "main_job_phases"]

PHASES = ("rollout_s", "reward_s", "prepare_s", "update_s", "iteration_s")


def main_job_phases(results: Path) -> str:
    """One line per main job (``results/mnist-sd3/main-{digit,ocr,geneval}``): mean seconds of each phase and its
    share of the iteration."""
    lines = []
    for task in ("digit", "ocr", "geneval"):
        rows = RunDir(results / "mnist-sd3" / f"main-{task}").read_rows("metrics.csv")[2:]  # metrics.csv or its .gz
        means = {p: statistics.mean(float(r[p]) for r in rows) for p in PHASES}
        lines.append(task + " " + " ".join(f"{p} {means[p]:.3f} ({100 * means[p] / means['iteration_s']:.0f}%)"
                                          for p in PHASES))
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(main_job_phases(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
