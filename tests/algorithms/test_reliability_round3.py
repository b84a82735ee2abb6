"""Reliability, round three (issue 29): a resume never mixes runs, a run never touches a file it did not write,
a damaged manifest is a damaged checkpoint, and a resume loses no metrics row and repeats no logged step."""

import json

import pytest

from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.run_dir import RESUME_MAY_CHANGE, RunDir
from tests.algorithms.conftest import TINY


def _train(out, *overrides):
    return cli_main(["train", "--algo", "vgrpo", "--out", str(out), *TINY, *overrides])


def _resume(out):
    return cli_main(["train", "--out", str(out), "--resume"])


def _edit_config(out, drop=(), **changes):
    path = out / "config.json"
    config = {k: v for k, v in json.loads(path.read_text()).items() if k not in drop}
    for key, value in changes.items():
        *sections, name = key.split(".")
        target = config
        for section in sections:
            target = target[section]
        target[name] = value
    path.write_text(json.dumps(config))


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
    _edit_config(out, **changes)
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
    _edit_config(out, iterations=3, checkpoint_every=2, **{"eval.every": 5})
    assert _resume(out) == 0
    assert [p.name for p in RunDir(out).checkpoint_paths()] == ["iter_000002.pt", "iter_000003.pt"]
    manifest = json.loads((out / "checkpoints" / "iter_000003.json").read_text())
    assert manifest["algo"] == "vgrpo" and manifest["task"] == "digits8" and manifest["library_version"]
    assert len(manifest["config_sha256"]) == 64 and manifest["config"]["group_size"] == 4
    _edit_config(out, iterations=2)  # fewer iterations than the checkpoint has: refused, not silently finished
    assert _resume(out) == 3
    assert "iterations" in capsys.readouterr().err
