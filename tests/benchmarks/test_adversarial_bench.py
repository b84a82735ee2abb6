"""``python -m vgrpo_lib.benchmarks.adversarial``: each trial runs the real command and checks its exit status, its
one error line and its invariant; a trial whose promise is broken is reported as broken."""

import dataclasses
import subprocess
import sys

import pytest

from vgrpo_lib.benchmarks.adversarial import BASE_ARGS, REPO, TRIALS, WAIT_S, TrialFolder, run_trial


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("adversarial") / "base"
    subprocess.run([sys.executable, "-m", "vgrpo_lib.algorithms.cli", "train", "--algo", "vgrpo", "--out", str(base),
                    *BASE_ARGS], cwd=REPO, check=True, capture_output=True, timeout=WAIT_S)
    return base


def _trial(name):
    return next(trial for trial in TRIALS if trial.name == name)


def test_the_trials_cover_every_class_of_the_reliability_issue():
    assert {t.kind for t in TRIALS} == {"config edits", "user files in --out", "damaged manifests", "damaged files",
                                        "full disk", "bad input"}
    commands = {t.name.split(" ")[0] for t in TRIALS if t.kind == "full disk"}
    assert commands == {"train", "sample", "eval", "export", "compress"}  # every command that writes


@pytest.mark.parametrize("name", ["config edited: algo vgrpo -> flow_grpo (its vgrpo section removed)", "--out's .lock is a symlink to a user file",
                                  "model.path on a testbed task"])
def test_a_trial_that_holds_is_reported_as_held(tmp_path, base_run, name):
    record = run_trial(_trial(name), TrialFolder(tmp_path, base_run, None))
    assert record["held"] and record["broke"] == [], record
    assert record["error"].startswith("vgrpo train: error: ")


def test_a_broken_promise_is_reported_with_what_broke(tmp_path, base_run):
    wrong = dataclasses.replace(_trial("model.path on a testbed task"), exit_code=3, named=("no such words",))
    record = run_trial(wrong, TrialFolder(tmp_path, base_run, None))
    assert not record["held"]
    assert record["broke"] == ["exit 2, expected 3", "the error does not name 'no such words'"]

