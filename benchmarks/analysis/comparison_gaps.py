"""Wall-clock between one run's last evaluation and the next run's start (file times of the runs' tables): the
comparison's time outside its runs (pauses, SIGSTOP, for tests and checks on the same machine), for the tuning runs
and the reported runs apart (the 5-seed reported runs were made in a later session than the tuning runs).
File times are those of the machine that ran it: a git checkout resets them, so run this where the runs were made
(`vgrpo compress` keeps a config's or table's time on its compressed copy).

    python -m vgrpo_lib.benchmarks.analysis.comparison_gaps results/compare-mnist-sd3-geneval \
        > results/compare-mnist-sd3-geneval/gaps.txt
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, stored_path
from vgrpo_lib.benchmarks.compare import TUNING_SEED

__all__ = ["comparison_gaps", "main"]


def _started(run: Path) -> float:
    """When ``run`` started: the time of its config (``config.json`` or its compressed copy)."""
    return os.path.getmtime(RunDir(run).stored_config_path)


def _finished(run: Path) -> float:
    """When ``run`` wrote its last evaluation: the time of its ``eval.jsonl`` (or its compressed copy)."""
    return os.path.getmtime(stored_path(run / "eval.jsonl"))


def comparison_gaps(comparison: Path) -> str:
    """The gaps between the runs of the comparison folder ``comparison`` (its ``runs/``), tuning and reported."""
    runs = sorted((comparison / "runs").iterdir(), key=_started)
    phases = {"tuning": [run for run in runs if run.name.endswith(f"_seed{TUNING_SEED}")],
              "reported": [run for run in runs if not run.name.endswith(f"_seed{TUNING_SEED}")]}
    lines = []
    for phase, group in phases.items():
        total = 0.0
        for before, after in zip(group, group[1:]):
            gap = _started(after) - _finished(before)
            total += gap
            lines.append(f"{before.name} -> {after.name}: {gap:.0f} s")
        span = _finished(group[-1]) - _started(group[0])
        lines.append(f"{phase} runs ({len(group)}): {span / 60:.1f} min from the first start to the last evaluation, "
                     f"{total:.0f} s ({total / 60:.1f} min) of it between runs")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", type=Path, help="a comparison's --out folder (with runs/)")
    sys.stdout.write(comparison_gaps(parser.parse_args(argv).comparison))
    return 0


if __name__ == "__main__":
    sys.exit(main())
