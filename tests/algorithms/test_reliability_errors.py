"""Reliability, round three (issue 29, items 5-9 and 13): every expected failure is one line naming the file, key or
argument, with its own exit status, before anything is written; a bug keeps its traceback."""

import errno
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import SafetensorError

from vgrpo_lib.algorithms import cli
from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.run_dir import CHECKPOINT_KEYS, RunDir
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.errors import UsageError
from vgrpo_lib.integrations import atomic
from vgrpo_lib.integrations.atomic import NAME_MAX, atomic_write_bytes, is_temp_name, os_error_naming, temp_prefix
from vgrpo_lib.integrations.tasks.hub import read_prompts
from vgrpo_lib.integrations.testbed import checkpoints as testbed_checkpoints
from vgrpo_lib.integrations.testbed.tasks import get_task
from tests.algorithms.conftest import TINY

DISK_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors' own words


def _train(out, *overrides):
    return cli_main(["train", "--algo", "vgrpo", "--out", str(out), *TINY, *overrides])


def _error_line(capsys, command="train"):
    """The one error line of a command (a progress bar of the work done before may precede it)."""
    err = capsys.readouterr().err
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith(f"vgrpo {command}: error: ") and "Traceback" not in err, err
    return last


# -- item 8: usage errors are their own type; any other ValueError is a bug with its traceback --------------------


def test_a_usage_error_is_exit_2_and_a_plain_value_error_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    assert issubclass(UsageError, ValueError)  # code catching ValueError keeps working
    assert _train(tmp_path / "a", "optim.lr=-1") == 2
    assert "optim.lr" in _error_line(capsys)

    def buggy(self, until=None):
        raise ValueError("Unknown format code 'f' for object of type 'str'")

    monkeypatch.setattr(Trainer, "train", buggy)
    with pytest.raises(ValueError, match="Unknown format code"):
        _train(tmp_path / "b")
    assert cli.expected_error(ValueError("a bug")) is None
    assert cli.expected_error(UsageError("bad input")) == (2, "bad input")


def _garble_second_cell(text):
    header, row, *rest = text.split("\n")
    cells = row.split(",")
    cells[1] = "oops"
    return "\n".join([header, ",".join(cells), *rest])


@pytest.mark.parametrize("table, edit, named", [
    ("eval.jsonl", lambda text: text.replace('"accuracy": ', '"accuracy": "x", "was": ', 1), "line 1, 'accuracy'"),
    ("metrics.csv", _garble_second_cell, "line 2, column 'reward_mean' holds 'oops'"),
])
def test_a_malformed_value_in_a_table_is_a_damaged_file_before_training(tmp_path, capsys, table, edit, named):
    out = tmp_path / "run"
    assert _train(out, "iterations=1", "eval.every=1") == 0
    path = out / table
    path.write_text(edit(path.read_text()))
    damaged = path.read_bytes()
    (out / "config.json").write_text((out / "config.json").read_text().replace('"iterations": 1', '"iterations": 2'))
    capsys.readouterr()
    assert cli_main(["train", "--out", str(out), "--resume"]) == 4
    err = _error_line(capsys)
    assert str(path) in err and named in err and "not a number" in err, err
    assert path.read_bytes() == damaged and [p.name for p in RunDir(out).checkpoint_paths()] == ["iter_000001.pt"]


# -- item 9: everything that can be checked is checked before the first write -------------------------------------


def test_wandb_without_an_api_key_is_one_line_before_anything_is_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env["HOME"] = str(tmp_path / "home")  # no ~/.netrc, no wandb settings
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "vgrpo_lib.algorithms.cli", "train", "--out", str(out), *TINY,
                           "log.backend=wandb"], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("vgrpo train: error: log.backend=wandb cannot log: ") and "WANDB_MODE=offline" in last
    assert "Traceback" not in done.stderr and not out.exists()


def test_nan_in_the_base_weights_is_a_damaged_file_not_a_learning_rate(tmp_path, monkeypatch, capsys):
    task = get_task("digits8")
    load = type(task).load_policy

    def damaged(self):
        policy = load(self)
        with torch.no_grad():
            next(policy.parameters()).view(-1)[0] = float("nan")
        return policy

    monkeypatch.setattr(type(task), "load_policy", damaged)
    out = tmp_path / "run"
    assert _train(out) == 4
    err = _error_line(capsys)
    assert "NaN or inf before any training" in err and "digits8" in err and "optim.lr" not in err, err
    assert not out.exists()


def test_resume_of_a_folder_that_never_got_its_config_says_to_start_it_again(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".config.json.k1ll3d0n.vgrpo.tmp").write_text("{")  # the one write a run killed this early made
    assert cli_main(["train", "--out", str(out), "--resume"]) == 3
    assert "start it again with the same command without --resume" in _error_line(capsys)
    assert _train(out, "iterations=1") == 0  # and the same command without --resume does


@pytest.mark.parametrize("overrides, named", [
    (["model.path=/somewhere"], "model.path=/somewhere"),
    (["model.lora_rank=4", "model.dtype=float32"], "model.lora_rank=4, model.dtype=float32"),
])
def test_model_keys_on_a_testbed_task_are_refused_naming_them(tmp_path, capsys, overrides, named):
    out = tmp_path / "run"
    assert _train(out, *overrides) == 2
    err = _error_line(capsys)
    assert named in err and "testbed task 'digits8'" in err, err
    assert not out.exists()


# -- item 6: expected failures are one line, not a traceback ------------------------------------------------------


def _sample(out):
    return cli_main(["sample", "--task", "digits8", "--per-prompt", "1", "--seed", "0", "--out", str(out)])


def test_sample_out_an_existing_folder_is_one_line_and_the_folder_untouched(tmp_path, capsys):
    folder = tmp_path / "samples"
    folder.mkdir()
    (folder / "mine.txt").write_text("keep")
    assert _sample(folder) == 2
    err = _error_line(capsys, "sample")
    assert str(folder) in err and "is a folder" in err, err
    assert [p.name for p in folder.iterdir()] == ["mine.txt"]


def test_a_name_that_fits_is_written_even_when_its_temporary_name_would_not(tmp_path, capsys):
    name = "s" * (NAME_MAX - 4) + ".npz"  # 255 bytes: fits; ".<name>.<8>.vgrpo.tmp" would be 275
    prefix = temp_prefix(name)
    assert len((prefix + "abcdefgh" + atomic.TEMP_SUFFIX).encode()) <= NAME_MAX
    assert is_temp_name(prefix + "abcdefgh" + atomic.TEMP_SUFFIX)
    multibyte = temp_prefix("é" * 200)  # cut at a character boundary, still UTF-8
    assert len((multibyte + "abcdefgh" + atomic.TEMP_SUFFIX).encode()) <= NAME_MAX and multibyte.endswith("é.")
    assert _sample(tmp_path / name) == 0
    assert (tmp_path / name).is_file() and sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_name_longer_than_the_file_system_takes_is_one_line(tmp_path, capsys, where):
    long = "n" * (NAME_MAX + 1)
    if where == "file":
        assert _sample(tmp_path / f"{long}.npz") == 2
        err = _error_line(capsys, "sample")
    else:
        assert _train(tmp_path / long / "run") == 2
        err = _error_line(capsys)
    assert long in err and "too long" in err, err
    assert list(tmp_path.iterdir()) == []


def test_checkpoints_replaced_by_a_file_is_one_line_and_the_file_untouched(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out, "iterations=1") == 0
    for path in (out / "checkpoints").iterdir():
        path.unlink()
    (out / "checkpoints").rmdir()
    (out / "checkpoints").write_text("my notes")
    capsys.readouterr()
    assert cli_main(["train", "--out", str(out), "--resume"]) == 3
    err = _error_line(capsys)
    assert f"{out / 'checkpoints'} is not a folder" in err, err
    assert (out / "checkpoints").read_text() == "my notes"


@pytest.mark.parametrize("missing", ["policy", "optimizer", "rng"])
def test_a_checkpoint_without_a_trainer_key_is_damaged_and_the_previous_one_used(tmp_path, capsys, missing):
    assert set(CHECKPOINT_KEYS) >= {"iteration", "policy", "optimizer", "rng"}
    out = tmp_path / "run"
    assert _train(out) == 0
    run = RunDir(out)
    newest = run.checkpoint_paths()[-1]
    state = torch.load(newest, weights_only=True)
    del state[missing]
    run_id = state.pop("run_id")
    run.save_checkpoint(state["iteration"], state, run_id, run.train_config())  # a hand-made one, its manifest right
    with pytest.warns(UserWarning, match=f"{newest}.*it has no {missing}; falling back"):
        assert cli_main(["train", "--out", str(out), "--resume"]) == 0


def _tiny_text_encoder(folder):
    transformers = pytest.importorskip("transformers", reason="the diffusers extra (CI installs it)")
    config = transformers.CLIPTextConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, max_position_embeddings=8)
    transformers.CLIPTextModel(config).save_pretrained(folder)
    return transformers.CLIPTextModel


@pytest.mark.parametrize("damage", ["empty", "truncated", "pickle with code"])
def test_a_damaged_weight_file_in_a_local_folder_is_one_line_naming_it(tmp_path, damage):
    from vgrpo_lib.integrations.rewards.loading import MissingWeightsError, load_weights

    folder = tmp_path / "text_encoder"
    model_class = _tiny_text_encoder(folder)
    weights = folder / "model.safetensors"
    if damage == "empty":
        weights.write_bytes(b"")
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:200])
    else:
        class Payload:
            def __reduce__(self):
                return (os.system, (f"touch {tmp_path / 'ran'}",))

        weights.unlink()
        weights = folder / "pytorch_model.bin"
        torch.save({"weight": Payload()}, weights)
    with pytest.raises(MissingWeightsError) as raised:
        load_weights(lambda: model_class.from_pretrained(folder), str(folder), "the text encoder")
    message = str(raised.value)
    assert str(weights) in message and "\n" not in message, message
    if damage == "pickle with code":
        assert "refused by weights_only loading" in message and "system" in message
    assert not (tmp_path / "ran").exists()


def test_a_prompt_file_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_bytes("a photo of a cat\n".encode() + b"caf\xe9\n")
    with pytest.raises(UsageError, match=f"prompt file '{path}' is not UTF-8 text \\(byte 20"):
        read_prompts(path)


# -- item 5: a full disk names the file --------------------------------------------------------------------------


def test_os_error_naming_names_the_file_a_writer_did_not():
    named = os_error_naming(OSError(errno.ENOSPC, "No space left on device"), "/runs/a.pt")
    assert (named.errno, named.filename) == (errno.ENOSPC, "/runs/a.pt")
    named = os_error_naming(SafetensorError(DISK_FULL), "/runs/a.safetensors")
    assert (named.errno, named.filename, named.strerror) == (errno.ENOSPC, "/runs/a.safetensors", os.strerror(28))
    assert os_error_naming(OSError(errno.ENOSPC, "full", "/already/named"), "/x") is None
    assert os_error_naming(SafetensorError("header too small"), "/x") is None
    assert os_error_naming(ValueError("not a write"), "/x") is None


def _disk_fills_on(monkeypatch, marker):
    """Writes of files whose temporary name contains ``marker`` fail as write() does on a full disk (no file name)."""
    write_bytes = atomic.Path.write_bytes

    def full(self, data):
        if marker in self.name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_bytes(self, data)

    monkeypatch.setattr(atomic.Path, "write_bytes", full)


def test_training_onto_a_full_disk_names_the_file(tmp_path, monkeypatch, capsys):
    _disk_fills_on(monkeypatch, "iter_000001.pt.")
    out = tmp_path / "run"
    assert _train(out) == 5
    err = _error_line(capsys)
    assert f"cannot write {out / 'checkpoints' / 'iter_000001.pt'}: No space left on device" in err, err
    assert not any(is_temp_name(p.name) for p in (out / "checkpoints").iterdir())


def test_compress_onto_a_full_disk_names_the_file(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert _train(out, "iterations=1") == 0
    _disk_fills_on(monkeypatch, "metrics.csv.gz")
    capsys.readouterr()
    assert cli_main(["compress", str(out)]) == 5
    assert f"cannot write {out / 'metrics.csv.gz'}: No space left on device" in _error_line(capsys, "compress")
    assert (out / "metrics.csv").exists()


@pytest.mark.parametrize("where", ["in the atomic write", "in the pipeline's own writer"])
def test_export_onto_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys, where):
    run = tmp_path / "run"
    assert _train(run, "iterations=1") == 0
    if where == "in the atomic write":
        def save_file(state, path):
            raise SafetensorError(DISK_FULL)

        monkeypatch.setattr(testbed_checkpoints, "save_file", save_file)
    else:
        def export_policy(self, policy, directory):
            (directory / "partial.safetensors").write_bytes(b"half")
            raise SafetensorError(DISK_FULL)

        monkeypatch.setattr(type(get_task("digits8")), "export_policy", export_policy)
    out = tmp_path / "export"
    capsys.readouterr()
    assert cli_main(["export", "--run", str(run), "--out", str(out)]) == 5
    err = _error_line(capsys, "export")
    assert f"cannot write {out}" in err and "No space left on device" in err, err
    assert not out.exists()  # nothing half-written: the same command can run again
