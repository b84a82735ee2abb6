"""Each algorithm's training reward at iteration 0, on the tuning seed (the same prompts and base policy for all),
mean over its tuning runs, in every comparison that keeps its runs' tables. The protocol's target is a training
reward, measured on each algorithm's own rollout: an algorithm whose rollout sampler (an SDE, or an ODE with an
SDE window) scores higher than the ODE rollout at the same weights needs less gain to reach it.

    python -m vgrpo_lib.benchmarks.analysis.first_iteration_rewards > results/first_iteration_rewards.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.analysis import results_parser
from vgrpo_lib.benchmarks.compare import TUNING_SEED

__all__ = ["first_iteration_rewards", "main"]


def first_iteration_rewards(results: Path) -> str:
    """One line per comparison under ``results`` with a ``runs/`` folder: each algorithm's mean iteration-0
    training reward over its tuning runs."""
    lines = []
    for comparison in sorted(p.parent for p in results.glob("*/runs")):
        first: dict[str, list[float]] = {}
        for run in sorted((comparison / "runs").iterdir()):
            if run.name.endswith(f"_seed{TUNING_SEED}"):
                variant = RunDir(run).read_config()["algo"]
                first.setdefault(variant, []).append(RunDir(run).read_rows("metrics.csv")[0]["reward_mean"])
        if first:
            lines.append(f"{comparison.name:<34}" + "  ".join(f"{v} {statistics.mean(r):.3f} ({len(r)} runs)"
                                                           for v, r in first.items()))
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(first_iteration_rewards(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
