"""benchmarks/gpu_run.sh: the prepared GPU evidence script, run in its CPU mode (same steps, toy sizes)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_run.sh"


@pytest.mark.slow
def test_cpu_mode_writes_the_timing_and_the_mnist_sd3_run(tmp_path):
    from vgrpo_lib.integrations.testbed.mnist_sd3.build import build_pipeline

    build_pipeline(seed=0).save_pretrained(tmp_path / "pipeline")  # the final configs, untrained: a fast stand-in
    out = tmp_path / "gpu_run"
    subprocess.run(["bash", str(SCRIPT), "--cpu", str(out), f"model.path={tmp_path / 'pipeline'}"], check=True,
                   capture_output=True, text=True)
    assert json.loads((out / "environment.json").read_text())["mode"] == "cpu"
    timing = json.loads((out / "gpu_timing.json").read_text())
    assert timing["vgrpo_s_per_iteration"] > 0 and timing["vgrpo_update_mfu"] > 0
    assert (out / "gpu_timing.txt").stat().st_size > 0  # the printed report
    run = out / "mnist_sd3_vgrpo"
    config = json.loads((run / "config.json").read_text())
    assert config["task"] == "mnist-sd3/digit" and config["algo"] == "vgrpo" and config["model"]["device"] == "cpu"
    evaluations = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["iteration"] for e in evaluations] == [0, 1]
    assert {"accuracy", "judge_accuracy", "judge_gap", "diversity"} <= set(evaluations[-1])
    metrics = (run / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 2 and "iteration_s" in metrics[0] and "rollout_s" in metrics[0]
    commands = (out / "commands.txt").read_text().splitlines()
    assert commands[0].startswith("python -m vgrpo_lib.benchmarks.gpu_timing") and "--preset mnist-sd3" in commands[1]


def test_cuda_mode_says_when_no_gpu_is_visible(tmp_path):
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True,
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode != 0 and "no CUDA device is visible" in result.stderr
