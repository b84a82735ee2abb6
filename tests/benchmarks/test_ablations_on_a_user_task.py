"""The ablations run on a user's task through its import path, one without the testbed's accuracy and diversity
(the custom-task tutorial's 2-D toy, as ``results/toy2d-regime/`` does)."""

from __future__ import annotations

from pathlib import Path

from vgrpo_lib.benchmarks.ablations import markdown, run_cell
from vgrpo_lib.benchmarks.analysis.training_speed import training_speed

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
TOY = ["prompts_per_iteration=2", "group_size=8", "rollout.num_steps=4", "eval.per_prompt=64", "eval.num_steps=4",
       "log.backend=csv", "optim.lr=3e-3"]


def test_a_cell_on_a_task_without_accuracy_reports_its_reward_and_reads_back_its_speed(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    cell = run_cell(tmp_path, "vgrpo", TOY, seeds=2, iterations=3, task="custom_task:make_task")
    assert set(cell) == {"final_reward", "base_reward", "overrides"}  # no accuracy, no diversity: the toy has none
    assert 0.0 <= cell["final_reward"]["mean"] <= 1.0 and cell["final_reward"]["std"] >= 0.0
    table = markdown({"set": "paper", "seeds": 2, "iterations": 3, "cells": {"vgrpo": cell}})
    assert "| vgrpo | " in table and table.rstrip().endswith("| — | — |")
    speed = training_speed(tmp_path, target=2.0)  # a reward of 2 is never reached
    assert speed.splitlines()[2].split()[0] == "vgrpo" and speed.splitlines()[2].endswith("inf  0/2")
