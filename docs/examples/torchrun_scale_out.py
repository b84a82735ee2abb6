"""Scaling out with torchrun: the same `vgrpo train`, one process per device.

Each process owns whole prompt groups (no gather of rewards for the advantages), DDP averages the gradients, rank 0
evaluates and writes the run folder; `distributed.strategy=fsdp2` shards a model that does not fit once per
device. On a CPU the processes talk over gloo, which is how this script runs anywhere: two processes on the tiny
8x8-digits task. On a GPU node the command is the same with `--nproc_per_node 8` and a real preset:

    torchrun --nproc_per_node 8 -m vgrpo_lib.algorithms.cli train --algo vgrpo --preset sd3.5-medium \
        model.prompts=prompts/train.txt --out runs/sd35m-vgrpo

    python docs/examples/torchrun_scale_out.py       # under a minute on a CPU
"""

import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# A tiny run: 2 iterations of 4 prompts x 4 samples on the 8x8 digits; prompts_per_iteration must be divisible by
# the number of processes (each takes 2 whole prompt groups).
TINY = ["task=digits8", "iterations=2", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=6",
        "eval.per_prompt=3", "eval.num_steps=6", "eval.every=0", "checkpoint_every=1"]

with tempfile.TemporaryDirectory() as tmp:
    run_dir = Path(tmp) / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "vgrpo_lib.algorithms.cli", "train", "--algo", "vgrpo", "--out", str(run_dir), *TINY]
    # One thread per process: two processes on a small machine should not contend for its cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(" ".join(command[1:]))
    subprocess.run(command, env=env, check=True, timeout=600)

    # Rank 0 wrote the run folder: the config, one metrics row per iteration, the evaluations and the checkpoints.
    rows = list(csv.DictReader(open(run_dir / "metrics.csv")))
    print(f"iterations: {len(rows)}, last reward_mean: {float(rows[-1]['reward_mean']):.3f}")
    assert [int(row["iteration"]) for row in rows] == [0, 1], rows
    assert (run_dir / "config.json").is_file() and (run_dir / "eval.csv").is_file()
    print("checkpoints:", sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*.pt")))
    assert any((run_dir / "checkpoints").glob("iter_*.pt"))
print("two processes trained one run to its end")
