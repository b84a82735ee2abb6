"""How much of each comparison run's wall-clock its process spent computing: ``train_cpu_s / train_seconds`` at its
last iteration, and its iteration with the largest wall-clock beyond its CPU time.

The comparisons on a two-core machine run single-threaded (``OMP_NUM_THREADS=1``), each pinned to one core, where a
run alone on its core spends 0.95-0.99 of its wall-clock on the CPU. A lower share means the wall-clock, and with it
every time to target, was inflated by something else: a paused process (``kill -STOP``: one iteration of minutes
with seconds of CPU) or other work on the same core (every iteration slower). The protocol's times are wall-clock,
so such a run is made again (moved out of the comparison, which then trains it anew) before its numbers are reported.

    python -m vgrpo_lib.benchmarks.analysis.cpu_share DIR [--below 0.9]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir

__all__ = ["CONTENDED_BELOW", "cpu_share", "main"]

CONTENDED_BELOW = 0.9


def cpu_share(comparison: Path, below: float = CONTENDED_BELOW) -> str:
    """A line per run under ``comparison/runs`` with a finished iteration: its CPU share, wall-clock and CPU seconds,
    the iteration that lost the most wall-clock beyond its CPU time, and ``CONTENDED`` below ``below``; then a count."""
    lines, contended = [], 0
    for run in sorted(path for path in (comparison / "runs").iterdir() if path.is_dir()):
        rows = RunDir(run).read_rows("metrics.csv")
        if not rows:
            continue
        previous_cpu, worst = 0.0, (0.0, None)
        for row in rows:
            lost = row["iteration_s"] - (row["train_cpu_s"] - previous_cpu)
            worst = max(worst, (lost, row), key=lambda pair: pair[0])
            previous_cpu = row["train_cpu_s"]
        share = rows[-1]["train_cpu_s"] / rows[-1]["train_seconds"]
        contended += share < below
        lost, row = worst
        iteration = "" if row is None else (f"; iteration {row['iteration']}: {row['iteration_s']:.1f} s wall, "
                                            f"{row['iteration_s'] - lost:.1f} s CPU")
        lines.append(f"{run.name}: CPU share {share:.2f} ({rows[-1]['train_cpu_s']:.0f} of "
                     f"{rows[-1]['train_seconds']:.0f} s{iteration}){'  CONTENDED' if share < below else ''}")
    lines.append(f"{contended} of {len(lines)} runs below a CPU share of {below:g}")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", type=Path, help="a `vgrpo compare` folder (or any folder with runs/)")
    parser.add_argument("--below", type=float, default=CONTENDED_BELOW, help="the share that marks a run contended")
    args = parser.parse_args(argv)
    if not (args.comparison / "runs").is_dir():
        parser.error(f"{args.comparison} has no runs/ folder")
    sys.stdout.write(cpu_share(args.comparison, args.below))
    return 0


if __name__ == "__main__":
    sys.exit(main())
