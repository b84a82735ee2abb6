"""Wall-clock between one run's last evaluation and the next run's start (file times of the runs' tables): the
comparison's time outside its runs, here mostly pauses (SIGSTOP) for tests and checks on the same machine.
File times are those of the machine that ran it: a git checkout resets them, so run this where the runs were made
(`vgrpo compress` keeps a table's time on its compressed copy).

    python results/compare-mnist-sd3-geneval/gaps.py > results/compare-mnist-sd3-geneval/gaps.txt
"""
import os
from pathlib import Path

from algorithms.run_dir import compressed_path

runs = sorted((Path(__file__).parent / "runs").iterdir(), key=lambda run: os.path.getmtime(run / "config.json"))
total = 0.0
for before, after in zip(runs, runs[1:]):
    evaluations = before / "eval.jsonl"
    gap = os.path.getmtime(after / "config.json") - os.path.getmtime(
        evaluations if evaluations.exists() else compressed_path(evaluations))
    total += gap
    print(f"{before.name} -> {after.name}: {gap:.0f} s")
print(f"between runs in all: {total:.0f} s ({total / 60:.1f} min)")
