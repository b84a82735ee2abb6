"""A real run killed with SIGKILL and resumed ends bitwise equal to an uninterrupted one: killed right after its
checkpoint N (the kill must land mid-run: return code -9, the run unfinished), inside a checkpoint write, and
before its first checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.reliability import run_differences, train_command
from tests.algorithms.conftest import TINY

ITERATIONS = 5
ARGS = TINY + [f"iterations={ITERATIONS}", "checkpoint_every=1", "optim.epochs=2", "optim.minibatch_size=8"]
REPO = Path(__file__).resolve().parents[2]
WAIT_S = 600


def _command(out: Path, resume: bool = False) -> list[str]:
    return train_command(out, ARGS, resume)


def _self_killing(out: Path, trigger: str) -> list[str]:
    """The training command in a process that SIGKILLs itself at ``trigger`` (Python run before the fatal call)."""
    script = (
        "import os, signal, sys\n"
        f"{trigger}\n"
        "from vgrpo_lib.algorithms.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return [sys.executable, "-c", script, *_command(out)[3:]]


def _assert_same_run(expected_dir: Path, resumed_dir: Path) -> None:
    """Identical in weights, optimizer state, the trainer's generator, the global RNGs and every metrics row."""
    assert RunDir(expected_dir).load_latest_checkpoint()["iteration"] == ITERATIONS
    assert run_differences(expected_dir, resumed_dir) == []


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    subprocess.run(_command(out), check=True, cwd=REPO, capture_output=True, timeout=WAIT_S)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [1, 2, 3])
def test_sigkill_after_checkpoint_n_then_resume_is_exact(uninterrupted, tmp_path, checkpoint):
    out = tmp_path / "run"
    process = subprocess.Popen(_command(out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = out / "checkpoints" / f"iter_{checkpoint:06d}.pt"
    deadline = time.monotonic() + WAIT_S
    while not target.exists():
        assert process.poll() is None, "the run ended before its checkpoint appeared"
        assert time.monotonic() < deadline, f"no {target.name} after {WAIT_S} s"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    left = [p.name for p in RunDir(out).checkpoint_paths()]
    assert target.name in left and f"iter_{ITERATIONS:06d}.pt" not in left, left  # the kill landed mid-run
    subprocess.run(_command(out, resume=True), check=True, cwd=REPO, capture_output=True, timeout=WAIT_S)
    _assert_same_run(uninterrupted, out)


@pytest.mark.slow
def test_killed_during_a_checkpoint_write_leaves_the_previous_checkpoint(uninterrupted, tmp_path):
    """The process dies between writing the temporary file and renaming it into place."""
    out = tmp_path / "run"
    trigger = (
        "import vgrpo_lib.integrations.atomic as atomic\n"
        "real_replace = os.replace\n"
        "def dying_replace(src, dst):\n"
        "    if str(dst).endswith('iter_000003.pt'):\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real_replace(src, dst)\n"
        "atomic.os.replace = dying_replace"
    )
    killed = subprocess.run(_self_killing(out, trigger), cwd=REPO, capture_output=True, timeout=WAIT_S)
    assert killed.returncode == -signal.SIGKILL
    assert [p.name for p in RunDir(out).checkpoint_paths()] == ["iter_000001.pt", "iter_000002.pt"]
    assert list((out / "checkpoints").glob(".iter_000003.pt.*.tmp"))  # the killed write's leftover ...
    subprocess.run(_command(out, resume=True), check=True, cwd=REPO, capture_output=True, timeout=WAIT_S)
    assert not list((out / "checkpoints").glob(".*.tmp"))  # ... is removed when the run resumes
    _assert_same_run(uninterrupted, out)


@pytest.mark.slow
def test_killed_before_its_first_checkpoint_the_run_resumes_from_iteration_zero(uninterrupted, tmp_path):
    out = tmp_path / "run"
    trigger = (
        "from vgrpo_lib.algorithms.trainer import Trainer\n"
        "real_step = Trainer.step\n"
        "def dying_step(self):\n"
        "    row = real_step(self)\n"  # one iteration trained, its metrics not yet written, no checkpoint
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "Trainer.step = dying_step"
    )
    killed = subprocess.run(_self_killing(out, trigger), cwd=REPO, capture_output=True, timeout=WAIT_S)
    assert killed.returncode == -signal.SIGKILL
    assert (out / "config.json").exists() and not RunDir(out).checkpoint_paths()
    fresh = subprocess.run(_command(out), cwd=REPO, capture_output=True, text=True, timeout=WAIT_S)
    assert fresh.returncode == 3 and "already holds a run; resume it with --resume" in fresh.stderr
    resumed = subprocess.run(_command(out, resume=True), cwd=REPO, capture_output=True, text=True, timeout=WAIT_S)
    assert resumed.returncode == 0 and "restarting it from iteration 0" in resumed.stderr
    _assert_same_run(uninterrupted, out)
