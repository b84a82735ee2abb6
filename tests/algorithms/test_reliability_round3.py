"""Reliability, round three (issue 29): a resume never mixes runs, a run never touches a file it did not write,
a damaged manifest is a damaged checkpoint, and a resume loses no metrics row and repeats no logged step."""

import json
import warnings

import pytest

from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.run_dir import CHECKPOINT_KEYS, RESUME_MAY_CHANGE, RunDir, read_csv
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.benchmarks.adversarial import edit_config
from tests.algorithms.conftest import TINY
from tests.algorithms.test_reliability import without_their_records


def _train(out, *overrides):
    return cli_main(["train", "--algo", "vgrpo", "--out", str(out), *TINY, *overrides])


def _resume(out):
    return cli_main(["train", "--out", str(out), "--resume"])



# -- item 1: a resume refuses an edited config -------------------------------------------------------------------


@pytest.mark.parametrize("changes, named", [
    ({"algo": "flow_grpo", "drop": ("vgrpo",)}, "algo ('vgrpo' -> 'flow_grpo')"),
    ({"task": "digit"}, "task"),
    ({"group_size": 2}, "group_size"),
    ({"seed": 7, "iterations": 3}, "seed"),
    ({"optim.lr": 0.5}, "optim.lr"),
])
def test_resume_refuses_a_config_edited_since_the_checkpoint_naming_the_keys(tmp_path, capsys, changes, named):
    out = tmp_path / "run"
    assert _train(out) == 0
    before = (out / "metrics.csv").read_bytes()
    edit_config(out, **changes)
    capsys.readouterr()
    assert _resume(out) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json" in err and "iter_000002.pt" in err and named in err, err
    assert "iterations (" not in err  # a key that may change is never named as a difference
    assert (out / "metrics.csv").read_bytes() == before  # nothing trained, nothing rewritten


def test_resume_accepts_the_documented_keys_changed(tmp_path, capsys):
    assert set(RESUME_MAY_CHANGE) == {"iterations", "checkpoint_every", "eval.every", "log.backend"}
    out = tmp_path / "run"
    assert _train(out) == 0
    edit_config(out, iterations=3, checkpoint_every=2, **{"eval.every": 5})
    assert _resume(out) == 0
    assert [p.name for p in RunDir(out).checkpoint_paths()] == ["iter_000002.pt", "iter_000003.pt"]
    manifest = json.loads((out / "checkpoints" / "iter_000003.json").read_text())
    assert manifest["algo"] == "vgrpo" and manifest["task"] == "digits8" and manifest["library_version"]
    assert len(manifest["config_sha256"]) == 64 and manifest["config"]["group_size"] == 4
    edit_config(out, iterations=2)  # fewer iterations than the checkpoint has: refused, not silently finished
    assert _resume(out) == 3
    assert "iterations" in capsys.readouterr().err


# -- issue item 3: a run never touches a file it did not write ---------------------------------------------------


def _one_error_line(err):
    return err.startswith("vgrpo train: error: ") and err.count("\n") == 1


def test_a_users_tmp_file_in_out_is_neither_deleted_nor_counted_as_fresh(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".draft.tmp").write_bytes(b"my draft")
    assert _train(out) == 3
    err = capsys.readouterr().err
    assert _one_error_line(err) and ".draft.tmp" in err, err
    assert (out / ".draft.tmp").read_bytes() == b"my draft" and sorted(p.name for p in out.iterdir()) == [".draft.tmp"]
    # In a run's own folder, a resume removes the leftovers of its killed writes, and only those.
    run = tmp_path / "run"
    assert _train(run) == 0
    (run / ".notes.tmp").write_bytes(b"mine")
    (run / "checkpoints" / ".iter_000001.pt.abc.tmp").write_bytes(b"mine too")
    leftover = run / ".metrics.csv.x1x1x1x1.vgrpo.tmp"
    leftover.write_bytes(b"half a write")
    edit_config(run, iterations=3)
    assert _resume(run) == 0
    assert not leftover.exists()
    assert (run / ".notes.tmp").read_bytes() == b"mine"
    assert (run / "checkpoints" / ".iter_000001.pt.abc.tmp").read_bytes() == b"mine too"


def _lock_kinds(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_bytes(b"line one\nline two\n")
    return {
        "symlink": lambda lock: lock.symlink_to(target),
        "dangling symlink": lambda lock: lock.symlink_to(tmp_path / "nowhere"),
        "directory": lambda lock: lock.mkdir(),
        "text": lambda lock: lock.write_bytes(b"my shopping list\n"),
        "non-UTF-8": lambda lock: lock.write_bytes(b"\xff\xfe\x00garbage"),
    }


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "directory", "text", "non-UTF-8"])
def test_a_lock_that_is_not_a_runs_lock_file_is_one_line_and_left_untouched(tmp_path, capsys, kind):
    make = _lock_kinds(tmp_path)[kind]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    make(fresh / ".lock")
    run = tmp_path / "run"
    assert _train(run, "iterations=1") == 0
    make(run / ".lock")
    capsys.readouterr()
    snapshot = {p: (p.is_symlink(), p.is_dir() or p.read_bytes() if p.exists() else None)
                for p in (fresh / ".lock", run / ".lock", tmp_path / "precious.txt")}
    for command in (lambda: _train(fresh), lambda: _resume(run)):
        assert command() == 3
        err = capsys.readouterr().err
        assert _one_error_line(err) and ".lock is not a run's lock file" in err, err
        assert "line one" not in err
    for path, (link, content) in snapshot.items():
        assert (path.is_symlink(), path.is_dir() or path.read_bytes() if path.exists() else None) == (link, content)
    assert (tmp_path / "precious.txt").read_bytes() == b"line one\nline two\n"
    assert sorted(p.name for p in fresh.iterdir()) == [".lock"]


# -- issue item 4: a damaged manifest is a damaged checkpoint ----------------------------------------------------


def _flip(text):
    return text[:-1] + ("0" if text[-1] != "0" else "1")


@pytest.mark.parametrize("damage", [
    lambda m: m | {"run_id": _flip(m["run_id"])},
    lambda m: m | {"run_id": None},
    lambda m: {k: v for k, v in m.items() if k != "run_id"},
    lambda m: m | {"iteration": 7},
    lambda m: m | {"config": m["config"] | {"seed": 5}},
], ids=["run_id flipped", "run_id null", "run_id missing", "iteration", "config"])
def test_a_damaged_manifest_is_reported_and_the_previous_checkpoint_used(tiny_config, tmp_path, damage):
    out = tmp_path / "run"
    Trainer(tiny_config("vgrpo"), out, progress=False).train()
    path = out / "checkpoints" / "iter_000002.json"
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    with pytest.warns(UserWarning, match=r"iter_000002.pt could not be loaded: its manifest iter_000002.json is damaged"):
        resumed = Trainer.resume(out, progress=False)
    assert resumed.iteration == 1
    resumed.train()
    assert [p.name for p in RunDir(out).checkpoint_paths()] == ["iter_000001.pt", "iter_000002.pt"]


# -- issue item 14: checkpoints past iteration 999,999 -----------------------------------------------------------


def _state(iteration):
    """A checkpoint state with every key a training checkpoint holds (run_dir.CHECKPOINT_KEYS), else empty."""
    return {key: {} for key in CHECKPOINT_KEYS} | {"iteration": iteration}


def test_checkpoints_past_iteration_999999_are_ordered_by_their_iteration(tmp_path):
    run, run_id = RunDir(tmp_path / "run"), "a" * 32
    for iteration in (999_998, 999_999, 1_000_000, 1_000_001):
        run.save_checkpoint(iteration, _state(iteration), run_id)
    assert [p.name for p in run.checkpoint_paths()] == ["iter_1000000.pt", "iter_1000001.pt"]
    assert run.load_latest_checkpoint(run_id)["iteration"] == 1_000_001
    (run.checkpoints / "iter_notes.pt").write_bytes(b"not a checkpoint name")  # not counted, not deleted
    run.save_checkpoint(10_000_000, _state(10_000_000), run_id)
    assert [p.name for p in run.checkpoint_paths()] == ["iter_1000001.pt", "iter_10000000.pt"]
    assert (run.checkpoints / "iter_notes.pt").exists()


# -- issue item 10: a resume loses no metrics row ----------------------------------------------------------------


def _cut_last_row(run):
    lines = (run / "metrics.csv").read_text().splitlines()
    lines[-1] = ",".join(lines[-1].split(",")[:-3])
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


def _delete_table(run):
    (run / "metrics.csv").unlink()


def _empty_beside_its_gz(run):
    RunDir(run).compress_tables()
    (run / "metrics.csv").write_text("")


@pytest.mark.parametrize("damage", [_cut_last_row, _delete_table, _empty_beside_its_gz])
def test_metrics_rows_come_back_from_the_checkpoint(tmp_path, damage):
    run = tmp_path / "run"
    assert _train(run) == 0
    before = read_csv(run / "metrics.csv")
    damage(run)
    edit_config(run, iterations=3)
    assert _resume(run) == 0
    after = read_csv(run / "metrics.csv")
    assert [row["iteration"] for row in after] == [0, 1, 2]
    assert after[:2] == before and len(after[2]) == len(before[1])
    assert not (run / "metrics.csv.gz").exists() or read_csv(run / "metrics.csv.gz") == after


def test_without_the_checkpoints_record_a_resume_refuses_naming_the_file(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run) == 0
    without_their_records(RunDir(run))
    _cut_last_row(run)
    edit_config(run, iterations=3)
    capsys.readouterr()
    assert _resume(run) == 4
    err = capsys.readouterr().err
    assert _one_error_line(err) and f"{run / 'metrics.csv'}" in err and "line 3" in err, err
    _delete_table(run)
    assert _resume(run) == 4
    assert "metrics.csv holds no row of iterations 0, 1" in capsys.readouterr().err


# -- issue item 12: TorchRL's CSV scalars hold each step once after a resume ---------------------------------------


def _scalar_steps(run):
    logs = sorted((run / "logs").rglob("*.csv"))
    assert logs
    return {path.relative_to(run).as_posix(): [int(line.split(",")[0]) for line in path.read_text().splitlines()]
            for path in logs}


@pytest.mark.parametrize("kept", [1, 0])
def test_csv_scalar_logs_hold_each_step_once_after_a_resume(tmp_path, kept):
    straight, run = tmp_path / "straight", tmp_path / "run"
    for out in (straight, run):
        assert _train(out, "eval.every=1", "log.backend=csv") == 0
    for path in RunDir(run).checkpoint_paths()[kept:]:  # the killed run logged past its newest checkpoint
        path.unlink()
    assert _resume(run) == 0
    assert _scalar_steps(run) == _scalar_steps(straight)
    assert _scalar_steps(run)["logs/run/scalars/eval/reward_mean.csv"] == [0, 1, 2]


# -- item 15: a bitwise resume assumes the same threads and libraries --------------------------------------------


def test_a_resume_with_another_thread_count_or_library_warns_naming_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out) == 0
    manifest_path = out / "checkpoints" / "iter_000002.json"
    manifest = json.loads(manifest_path.read_text())
    assert set(manifest["environment"]) == {"torch_threads", "torch", "tensordict", "torchrl", "python"}
    assert manifest["environment"]["torch_threads"] >= 1
    edit_config(out, iterations=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _resume(out) == 0
    assert not [w for w in caught if "may not continue bitwise" in str(w.message)]  # the same environment
    manifest_path = out / "checkpoints" / "iter_000003.json"
    manifest = json.loads(manifest_path.read_text())
    threads = manifest["environment"]["torch_threads"]
    manifest["environment"] |= {"torch_threads": threads + 7, "torch": "0.0.1"}
    manifest_path.write_text(json.dumps(manifest))
    edit_config(out, iterations=4)
    with pytest.warns(UserWarning, match=rf"made with torch_threads {threads + 7} -> {threads}, torch 0\.0\.1 -> "):
        assert _resume(out) == 0
