"""Random kills: a training run SIGKILLed at random moments, resumed each time, must end as the uninterrupted run.

The adversarial trial of the reliability issue as a repeatable benchmark. One uninterrupted run of the tiny
testbed configuration gives the reference and its duration ``T``; then one run is started and killed ``--kills``
times, each time after a uniform random delay in ``[0, T]`` from its (re)start (so kills land while Python starts,
while the run trains, evaluates, writes a checkpoint or prunes old ones), and restarted after each kill:
``--resume`` when the folder holds a run (its config: :meth:`RunDir.exists`), else the original command. After the last kill the
run finishes. The figure is whether its final checkpoint (policy, optimizer state, the trainer's generator, the
global torch and Python RNGs) and every metrics row equal the uninterrupted run's (:func:`run_differences`), with
where each kill landed (return code, the newest checkpoint then, leftover temporary files).

    python -m vgrpo_lib.benchmarks.reliability [--kills 10] [--seed 0] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from vgrpo_lib.algorithms.run_dir import RunDir, read_csv

__all__ = [
    "REPO", "RUN_ARGS", "WAIT_S", "train_command", "metrics_without_timing", "run_differences", "random_kills", "main",
]

REPO = Path(__file__).resolve().parents[1]
# The tiny testbed run of the kill tests (tests/algorithms/conftest.py TINY): 8x8 digits, 4 prompts x 4 images.
RUN_ARGS = ["task=digits8", "iterations=8", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=6",
            "eval.per_prompt=3", "eval.num_steps=6", "eval.every=4", "checkpoint_every=1",
            "optim.epochs=2", "optim.minibatch_size=8"]
WAIT_S = 900


def train_command(out: Path, args: list[str], resume: bool = False) -> list[str]:
    """``vgrpo train`` of ``args`` into ``out`` (V-GRPO), or its ``--resume``."""
    base = [sys.executable, "-m", "vgrpo_lib.algorithms.cli", "train", "--out", str(out)]
    return base + ["--resume"] if resume else base + ["--algo", "vgrpo", *args]


def metrics_without_timing(out: Path) -> list[dict]:
    """The rows of ``out/metrics.csv`` without their wall-clock columns (which differ between any two runs)."""
    return [{k: v for k, v in row.items() if not k.endswith(("_s", "train_seconds"))} for row in read_csv(out / "metrics.csv")]


def run_differences(expected_dir: Path, resumed_dir: Path) -> list[str]:
    """What differs between two runs' newest checkpoints and metrics (empty: identical in every stream)."""
    expected, resumed = RunDir(expected_dir).load_latest_checkpoint(), RunDir(resumed_dir).load_latest_checkpoint()
    if resumed is None or resumed["iteration"] != expected["iteration"]:
        return [f"newest checkpoint: iteration {None if resumed is None else resumed['iteration']}, "
                f"expected {expected['iteration']}"]
    found = [f"policy[{k}]" for k in expected["policy"] if not torch.equal(expected["policy"][k], resumed["policy"][k])]
    for slot, state in expected["optimizer"]["state"].items():
        found += [f"optimizer[{slot}][{name}]" for name, value in state.items()
                  if not torch.equal(value, resumed["optimizer"]["state"][slot][name])]
    if not torch.equal(expected["rng"]["torch"], resumed["rng"]["torch"]):
        found.append("global torch RNG")
    if expected["rng"]["python"] != resumed["rng"]["python"]:
        found.append("Python RNG")
    if not torch.equal(expected["generator"], resumed["generator"]):
        found.append("trainer generator")
    if metrics_without_timing(resumed_dir) != metrics_without_timing(expected_dir):
        found.append("metrics.csv rows")
    return found


def _landing(out: Path) -> dict:
    """Where a kill landed: the newest checkpoint on disk and the temporary files of unfinished writes."""
    checkpoints = RunDir(out).checkpoint_paths() if RunDir(out).exists() else []
    return {"newest_checkpoint": checkpoints[-1].name if checkpoints else None,
            "temp_files": sorted(p.name for p in out.rglob(".*.tmp")) if out.exists() else []}


def random_kills(kills: int, seed: int, work: Path, args: list[str] = RUN_ARGS, log=print) -> dict:
    """Run the trial in ``work`` (see the module doc); returns the record the benchmark writes.

    A trial is one run folder, killed and restarted until a restart finishes before its kill lands; its
    final state is then compared with the uninterrupted run's, and the next trial starts in a new folder,
    until ``kills`` kills have landed."""
    straight = work / "straight"
    start = time.perf_counter()
    subprocess.run(train_command(straight, args), check=True, cwd=REPO, capture_output=True, timeout=WAIT_S)
    duration = time.perf_counter() - start
    log(f"uninterrupted run: {duration:.1f} s")
    rng = random.Random(seed)
    record = {"kills_asked": kills, "seed": seed, "uninterrupted_s": round(duration, 2), "kills": [], "trials": []}
    trial_kills = 0
    while True:
        killed = work / f"trial_{len(record['trials'])}"
        resume = RunDir(killed).exists()
        done = len(record["kills"]) >= kills
        delay = WAIT_S if done else rng.uniform(0.0, duration)
        process = subprocess.Popen(train_command(killed, args, resume), cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        try:
            process.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
        code = process.wait(timeout=WAIT_S)
        if code == -signal.SIGKILL:
            trial_kills += 1
            landing = {"trial": len(record["trials"]), "delay_s": round(delay, 2), "return_code": code,
                       "restarted_with": "--resume" if resume else "train", **_landing(killed)}
            record["kills"].append(landing)
            log(f"kill {len(record['kills'])}/{kills} after {delay:.1f} s: {landing}")
            continue
        if code != 0:
            raise RuntimeError(f"{killed.name}: the run failed with exit code {code}:\n{process.stderr.read()}")
        differences = run_differences(straight, killed)
        record["trials"].append({"kills": trial_kills, "differences": differences,
                                 "temp_files_left": _landing(killed)["temp_files"]})
        log(f"{killed.name} finished after {trial_kills} kills: "
            + ("identical to the uninterrupted run" if not differences else f"DIFFERS in {differences}"))
        trial_kills = 0
        if done:
            break
    record["identical"] = all(not t["differences"] and not t["temp_files_left"] for t in record["trials"])
    last = RunDir(straight).checkpoint_paths()[-1].name  # the run's final checkpoint
    newest = [k["newest_checkpoint"] for k in record["kills"]]
    record["kills_before_first_checkpoint"] = newest.count(None)
    record["kills_between_checkpoints"] = sum(n not in (None, last) for n in newest)
    record["kills_after_last_checkpoint"] = newest.count(last)
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the record to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        record = random_kills(args.kills, args.seed, Path(work))
    text = json.dumps(record, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if record["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
