"""The public extension path: a user's own task object, task factory (by name or import path) and reward.

The task is the tutorial's 2-D flow-matching toy (``docs/examples/custom_task.py``), imported from its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vgrpo_lib.algorithms.cli import main
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.tasks import REQUIRED_MEMBERS, TaskProtocol, TaskProtocolError, check_task, load_task
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.benchmarks.reliability import run_differences
from vgrpo_lib.integrations.tasks import (
    TASK_ENTRIES, ImportPathError, build_task, is_import_path, register_task, resolve_task_name,
)
from vgrpo_lib.integrations.tasks.hub import ImportedMultiReward, ImportedReward, make_reward

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
FACTORY = "custom_task:make_task"
SHORT = ["iterations=3", "prompts_per_iteration=2", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=8",
         "eval.num_steps=4", "eval.every=0", "checkpoint_every=1", "log.backend=csv", "optim.lr=3e-3"]
HERE = "tests.algorithms.test_custom_task"


@pytest.fixture
def toy(monkeypatch):
    """The tutorial module (its folder on sys.path, as PYTHONPATH=docs/examples puts it)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import custom_task

    return custom_task


@pytest.fixture
def registered():
    """Names registered by a test, removed afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        TASK_ENTRIES.pop(name, None)


def _config(*overrides: str) -> TrainConfig:
    return build_config("vgrpo", None, "testbed", [*SHORT, *overrides])


# -- the protocol ------------------------------------------------------------------------------------------------


class _Partial:
    sample_shape = (2,)

    def decode(self, samples):
        return samples

    reward = 3  # present, not callable


def test_check_task_names_every_missing_member_in_one_error():
    with pytest.raises(TaskProtocolError) as raised:
        check_task(_Partial())
    message = str(raised.value)
    missing = [name for name in REQUIRED_MEMBERS if name not in ("sample_shape", "decode", "reward")]
    assert all(REQUIRED_MEMBERS[name] in message for name in missing), message
    assert "reward is not callable" in message and "decode" not in message.replace("decode(samples)", "")
    assert "\n" not in message and not isinstance(_Partial(), TaskProtocol)


def test_the_shipped_tasks_and_the_toy_satisfy_the_protocol(toy):
    task = check_task(toy.make_task())
    assert isinstance(task, TaskProtocol) and isinstance(load_task("digits8"), TaskProtocol)


def test_trainer_refuses_a_non_task_before_writing_anything(tmp_path):
    with pytest.raises(TaskProtocolError, match=r"missing sample_prompts\(n, generator\)"):
        Trainer(_config(), tmp_path / "run", task=_Partial())
    assert not (tmp_path / "run").exists()


# -- Trainer(task=obj) -------------------------------------------------------------------------------------------


def test_trainer_with_a_task_object_trains_and_resumes_exactly(toy, tmp_path):
    config = _config()
    Trainer(config, tmp_path / "straight", task=toy.make_task(), progress=False).train()
    saved = json.loads((tmp_path / "straight" / "config.json").read_text())
    assert saved["task"] == "custom_task.Toy2DTask"  # config.task="digit" would name another task: replaced

    Trainer(config, tmp_path / "resumed", task=toy.make_task(), progress=False).train(until=1)
    with pytest.raises(ValueError, match=r"Trainer.resume\(run_dir, task=obj\)"):
        Trainer.resume(tmp_path / "resumed")  # a task object cannot be rebuilt from the config
    Trainer.resume(tmp_path / "resumed", task=toy.make_task(), progress=False).train()
    assert run_differences(tmp_path / "straight", tmp_path / "resumed") == []


def test_a_label_of_the_users_own_is_kept(toy, tmp_path):
    from dataclasses import replace

    trainer = Trainer(replace(_config(), task="toy2d"), tmp_path / "run", task=toy.make_task(), progress=False)
    assert trainer.config.task == "toy2d"


# -- register_task -----------------------------------------------------------------------------------------------


def test_register_task_makes_a_factory_buildable_by_name(toy, registered, tmp_path):
    register_task("toy2d-test", toy.make_task, "the tutorial's 2-D toy")
    registered.append("toy2d-test")
    assert isinstance(build_task("toy2d-test"), toy.Toy2DTask)
    assert resolve_task_name("toy2d-test") == "toy2d-test"
    with pytest.raises(ValueError, match="already registered"):
        register_task("toy2d-test", toy.make_task, "again")
    register_task("toy2d-test", lambda settings: toy.make_task(), "with settings", replace=True)
    assert isinstance(build_task("toy2d-test", {"lora_rank": 4}), toy.Toy2DTask)
    with pytest.raises(ValueError, match="':'"):
        register_task("pkg:name", toy.make_task, "an import path's syntax")
    with pytest.raises(ValueError, match="callable"):
        register_task("toy2d-other", 42, "not a factory")
    evaluations = Trainer(_config("task=toy2d-test"), tmp_path / "run", progress=False).train()
    assert evaluations[-1]["iteration"] == 3


# -- --task package.module:factory -------------------------------------------------------------------------------


def test_cli_trains_from_an_import_path_and_resume_rebuilds_it(toy, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", FACTORY, "--out", str(out), *SHORT]) == 0
    assert json.loads((out / "config.json").read_text())["task"] == FACTORY
    rows = [json.loads(line) for line in (out / "eval.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 3]

    partial = tmp_path / "partial"
    Trainer(build_config("vgrpo", FACTORY, "testbed", SHORT), partial, progress=False).train(until=1)
    assert main(["train", "--resume", "--out", str(partial)]) == 0  # the saved import path, built again
    assert run_differences(out, partial) == []


def test_sample_takes_an_import_path_too(toy, tmp_path, capsys):
    out = tmp_path / "samples.npz"
    assert main(["sample", "--task", FACTORY, "--per-prompt", "5", "--seed", "0", "--steps", "4", "--out", str(out)]) == 0
    import numpy as np

    assert np.load(out)["images"].shape == (5, 2)  # the toy's samples are 2-D points


def _one_line_error(argv: list[str], capsys) -> str:
    code = main(argv)
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and error.startswith("vgrpo train: error: "), error
    return error


def make_nothing():
    return 42


NOT_A_FACTORY = {"answer": 42}


def make_with_two(a, b):
    return None


@pytest.mark.parametrize(("task", "expected"), [
    ("no_such_module_h1:make_task", "no module named 'no_such_module_h1'"),
    ("custom_task:no_such_factory", "'custom_task' has no attribute 'no_such_factory' (it defines: "),
    (f"{HERE}:make_nothing", "int object (from the task 'tests.algorithms.test_custom_task:make_nothing') is not a "
                             "task: missing sample_shape"),
    (f"{HERE}:NOT_A_FACTORY", "is a dict, not a task factory"),
    (f"{HERE}:make_with_two", "takes 2 required arguments (a, b)"),
    ("no-such-task", "Unknown task 'no-such-task' under preset 'testbed'; valid tasks: digit, "),
])
def test_a_bad_task_is_one_line(toy, tmp_path, capsys, task, expected):
    error = _one_line_error(["train", "--task", task, "--out", str(tmp_path / "run"), *SHORT], capsys)
    assert expected in error
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "config.json").exists()


def test_train_help_separates_the_kinds_of_tasks_and_shows_the_default_algorithm(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a testbed task" not in text.replace("a testbed task (", "")
    assert "(default: vgrpo)" in text
    for kind in ("a testbed task (digit,", "--preset mnist-sd3 --task", "a hub model (flux.1-dev, flux.2-dev, flux.2-klein,",
                 "package.module:factory"):
        assert kind in text, kind


# -- model.reward=package.module:function ------------------------------------------------------------------------


def brightness(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    return images.mean(dim=(1, 2, 3))


def two_columns(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    return torch.stack([images.mean(dim=(1, 2, 3)), images.amax(dim=(1, 2, 3))], dim=1)


two_columns.names = ["mean", "max"]
two_columns.weights = [1.0, 0.5]


def undeclared_columns(images, prompts):
    return torch.zeros(images.shape[0], 2)


def a_list(images, prompts):
    return [0.0] * images.shape[0]


def integers(images, prompts):
    return torch.zeros(images.shape[0], dtype=torch.long)


IMAGES = torch.rand(4, 3, 8, 8)
PROMPTS = ["a", "b", "c", "d"]


def test_a_reward_by_import_path_is_any_callable_checked_on_its_first_call():
    assert is_import_path(f"{HERE}:brightness") and not is_import_path("pickscore:1") and not is_import_path(
        "pickscore:1,ocr:0.5")
    single = make_reward(f"{HERE}:brightness")
    assert type(single) is ImportedReward and not hasattr(single, "stack")
    assert torch.equal(single(IMAGES, PROMPTS), IMAGES.mean(dim=(1, 2, 3)))

    multi = make_reward(f"{HERE}:two_columns")
    assert isinstance(multi, ImportedMultiReward) and multi.names == ["mean", "max"]
    assert multi.stack(IMAGES, PROMPTS).shape == (4, 2)
    assert torch.allclose(multi(IMAGES, PROMPTS), two_columns(IMAGES, PROMPTS) @ torch.tensor([1.0, 0.5]))


@pytest.mark.parametrize(("name", "expected"), [
    ("undeclared_columns", r"returned shape \(4, 2\): a reward with several columns must declare them as "
                           r"`undeclared_columns.names`"),
    ("a_list", r"returned a list; it must return a float tensor of shape \(4,\)"),
    ("integers", "returned dtype torch.int64; it must be a float tensor"),
])
def test_a_wrong_reward_result_is_named_on_the_first_call(name, expected):
    with pytest.raises(ValueError, match=expected):
        make_reward(f"{HERE}:{name}")(IMAGES, PROMPTS)


def test_a_bad_reward_path_is_one_line():
    with pytest.raises(ImportPathError, match="The reward 'no_such_module_h1:score': no module named"):
        make_reward("no_such_module_h1:score")
    with pytest.raises(ValueError, match="is a list, not a callable"):
        make_reward(f"{HERE}:PROMPTS")
