"""Time per training iteration at 1 and 2 (or more) gloo processes on the same global batch.

A sanity check of the multi-process communication pattern (global draws, reward all-gather, DDP gradient
all-reduce, metric reduction), not a speed claim: on a CPU machine the processes share its cores and
memory bandwidth. Each process uses one torch thread, so N processes use N cores; the speed-up of N
processes over one is ``iteration_s[1] / iteration_s[N]`` (ideal: N). Evaluation and file writing are left
out (the loop calls ``Trainer.step``).

The task's shipped base policy is used when its checkpoint exists; otherwise a seeded, randomly initialised
``VelocityMLP`` of the same default architecture stands in (the cost of an iteration does not depend on the
weights), and the JSON says so.

    python -m vgrpo_lib.benchmarks.scaling [--task digit] [--algo vgrpo] [--processes 1 2] [--iterations 5] [--out FILE]
                                 [key=value ...]       (e.g. distributed.strategy=fsdp2)
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.algorithms.run_dir import atomic_write_text
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.distributed import shutdown
from vgrpo_lib.integrations.testbed.tasks import get_task

__all__ = ["WARMUP", "measure", "main"]

WARMUP = 1


def _worker(rank: int, world_size: int, port: int, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(minutes=5)
    )
    config = build_config(args.algo, args.task, "testbed", [f"iterations={WARMUP + args.iterations}", *args.overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(config, Path(run_dir) / "run", progress=False)
        rows = [trainer.step() for _ in range(WARMUP + args.iterations)][WARMUP:]
        del trainer  # its DDP wrapper must go before the process group (see distributed.shutdown)
    # The slowest process sets the pace: report the max over processes of each phase's median.
    medians = torch.tensor([statistics.median(row[phase] for row in rows) for phase in ITERATION_PHASES], dtype=torch.float64)
    dist.all_reduce(medians, dist.ReduceOp.MAX)
    if rank == 0:
        Path(out).write_text(json.dumps(dict(zip(ITERATION_PHASES, medians.tolist()))))
    shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace, world_size: int) -> dict:
    """Median seconds per phase of an iteration with ``world_size`` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        mp.start_processes(_worker, args=(world_size, _free_port(), args, out), nprocs=world_size, start_method="spawn")
        return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="digit")
    parser.add_argument("--algo", default="vgrpo")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iterations", type=int, default=5, help=f"timed iterations (after {WARMUP} warm-up)")
    parser.add_argument("--out", default=None, help="also write the JSON result to this file")
    parser.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. prompts_per_iteration=8")
    args = parser.parse_args(argv)
    config = build_config(args.algo, args.task, "testbed", args.overrides)
    timings = {str(n): measure(args, n) for n in args.processes}
    single = timings[str(min(args.processes))]["iteration_s"]
    result = {
        "task": args.task,
        "algo": args.algo,
        "policy": get_task(args.task).policy_name,
        "global_batch": config.prompts_per_iteration * config.group_size,
        "torch_threads_per_process": 1,
        "cpu_count": torch.multiprocessing.cpu_count(),
        "seconds_per_iteration": {n: round(t["iteration_s"], 4) for n, t in timings.items()},
        "phases_s": {n: {k: round(v, 4) for k, v in t.items() if k != "iteration_s"} for n, t in timings.items()},
        "speedup": {n: round(single / t["iteration_s"], 3) for n, t in timings.items()},
        "overrides": args.overrides,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        atomic_write_text(args.out, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
