"""How fast each cell of an ablation trains, not only where it ends: the mean training reward of its seeds at a few
iterations, and the median first iteration at which a seed's reward reaches a target.

    python -m vgrpo_lib.benchmarks.analysis.training_speed results/toy2d-regime --target 0.8 \
        > results/toy2d-regime/training_speed.txt

The ablation's ``paper.md`` reports each cell's final reward (the mean of its last three iterations); on a task whose
reward saturates, cells that end alike can still differ in how soon they get there, which is what this reads from
the runs' ``metrics.csv`` (``runs/<cell>_seed<k>/``).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir

__all__ = ["main", "training_speed"]

CHECKPOINTS = (0, 5, 10, 20)  # iterations at which the mean reward is shown (and the last one)


def _runs_by_cell(folder: Path) -> dict[str, list[Path]]:
    cells: dict[str, list[Path]] = {}
    for run in sorted(folder.glob("runs/*_seed*")):
        cells.setdefault(re.sub(r"_seed\d+$", "", run.name), []).append(run)
    if not cells:
        raise FileNotFoundError(f"{folder} holds no runs/<cell>_seed<k>/ folders (the output of vgrpo ablations).")
    return cells


def _first_reaching(rewards: list[float], target: float) -> float:
    return next((float(i) for i, reward in enumerate(rewards) if reward >= target), float("inf"))


def training_speed(folder: Path, target: float) -> str:
    """The table of :mod:`this module <vgrpo_lib.benchmarks.analysis.training_speed>` for the ablation in
    ``folder``: one row per cell, its runs' training rewards (``reward_mean`` per iteration) read back."""
    cells = _runs_by_cell(folder)
    curves = {cell: [[row["reward_mean"] for row in RunDir(run).read_rows("metrics.csv")] for run in runs]
              for cell, runs in cells.items()}
    last = min(len(curve) for runs in curves.values() for curve in runs) - 1
    shown = [i for i in CHECKPOINTS if i < last] + [last]
    header = f"{'cell':<24}" + "".join(f"{f'it {i}':>9}" for i in shown) + f"{f'to {target:g}':>10}  seeds reaching"
    lines = [f"mean training reward of the seeds at iteration i; 'to {target:g}': the median first iteration at which "
             f"a seed's reward reaches {target:g} (inf: not reached)", header]
    for cell, runs in curves.items():
        means = "".join(f"{statistics.mean(curve[i] for curve in runs):>9.3f}" for i in shown)
        firsts = [_first_reaching(curve, target) for curve in runs]
        reached = sum(first != float("inf") for first in firsts)
        lines.append(f"{cell:<24}{means}{statistics.median(firsts):>10g}  {reached}/{len(runs)}")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="an ablation's --out folder (with runs/<cell>_seed<k>/)")
    parser.add_argument("--target", type=float, required=True, help="the training reward a seed must reach")
    args = parser.parse_args(argv)
    sys.stdout.write(training_speed(args.folder, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
