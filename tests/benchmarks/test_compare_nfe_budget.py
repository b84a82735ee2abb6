"""``vgrpo compare --nfe-budget N``: every setting gets the same compute (N model evaluations per sample), not the same
iterations; each setting's iterations are N over its NFE per iteration, read from its algorithm as built for training
(``iteration_nfe``), and the runs' own NFE tables must agree with it (issue 30: the iteration budget stopped V-GRPO,
whose iteration is the cheapest, first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.registry import ALGORITHM_CLASSES
from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.algorithms.trainer import Trainer, iteration_nfe
from vgrpo_lib.benchmarks import levers
from vgrpo_lib.benchmarks.cli import main
from vgrpo_lib.benchmarks.compare import VARIANTS, chosen_config, run_compare, run_name, runner
from vgrpo_lib.errors import UsageError

RESULTS = Path(__file__).resolve().parents[2] / "results"
TINY = ["prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=2", "eval.num_steps=4"]


@pytest.mark.parametrize("algo", sorted(ALGORITHM_CLASSES))
@pytest.mark.parametrize(("epochs", "downsample"), [(1, "none"), (2, "none"), (2, 2)])
def test_iteration_nfe_is_what_an_iteration_of_the_run_spends(algo, epochs, downsample, tmp_path):
    """For every registered algorithm, one and two epochs (V-GRPO's prepare forwards appear with two), and with the
    update on half of each group (advantage.downsample): the NFE that the budget divides by equals the first
    iteration's NFE per sample in the run's own metrics."""
    # The preset's own rollout (DGPO trains up to a step of it), a small batch.
    small = ["prompts_per_iteration=4", "group_size=4", "eval.per_prompt=2", "eval.num_steps=4"]
    config = build_config(algo, "digits8", "official", [*small, "iterations=1", f"optim.epochs={epochs}",
                                                        f"advantage.downsample={downsample}"])
    expected = iteration_nfe(config)
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.train()
    row = RunDir(tmp_path / "run").read_rows("metrics.csv")[0]
    assert row["nfe_per_sample"] == expected > 0
    assert row["nfe_rollout"] + row["nfe_prepare"] + row["nfe_update"] == expected


def test_a_config_whose_cost_changes_as_it_trains_is_refused_by_name():
    config = build_config("vgrpo", "digits8", "official", [*TINY, "vgrpo.adaptive_pairs=share=0.5,max=8,every=2"])
    with pytest.raises(UsageError, match=r"vgrpo with vgrpo\.adaptive_pairs chooses its cost per iteration"):
        iteration_nfe(config)


def test_the_pipeline_comparisons_settings_are_costed_as_its_protocol_recorded():
    """On MNIST-SD3 (a pipeline whose policy gains a behaviour adapter when an algorithm is built on it) every
    setting is costed, and the iterations are those the landed equal-compute comparison recorded
    (results/compare-mnist-sd3-digit-nfe/protocol.json.gz)."""
    recorded = json.loads(read_stored_text(RESULTS / "compare-mnist-sd3-digit-nfe" / "protocol.json"))
    table = runner.setting_iterations(recorded["nfe_budget"], tuple(recorded["setting_iterations"]), recorded["task"],
                                      recorded["learning_rates"][0], ["eval.every=10", *recorded["overrides"]],
                                      recorded["pipeline"])
    assert table == recorded["setting_iterations"] == {
        "vgrpo+lean": {"one_step": 230, "two_epochs": 153, "paper_soft_clip": 230},
        "diffusion_nft": {"one_step": 65, "two_epochs": 40, "two_minibatches": 65}}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"iterations": 3}, "--nfe-budget sets each setting's iterations"),
    ({"overrides": [*TINY, "iterations=3"]}, "--nfe-budget sets each setting's iterations"),
    # V-GRPO with two epochs: 4 rollout steps, K = 4 prepare forwards, 2 x 4 in the update.
    ({"nfe_budget": 10}, r"--nfe-budget 10 is under one iteration of vgrpo \(two_epochs\), which costs 16 NFE per sample"),
    ({"overrides": [*TINY, "vgrpo.adaptive_pairs=share=0.5,max=8,every=2"]}, r"vgrpo\.adaptive_pairs"),
])
def test_an_nfe_budget_that_cannot_be_spent_alike_is_refused_before_anything_is_written(tmp_path, kwargs, message):
    kwargs = {"nfe_budget": 200, "overrides": TINY} | kwargs
    with pytest.raises(UsageError, match=message):
        run_compare(tmp_path / "cmp", task="digits8", seeds=1, quick=True, variants=("vgrpo", "diffusion_nft"),
                    learning_rates=(1e-3,), **kwargs)
    assert not (tmp_path / "cmp").exists()


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    out = tmp_path_factory.mktemp("nfe_comparison")
    assert main(["compare", "--task", "digits8", "--quick", "--seeds", "2", "--variants", "vgrpo", "diffusion_nft",
                 "--learning-rates", "1e-3", "--nfe-budget", "150", "--out", str(out), *TINY]) == 0
    return out


def test_each_setting_runs_the_iterations_that_spend_the_budget(comparison):
    protocol = json.loads((comparison / "protocol.json").read_text())
    assert protocol["nfe_budget"] == 150 and protocol["budget"] == ["eval.every=10"]
    runs = 0
    for variant, controls in protocol["setting_iterations"].items():
        assert set(controls) == set(VARIANTS[variant].step_controls)
        for control, iterations in controls.items():
            for path in (comparison / "runs").glob(f"{variant}_{control}_lr*"):
                config = RunDir(path).train_config()
                per_iteration = iteration_nfe(config)
                # The most whole iterations within the budget, as the run's own table counts them.
                assert config.iterations == iterations == 150 // per_iteration
                spent = RunDir(path).read_rows("metrics.csv")[-1]["nfe_cumulative"]
                assert spent == iterations * per_iteration and 150 - per_iteration < spent <= 150
                # The evaluation still closes every run, whatever its length.
                assert RunDir(path).read_jsonl("eval.jsonl")[-1]["iteration"] == iterations
                runs += 1
    assert runs == 3 + 3 + 2 + 2  # three tuning settings each, two reported seeds each
    iterations = protocol["setting_iterations"]
    summary = json.loads((comparison / "summary.json").read_text())
    chosen = {algo: iterations[algo][row["step_control"]] for algo, row in summary["algorithms"].items()}
    assert (f"Equal compute: every setting ran the iterations that fit in 150 model evaluations per sample; the "
            f"chosen settings' iterations: vgrpo {chosen['vgrpo']}, diffusion_nft {chosen['diffusion_nft']}."
            in (comparison / "summary.md").read_text())
    # The cheaper iteration trains longer: V-GRPO's one step per rollout needs no prepare forwards.
    assert iterations["vgrpo"]["one_step"] > iterations["diffusion_nft"]["one_step"]
    assert iterations["vgrpo"]["one_step"] > iterations["vgrpo"]["two_epochs"]


def test_levers_on_a_comparison_under_an_nfe_budget_start_from_each_settings_own_iterations(comparison, tmp_path):
    protocol = json.loads((comparison / "protocol.json").read_text())
    chosen = {name: protocol["chosen"][name]["step_control"] for name in ("vgrpo", "diffusion_nft")}
    own = {name: protocol["setting_iterations"][name][control] for name, control in chosen.items()}
    for name in chosen:  # the reported run's config, as the comparison built it
        config = chosen_config(protocol, name, 1)
        stored = RunDir(comparison / "runs" / run_name(name, chosen[name], 1e-3, 1)).train_config()
        assert config.to_json() == stored.to_json() and config.iterations == own[name]
    report = levers.run_levers(comparison, tmp_path, variant="vgrpo", cells=["budget_x2"])
    assert report["cells"]["budget_x2"]["iterations"] == 2 * own["vgrpo"]
    for name, row in report["references"].items():
        assert row["iterations"] == own[name]
        assert row["nfe_per_sample"] == pytest.approx(iteration_nfe(chosen_config(protocol, name, 0)) * own[name])
