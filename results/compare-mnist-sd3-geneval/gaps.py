"""Wall-clock between one run's last evaluation and the next run's start (file times of the runs' tables): the
comparison's time outside its runs, here mostly pauses (SIGSTOP) for tests and checks on the same machine.
File times are those of the machine that ran it: a git checkout resets them, so run this where the runs were made.

    python results/compare-mnist-sd3-geneval/gaps.py > results/compare-mnist-sd3-geneval/gaps.txt
"""
import os
from pathlib import Path

runs = sorted((Path(__file__).parent / "runs").iterdir(), key=lambda run: os.path.getmtime(run / "config.json"))
total = 0.0
for before, after in zip(runs, runs[1:]):
    gap = os.path.getmtime(after / "config.json") - os.path.getmtime(before / "eval.jsonl")
    total += gap
    print(f"{before.name} -> {after.name}: {gap:.0f} s")
print(f"between runs in all: {total:.0f} s ({total / 60:.1f} min)")
