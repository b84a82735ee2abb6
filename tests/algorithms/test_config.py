import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.config import TrainConfig, apply_overrides, valid_keys
from algorithms.presets import preset_overrides


def test_json_round_trip_of_an_overridden_config():
    config = apply_overrides(TrainConfig(), ["vgrpo.num_pairs=8", "optim.minibatch_size=32", "advantage.soft_clip=3"])
    assert TrainConfig.from_dict(json.loads(config.to_json())) == config
    assert config.vgrpo.num_pairs == 8 and config.optim.minibatch_size == 32 and config.advantage.soft_clip == 3.0


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 64), st.floats(1e-6, 1.0), st.sampled_from(["none", "3", "0.5"]))
def test_overrides_are_typed(num_pairs, lr, soft_clip):
    config = apply_overrides(
        TrainConfig(), [f"vgrpo.num_pairs={num_pairs}", f"optim.lr={lr!r}", f"advantage.soft_clip={soft_clip}"]
    )
    assert config.vgrpo.num_pairs == num_pairs and config.optim.lr == lr
    assert config.advantage.soft_clip == (None if soft_clip == "none" else float(soft_clip))


@pytest.mark.parametrize(
    "override, message",
    [
        ("nope=1", "Unknown config key 'nope'"),
        ("vgrpo.nope=1", "Unknown config key 'vgrpo.nope'"),
        ("nosection.lr=1", "Unknown config section 'nosection'"),
        ("optim.lr=fast", "expected float"),
        ("optim.lr=-1", "optim.lr must be > 0"),
        ("group_size=1", "group_size must be >= 2"),
        ("algo=ppo", "Unknown algorithm 'ppo'"),
        ("flow_grpo.window_size=99", "window_size must be in 1..rollout.num_steps"),
        ("iterations", "must look like key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_every_valid_key_can_be_set_from_the_command_line():
    config = TrainConfig()
    for key in valid_keys():
        section, _, name = key.rpartition(".")
        value = getattr(getattr(config, section) if section else config, name)
        text = "none" if value is None else str(value)
        assert apply_overrides(config, [f"{key}={text}"]) == config


def test_presets_apply_and_unknown_preset_is_refused():
    for algo in ("vgrpo", "flow_grpo", "diffusion_nft"):
        apply_overrides(TrainConfig(), [f"algo={algo}", *preset_overrides("testbed", algo)])
    assert "task=sd3.5-medium" in preset_overrides("sd3.5-medium", "vgrpo")
    with pytest.raises(ValueError, match="Unknown preset 'sd4'"):
        preset_overrides("sd4", "vgrpo")


def test_model_and_distributed_sections_round_trip_and_parse_image_sizes():
    from algorithms.config import parse_image_size

    config = apply_overrides(TrainConfig(), ["model.prompts=p.txt", "model.image_size=720x1280",
                                             "model.gradient_checkpointing=false", "distributed.strategy=fsdp2"])
    assert TrainConfig.from_dict(json.loads(config.to_json())) == config
    assert (config.model.prompts, config.model.gradient_checkpointing, config.distributed.strategy) == ("p.txt", False, "fsdp2")
    assert parse_image_size("512") == 512 and parse_image_size("720x1280") == (720, 1280)
    assert parse_image_size("500") is None and parse_image_size("512x") is None and parse_image_size("-512") is None


def test_rollout_grid_is_uniform_on_the_testbed_unless_shifted():
    from algorithms.tasks import get_task, rollout_grid
    from vgrpo_lib.samplers import time_grid

    task = get_task("digit")
    assert rollout_grid(task, TrainConfig().rollout) == time_grid(10)
    shifted = apply_overrides(TrainConfig(), ["rollout.shift=3.0", "rollout.num_steps=4"]).rollout
    assert rollout_grid(task, shifted) == time_grid(4, shift=3.0) != time_grid(4)

    class OwnGrid:
        def time_grid(self, num_steps):
            return [1.0, 0.3, 0.0][: num_steps + 1]

    assert rollout_grid(OwnGrid(), apply_overrides(TrainConfig(), ["rollout.num_steps=2"]).rollout) == [1.0, 0.3, 0.0]
    assert rollout_grid(OwnGrid(), shifted) == time_grid(4, shift=3.0), "an explicit shift wins over the task's grid"


def test_antithetic_noise_needs_an_even_number_of_pairs():
    assert apply_overrides(TrainConfig(), ["vgrpo.noise=antithetic"]).vgrpo.noise == "antithetic"
    with pytest.raises(ValueError, match="vgrpo.num_pairs must be even with vgrpo.noise=antithetic, got 3"):
        apply_overrides(TrainConfig(), ["vgrpo.noise=antithetic", "vgrpo.num_pairs=3"])


@pytest.mark.parametrize(
    "text, expected",
    [("0.02", 0.02), ("0.01,0.03", (0.01, 0.03)), ("(0.01, 0.03)", (0.01, 0.03)), ("[0.005,0.02]", (0.005, 0.02))],
)
def test_clip_range_is_eps_or_a_low_high_pair_and_round_trips(text, expected):
    config = apply_overrides(TrainConfig(), [f"vgrpo.clip_range={text}"])
    assert config.vgrpo.clip_range == expected
    assert TrainConfig.from_dict(json.loads(config.to_json())) == config  # the pair is a JSON list, read back a tuple


@pytest.mark.parametrize(
    "text, message",
    [("0.01,0.02,0.03", "expected float or a \\(low, high\\) pair"), ("low,high", "expected float or a \\(low, high\\)"),
     ("1.0", "vgrpo.clip_range must be eps or a \\(low, high\\) pair with 0 <= low < 1"),
     ("0.01,-0.01", "vgrpo.clip_range must be"), ("0.01,nan", "vgrpo.clip_range must be")],
)
def test_bad_clip_ranges_name_the_key(text, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(TrainConfig(), [f"vgrpo.clip_range={text}"])
    payload = TrainConfig().to_dict()
    payload["vgrpo"]["clip_range"] = [0.01, "x"]
    with pytest.raises(ValueError, match="Config key vgrpo.clip_range must be float or a \\(low, high\\) pair"):
        TrainConfig.from_dict(payload)


def test_diffusion_nft_needs_an_advantage_clip_for_its_normalisation():
    with pytest.raises(ValueError, match="diffusion_nft needs advantage.clip"):
        apply_overrides(TrainConfig(), ["algo=diffusion_nft"])
    config = apply_overrides(TrainConfig(), ["algo=diffusion_nft", "advantage.clip=5"])
    assert config.advantage.clip == 5.0
