"""The benchmark commands end to end at toy sizes on the 8x8 digits: they run and write what they promise."""

import json

import pytest

from vgrpo_lib.benchmarks.compare import run_compare
from vgrpo_lib.benchmarks.estimator_lab import run_lab

SUMMARY_KEYS = {"time_to_target_s", "nfe_to_target", "steps_to_target", "final_reward", "final_accuracy",
                "seconds_per_iteration", "judge_gap", "diversity", "heldout_time_to_target_s", "heldout_nfe_to_target"}


@pytest.mark.slow
def test_compare_follows_the_protocol_and_writes_the_documented_summary(tmp_path, capsys):
    """Tuning on the tuning seed only, the target from the rule fixed before the reported runs, the chosen
    setting per algorithm, ratios against V-GRPO with intervals."""
    from vgrpo_lib.benchmarks.compare import TUNING_SEED, target_rule

    tiny = ["prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=2", "eval.num_steps=4"]
    run_compare(tmp_path, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"),
                learning_rates=(1e-3,), overrides=tiny, iterations=3)
    # Progress: one line per run, counted against every run of the protocol (2 x 3 tuning + 2 x 2 reported).
    lines = [line for line in capsys.readouterr().out.splitlines() if "final reward" in line]
    assert [line.split()[0] for line in lines] == [f"[{k}/10]" for k in range(1, 11)]
    assert all(line.endswith(" min)") for line in lines)
    summary = json.loads((tmp_path / "summary.json").read_text())
    protocol = json.loads((tmp_path / "protocol.json").read_text())
    assert summary["protocol"] == protocol and summary["target_reward"] == protocol["target"]
    runs = sorted(path.name for path in (tmp_path / "runs").iterdir())
    tuning = [name for name in runs if name.endswith(f"seed{TUNING_SEED}")]
    assert len(tuning) == 2 * 3  # two variants x three step controls x one learning rate, on the tuning seed only
    assert protocol["reported_seeds"] == [0, 1] and TUNING_SEED not in protocol["reported_seeds"]
    # The target is the rule applied to the tuning runs' curves (read back from their metrics).
    from vgrpo_lib.algorithms.run_dir import RunDir

    curves = [RunDir(tmp_path / "runs" / name).read_rows("metrics.csv") for name in tuning]
    assert protocol["target"] == pytest.approx(target_rule(curves)["target"])
    assert protocol["base"] <= protocol["target"] <= protocol["ceiling"]
    from vgrpo_lib.benchmarks.compare import heldout_target_rule

    evaluations = [RunDir(tmp_path / "runs" / name).read_jsonl("eval.jsonl") for name in tuning]
    assert protocol["heldout"] == heldout_target_rule(evaluations)
    assert set(summary["algorithms"]) == {"vgrpo", "diffusion_nft"}
    for name, row in summary["algorithms"].items():
        assert SUMMARY_KEYS <= set(row)
        assert row["step_control"] in protocol["step_controls"][name]
        assert f"{name}_{row['step_control']}_lr0.001_seed1" in runs
    assert "clip_fraction" in summary["per_seed"]["vgrpo"][0] and "approx_kl_sq" in summary["per_seed"]["vgrpo"][0]
    for run in summary["per_seed"]["vgrpo"]:  # the phases split the iteration
        phases = sum(run[f"mean_{phase}_s"] for phase in ("rollout", "reward", "prepare", "update"))
        assert phases == pytest.approx(run["mean_iteration_s"], rel=1e-9) and run["mean_rollout_s"] > 0
    assert "Where the time goes" in (tmp_path / "summary.md").read_text()
    assert set(summary["ratios_vs_vgrpo"]) == {"diffusion_nft"}
    assert set(summary["ratios_vs_vgrpo"]["diffusion_nft"]) >= {"heldout_time_to_target_s", "heldout_nfe_to_target"}
    assert "heldout_time_to_target_s_reached" in summary["algorithms"]["vgrpo"]
    for name in ("summary.md", "reward_vs_train_seconds.png", "reward_vs_nfe_cumulative.png", "reward_vs_grad_steps.png"):
        assert (tmp_path / name).stat().st_size > 0
    # Run again on the same folder: every run is read back (a finished run is not retrained), same summary.
    stamps = {name: (tmp_path / "runs" / name / "metrics.csv").stat().st_mtime_ns for name in runs}
    run_compare(tmp_path, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"),
                learning_rates=(1e-3,), overrides=tiny, iterations=3)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert {name: (tmp_path / "runs" / name / "metrics.csv").stat().st_mtime_ns for name in runs} == stamps
    assert capsys.readouterr().out.count("(read back)") == 10
    # ... also without checkpoints, as results/ keeps a comparison: finished runs are read back from their tables.
    for name in runs:
        for checkpoint in RunDir(tmp_path / "runs" / name).checkpoint_paths():
            checkpoint.unlink()
    run_compare(tmp_path, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"),
                learning_rates=(1e-3,), overrides=tiny, iterations=3)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert {name: (tmp_path / "runs" / name / "metrics.csv").stat().st_mtime_ns for name in runs} == stamps
    # Compressed as results/ keeps it (`vgrpo compress`: the runs' configs too), the comparison is read back the
    # same, nothing retrained.
    from vgrpo_lib.algorithms.cli import main as cli_main

    assert cli_main(["compress", str(tmp_path)]) == 0
    assert f"{tmp_path}: 40 files (configs and tables) of 10 runs compressed" in capsys.readouterr().out
    assert not list(tmp_path.glob("runs/*/*.csv")) and not list(tmp_path.glob("runs/*/*.jsonl"))
    assert not list(tmp_path.glob("runs/*/config.json")) and len(list(tmp_path.glob("runs/*/config.json.gz"))) == 10
    run_compare(tmp_path, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"),
                learning_rates=(1e-3,), overrides=tiny, iterations=3)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert capsys.readouterr().out.count("(read back)") == 10 and not list(tmp_path.glob("runs/*/metrics.csv"))
    # Its protocol and summary compressed as well (as results/ keeps them): read back the same, and a comparison
    # continued there re-summarises it, writing both afresh (the copies, now out of date, removed).
    from vgrpo_lib.algorithms.run_dir import read_stored_text

    assert cli_main(["compress", str(tmp_path / "summary.json"), str(tmp_path / "protocol.json")]) == 0
    assert capsys.readouterr().out.startswith(f"{tmp_path / 'summary.json'}: compressed to summary.json.gz, ")
    assert not (tmp_path / "summary.json").exists() and json.loads(read_stored_text(tmp_path / "summary.json")) == summary
    assert json.loads(read_stored_text(tmp_path / "protocol.json")) == protocol
    run_compare(tmp_path, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"),
                learning_rates=(1e-3,), overrides=tiny, iterations=3)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert json.loads((tmp_path / "protocol.json").read_text()) == protocol and not list(tmp_path.glob("*.gz"))
    assert capsys.readouterr().out.count("(read back)") == 10
    # A run cut before its last evaluation was written is not finished (it would resume from its checkpoint).
    from vgrpo_lib.benchmarks.compare import finished_run

    cut = tmp_path / "runs" / tuning[0]
    config = RunDir(cut).train_config()
    assert finished_run(config, cut).metrics == RunDir(cut).read_rows("metrics.csv") == curves[0]
    RunDir(cut).write_jsonl("eval.jsonl", RunDir(cut).read_jsonl("eval.jsonl")[:-1])  # replaces eval.jsonl.gz
    assert not (cut / "eval.jsonl.gz").exists() and finished_run(config, cut) is None
    with pytest.raises(ValueError, match="holds a run of another setting"):
        run_compare(tmp_path, task="digits8", seeds=2, quick=True, variants=("vgrpo", "diffusion_nft"),
                    learning_rates=(1e-3,), overrides=[*tiny, "eval.per_prompt=3"], iterations=3)
    with pytest.raises(ValueError, match="at least 5 seeds"):
        run_compare(tmp_path / "few", seeds=3)
    with pytest.raises(ValueError, match="Unknown variant"):
        run_compare(tmp_path / "bad", quick=True, variants=("vgrpo", "nonsense"))


@pytest.mark.slow
def test_compare_can_select_by_the_held_out_target(tmp_path, capsys):
    """``select="heldout"`` reads the same tuning runs back and chooses each algorithm's setting by the held-out
    target (else the final held-out reward), ``select="heldout-kept"`` by the held-out target reached and still met
    at the end; the protocol records which target selected, and a bad name is refused before any run starts."""
    from vgrpo_lib.benchmarks.compare import markdown_table, selection_key

    tiny = ["prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=2", "eval.num_steps=4"]
    kwargs = dict(task="digits8", seeds=1, quick=True, variants=("vgrpo", "diffusion_nft"), learning_rates=(1e-3,),
                  overrides=tiny, iterations=3)
    by_training = run_compare(tmp_path, **kwargs)
    by_heldout = run_compare(tmp_path, select="heldout", **kwargs)
    by_kept = run_compare(tmp_path, select="heldout-kept", **kwargs)
    assert capsys.readouterr().out.count("(read back)") >= 12  # the six tuning runs are not retrained
    assert [s["protocol"]["selection"] for s in (by_training, by_heldout, by_kept)] == ["training", "heldout",
                                                                                       "heldout-kept"]
    assert by_heldout["tuning"] == by_training["tuning"] == by_kept["tuning"]
    for summary, by in ((by_training, "training"), (by_heldout, "heldout"), (by_kept, "heldout-kept")):
        for variant, settings in summary["tuning"].items():
            best = min(settings, key=lambda name: selection_key(settings[name], by=by))
            chosen = summary["protocol"]["chosen"][variant]
            assert best == f"{chosen['step_control']} lr {chosen['lr']:g}"
    assert "selected by the held-out target" in markdown_table(by_heldout)
    assert "selected by the held-out (reached and still met at the end) target" in (tmp_path / "summary.md").read_text()
    with pytest.raises(ValueError, match="select/by='eval'"):
        run_compare(tmp_path / "bad", select="eval", **kwargs)
    assert not (tmp_path / "bad").exists()


def test_estimator_lab_writes_statistics_and_ground_truth(tmp_path):
    report = run_lab(tmp_path, quick=True, task="digits8", names=("naive", "vgrpo"))
    written = json.loads((tmp_path / "estimators.json").read_text())
    assert set(written["estimators"]) == {"naive", "vgrpo", "vgrpo_importance (ours)"}
    for stats in written["estimators"].values():
        assert 0.0 <= stats["mc_noise_share"] <= 1.0 + 1e-9 and -1.0 <= stats["gradient_cosine"] <= 1.0
    # The group-shared estimator's within-group noise is below the naive one's on any policy (pairs shared
    # within a group cancel); measured ratio on this toy setting 4.6x (0.464 vs 0.102), asserted 1.5x.
    assert written["estimators"]["vgrpo"]["within_group_cv"] * 1.5 < written["estimators"]["naive"]["within_group_cv"]
    assert set(report["ground_truth"]["estimators"]) == {"naive", "vgrpo"}
    assert (tmp_path / "estimators.png").stat().st_size > 0


@pytest.mark.slow
def test_ablations_run_only_the_named_cells_and_refuse_unknown_ones(tmp_path):
    import pytest

    from vgrpo_lib.benchmarks.ablations import run_ablations

    report = run_ablations(tmp_path, which="paper", task="digits8", seeds=1, quick=True,
                           cells=["vgrpo", "antithetic (ours)"])
    assert list(report["cells"]) == ["vgrpo", "antithetic (ours)"] and report["task"] == "digits8"
    assert report["cells"]["antithetic (ours)"]["overrides"][-1] == "vgrpo.noise=antithetic"
    assert json.loads((tmp_path / "paper.json").read_text())["cells"].keys() == report["cells"].keys()
    with pytest.raises(ValueError, match="Unknown cell.*'nonsense'.*expected some of.*'naive'"):
        run_ablations(tmp_path / "bad", which="paper", cells=["nonsense"])
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_scaling_times_one_and_two_processes(tmp_path):
    """The gloo scaling check end to end at toy size (DDP and FSDP2): both process counts report every phase."""
    from vgrpo_lib.benchmarks.scaling import main as scaling

    tiny = ["prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4"]
    for strategy in ("ddp", "fsdp2"):
        out = tmp_path / f"{strategy}.json"
        scaling(["--task", "digits8", "--processes", "1", "2", "--iterations", "1", "--out", str(out), *tiny,
                 f"distributed.strategy={strategy}"])
        result = json.loads(out.read_text())
        assert set(result["seconds_per_iteration"]) == {"1", "2"} and result["speedup"]["1"] == 1.0
        assert all(value > 0 for value in result["seconds_per_iteration"].values())
        assert {"rollout_s", "reward_s", "update_s"} <= set(result["phases_s"]["2"])
        assert result["global_batch"] == 16 and result["overrides"][-1] == f"distributed.strategy={strategy}"


def test_a_comparison_keeps_each_run_as_its_records_not_its_trainer(tmp_path, monkeypatch):
    """A trainer holds its model (a whole pipeline on the hub path): once a run is trained, the comparison keeps
    only its metrics and evaluations, so its memory stays that of one run (a 36-run MNIST-Wan comparison held 9 GB
    after 13 runs before this)."""
    import gc
    import weakref

    from vgrpo_lib.benchmarks.compare import runner

    trainers = []

    def tracked(config, run_dir):
        gc.collect()
        assert all(ref() is None for ref in trainers), "an earlier run's trainer is still alive"
        run = start_or_resume(config, run_dir)
        trainers.append(weakref.ref(run))
        return run

    start_or_resume = runner.start_or_resume
    monkeypatch.setattr(runner, "start_or_resume", tracked)
    tiny = ["prompts_per_iteration=2", "group_size=4", "rollout.num_steps=2", "eval.per_prompt=1", "eval.num_steps=2"]
    run_compare(tmp_path, task="digits8", seeds=1, quick=True, variants=("vgrpo",), learning_rates=(1e-3,),
                overrides=tiny, iterations=1)
    assert len(trainers) == 4  # three tuning runs and one reported, each checked gone before the next started


@pytest.mark.slow
def test_compare_can_tune_on_several_seeds_and_select_by_all_of_them(tmp_path, capsys):
    """``tuning_seeds=2``: every setting trained on seeds 100 and 101; the targets from all of those runs; each
    algorithm's setting the one the key over both seeds chooses; the protocol names the seeds, the summary keeps
    every seed's row; the first seed's runs are those a one-seed comparison makes (read back, not retrained)."""
    from vgrpo_lib.algorithms.run_dir import RunDir
    from vgrpo_lib.benchmarks.compare import TUNING_SEED, selection_key, target_rule

    tiny = ["prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "eval.per_prompt=2", "eval.num_steps=4"]
    kwargs = dict(task="digits8", seeds=1, quick=True, variants=("vgrpo", "diffusion_nft"), learning_rates=(1e-3,),
                  overrides=tiny, iterations=3)
    one = run_compare(tmp_path, **kwargs)
    capsys.readouterr()
    two = run_compare(tmp_path, tuning_seeds=2, **kwargs)
    lines = [line for line in capsys.readouterr().out.splitlines() if "final reward" in line]
    assert len(lines) == 2 * (3 * 2 + 1) and sum("(read back)" in line for line in lines) >= 2 * 3
    protocol = two["protocol"]
    assert protocol["tuning_seeds"] == [TUNING_SEED, TUNING_SEED + 1] and "tuning_seeds" not in one["protocol"]
    tuning = sorted(p.name for p in (tmp_path / "runs").iterdir() if p.name.endswith(("seed100", "seed101")))
    assert len(tuning) == 2 * 3 * 2
    curves = [RunDir(tmp_path / "runs" / name).read_rows("metrics.csv") for name in tuning]
    assert protocol["target"] == pytest.approx(target_rule(curves)["target"])
    for variant, settings_ in two["tuning_per_seed"].items():
        assert all(len(rows) == 2 for rows in settings_.values())
        assert {name: rows[0] for name, rows in settings_.items()} == two["tuning"][variant]
        best = min(settings_, key=lambda name: selection_key(settings_[name]))
        chosen = protocol["chosen"][variant]
        assert best == f"{chosen['step_control']} lr {chosen['lr']:g}"
    assert "tuning seeds 100, 101;" in (tmp_path / "summary.md").read_text()
    with pytest.raises(ValueError, match="--tuning-seeds must be at least 1, got 0"):
        run_compare(tmp_path / "bad", tuning_seeds=0, **kwargs)
    with pytest.raises(ValueError, match="--seeds must be at most 100"):
        run_compare(tmp_path / "bad", **(kwargs | {"seeds": 101}))
    assert not (tmp_path / "bad").exists()
