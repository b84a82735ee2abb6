"""Two "nodes" on this machine: ``torchrun --nnodes 2 --nproc_per_node 1`` with c10d rendezvous, gloo, one process each,
through the ``vgrpo train`` command, makes the 1-process run's weight changes (up to float32 summation order) and logs
its metrics rows. The launch is the multi-node command of docs/tutorials/remote-rewards-and-nodes.md with 127.0.0.1 as
the rendezvous host. As in tests/integrations/test_distributed.py, the runs train with SGD with momentum in AdamW's
place (tests/same_steps.py says why)."""

from __future__ import annotations

import csv
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.integrations.testbed.tasks import get_task
from tests.same_steps import assert_same_changes

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900  # two launchers and two trainers on a loaded 2-core machine
METRICS_RTOL, METRICS_ATOL = 1e-4, 1e-6
ARGS = ["iterations=2", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=2",
        "eval.num_steps=4", "eval.every=0"]
# The ranks' entry point: the vgrpo command, with SGD in AdamW's place.
WORKER = """import sys
from tests.same_steps import train_with_sgd
train_with_sgd()
from vgrpo_lib.benchmarks.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train(worker: Path, out: Path) -> list[str]:
    return [str(worker), "train", "--algo", "vgrpo", "--task", "digits8", "--out", str(out), *ARGS]


def _node(rank: int, port: int, worker: Path, out: Path) -> list[str]:
    """The launch command of node ``rank`` of 2 (the one of the docs; ``is_host``: node 0 hosts the rendezvous)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "vgrpo-two-nodes",
            "--rdzv_conf", f"is_host={int(rank == 0)}", "--max_restarts", "0", *_train(worker, out)]


def _rows(run: Path) -> list[dict]:
    """metrics.csv without wall-clock columns and ``ess`` (a mean of per-process values under several processes)."""
    with open(run / "metrics.csv") as table:
        return [{k: float(v) for k, v in row.items() if not k.endswith("_s") and k not in ("train_seconds", "ess")}
                for row in csv.DictReader(table)]


@pytest.mark.slow
def test_two_nodes_of_one_process_equal_one_process(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    single, two = tmp_path / "single", tmp_path / "two_nodes"
    subprocess.run([sys.executable, *_train(worker, single)], cwd=REPO, env=env, check=True, capture_output=True,
                   timeout=TIMEOUT_S)

    port, logs = _free_port(), [tmp_path / f"node{rank}.log" for rank in range(2)]
    nodes = []
    try:
        for rank in range(2):
            with open(logs[rank], "w") as log:
                nodes.append(subprocess.Popen(_node(rank, port, worker, two), cwd=REPO, env=env, stdout=log,
                                              stderr=subprocess.STDOUT))
        codes = [node.wait(timeout=TIMEOUT_S) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    assert codes == [0, 0], "\n".join(f"node {rank}: {log.read_text()[-3000:]}" for rank, log in enumerate(logs))
    # One run of two processes: only the node that got rank 0 (the rendezvous picks which) prints the result.
    assert sum("run directory:" in log.read_text() for log in logs) == 1

    base = get_task("digits8").load_policy().state_dict()
    trained = RunDir(two).load_latest_checkpoint()
    expected = RunDir(single).load_latest_checkpoint()
    assert trained["iteration"] == expected["iteration"] == 2
    assert_same_changes(trained["policy"], expected["policy"], base)
    got, want = _rows(two), _rows(single)
    assert len(got) == len(want) == 2
    for row, expected_row in zip(got, want):
        assert row.keys() == expected_row.keys()
        for key in expected_row:
            assert math.isclose(row[key], expected_row[key], rel_tol=METRICS_RTOL, abs_tol=METRICS_ATOL), key
