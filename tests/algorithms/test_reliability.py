"""What a run directory promises under misuse: one run at a time, checkpoints that prove their integrity and their
run, resume exact in every random stream, divergence reported as such, and one line for every expected failure."""

import errno
import gzip
import hashlib
import io
import json
import os
import random
import re
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import vgrpo_lib.integrations.atomic as atomic
from vgrpo_lib.algorithms.cli import main as cli_main, run_folders
from vgrpo_lib.algorithms.errors import DamagedFileError, DivergenceError, RunDirError, RunDirExists, RunDirInUse
from vgrpo_lib.algorithms.run_dir import RunDir, compressed_path, float32_snapped, read_csv, rows_to_csv
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.testbed import tasks as testbed_tasks
from tests.algorithms.conftest import TINY

TIMING = ("_s", "train_seconds")


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in rows]


def without_their_records(run: RunDir) -> None:
    """Rewrite the run's checkpoints (and manifests) as an older vgrpo-lib wrote them: without the record of the
    metrics rows and evaluations."""
    for path in run.checkpoint_paths():
        state = torch.load(path, weights_only=True)
        del state["records"]
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path.write_bytes(buffer.getvalue())
        manifest = json.loads(path.with_suffix(".json").read_text())
        manifest |= {"sha256": hashlib.sha256(buffer.getvalue()).hexdigest(), "bytes": len(buffer.getvalue())}
        path.with_suffix(".json").write_text(json.dumps(manifest))


def _cli_train(out, *overrides):
    return ["train", "--algo", "vgrpo", "--out", str(out), *TINY, *overrides]


# -- one run per folder --------------------------------------------------------------------------------------------


def test_a_second_run_on_a_locked_folder_is_refused_naming_the_holder(tiny_config, tmp_path):
    holder = RunDir(tmp_path / "run")
    holder.lock()
    with pytest.raises(RunDirInUse, match=rf"in use by another run \(pid {os.getpid()} host "):
        Trainer(tiny_config("vgrpo"), tmp_path / "run", progress=False)
    # Taken between a new run's first check and its start: train() refuses, having written nothing.
    late = Trainer(tiny_config("vgrpo"), tmp_path / "other", progress=False)
    other = RunDir(tmp_path / "other")
    other.lock()
    with pytest.raises(RunDirInUse):
        late.train()
    assert [p.name for p in (tmp_path / "other").iterdir()] == [".lock"]
    holder.unlock(), other.unlock()
    Trainer(tiny_config("vgrpo", "iterations=1"), tmp_path / "run", progress=False).train()  # free again


def test_a_stale_lock_of_a_dead_process_is_taken_over(tiny_config, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("pid 999999 host gone-host\n")  # written by a killed run: no process holds it
    with pytest.warns(UserWarning, match=r"previous holder \(pid 999999 host gone-host\) is gone"):
        Trainer(tiny_config("vgrpo", "iterations=1"), run, progress=False).train()
    assert not (run / ".lock").exists()  # a killed run's lock file: taken over, then removed at the end
    assert RunDir(run).lock_holder() is None


def test_a_finished_run_removes_its_lock_file_but_never_a_file_it_did_not_make(tiny_config, tmp_path):
    Trainer(tiny_config("vgrpo", "iterations=1"), tmp_path / "run", progress=False).train()
    assert not (tmp_path / "run" / ".lock").exists()
    assert (tmp_path / "run" / "config.json").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".lock").write_bytes(b"")  # an empty file of the user's, not a run's lock: kept
    Trainer(tiny_config("vgrpo", "iterations=1"), mine, progress=False).train()
    assert (mine / ".lock").read_bytes() == b""
    refused = RunDir(tmp_path / "run")  # a lock taken and released by a refused start leaves nothing either
    with pytest.raises(RunDirExists):
        refused.take(fresh=True)
    assert not (tmp_path / "run" / ".lock").exists()


def test_a_lock_file_removed_under_a_waiting_process_is_never_held_twice(tmp_path, monkeypatch):
    """The race of removing a lock file: B opens ``.lock`` while A holds it; A finishes (removes the file, releases
    it) and C takes a new ``.lock``; B's flock on the removed file succeeds, but B must see that it is not the
    folder's lock any more and find C holding the real one."""
    first, third = RunDir(tmp_path), RunDir(tmp_path)
    first.lock()
    opened = []
    real_open = RunDir._open_lock_file

    def open_then_race(self, flags):
        handle = real_open(self, flags)
        if not opened:
            opened.append(self.lock_path)
            first.unlock()  # removes the file B just opened
            third.lock()  # a new .lock, held
        return handle

    monkeypatch.setattr(RunDir, "_open_lock_file", open_then_race)
    with pytest.raises(RunDirInUse, match=rf"pid {os.getpid()} host "):
        RunDir(tmp_path).lock()
    assert opened and third.lock_holder() is not None
    third.unlock()
    assert not (tmp_path / ".lock").exists()


def test_out_refuses_a_non_empty_folder_that_is_not_a_run_and_writes_nothing(tiny_config, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "reward.png").write_bytes(b"my own picture")
    (folder / "checkpoints").mkdir()
    with pytest.raises(RunDirError, match=r"not empty and is not a run directory \(it holds checkpoints/, reward.png\)"):
        Trainer(tiny_config("vgrpo"), folder, progress=False)
    assert (folder / "reward.png").read_bytes() == b"my own picture"
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "reward.png"]


def test_a_run_id_ties_checkpoints_to_their_config_and_foreign_ones_are_refused(tiny_config, tmp_path, capsys):
    for name in ("a", "b"):
        Trainer(tiny_config("vgrpo", "iterations=1"), tmp_path / name, progress=False).train()
    a, b = RunDir(tmp_path / "a"), RunDir(tmp_path / "b")
    assert a.run_id() != b.run_id() and len(a.run_id()) == 32
    assert a.load_latest_checkpoint()["run_id"] == a.run_id()
    # Run b's newest checkpoint (and its manifest) copied into run a, as two runs on one folder could leave it.
    for suffix in (".pt", ".json"):
        (a.checkpoints / f"iter_000009{suffix}").write_bytes((b.checkpoints / f"iter_000001{suffix}").read_bytes())
    with pytest.raises(RunDirError, match=rf"iter_000009.pt belongs to run {b.run_id()}, not to this folder's run"):
        Trainer.resume(tmp_path / "a", progress=False)
    assert cli_main(["train", "--out", str(tmp_path / "a"), "--resume"]) == 3
    assert "mixes two runs" in capsys.readouterr().err


# -- checkpoint integrity ------------------------------------------------------------------------------------------


def test_flipped_bytes_in_the_newest_checkpoint_are_detected_and_the_previous_one_used(tiny_config, tmp_path):
    Trainer(tiny_config("vgrpo"), tmp_path / "run", progress=False).train()
    run = RunDir(tmp_path / "run")
    newest = run.checkpoint_paths()[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = bytes(255 - b for b in data[len(data) // 2 : len(data) // 2 + 16])
    newest.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"iter_000002.pt could not be loaded: its SHA-256 is not the one"):
        state = run.load_latest_checkpoint()
    assert state["iteration"] == 1
    newest.with_suffix(".json").unlink()  # unverifiable: treated as damaged too
    with pytest.warns(UserWarning, match="manifest iter_000002.json is missing"):
        assert run.load_latest_checkpoint()["iteration"] == 1
    run.checkpoint_paths()[0].write_bytes(b"")  # nothing usable left: an error naming every checkpoint
    with pytest.raises(RunDirError, match="no usable checkpoint.*iter_000002.pt: its manifest.*iter_000001.pt: its SHA-256"), pytest.warns(UserWarning):
        run.load_latest_checkpoint()


def test_non_finite_weights_after_a_step_stop_the_run_as_divergence_and_are_never_saved(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("vgrpo", "iterations=3"), tmp_path / "run", progress=False)
    trainer.train(until=1)
    real_step = trainer.optimizer.step

    def poisoned_step(*args, **kwargs):
        real_step(*args, **kwargs)
        trainer.optimizer.state[trainer.optimizer.param_groups[0]["params"][0]]["exp_avg_sq"].view(-1)[0] = -torch.inf

    trainer.optimizer.step = poisoned_step
    with pytest.raises(DivergenceError, match="weights or optimizer state are not finite after gradient step 2"):
        trainer.train()
    assert [p.name for p in RunDir(tmp_path / "run").checkpoint_paths()] == ["iter_000001.pt"]


def test_exploding_learning_rate_is_reported_as_divergence(tmp_path, capsys):
    assert cli_main(_cli_train(tmp_path / "run", "optim.lr=1e30", "iterations=3")) == 6
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # beside the progress bar
    assert len(errors) == 1 and errors[0].startswith("vgrpo train: error: The policy diverged: 16 of 16"), errors


def test_a_nan_evaluation_exits_non_zero(tmp_path, capsys, monkeypatch):
    real = testbed_tasks.Task.evaluate
    monkeypatch.setattr(testbed_tasks.Task, "evaluate", lambda self, images, prompts: real(self, images, prompts)
                        | {"reward_mean": float("nan")})
    assert cli_main(_cli_train(tmp_path / "run")) == 6
    assert "The evaluation at iteration 0 is not finite (reward_mean)" in capsys.readouterr().err


# -- resume ------------------------------------------------------------------------------------------------------


def _noisy_reward(trainer):
    """The task's reward plus draws from the global torch, NumPy and Python streams."""
    real = trainer.reward_fn

    def reward(images, prompts):
        noise = 0.05 * (torch.rand(images.shape[0]) + float(np.random.rand()) + random.random())
        return real(images, prompts) + noise

    trainer.reward_fn = reward
    return trainer


def test_resume_is_exact_in_every_stream_with_global_rng_rewards_and_an_evaluation_right_after(tiny_config, tmp_path):
    config = tiny_config("vgrpo", "iterations=4", "eval.every=1", "checkpoint_every=2")
    testbed_tasks._frozen.cache_clear()  # the judge is built lazily by the first evaluation, as in a fresh process
    straight = _noisy_reward(Trainer(config, tmp_path / "straight", progress=False))
    straight.train()
    testbed_tasks._frozen.cache_clear()
    _noisy_reward(Trainer(config, tmp_path / "resumed", progress=False)).train(until=2)
    # A new process: other global streams, and the judge not built yet (it will be, at the evaluation of iteration 3).
    testbed_tasks._frozen.cache_clear()
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    resumed = _noisy_reward(Trainer.resume(tmp_path / "resumed", progress=False))
    resumed.train()
    for key, value in straight.policy.state_dict().items():
        assert torch.equal(value, resumed.policy.state_dict()[key]), key
    assert _strip(read_csv(tmp_path / "straight" / "metrics.csv")) == _strip(read_csv(tmp_path / "resumed" / "metrics.csv"))
    assert _strip(read_csv(tmp_path / "straight" / "eval.csv")) == _strip(read_csv(tmp_path / "resumed" / "eval.csv"))
    ended = [RunDir(tmp_path / name).load_latest_checkpoint()["rng"] for name in ("straight", "resumed")]
    assert torch.equal(ended[0]["torch"], ended[1]["torch"])  # every global stream ends where it ended
    assert torch.equal(ended[0]["numpy"][1], ended[1]["numpy"][1]) and ended[0]["python"] == ended[1]["python"]


def test_a_run_stopped_before_its_first_checkpoint_restarts_from_iteration_zero(tiny_config, tmp_path, monkeypatch):
    config = tiny_config("vgrpo", "iterations=3", "checkpoint_every=10")
    straight = Trainer(config, tmp_path / "straight", progress=False)
    straight.train()

    def killed(self, iteration, state, run_id, config=None):
        raise KeyboardInterrupt  # the process dies before its first checkpoint

    with monkeypatch.context() as patch:
        patch.setattr(RunDir, "save_checkpoint", killed)
        with pytest.raises(KeyboardInterrupt):
            Trainer(config, tmp_path / "run", progress=False).train()
    run = RunDir(tmp_path / "run")
    assert run.exists() and not run.checkpoint_paths()
    with pytest.raises(RunDirExists):  # a new run there is refused: it is this run, to resume
        Trainer(config, tmp_path / "run", progress=False)
    leftovers = [run.root / ".metrics.csv.x1x1x1x1.vgrpo.tmp", run.checkpoints / ".iter_000003.pt.x2x2x2x2.vgrpo.tmp"]
    run.checkpoints.mkdir()
    for path in leftovers:
        path.write_bytes(b"half a write")
    with pytest.warns(UserWarning, match="no checkpoint yet"):
        resumed = Trainer.resume(tmp_path / "run", progress=False)
    assert not any(path.exists() for path in leftovers)  # removed at start
    resumed.train()
    for key, value in straight.policy.state_dict().items():
        assert torch.equal(value, resumed.policy.state_dict()[key]), key
    assert _strip(read_csv(tmp_path / "straight" / "metrics.csv")) == _strip(read_csv(run.root / "metrics.csv"))


# -- one line for expected failures ------------------------------------------------------------------------------


@pytest.mark.parametrize("code, text", [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")])
def test_disk_full_and_read_only_are_one_line(tmp_path, capsys, monkeypatch, code, text):
    def refuse(dir, prefix, suffix):
        raise OSError(code, text, os.path.join(dir, prefix + "tmp"))

    monkeypatch.setattr(atomic.tempfile, "mkstemp", refuse)
    assert cli_main(_cli_train(tmp_path / "run")) == 5
    err = capsys.readouterr().err
    assert err == f"vgrpo train: error: cannot write {tmp_path / 'run'}/.config.json.tmp: {text}\n"


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("metrics.csv", "iteration,reward_mean\n0,0.5\nbanana,0.6\n", "metrics.csv is damaged: line 3 has no number in column 'iteration'"),
        ("metrics.csv", "\x00\x01garbage\n\xff", "metrics.csv is not a readable CSV file"),
        ("eval.jsonl", '{"iteration": 0}\n{not json\n', "eval.jsonl is damaged: line 2 is not valid JSON"),
        ("config.json", "{truncated", "config.json (the run's config) is not valid JSON"),
        ("config.json", '{"run_id": "x", "bogus": 1}', "config.json is not a valid run config"),
    ],
)
def test_garbled_run_files_are_named_with_what_is_wrong(tmp_path, capsys, name, content, message):
    assert cli_main(_cli_train(tmp_path / "run", "iterations=1")) == 0
    capsys.readouterr()
    (tmp_path / "run" / name).write_bytes(content.encode("latin-1"))
    assert cli_main(["train", "--out", str(tmp_path / "run"), "--resume"]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"vgrpo train: error: {tmp_path / 'run'}/") and message in err and err.count("\n") == 1, err


def test_an_unexpected_error_keeps_its_traceback(tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("a bug deep inside")

    monkeypatch.setattr(Trainer, "evaluate", broken)
    with pytest.raises(RuntimeError, match="a bug deep inside"):
        cli_main(_cli_train(tmp_path / "run"))


def test_the_base_column_is_not_the_trained_one_when_eval_jsonl_is_gone(tmp_path, capsys):
    assert cli_main(_cli_train(tmp_path / "run", "iterations=2", "checkpoint_every=1")) == 0
    capsys.readouterr()
    run = RunDir(tmp_path / "run")
    newest = run.checkpoint_paths()[-1]
    newest.unlink()  # so that --resume has an iteration left to train
    newest.with_suffix(".json").unlink()
    without_their_records(run)  # as an older vgrpo-lib wrote them: eval.jsonl alone holds the evaluations
    (run.root / "eval.jsonl").unlink()
    assert cli_main(["train", "--out", str(run.root), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "reward_mean" in out and all(line.split()[1] == "n/a" for line in out.splitlines()[1:4]), out
    assert "no base evaluation" in out


# -- compressed tables ---------------------------------------------------------------------------------------------


def test_compressed_tables_read_back_unchanged_and_a_resumed_run_continues_them(tmp_path, capsys):
    """`vgrpo compress` replaces a run's config and tables by gzip copies; every reader gets the same config and rows,
    and a run resumed from there (its config read from config.json.gz, not rewritten) writes its tables afresh (the
    copies, now out of date, are removed): it ends as the uncut run, bit for bit."""
    assert cli_main(_cli_train(tmp_path / "straight", "iterations=2")) == 0
    assert cli_main(_cli_train(tmp_path / "run", "iterations=2", "checkpoint_every=1")) == 0
    run = RunDir(tmp_path / "run")
    config, run_id = run.train_config().to_json(), run.run_id()
    stored = {name: (run.root / name).read_bytes() for name in ("config.json", "metrics.csv", "eval.csv", "eval.jsonl")}
    written = {name: (run.root / name).stat().st_mtime_ns for name in stored}
    rows, records, evaluations = run.read_rows("metrics.csv"), run.read_jsonl("eval.jsonl"), read_csv(run.root / "eval.csv")
    capsys.readouterr()
    assert cli_main(["compress", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path}: 8 files (configs and tables) of 2 runs compressed, ")
    for name, data in stored.items():
        assert not (run.root / name).exists() and gzip.decompress((run.root / f"{name}.gz").read_bytes()) == data
        assert (run.root / f"{name}.gz").stat().st_mtime_ns == written[name]  # when the run wrote it
    assert run_folders(tmp_path) == [run.root, tmp_path / "straight"]  # still runs, found by their config.json.gz
    assert run.exists() and run.stored_config_path == run.root / "config.json.gz"
    assert run.train_config().to_json() == config and run.run_id() == run_id
    assert run.read_rows("metrics.csv") == rows and run.read_jsonl("eval.jsonl") == records
    assert read_csv(run.root / "eval.csv") == evaluations
    newest = run.checkpoint_paths()[-1]
    newest.unlink()  # so that --resume has an iteration left to train
    newest.with_suffix(".json").unlink()
    assert cli_main(["train", "--out", str(run.root), "--resume"]) == 0
    assert [path.name for path in run.root.glob("*.gz")] == ["config.json.gz"] and not run.config_path.exists()
    assert _strip(read_csv(run.root / "metrics.csv")) == _strip(read_csv(tmp_path / "straight" / "metrics.csv"))
    ended = [RunDir(tmp_path / name).load_latest_checkpoint() for name in ("straight", "run")]
    assert ended[0]["iteration"] == ended[1]["iteration"] == 2
    for key, value in ended[0]["policy"].items():
        assert torch.equal(value, ended[1]["policy"][key]), key
    assert torch.equal(ended[0]["rng"]["torch"], ended[1]["rng"]["torch"])


def test_a_compressed_run_restarted_from_iteration_zero_keeps_one_config(tiny_config, tmp_path):
    """A compressed run without a checkpoint restarts from iteration 0 and writes its config afresh: the compressed
    copy, out of date then, is removed (never two copies that may disagree), and the run keeps its id."""
    run = RunDir(tmp_path / "run")
    Trainer(tiny_config("vgrpo", "iterations=1"), run.root, progress=False).train()
    run_id = run.run_id()
    for path in run.checkpoint_paths():
        path.unlink()
        path.with_suffix(".json").unlink()
    run.compress_tables()
    assert not run.config_path.exists() and compressed_path(run.config_path).exists()
    with pytest.warns(UserWarning, match="no checkpoint yet"):
        resumed = Trainer.resume(run.root, progress=False)
    resumed.train()
    assert run.config_path.exists() and not compressed_path(run.config_path).exists()
    assert run.run_id() == run_id and [p.name for p in run.checkpoint_paths()] == ["iter_000001.pt"]


@pytest.mark.parametrize("data, message", [
    (b"not gzip at all", "config.json.gz is not a readable text file"),
    (gzip.compress(b"{truncated"), "config.json.gz (the run's config) is not valid JSON"),
    (gzip.compress(b'["a list"]'), "config.json.gz is damaged: it holds a JSON list, not an object"),
], ids=["not gzip", "not JSON", "not an object"])
def test_a_damaged_compressed_config_is_named(tmp_path, capsys, data, message):
    assert cli_main(_cli_train(tmp_path / "run", "iterations=1")) == 0
    run = RunDir(tmp_path / "run")
    run.compress_tables()
    compressed_path(run.config_path).write_bytes(data)
    with pytest.raises(DamagedFileError, match=re.escape(message)):
        run.train_config()
    capsys.readouterr()
    assert cli_main(["train", "--out", str(run.root), "--resume"]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"vgrpo train: error: {run.root}/config.json.gz") and message in err, err
    assert err.count("\n") == 1, err


def test_a_damaged_compressed_table_is_named_and_a_run_in_use_is_not_compressed(tmp_path, capsys):
    assert cli_main(_cli_train(tmp_path / "run", "iterations=1")) == 0
    run = RunDir(tmp_path / "run")
    (run.root / "eval.jsonl").unlink()
    (run.root / "eval.jsonl.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DamagedFileError, match=r"eval\.jsonl\.gz is not a readable text file"):
        run.read_jsonl("eval.jsonl")
    holder = RunDir(run.root)
    holder.lock()
    with pytest.raises(RunDirInUse, match="in use by another run"):
        run.compress_tables()
    holder.unlock()
    assert (run.root / "metrics.csv").exists()  # untouched while refused
    capsys.readouterr()
    assert cli_main(["compress", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == f"vgrpo compress: error: {tmp_path / 'nothing'} is not a folder.\n"
    (tmp_path / "empty").mkdir()
    assert cli_main(["compress", str(tmp_path / "empty")]) == 2
    assert "holds no run directory" in capsys.readouterr().err


# -- atomic writes ---------------------------------------------------------------------------------------------


def test_atomic_writes_respect_the_umask_and_fsync_the_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)), real_fsync(fd)))
    old = os.umask(0o027)
    try:
        path = atomic.atomic_write_text(tmp_path / "a.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert synced == [False, True]  # the file, then its folder after the rename
    os.umask(0o002)
    try:
        assert stat.S_IMODE(atomic.atomic_write_text(tmp_path / "b.txt", "y").stat().st_mode) == 0o664
    finally:
        os.umask(old)
    assert json.loads(atomic.atomic_write_text(tmp_path / "c.json", "[1]").read_text()) == [1]


def test_read_csv_names_the_file_of_a_row_longer_than_its_header(tmp_path):
    (tmp_path / "m.csv").write_text("iteration\n0,1\n")
    with pytest.raises(DamagedFileError, match=r"m.csv is damaged: line 2 has more cells than the header"):
        read_csv(tmp_path / "m.csv")


@settings(max_examples=300, deadline=None)
@given(single=st.floats(width=32, allow_nan=False), double=st.floats(allow_nan=False, allow_infinity=False))
def test_a_float32_metric_is_kept_as_that_float32_and_any_other_number_whole(single, double):
    snapped = float32_snapped(float(np.float32(single)))
    assert np.float32(snapped) == np.float32(single)  # lossless for the float32 a tensor gave
    assert float32_snapped(snapped) == snapped  # idempotent
    in_range = abs(double) <= float(np.finfo(np.float32).max)
    if not (in_range and float(np.float32(double)) == double):  # a float64 that is no float32 (a clock reading)
        assert float32_snapped(double) == double
    rows = [{"iteration": 0, "metric": snapped, "seconds": float32_snapped(double)}, {"iteration": 1, "metric": 0.5}]
    text = rows_to_csv(rows)
    assert _parsed(text) == rows and rows_to_csv(_parsed(text)) == text  # read back: the same numbers, the same text


def _parsed(text: str) -> list[dict]:
    """The rows read_csv gives for the CSV ``text``."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.csv"
        path.write_text(text)
        return read_csv(path)


def test_the_metrics_rows_in_memory_are_those_metrics_csv_gives_back(tiny_config, tmp_path):
    """A float32 metric is recorded with its own digits (float32_snapped), so a comparison summarising the rows it
    trained and one summarising the rows it reads back (continued later) compute from the same numbers."""
    trainer = Trainer(tiny_config("vgrpo", "iterations=2"), tmp_path / "run", progress=False)
    trainer.train()
    assert read_csv(tmp_path / "run" / "metrics.csv") == trainer.metrics
    reward = trainer.metrics[-1]["reward_mean"]
    assert reward == float(str(np.float32(reward)))  # the float32's shortest decimal, not its float64 expansion
