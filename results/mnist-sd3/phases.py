"""Seconds per iteration of the three main jobs and their per-phase split (the README's "One V-GRPO iteration of the
preset costs ..." sentence): means over iterations, the first two left out (warm-up).

    python results/mnist-sd3/phases.py > results/mnist-sd3/phases.txt
"""
import statistics
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir

HERE = Path(__file__).parent
PHASES = ("rollout_s", "reward_s", "prepare_s", "update_s", "iteration_s")
for task in ("digit", "ocr", "geneval"):
    rows = RunDir(HERE / f"main-{task}").read_rows("metrics.csv")[2:]  # metrics.csv or its .gz
    means = {p: statistics.mean(float(r[p]) for r in rows) for p in PHASES}
    print(task, " ".join(f"{p} {means[p]:.3f} ({100 * means[p] / means['iteration_s']:.0f}%)" for p in PHASES))
