"""The mnist-sd3 V-GRPO main job on the H200 (mnist_sd3_vgrpo/) against the same job on 2 CPU cores
(results/mnist-sd3/main-digit/): seconds per iteration by phase, the training-reward trajectories, the held-out
evaluations. Run from the repository root: PYTHONPATH=. python results/gpu-run/cpu_vs_gpu.py > results/gpu-run/cpu_vs_gpu.txt"""

import statistics
from pathlib import Path

from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.algorithms.run_dir import RunDir

RUNS = {"H200": Path("results/gpu-run/mnist_sd3_vgrpo"), "2 CPU cores": Path("results/mnist-sd3/main-digit")}


metrics = {name: RunDir(run).read_rows("metrics.csv") for name, run in RUNS.items()}  # metrics.csv or its .gz
print("median seconds per iteration (iterations 1-299; iteration 0 holds CUDA's start-up):")
print(f"{'phase':<14}" + "".join(f"{name:>14}" for name in RUNS) + f"{'CPU / H200':>12}")
for phase in ITERATION_PHASES:
    medians = [statistics.median(float(r[phase]) for r in m[1:]) for m in metrics.values()]
    print(f"{phase:<14}" + "".join(f"{v:>14.3f}" for v in medians) + f"{medians[1] / medians[0]:>12.1f}")
wall = {name: float(m[-1]["train_seconds"]) for name, m in metrics.items()}
print("training seconds (sum of iterations, evaluations excluded): "
      + ", ".join(f"{name} {seconds:.0f}" for name, seconds in wall.items()))

gpu, cpu = ([float(r["reward_mean"]) for r in m] for m in metrics.values())
gaps = [abs(g - c) for g, c in zip(gpu, cpu)]
print(f"\ntraining reward, H200 - CPU, over {len(gaps)} iterations: max |difference| {max(gaps):.4f}, "
      f"mean {statistics.mean(gaps):.4f} (the noise is drawn on the CPU from the same seeds on both; "
      f"the runs differ by float rounding in the model)")

print("\nheld-out evaluations (iteration: accuracy H200 / CPU, judge H200 / CPU):")
evals = {name: RunDir(run).read_jsonl("eval.jsonl") for name, run in RUNS.items()}
for g, c in zip(*evals.values()):
    print(f"  {g['iteration']:>3}: {g['accuracy']:.3f} / {c['accuracy']:.3f}   "
          f"{g['judge_accuracy']:.3f} / {c['judge_accuracy']:.3f}")
