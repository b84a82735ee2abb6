"""vgrpo_lib.benchmarks.cost: per-phase seconds and NFE of a short real run, and the command's report."""

import json
import sys

import pytest

from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.benchmarks import cost

TINY = ["task=digits8", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "vgrpo.num_pairs=2"]


def test_measure_reports_every_phase_and_the_paper_nfe_accounting():
    report = cost.measure("vgrpo", [*TINY, "optim.epochs=2"])
    assert set(ITERATION_PHASES) <= set(report)
    assert all(report[phase] > 0 for phase in ITERATION_PHASES if phase != "prepare_s")
    # Medians of the phases need not sum to the median iteration, but none exceeds it.
    assert all(report[phase] <= report["iteration_s"] for phase in ITERATION_PHASES)
    # V-GRPO (paper accounting): the rollout's 4 steps; K = 2 pairs without grad for the old surrogate (two epochs,
    # so not single-step); per epoch K with grad plus K of the reference policy for the testbed's KL to the base.
    assert (report["nfe_rollout"], report["nfe_prepare"], report["nfe_update"]) == (4, 2, 2 * 2 + 2 * 2)
    assert report["nfe_per_sample"] == 4 + 2 + 8 and report["cpu_s_per_iteration"] > 0


def test_phases_only_command_writes_each_algorithm_on_the_task(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(cost, "measure", lambda algo, overrides: calls.append((algo, overrides)) or {"iteration_s": 1.0})
    monkeypatch.setattr(sys, "argv", ["cost", "--phases-only", "--task", "pair", "--out", str(tmp_path / "cost.json")])
    cost.main()
    report = json.loads((tmp_path / "cost.json").read_text())
    assert report == {"task": "pair", "algorithms": {algo: {"iteration_s": 1.0} for algo in ("vgrpo", "flow_grpo", "diffusion_nft")}}
    # As the comparison runs them: every algorithm on the task, V-GRPO without its KL to the base policy.
    assert calls == [("vgrpo", ["task=pair", "vgrpo.ref_kl_coef=none"]), ("flow_grpo", ["task=pair"]),
                     ("diffusion_nft", ["task=pair"])]


@pytest.mark.parametrize("quick, sizes", [(True, 2 + 2 + 2), (False, 4 + 4 + 2)])
def test_full_report_sweeps_group_size_pairs_and_image(monkeypatch, quick, sizes):
    monkeypatch.setattr(cost, "measure", lambda algo, overrides: {"algo": algo, "overrides": overrides})
    report = cost.run(quick)
    assert set(report["algorithms"]) == {"vgrpo", "vgrpo_2_epochs", "flow_grpo", "diffusion_nft"}
    assert len(report["vgrpo_scaling"]) == sizes
    assert all(entry["algo"] == "vgrpo" for entry in report["vgrpo_scaling"].values())
