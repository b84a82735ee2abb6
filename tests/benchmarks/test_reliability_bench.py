"""``python -m vgrpo_lib.benchmarks.reliability``: random SIGKILLs of a real run, each followed by a restart, end identical."""

import subprocess

import pytest

from vgrpo_lib.benchmarks.reliability import REPO, RUN_ARGS, WAIT_S, random_kills, run_differences, train_command

SHORT = [*RUN_ARGS, "iterations=3", "eval.every=2"]


@pytest.mark.slow
def test_random_kills_land_and_every_trial_ends_identical_to_the_uninterrupted_run(tmp_path):
    record = random_kills(3, seed=1, work=tmp_path, args=SHORT, log=lambda *_: None)
    assert len(record["kills"]) == 3 and all(k["return_code"] == -9 for k in record["kills"])
    assert record["trials"] and sum(t["kills"] for t in record["trials"]) == 3
    assert record["identical"], record["trials"]


@pytest.mark.slow
def test_run_differences_names_what_differs_between_two_seeds(tmp_path):
    for seed in (0, 1):
        subprocess.run(train_command(tmp_path / f"seed{seed}", [*SHORT, f"seed={seed}"]), check=True, cwd=REPO,
                       capture_output=True, timeout=WAIT_S)
    found = run_differences(tmp_path / "seed0", tmp_path / "seed1")
    assert any(f.startswith("policy[") for f in found) and "metrics.csv rows" in found
    assert run_differences(tmp_path / "seed0", tmp_path / "seed0") == []
