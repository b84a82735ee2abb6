"""Each algorithm's training reward at iteration 0, on the tuning seed (the same prompts and base policy for all),
mean over its tuning runs, in every comparison that keeps its runs' tables. The protocol's target is a training
reward, measured on each algorithm's own rollout: an algorithm whose rollout sampler (an SDE, or an ODE with an
SDE window) scores higher than the ODE rollout at the same weights needs less gain to reach it.

    python results/first_iteration_rewards.py > results/first_iteration_rewards.txt
"""
import statistics
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.compare import TUNING_SEED

RESULTS = Path(__file__).parent
for comparison in sorted(p.parent for p in RESULTS.glob("*/runs")):
    first = {}
    for run in sorted((comparison / "runs").iterdir()):
        if run.name.endswith(f"_seed{TUNING_SEED}"):
            variant = RunDir(run).read_config()["algo"]
            first.setdefault(variant, []).append(RunDir(run).read_rows("metrics.csv")[0]["reward_mean"])
    if first:
        print(f"{comparison.name:<34}" + "  ".join(f"{v} {statistics.mean(r):.3f} ({len(r)} runs)" for v, r in first.items()))
