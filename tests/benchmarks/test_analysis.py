"""The analyses of ``vgrpo_lib.benchmarks.analysis`` run on the committed raw data in results/ and give the committed
outputs byte for byte; the file-time reports on folders whose times are set here; every analysis module imports
without running anything and has a ``main``."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import re
import shutil
from pathlib import Path

import pytest

import vgrpo_lib.benchmarks.analysis as analysis
from vgrpo_lib.algorithms.run_dir import RunDir, compress_file, read_stored_text
from vgrpo_lib.benchmarks.analysis.comparison_gaps import comparison_gaps
from vgrpo_lib.benchmarks.analysis.cpu_vs_gpu import cpu_vs_gpu
from vgrpo_lib.benchmarks.analysis.first_iteration_rewards import first_iteration_rewards
from vgrpo_lib.benchmarks.analysis.geneval_table import geneval_table
from vgrpo_lib.benchmarks.analysis.gpu_geneval_summary import gpu_geneval_summary
from vgrpo_lib.benchmarks.analysis.heldout_curves import heldout_curves
from vgrpo_lib.benchmarks.analysis.heldout_selection import heldout_selection
from vgrpo_lib.benchmarks.analysis.iteration_budget import iteration_budget
from vgrpo_lib.benchmarks.analysis.kept_selection import kept_selection
from vgrpo_lib.benchmarks.analysis.main_job_phases import main_job_phases
from vgrpo_lib.benchmarks.analysis.phrasing_gap import phrasing_gap
from vgrpo_lib.benchmarks.analysis.protocol_wall_times import protocol_wall_times
from vgrpo_lib.benchmarks.analysis.repeat_check import main as repeat_check_main
from vgrpo_lib.benchmarks.analysis.repeat_check import repeat_check
from vgrpo_lib.benchmarks.analysis.sampler_gap import sampler_gap
from vgrpo_lib.benchmarks.analysis.table_sizes import table_sizes
from vgrpo_lib.benchmarks.analysis.training_speed import training_speed

RESULTS = Path(__file__).resolve().parents[2] / "results"

REPORTS = {  # committed output: how it is made from the committed raw data
    "first_iteration_rewards.txt": lambda: first_iteration_rewards(RESULTS),
    "heldout_selection.txt": lambda: heldout_selection(RESULTS),
    "kept_selection.txt": lambda: kept_selection(RESULTS),
    "table_sizes.txt": lambda: table_sizes(RESULTS),
    "toy2d-regime/training_speed.txt": lambda: training_speed(RESULTS / "toy2d-regime", target=0.8),
    "mnist-sd3/phases.txt": lambda: main_job_phases(RESULTS),
    "mnist-sd3/main-geneval/geneval_table.md": lambda: geneval_table(RESULTS / "mnist-sd3" / "main-geneval"),
    "gpu-run/cpu_vs_gpu.txt": lambda: cpu_vs_gpu(RESULTS),
    "gpu-geneval/summary.txt": lambda: gpu_geneval_summary(RESULTS),
    "iteration-budget/budget.txt": lambda: iteration_budget(RESULTS),
    "sampler-gap-mnist-sd3-digit/gap.md": lambda: sampler_gap(
        RESULTS / "sampler-gap-mnist-sd3-digit", RESULTS / "compare-mnist-sd3-digit-nfe-decay"),
    "phrasing-gap-mnist-sd3-digit/gap.md": lambda: phrasing_gap(
        RESULTS / "phrasing-gap-mnist-sd3-digit", RESULTS / "compare-mnist-sd3-digit-k4"),
    "compare-mnist-sd3-ocr-lean/heldout_curves.md": lambda: heldout_curves(RESULTS / "compare-mnist-sd3-ocr-lean"),
    "compare-mnist-sd3-digit-heldout/repeat_check.txt": lambda: repeat_check(
        RESULTS / "compare-mnist-sd3-digit-heldout", json.loads(read_stored_text(RESULTS / "compare-mnist-sd3-digit/summary.json"))),
    "compare-mnist-sd3-ocr-heldout/repeat_check.txt": lambda: repeat_check(
        RESULTS / "compare-mnist-sd3-ocr-heldout", json.loads(read_stored_text(RESULTS / "compare-mnist-sd3-ocr/summary.json"))),
}


@pytest.mark.parametrize("output", sorted(REPORTS))
def test_an_analysis_of_the_committed_raw_data_gives_the_committed_output(output):
    assert REPORTS[output]() == (RESULTS / output).read_text()


def test_repeat_check_runs_from_the_command_line(capsys):
    folder, earlier = RESULTS / "compare-mnist-sd3-ocr-heldout", RESULTS / "compare-mnist-sd3-ocr" / "summary.json"
    assert repeat_check_main([str(folder), str(earlier)]) == 0
    assert capsys.readouterr().out == (folder / "repeat_check.txt").read_text()


def _curves_comparison(folder: Path, evaluated: dict[int, list[int]]) -> Path:
    """A finished comparison of one algorithm (vgrpo, one step at lr 1e-3) whose reported seed ``s`` has 6
    iterations of training rewards 0.1 * (s + 1) * i and evaluations at ``evaluated[s]`` (held-out reward 0.05 * i
    + 0.01 * s, clock 2 s per iteration)."""
    protocol = {"chosen": {"vgrpo": {"step_control": "one_step", "lr": 1e-3}}, "reported_seeds": sorted(evaluated),
                "target": 0.5, "heldout": {"target": 0.4}}
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"protocol": protocol}))
    for seed, iterations in evaluated.items():
        run = RunDir(folder / "runs" / f"vgrpo_one_step_lr0.001_seed{seed}")
        run.root.mkdir(parents=True)
        (run.root / "metrics.csv").write_text("iteration,reward_mean\n" + "".join(
            f"{i},{0.1 * (seed + 1) * i}\n" for i in range(6)))
        run.write_jsonl("eval.jsonl", [{"iteration": i, "reward_mean": 0.05 * i + 0.01 * seed, "train_seconds": 2.0 * i}
                                       for i in iterations])
    return folder


def test_heldout_curves_average_the_seeds_at_each_evaluation(tmp_path):
    """Held-out reward, the training reward smoothed over the 3 iterations up to the evaluated policy's first
    rollout (the last row's for the final evaluation), their difference and the clock, averaged over the seeds."""
    report = heldout_curves(_curves_comparison(tmp_path / "cmp", {0: [0, 3, 6], 1: [0, 3, 6]}))
    # Iteration 3: held-out (0.15 + 0.16) / 2 = 0.155; training: seed 0 mean(0.1, 0.2, 0.3) = 0.2, seed 1 0.4 -> 0.3.
    # Iteration 6 reads row 5: seed 0 mean(0.3, 0.4, 0.5) = 0.4, seed 1 0.8 -> 0.6; held-out (0.3 + 0.31) / 2 = 0.305.
    assert "| 0 | 0.005 | 0.000 | -0.005 | 0 |" in report
    assert "| 3 | 0.155 | 0.300 | +0.145 | 6 |" in report
    assert "| 6 | 0.305 | 0.600 | +0.295 | 12 |" in report
    assert "| iteration | vgrpo |" in report and "| 6 | 0.305 |" in report.split("side by side")[1]


def test_heldout_curves_refuse_seeds_evaluated_at_different_iterations(tmp_path):
    with pytest.raises(ValueError, match="vgrpo's reported seeds were evaluated at different iterations"):
        heldout_curves(_curves_comparison(tmp_path / "cmp", {0: [0, 3, 6], 1: [0, 2, 6]}))
    with pytest.raises(ValueError, match="evaluated at different iterations"):  # the first seed's a subset
        heldout_curves(_curves_comparison(tmp_path / "cmp2", {0: [0, 6], 1: [0, 3, 6]}))


def _touch(path: Path, seconds: float, text: str = "{}") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (seconds, seconds))



def test_the_kept_selection_report_refuses_a_recorded_choice_its_held_out_key_does_not_make(tmp_path):
    """A comparison selected by the held-out target whose ``protocol.chosen`` is not what the held-out key picks from
    its own tuning rows (an edited or mixed summary) is refused naming the file, not reported as if it were."""
    summary = json.loads(read_stored_text(RESULTS / "compare-mnist-sd3-digit-nfe" / "summary.json"))
    (tmp_path / "edited").mkdir()
    (tmp_path / "edited" / "summary.json").write_text(json.dumps(summary))
    assert "compare-mnist-sd3-digit-nfe" not in kept_selection(tmp_path)
    assert "by heldout one_step lr 0.003" in kept_selection(tmp_path)
    summary["protocol"]["chosen"]["vgrpo+lean"] = {"step_control": "paper_soft_clip", "lr": 0.001}
    (tmp_path / "edited" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"edited/summary\.json: vgrpo\+lean's recorded choice .* heldout key's one_step"):
        kept_selection(tmp_path)
    # A comparison selected by the kept rule is held to that rule's choices (there vgrpo+lean's soft clip at 1e-3, as
    # set above, and DiffusionNFT's one step at 3e-3).
    summary["protocol"]["selection"] = "heldout-kept"
    summary["protocol"]["chosen"]["diffusion_nft"] = {"step_control": "one_step", "lr": 0.003}
    (tmp_path / "edited" / "summary.json").write_text(json.dumps(summary))
    assert "(selected by heldout-kept;" in kept_selection(tmp_path)
    summary["protocol"]["chosen"]["vgrpo+lean"] = {"step_control": "one_step", "lr": 0.003}
    (tmp_path / "edited" / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"recorded choice .* heldout-kept key's paper_soft_clip lr 0\.001"):
        kept_selection(tmp_path)

def test_the_sampler_gap_refuses_runs_it_cannot_pair(tmp_path):
    """The sampler study pairs two runs per seed that trained alike: a seed with one run, a run of another name or
    two runs of different lengths are refused naming the problem; runs whose training differs are reported unpaired,
    not read as paired."""
    kept = RESULTS / "sampler-gap-mnist-sd3-digit" / "runs"
    comparison = RESULTS / "compare-mnist-sd3-digit-nfe-decay"
    study = tmp_path / "study"
    shutil.copytree(kept / "eval6_seed0", study / "runs" / "eval6_seed0")
    with pytest.raises(ValueError, match="seed 0 has 1 runs, not one per sampler"):
        sampler_gap(study, comparison)
    shutil.copytree(kept / "eval20_seed1", study / "runs" / "eval20_seed0")  # another seed's training
    assert "Training identical in both runs (each iteration's reward_mean and loss_objective): NO" in \
        sampler_gap(study, comparison)
    shutil.copytree(kept / "eval20_seed0", study / "runs" / "seed0_eval20")
    with pytest.raises(ValueError, match="seed0_eval20: not a run of this study"):
        sampler_gap(study, comparison)
    shutil.rmtree(study / "runs" / "seed0_eval20")
    metrics = RunDir(study / "runs" / "eval20_seed0").read_rows("metrics.csv")
    (study / "runs" / "eval20_seed0" / "metrics.csv.gz").unlink()
    RunDir(study / "runs" / "eval20_seed0").write_rows("metrics.csv", metrics[:-1])
    with pytest.raises(ValueError, match="seed 0: the two runs trained 153 and 152 iterations"):
        sampler_gap(study, comparison)


def test_first_heldout_iteration_reads_the_protocols_clock():
    """The reports' held-out crossing is the protocol's: the base evaluation (iteration 0) never counts, a value equal
    to the target does, and a run that never reaches it reads ``never``."""
    evaluations = [{"iteration": 0, "reward_mean": 0.9}, {"iteration": 10, "reward_mean": 0.5},
                   {"iteration": 20, "reward_mean": 0.8}, {"iteration": 30, "reward_mean": 0.95}]
    assert analysis.first_heldout_iteration(evaluations, 0.8) == "20"
    assert analysis.first_heldout_iteration(evaluations, 0.9) == "30"
    assert analysis.first_heldout_iteration(evaluations, 0.99) == "never"


def test_the_phrasing_gap_refuses_runs_it_cannot_pair(tmp_path):
    """The phrasing study pairs, per setting and seed, the run evaluated on the held-out prompts with the one
    evaluated on the training prompts: a seed with one of them, a run of another name or two runs of different
    lengths are refused naming the problem; the report's gap is the difference of the two evaluations."""
    kept = RESULTS / "phrasing-gap-mnist-sd3-digit" / "runs"
    comparison = RESULTS / "compare-mnist-sd3-digit-k4"
    setting = "vgrpo+lean_paper_soft_clip_lr0.003"
    study = tmp_path / "study"
    shutil.copytree(kept / f"heldout_{setting}_seed0", study / "runs" / f"heldout_{setting}_seed0")
    with pytest.raises(ValueError, match=f"{re.escape(setting)} seed 0 has only its heldout run"):
        phrasing_gap(study, comparison)
    shutil.copytree(kept / f"heldout_{setting}_seed0", study / "runs" / f"training_{setting}_seed0")  # itself
    report = phrasing_gap(study, comparison)
    assert "equal for the first 230 iterations" in report and "+0.000 on average" in report
    shutil.copytree(kept / f"training_{setting}_seed1", study / "runs" / f"seed1_{setting}")
    with pytest.raises(ValueError, match=f"seed1_{re.escape(setting)}: not a run of this study"):
        phrasing_gap(study, comparison)
    shutil.rmtree(study / "runs" / f"seed1_{setting}")
    run = RunDir(study / "runs" / f"training_{setting}_seed0")
    metrics = run.read_rows("metrics.csv")
    (run.root / "metrics.csv.gz").unlink()
    run.write_rows("metrics.csv", metrics[:-1])
    with pytest.raises(ValueError, match=f"{re.escape(setting)} seed 0: the two runs trained 230 and 229 iterations"):
        phrasing_gap(study, comparison)


def test_the_file_time_reports_read_the_times_of_the_runs(tmp_path):
    day = 1_800_000_000  # 2027-01-15 08:00:00 UTC
    for name, start, end in (("vgrpo_one_step_lr0.001_seed100", 0, 60), ("vgrpo_one_step_lr0.001_seed0", 90, 150),
                             ("vgrpo_one_step_lr0.001_seed1", 200, 260)):
        _touch(tmp_path / "protocol-x" / "runs" / name / "config.json", day + start)
        _touch(tmp_path / "protocol-x" / "runs" / name / "eval.jsonl", day + end)
    _touch(tmp_path / "protocol-x" / "summary.json", day + 600)
    assert protocol_wall_times(tmp_path) == "protocol-x: 10 min (08:00:00 to 08:10:00 UTC)\n"
    gaps = comparison_gaps(tmp_path / "protocol-x")
    assert gaps == (
        "tuning runs (1): 1.0 min from the first start to the last evaluation, 0 s (0.0 min) of it between runs\n"
        "vgrpo_one_step_lr0.001_seed0 -> vgrpo_one_step_lr0.001_seed1: 50 s\n"
        "reported runs (2): 2.8 min from the first start to the last evaluation, 50 s (0.8 min) of it between runs\n")
    # Kept compressed as results/ keeps them (configs and tables by `vgrpo compress RUN`, each copy with its file's
    # time), the reports are the same.
    for run in (tmp_path / "protocol-x" / "runs").iterdir():
        assert [table.path.name for table in RunDir(run).compress_tables()] == ["config.json.gz", "eval.jsonl.gz"]
    compress_file(tmp_path / "protocol-x" / "summary.json")
    assert protocol_wall_times(tmp_path) == "protocol-x: 10 min (08:00:00 to 08:10:00 UTC)\n"
    assert comparison_gaps(tmp_path / "protocol-x") == gaps


def test_every_analysis_module_imports_without_running_and_has_a_main():
    names = [m.name for m in pkgutil.iter_modules(analysis.__path__)]
    assert len(names) == 32  # the 24 scripts results/ held, training_speed, iteration_budget, cpu_share, pair_ratios,
    # kept_selection, sampler_gap, heldout_curves, phrasing_gap
    for name in names:
        module = importlib.import_module(f"vgrpo_lib.benchmarks.analysis.{name}")
        assert callable(module.main) and module.__doc__ and "main" in module.__all__, name


def test_results_holds_no_script():
    assert sorted(RESULTS.glob("**/*.py")) == []
