"""`vgrpo levers`: levers added to a finished comparison's chosen setting, run on its reported seeds and summarised
against its own targets (vgrpo_lib.benchmarks.levers)."""

import json
import math
import statistics

import pytest

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.benchmarks import levers
from vgrpo_lib.benchmarks.cli import main
from vgrpo_lib.benchmarks.compare import (
    VARIANTS, build, chosen_config, median_ratios, ratio_cell, run_compare, summarise_run,
)
from vgrpo_lib.errors import UsageError

TINY = ["prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=2", "eval.num_steps=4"]


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    out = tmp_path_factory.mktemp("comparison")
    run_compare(out, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"), learning_rates=(1e-3,),
                overrides=TINY, iterations=3)
    return out


def test_each_cell_runs_the_chosen_setting_plus_its_levers_against_the_comparisons_targets(comparison, tmp_path):
    report = levers.run_levers(comparison, tmp_path, variant="vgrpo", cells=["k8", "k8+ema_eval"])
    protocol = json.loads((comparison / "protocol.json").read_text())
    summary = json.loads((comparison / "summary.json").read_text())
    assert report["target"] == protocol["target"] and report["heldout_target"] == protocol["heldout"]["target"]
    assert report["chosen"] == protocol["chosen"]["vgrpo"] and report["seeds"] == [0, 1]

    for cell in ("k8", "k8+ema_eval"):
        for seed, row in zip((0, 1), report["cells"][cell]["per_seed"]):
            run = RunDir(tmp_path / "runs" / f"{cell}_seed{seed}")
            config = run.train_config()
            # The comparison's setting of this seed (lr, step control, budget, tiny overrides) plus the levers.
            assert config.seed == seed and config.optim.lr == protocol["chosen"]["vgrpo"]["lr"]
            assert config.iterations == 3 and config.rollout.num_steps == 4 and config.vgrpo.num_pairs == 8
            assert config.optim.ema_decay == (0.9 if cell == "k8+ema_eval" else None)
            # Each row is the protocol's summary of the run's own tables, against the comparison's targets.
            expected = summarise_run(run.read_rows("metrics.csv"), run.read_jsonl("eval.jsonl"), protocol["target"],
                                     protocol["heldout"]["target"])
            assert row == pytest.approx(expected, nan_ok=True)

    # The ratios are the cell's median over the unchanged setting's (the comparison's own runs) and DiffusionNFT's.
    assert report["comparison_finished"] and set(report["references"]) == {"vgrpo", "diffusion_nft"}
    for key, reference in summary["per_seed"].items():
        cell_median, reference_median = (statistics.median(math.inf if r["nfe_to_target"] is None else r["nfe_to_target"]
                                                           for r in runs)
                                          for runs in (report["cells"]["k8"]["per_seed"], reference))
        ratio = report["cells"]["k8"]["over"][key]["nfe_to_target"]["ratio"]
        if math.isinf(cell_median) or math.isinf(reference_median):
            assert ratio is None  # a median seed that never reached the target: not estimable
        else:
            assert ratio == pytest.approx(cell_median / reference_median)
    assert json.loads((tmp_path / "levers.json").read_text()) == json.loads(json.dumps(report))
    table = (tmp_path / "levers.md").read_text()
    assert "| vgrpo (comparison) |" in table and "| diffusion_nft (comparison) |" in table and "| k8+ema_eval |" in table
    # Each row's budget: the iterations and NFE per sample its runs spent (the comparison's own runs' tables for
    # its rows), so a reader sees which rows had equal compute.
    for name in ("vgrpo", "diffusion_nft"):
        spent = [RunDir(comparison / "runs" / f"{name}_{protocol['chosen'][name]['step_control']}_lr0.001_seed{seed}")
                 .read_rows("metrics.csv")[-1]["nfe_cumulative"] for seed in (0, 1)]
        assert report["references"][name]["nfe_per_sample"] == pytest.approx(statistics.mean(spent))
        assert f"| {name} (comparison) | 3 ({statistics.mean(spent):.0f}) |" in table
    # Each row's seconds per iteration (a machine unlike the comparison's shows there) and the held-out NFE ratios,
    # which no machine changes, beside the time ratios.
    k8_row = report["cells"]["k8"]
    over = k8_row["over"]
    assert (f"| k8 | 3 ({k8_row['nfe_per_sample']:.0f}) | {k8_row['seconds_per_iteration']:.2f} | " in table)
    expected_ratios = " | ".join(ratio_cell(over[reference][key]) for reference, key in (
        ("vgrpo", "heldout_time_to_target_s"), ("vgrpo", "heldout_nfe_to_target"),
        ("diffusion_nft", "heldout_time_to_target_s"), ("diffusion_nft", "heldout_nfe_to_target"),
        ("diffusion_nft", "time_to_target_s")))
    assert next(line for line in table.splitlines() if line.startswith("| k8 |")).endswith(f" | {expected_ratios} |")
    assert "over unchanged vgrpo (held-out NFE) | over diffusion_nft (held-out time)" in table
    k8 = [RunDir(tmp_path / "runs" / f"k8_seed{seed}").read_rows("metrics.csv") for seed in (0, 1)]
    assert report["cells"]["k8"]["iterations"] == 3
    assert report["cells"]["k8"]["nfe_per_sample"] == statistics.mean(rows[-1]["nfe_cumulative"] for rows in k8)


def test_the_baseline_cell_retrains_the_unchanged_setting_and_every_cell_has_ratios_over_it(comparison, tmp_path):
    """baseline: the comparison's chosen config exactly, trained again here, so the other cells' time ratios can be
    read on one machine; it takes no lever, and a lever that changes nothing is still refused."""
    report = levers.run_levers(comparison, tmp_path, variant="vgrpo", cells=["baseline", "k8"])
    protocol = json.loads((comparison / "protocol.json").read_text())
    for seed in (0, 1):
        retrained = RunDir(tmp_path / "runs" / f"baseline_seed{seed}")
        assert retrained.train_config().to_json() == chosen_config(protocol, "vgrpo", seed).to_json()
    baseline, k8 = report["cells"]["baseline"], report["cells"]["k8"]
    assert baseline["overrides"] == [] and "baseline" not in baseline["over"]
    expected = median_ratios(k8["per_seed"], baseline["per_seed"])
    assert k8["over"]["baseline"] == json.loads(json.dumps(expected))
    table = (tmp_path / "levers.md").read_text()
    assert "| over baseline (held-out time) | over baseline (training time) |" in table
    k8_line = next(line for line in table.splitlines() if line.startswith("| k8 |"))
    assert k8_line.endswith(f" | {ratio_cell(expected['heldout_time_to_target_s'])} | "
                            f"{ratio_cell(expected['time_to_target_s'])} |")
    baseline_line = next(line for line in table.splitlines() if line.startswith("| baseline |"))
    assert baseline_line.endswith(" | — | — |")
    with pytest.raises(UsageError, match="'baseline' is the unchanged setting and takes no lever"):
        levers.cell_overrides("baseline+k8", 3, 1e-3)
    with pytest.raises(UsageError, match="'k4' leaves vgrpo's chosen setting"):  # K = 4 already: still refused
        levers.run_levers(comparison, tmp_path / "refused", variant="vgrpo", cells=["baseline", "k4"])
    assert not (tmp_path / "refused").exists()


def test_a_budget_lever_multiplies_the_comparisons_iterations_and_the_evaluations_go_on(comparison, tmp_path):
    """budget_x2: the chosen setting with twice the comparison's iterations (3 -> 6), evaluated at the same period
    past the comparison's end, alone or beside a config lever; every other setting as the comparison's."""
    report = levers.run_levers(comparison, tmp_path, variant="vgrpo", cells=["budget_x2", "budget_x2+ema_eval"])
    protocol = json.loads((comparison / "protocol.json").read_text())
    for cell in ("budget_x2", "budget_x2+ema_eval"):
        assert report["cells"][cell]["overrides"][0] == "iterations=6" and report["cells"][cell]["iterations"] == 6
        for seed in (0, 1):
            run = RunDir(tmp_path / "runs" / f"{cell}_seed{seed}")
            config = run.train_config()
            plain = chosen_config(protocol, "vgrpo", seed)
            assert config.iterations == 6 and plain.iterations == 3
            assert config.optim.ema_decay == (0.9 if cell.endswith("ema_eval") else None)
            changed = {key for key, value in config.to_dict().items() if plain.to_dict()[key] != value}
            assert changed == ({"iterations", "optim"} if cell.endswith("ema_eval") else {"iterations"})
            assert [row["iteration"] for row in run.read_rows("metrics.csv")] == list(range(6))
            assert [row["iteration"] for row in run.read_jsonl("eval.jsonl")][-1] == 6
    assert "| budget_x2 | 6 (" in (tmp_path / "levers.md").read_text()



def test_the_decay_lever_takes_the_chosen_rate_down_by_a_cosine_over_the_cells_iterations(comparison, tmp_path):
    """lr_cosine: from the chosen rate (1e-3) to a tenth of it over the run, lengthened with a budget lever in the
    same cell whatever the order; the run's metrics carry the rate of each iteration (the step control's)."""
    assert levers.cell_overrides("lr_cosine", 230, 3e-3) == ["schedule.lr=cosine:end=0.0003,steps=230"]
    both = ["iterations=460", "schedule.lr=cosine:end=0.0003,steps=460"]
    assert levers.cell_overrides("budget_x2+lr_cosine", 230, 3e-3) == both
    assert levers.cell_overrides("lr_cosine+budget_x2", 230, 3e-3) == both[::-1]
    report = levers.run_levers(comparison, tmp_path, variant="diffusion_nft", cells=["lr_cosine"])
    for seed in (0, 1):
        run = RunDir(tmp_path / "runs" / f"lr_cosine_seed{seed}")
        assert run.train_config().schedule.lr == "cosine:end=0.0001,steps=3"
        rates = [row["lr"] for row in run.read_rows("metrics.csv")]
        expected = [1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi * i / 3)) for i in range(3)]
        assert rates == pytest.approx(expected)
    assert report["cells"]["lr_cosine"]["overrides"] == ["schedule.lr=cosine:end=0.0001,steps=3"]


def test_a_lever_on_both_sides_of_a_comparison_gives_the_protocols_ratio_of_the_two_cells(comparison, tmp_path,
                                                                                           capsys):
    """pair_ratios --cell: the same lever run on two algorithms of one comparison, divided cell by cell with the
    protocol's bootstrap (median_ratios of their per-seed rows); a missing cell, or levers of comparisons with other
    targets, are refused by name."""
    from vgrpo_lib.benchmarks.analysis.pair_ratios import lever_pair_ratios
    from vgrpo_lib.benchmarks.analysis.pair_ratios import main as pair_ratios_main
    from vgrpo_lib.benchmarks.compare import HELDOUT_RATIO_KEYS, median_ratios, ratio_cell

    sides = {v: levers.run_levers(comparison, tmp_path / v, variant=v, cells=["lr_cosine", "euler_6"])
             for v in ("vgrpo", "diffusion_nft")}
    capsys.readouterr()
    table = lever_pair_ratios(tmp_path / "vgrpo", tmp_path / "diffusion_nft", "lr_cosine")
    ratios = median_ratios(*(sides[v]["cells"]["lr_cosine"]["per_seed"] for v in ("vgrpo", "diffusion_nft")))
    for key in HELDOUT_RATIO_KEYS:
        assert f"| {key} | " in table and table.split(f"| {key} | ")[1].split("\n")[0].endswith(
            f"| {ratio_cell(ratios[key])} |")
    assert "vgrpo lr_cosine's median over diffusion_nft lr_cosine's (2 and 2 seeds" in table
    assert pair_ratios_main(["--cell", "lr_cosine", str(tmp_path / "vgrpo"), str(tmp_path / "diffusion_nft")]) == 0
    assert capsys.readouterr().out == table
    with pytest.raises(UsageError, match="diffusion_nft: no cell 'k8'; it has lr_cosine, euler_6"):
        lever_pair_ratios(tmp_path / "diffusion_nft", tmp_path / "vgrpo", "k8")
    other = json.loads((tmp_path / "vgrpo" / "levers.json").read_text()) | {"heldout_target": 0.5}
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "levers.json").write_text(json.dumps(other))
    with pytest.raises(UsageError, match="measure against different targets"):
        lever_pair_ratios(tmp_path / "other", tmp_path / "diffusion_nft", "lr_cosine")
    with pytest.raises(SystemExit):
        pair_ratios_main(["--cell", "lr_cosine", str(tmp_path / "vgrpo")])

def test_levers_start_once_the_settings_are_chosen_and_a_second_command_adds_the_ratios(comparison, tmp_path,
                                                                                       monkeypatch, capsys):
    # A comparison in its reported phase: protocol.json written, no summary yet.
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "protocol.json").write_text((comparison / "protocol.json").read_text())
    early = levers.run_levers(unfinished, tmp_path / "levers", cells=["ema_eval"])
    assert not early["comparison_finished"] and early["references"] == {}
    assert early["cells"]["ema_eval"]["over"] == {}
    assert "has not finished: no ratios yet" in (tmp_path / "levers" / "levers.md").read_text()

    def no_training(self):
        raise AssertionError("a finished lever run was trained again")

    monkeypatch.setattr(Trainer, "train", no_training)
    # Finished (its summary there), the same command reads every lever run back and adds the ratios.
    (unfinished / "summary.json").write_text((comparison / "summary.json").read_text())
    assert main(["levers", "--comparison", str(unfinished), "--levers", "ema_eval", "--out",
                 str(tmp_path / "levers")]) == 0
    assert capsys.readouterr().out.count("(read back)") == 2
    late = json.loads((tmp_path / "levers" / "levers.json").read_text())
    assert late["comparison_finished"] and set(late["cells"]["ema_eval"]["over"]) == {"vgrpo", "diffusion_nft"}
    assert late["cells"]["ema_eval"]["per_seed"] == json.loads(json.dumps(early["cells"]["ema_eval"]["per_seed"]))


def test_bad_requests_are_refused_by_name_before_any_run(comparison, tmp_path):
    with pytest.raises(UsageError, match="has chosen no setting yet"):
        levers.run_levers(tmp_path / "nothing", tmp_path / "out", cells=["k8"])
    with pytest.raises(UsageError, match="'awm' is not in the comparison"):
        levers.run_levers(comparison, tmp_path / "out", variant="awm", cells=["k8"])
    with pytest.raises(UsageError, match="unknown 'k9'"):
        levers.run_levers(comparison, tmp_path / "out", cells=["k8+k9"])
    with pytest.raises(UsageError, match="a repeat"):
        levers.run_levers(comparison, tmp_path / "out", cells=["k8+k8"])
    with pytest.raises(UsageError, match="a repeat"):
        levers.run_levers(comparison, tmp_path / "out", cells=["budget_x2+budget_x2"])
    with pytest.raises(UsageError, match="at least one lever"):
        levers.run_levers(comparison, tmp_path / "out", cells=[])
    # A lever that leaves the chosen setting as it is measures nothing (the comparison's V-GRPO already has K = 4).
    with pytest.raises(UsageError, match="'k4' leaves vgrpo's chosen setting"):
        levers.run_levers(comparison, tmp_path / "out", cells=["k8", "k4"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", ["vgrpo", "vgrpo+"])
def test_every_lever_gives_a_valid_config_on_each_vgrpo_setting(variant):
    """Each lever, on each setting a comparison can choose for V-GRPO or vgrpo+, builds a config that passes every
    check (a lever whose value the setting already has, as k8 on vgrpo+, is refused by run_levers, tested above);
    K chosen from the noise changes every one of them."""
    for control in VARIANTS[variant].step_controls:
        plain = build(variant, "digit", 0, 1e-3, control, [])
        built = {lever: build(variant, "digit", 0, 1e-3, control, list(overrides))
                 for lever, overrides in levers.LEVERS.items()}
        assert built["adaptive_k"].vgrpo.adaptive_pairs == "share=0.5,max=16,every=5" and plain.vgrpo.adaptive_pairs is None
        assert built["adaptive_k_smoothed"].vgrpo.adaptive_pairs == "share=0.5,max=16,every=5,smoothing=0.7"
        assert (built["k2"].vgrpo.num_pairs, built["k4"].vgrpo.num_pairs, built["k8"].vgrpo.num_pairs) == (2, 4, 8)
        assert (plain.advantage.scale, built["batch_scale"].advantage.scale) == ("group", "batch")
        assert (built["euler_6"].rollout.num_steps, built["euler_4"].rollout.num_steps) == (6, 4)
        assert (plain.advantage.downsample, built["downsample_4"].advantage.downsample,
                built["downsample_2"].advantage.downsample) == (None, 4, 2)
