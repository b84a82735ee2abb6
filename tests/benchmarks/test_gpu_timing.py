"""benchmarks/gpu_timing.py runs its GPU code path end to end on the CPU with a tiny config."""

import json
import math

import pytest

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.benchmarks.gpu_timing import SD35_MEDIUM_TRANSFORMER, main  # noqa: E402


def test_tiny_mode_times_every_phase_and_counts_flops(tmp_path):
    out = tmp_path / "timing.json"
    result = main(["--tiny", "--steps", "4", "--sde-steps", "3", "--repeats", "1", "--lora-rank", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == result
    assert 0 < result["flops_forward_per_sample"] < result["flops_forward_backward_per_sample"]
    for key in ("rollout", "vgrpo_update", "flow_grpo_update"):
        assert result[f"{key}_s_per_sample"] > 0 and math.isfinite(result[f"{key}_mfu"]) and result[f"{key}_mfu"] > 0
    assert result["vgrpo_s_per_iteration"] > 0 and result["lora_parameters"] < result["transformer_parameters"]


def test_the_full_config_is_sd35_medium():
    c = SD35_MEDIUM_TRANSFORMER
    assert (c["num_layers"], c["num_attention_heads"] * c["attention_head_dim"], len(c["dual_attention_layers"])) == (24, 1536, 13)
