"""A real run killed with SIGKILL at several points and resumed ends bitwise equal to an uninterrupted one."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from algorithms.run_dir import RunDir, read_csv
from tests.algorithms.conftest import TINY

ARGS = TINY + ["iterations=5", "checkpoint_every=1", "optim.epochs=2", "optim.minibatch_size=8"]
REPO = Path(__file__).resolve().parents[2]


def _command(out: Path, resume: bool = False) -> list[str]:
    base = [sys.executable, "-m", "algorithms.cli", "train", "--out", str(out)]
    return base + ["--resume"] if resume else base + ["--algo", "vgrpo", *ARGS]


def _final_state(out: Path) -> dict:
    return RunDir(out).load_latest_checkpoint()


def _metrics_without_timing(out: Path) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.endswith(("_s", "train_seconds"))} for row in read_csv(out / "metrics.csv")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    subprocess.run(_command(out), check=True, cwd=REPO, capture_output=True, timeout=600)
    return out


@pytest.mark.parametrize("kill_after_s", [2.0, 5.0, 8.0])
def test_sigkill_at_a_random_point_then_resume_is_exact(uninterrupted, tmp_path, kill_after_s):
    out = tmp_path / "run"
    process = subprocess.Popen(_command(out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(kill_after_s)
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    if not RunDir(out).checkpoint_paths():  # killed before the first checkpoint: a fresh start is the resume
        subprocess.run(["rm", "-rf", str(out)], check=True)
        subprocess.run(_command(out), check=True, cwd=REPO, capture_output=True, timeout=600)
    else:
        subprocess.run(_command(out, resume=True), check=True, cwd=REPO, capture_output=True, timeout=600)
    expected, resumed = _final_state(uninterrupted), _final_state(out)
    assert resumed["iteration"] == expected["iteration"] == 5
    for key in expected["policy"]:
        assert torch.equal(expected["policy"][key], resumed["policy"][key]), key
    assert _metrics_without_timing(out) == _metrics_without_timing(uninterrupted)


def test_killed_during_a_checkpoint_write_leaves_the_previous_checkpoint(uninterrupted, tmp_path):
    """The process dies between writing the temporary file and renaming it into place."""
    out = tmp_path / "run"
    script = (
        "import os, signal, sys\n"
        "import integrations.atomic as atomic\n"
        "real_replace = os.replace\n"
        "def dying_replace(src, dst):\n"
        "    if str(dst).endswith('iter_000003.pt'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real_replace(src, dst)\n"
        "atomic.os.replace = dying_replace\n"
        "from algorithms.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    arguments = _command(out)[3:]
    killed = subprocess.run([sys.executable, "-c", script, *arguments], cwd=REPO, capture_output=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in RunDir(out).checkpoint_paths()] == ["iter_000001.pt", "iter_000002.pt"]
    subprocess.run(_command(out, resume=True), check=True, cwd=REPO, capture_output=True, timeout=600)
    expected, resumed = _final_state(uninterrupted), _final_state(out)
    for key in expected["policy"]:
        assert torch.equal(expected["policy"][key], resumed["policy"][key]), key
