"""``vgrpo+``, the library's own V-GRPO beyond the paper (issue 30): a named configuration of V-GRPO that every preset
and the comparison take, kept apart from the paper's and the official presets."""

from __future__ import annotations

import json
from operator import attrgetter

import pytest

from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.config import valid_keys
from vgrpo_lib.algorithms.presets import BEYOND_PAPER, PAPER, PRESETS, build_config, named_configuration
from vgrpo_lib.benchmarks.cli import main as bench_main
from vgrpo_lib.benchmarks.compare import VARIANTS, build, run_compare
from vgrpo_lib.errors import UsageError

PLUS = BEYOND_PAPER["vgrpo+"][1]


def test_vgrpo_plus_is_vgrpo_with_its_settings_after_the_preset_and_before_the_users():
    plus = build_config("vgrpo+", None, "testbed", [])
    assert plus.algo == "vgrpo" and plus.vgrpo.num_pairs == 8 and plus.optim.epochs == 2
    assert plus.to_dict() == build_config("vgrpo", None, "testbed", PLUS).to_dict()
    assert build_config("vgrpo+", None, "testbed", ["vgrpo.num_pairs=4"]).vgrpo.num_pairs == 4  # the user's wins
    assert named_configuration("diffusion_nft") == ("diffusion_nft", [])


@pytest.mark.parametrize("preset", ["testbed", "official", "mnist-sd3", "mnist-wan", *PAPER])
def test_no_paper_or_official_preset_holds_vgrpo_plus(preset):
    """The paper's presets stay the paper's: V-GRPO under each differs from vgrpo+ under the same preset."""
    assert preset in PRESETS
    paper, plus = build_config("vgrpo", None, preset, []), build_config("vgrpo+", None, preset, [])
    assert paper.to_dict() != plus.to_dict()
    assert plus.vgrpo.num_pairs == 8 and plus.vgrpo.clip_range == 0.01
    assert paper.vgrpo.num_pairs == 4  # the paper's K (FLUX.1-dev's several epochs are the paper's own)


def test_the_comparison_tunes_vgrpo_plus_over_three_step_controls():
    variant = VARIANTS["vgrpo+"]
    assert list(variant.step_controls) == ["one_step", "two_epochs", "three_epochs"]
    epochs = [build("vgrpo+", "digit", 100, 1e-3, control, []).optim.epochs for control in variant.step_controls]
    assert epochs == [1, 2, 3]
    assert all(build("vgrpo+", "digit", 100, 1e-3, c, []).vgrpo.num_pairs == 8 for c in variant.step_controls)
    # V-GRPO's own controls are unchanged by it
    assert list(VARIANTS["vgrpo"].step_controls) == ["one_step", "two_epochs", "paper_soft_clip"]


@pytest.mark.parametrize("name, pairs", [("vgrpo+lean", 2), ("vgrpo+lean-k4", 4)])
def test_the_lean_candidates_are_vgrpo_with_their_pairs_and_a_six_step_rollout_over_vgrpos_controls(name, pairs):
    """The lean candidates change the pairs and the training rollout only: their evaluation, loss and every tuned
    control are V-GRPO's, so the comparison measures the iteration's cost and the pairs and nothing else."""
    lean, paper = build_config(name, None, "testbed", []), build_config("vgrpo", None, "testbed", [])
    assert (lean.algo, lean.vgrpo.num_pairs, lean.rollout.num_steps) == ("vgrpo", pairs, 6)
    differing = {key for key, value in _settings(lean).items() if _settings(paper)[key] != value}
    # The pairs differ only where the paper's K is not the candidate's (the testbed's paper K is 4).
    assert differing == {"rollout.num_steps"} | ({"vgrpo.num_pairs"} if paper.vgrpo.num_pairs != pairs else set())
    assert lean.eval.num_steps == paper.eval.num_steps
    assert VARIANTS[name].step_controls == VARIANTS["vgrpo"].step_controls
    for control in VARIANTS["vgrpo"].step_controls:
        run, same = build(name, "pair", 100, 3e-4, control, []), build("vgrpo", "pair", 100, 3e-4, control, [])
        assert _settings(run) == {**_settings(same), "vgrpo.num_pairs": pairs, "rollout.num_steps": 6}



def test_the_pods_candidate_is_vgrpo_lean_k4_with_four_rollout_steps_and_half_the_group_updated():
    """vgrpo+pods changes vgrpo+lean-k4's training rollout (4 Euler steps) and trains the update on 4 samples of each
    group (advantage.downsample), under V-GRPO's controls; everything else, the evaluation included, is the same."""
    assert VARIANTS["vgrpo+pods"].step_controls == VARIANTS["vgrpo"].step_controls
    for control in VARIANTS["vgrpo"].step_controls:
        pods, k4 = build("vgrpo+pods", "digit", 100, 3e-3, control, []), build("vgrpo+lean-k4", "digit", 100, 3e-3, control, [])
        assert _settings(pods) == {**_settings(k4), "rollout.num_steps": 4, "advantage.downsample": 4}
        assert pods.eval.num_steps == k4.eval.num_steps

def _settings(config) -> dict:
    """Every dotted key of the config (``valid_keys``) and its value."""
    return {key: attrgetter(key)(config) for key in valid_keys()}


def test_train_and_config_take_vgrpo_plus(tmp_path, capsys):
    out = tmp_path / "run"
    tiny = ["iterations=1", "prompts_per_iteration=2", "group_size=4", "rollout.num_steps=2", "eval.every=0",
            "eval.per_prompt=1", "eval.num_steps=2"]
    assert cli_main(["train", "--algo", "vgrpo+", "--task", "digits8", "--out", str(out), *tiny]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["algo"] == "vgrpo" and saved["vgrpo"]["num_pairs"] == 8 and saved["optim"]["epochs"] == 2
    capsys.readouterr()
    assert cli_main(["config", "--algo", "vgrpo+", "--format", "json"]) == 0
    assert '"vgrpo.num_pairs"' in capsys.readouterr().out


@pytest.mark.parametrize("grid", [(), (0.0, 1e-3), (1e-3, 1e-3), (-1e-4,)])
def test_the_comparison_refuses_a_learning_rate_grid_that_is_not_distinct_and_positive(tmp_path, grid):
    with pytest.raises(UsageError, match="--learning-rates"):
        run_compare(tmp_path, task="digits8", seeds=1, quick=True, variants=("vgrpo",), learning_rates=grid)


def test_compare_takes_its_learning_rate_grid_from_the_command_line(tmp_path, capsys):
    """``--learning-rates`` sets the tuning grid: one rate, one tuning run per step control, named by it."""
    tiny = ["prompts_per_iteration=2", "group_size=4", "rollout.num_steps=2", "eval.per_prompt=1", "eval.num_steps=2"]
    assert bench_main(["compare", "--task", "digits8", "--quick", "--seeds", "1", "--iterations", "1", "--variants",
                       "vgrpo+", "--learning-rates", "0.002", "--out", str(tmp_path), *tiny]) == 0
    runs = sorted(path.name for path in (tmp_path / "runs").iterdir())
    assert runs == sorted([*(f"vgrpo+_{c}_lr0.002_seed100" for c in VARIANTS["vgrpo+"].step_controls),
                           f"vgrpo+_{json.loads((tmp_path / 'protocol.json').read_text())['chosen']['vgrpo+']['step_control']}"
                           "_lr0.002_seed0"])
    assert json.loads((tmp_path / "protocol.json").read_text())["learning_rates"] == [0.002]
