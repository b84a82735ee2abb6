import json
import re
from dataclasses import fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib.algorithms.config import ALGORITHMS, OPTIONS, AlgorithmSection, FlowGRPOConfig, TrainConfig, apply_overrides, valid_keys
from vgrpo_lib.algorithms.presets import PAPER, PRESETS, build_config, preset_overrides


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
        ("optim.lrr=1e-4", "Unknown config key 'optim.lrr'; did you mean optim.lr\\?$"),
        ("optm.lr=1e-4", "Unknown config section 'optm'; did you mean optim\\?$"),
        ("vgrpo.kl_coef=0.3", "Unknown config key 'vgrpo.kl_coef': renamed to vgrpo.behaviour_kl_coef"),
        ("flow_grpo.adv_clip=5", "Unknown config key 'flow_grpo.adv_clip': renamed to advantage.clip"),
        ("optim.lr=fast", "expected float"),
        ("optim.lr=-1", "optim.lr must be > 0"),
        ("group_size=1", "group_size must be >= 2"),
        ("algo=ppo", "Unknown algorithm 'ppo'"),
        ("iterations", "must look like key=value"),
    ],
)
def test_bad_overrides_name_the_problem(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(TrainConfig(), [override])


def test_an_unknown_key_gets_one_suggestion_not_the_list_of_every_key():
    with pytest.raises(ValueError) as error:
        apply_overrides(TrainConfig(), ["optim.lrr=1e-4"])
    assert str(error.value) == "Unknown config key 'optim.lrr'; did you mean optim.lr?"
    with pytest.raises(ValueError) as error:
        apply_overrides(TrainConfig(), ["zzzz=1"])
    assert "did you mean" not in str(error.value) and "optim.lr" not in str(error.value)
    with pytest.raises(ValueError, match="Unknown config key 'optim.lrr'; did you mean optim.lr"):
        TrainConfig.from_dict({"optim": {"lrr": 1e-4}})  # a config.json gets the same hint


def owner(key: str) -> str:
    """The first algorithm that reads the section of ``key`` (shared keys: vgrpo, which reads them all)."""
    section = getattr(TrainConfig(), key.partition(".")[0], None)
    return section.algorithms[0] if isinstance(section, AlgorithmSection) else "vgrpo"


def test_every_valid_key_can_be_set_from_the_command_line_under_the_algorithm_that_uses_it():
    for key in valid_keys():
        config = build_config(owner(key), None, "testbed", [])
        section, _, name = key.rpartition(".")
        value = getattr(getattr(config, section) if section else config, name)
        text = "none" if value is None else str(value)
        assert apply_overrides(config, [f"{key}={text}"]) == config, key


@pytest.mark.parametrize("algo", ["vgrpo", "flow_grpo", "diffusion_nft", "grpo_guard", "awm"])
def test_a_key_of_another_algorithm_is_refused_naming_the_algorithms_that_use_it(algo):
    config = build_config(algo, None, "testbed", [])
    refused = 0
    for key in valid_keys():
        section = getattr(config, key.partition(".")[0], None)
        if isinstance(section, AlgorithmSection) and algo not in section.algorithms:
            value = getattr(section, key.partition(".")[2])
            text = "none" if value is None else str(value)
            users = " / ".join(section.algorithms)
            # refused even at its default value: the user asked for something the run would ignore
            with pytest.raises(ValueError, match=rf"^{re.escape(key)} is a setting of {users}, but algo={algo} "
                                                 rf"does not use it; drop it, or train with algo={section.algorithms[0]}\.$"):
                apply_overrides(config, [f"{key}={text}"])
            refused += 1
    assert refused > 10
    # A section of another algorithm off its defaults is refused when the config is built (e.g. from a dict).
    other = next(name for name in ("vgrpo", "diffusion_nft") if name != algo)
    payload = json.loads(config.to_json())
    assert other not in payload, "config.json holds only the chosen algorithm's section"
    payload[other] = {"ref_kl_coef": 0.5}
    with pytest.raises(ValueError, match=f"{other}.ref_kl_coef is a setting of {other}, but algo={algo}"):
        TrainConfig.from_dict(payload)
    payload[other] = {"ref_kl_coef": None}  # at its default it reads back (config.json files written with every section)
    assert TrainConfig.from_dict(payload) == config


def test_an_option_the_algorithm_ignores_is_refused_naming_the_algorithms_that_use_it():
    message = ("rollout.solver is not used by flow_grpo (its rollout is its own SDE sampler); it is used by vgrpo, "
               "diffusion_nft, fpo, awm, dgpo.")
    for solver in ("heun", "euler"):  # euler is the default: refused all the same when set
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            build_config("flow_grpo", None, "testbed", [f"rollout.solver={solver}"])
    assert "solver" not in json.loads(build_config("flow_grpo", None, "testbed", []).to_json())["rollout"]
    assert build_config("diffusion_nft", None, "testbed", ["rollout.solver=heun"]).rollout.solver == "heun"
    with pytest.raises(ValueError, match="rollout.solver is not used by flow_grpo"):
        apply_overrides(TrainConfig(), ["rollout.solver=heun", "algo=flow_grpo"])  # whatever the order
    # Flow-GRPO-Fast reads flow_grpo.* but its branching window replaces MixGRPO's window and the step fraction.
    with pytest.raises(ValueError, match=re.escape(
            "flow_grpo.window_size is not used by flow_grpo_fast (its branching window chooses the trained steps); "
            "it is used by flow_grpo, grpo_guard.")):
        build_config("flow_grpo_fast", None, "testbed", ["flow_grpo.window_size=2"])
    assert build_config("grpo_guard", None, "testbed", ["flow_grpo.noise_level=0.5"]).flow_grpo.noise_level == 0.5


def test_an_algorithm_section_is_one_dataclass_and_one_field():
    """ALGORITHMS, the --algo choices and OPTIONS are read from TrainConfig's AlgorithmSection fields and the
    fields' metadata; the registry of algorithm classes covers the same names."""
    from vgrpo_lib.algorithms.registry import ALGORITHM_CLASSES

    sections = [getattr(TrainConfig(), f.name) for f in fields(TrainConfig)]
    assert set(ALGORITHMS) == {a for s in sections if isinstance(s, AlgorithmSection) for a in s.algorithms}
    assert set(ALGORITHMS) == set(ALGORITHM_CLASSES)
    assert OPTIONS["flow_grpo.kl_form"] == FlowGRPOConfig.__dataclass_fields__["kl_form"].metadata["choices"]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("algo", ALGORITHMS)
def test_for_algo_returns_a_valid_config_for_every_algorithm_and_preset(algo, preset):
    if preset in PAPER and algo != "vgrpo":  # the paper's settings are V-GRPO's
        with pytest.raises(ValueError, match=f"{preset!r} preset is the V-GRPO paper's setting; it covers vgrpo"):
            TrainConfig.for_algo(algo, preset=preset)
        return
    config = TrainConfig.for_algo(algo, preset=preset)
    assert config.algo == algo
    assert config == build_config(algo, None, preset, [])
    assert TrainConfig.from_dict(json.loads(config.to_json())) == config


def test_for_algo_takes_a_task_and_overrides_after_the_preset():
    config = TrainConfig.for_algo("diffusion_nft", preset="mnist-sd3", task="ocr", overrides=["optim.lr=2e-4"])
    assert (config.task, config.optim.lr) == ("mnist-sd3/ocr", 2e-4)
    assert TrainConfig.for_algo("diffusion_nft") == build_config("diffusion_nft", None, "testbed", [])
    with pytest.raises(ValueError, match="Unknown preset 'sd4'"):
        TrainConfig.for_algo("vgrpo", preset="sd4")


def test_presets_apply_and_unknown_preset_is_refused():
    for algo in ("vgrpo", "flow_grpo", "diffusion_nft"):
        apply_overrides(TrainConfig(), [f"algo={algo}", *preset_overrides("testbed", algo)])
    assert "task=sd3.5-medium" in preset_overrides("sd3.5-medium", "vgrpo")
    with pytest.raises(ValueError, match="Unknown preset 'sd4'"):
        preset_overrides("sd4", "vgrpo")


def test_model_and_distributed_sections_round_trip_and_parse_image_sizes():
    from vgrpo_lib.algorithms.config import parse_image_size

    config = apply_overrides(TrainConfig(), ["model.prompts=p.txt", "model.image_size=720x1280",
                                             "model.gradient_checkpointing=false", "distributed.strategy=fsdp2"])
    assert TrainConfig.from_dict(json.loads(config.to_json())) == config
    assert (config.model.prompts, config.model.gradient_checkpointing, config.distributed.strategy) == ("p.txt", False, "fsdp2")
    assert parse_image_size("512") == 512 and parse_image_size("720x1280") == (720, 1280)
    assert parse_image_size("500") is None and parse_image_size("512x") is None and parse_image_size("-512") is None


def test_rollout_grid_is_uniform_on_the_testbed_unless_shifted():
    from vgrpo_lib.algorithms.tasks import get_task, rollout_grid
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


def test_diffusion_nft_amax_has_its_own_key_and_the_old_ones_name_it():
    """advantage.clip is a clip for every algorithm that reads it; DiffusionNFT's Amax (the bound and normaliser of
    its optimality) is diffusion_nft.advantage_max, so a DiffusionNFT config is valid as constructed."""
    config = TrainConfig(algo="diffusion_nft")
    assert config.diffusion_nft.advantage_max == 5.0 and config.advantage.clip is None
    assert apply_overrides(config, ["diffusion_nft.advantage_max=2"]).diffusion_nft.advantage_max == 2.0
    with pytest.raises(ValueError, match="advantage.clip is not used by diffusion_nft \\(its Amax is "
                                         "diffusion_nft.advantage_max.*configs before it named Amax advantage.clip"):
        apply_overrides(config, ["advantage.clip=5"])
    with pytest.raises(ValueError, match="'diffusion_nft.adv_max': renamed to diffusion_nft.advantage_max"):
        apply_overrides(config, ["diffusion_nft.adv_max=5"])
    saved = json.loads(config.to_json())  # a config.json written before the rename held Amax in advantage.clip
    assert "clip" not in saved["advantage"]
    saved["advantage"]["clip"] = 5.0
    with pytest.raises(ValueError, match="advantage.clip is not used by diffusion_nft \\(its Amax is diffusion_nft"):
        TrainConfig.from_dict(saved)
    with pytest.raises(ValueError, match="diffusion_nft.advantage_max must be > 0"):
        apply_overrides(config, ["diffusion_nft.advantage_max=0"])


def test_the_losses_read_the_advantage_keys_by_their_one_meaning(tiny_config, tmp_path):
    """Flow-GRPO's loss clips with advantage.clip (the trainer's GroupAdvantage clips with it too); DiffusionNFT's
    loss takes its Amax from diffusion_nft.advantage_max, and its advantages are not clipped before."""
    from vgrpo_lib.algorithms.trainer import Trainer

    flow = Trainer(tiny_config("flow_grpo", "advantage.clip=3"), tmp_path / "flow", progress=False)
    assert flow.algorithm.loss_module.advantage_clip == flow.advantage.clip == 3.0
    nft = Trainer(tiny_config("diffusion_nft", "diffusion_nft.advantage_max=2"), tmp_path / "nft", progress=False)
    assert nft.algorithm.loss_module.advantage_max == 2.0 and nft.advantage.clip is None


def test_cross_key_rules_of_the_chosen_algorithm_name_the_keys():
    with pytest.raises(ValueError, match="flow_grpo.window_size must be in 1..rollout.num_steps=10, got 99"):
        apply_overrides(TrainConfig(), ["algo=flow_grpo", "flow_grpo.window_size=99"])
    with pytest.raises(ValueError, match="flow_grpo.timestep_fraction must leave at least one of rollout.num_steps=2"):
        apply_overrides(TrainConfig(), ["algo=flow_grpo", "rollout.num_steps=2", "flow_grpo.timestep_fraction=0.3"])
    with pytest.raises(ValueError, match="optim.minibatches and optim.minibatch_size both set"):
        apply_overrides(TrainConfig(), ["optim.minibatches=2", "optim.minibatch_size=8"])


def test_seeds_beyond_64_bits_or_negative_are_refused_naming_the_key():
    """Issue 29.7: a seed past 2**64 ended deep in torch as 'Overflow when unpacking long long'."""
    config = TrainConfig.for_algo("vgrpo")
    for override, key in (("seed=18446744073709551616", "seed"), ("seed=9223372036854775808", "seed"),
                          ("eval.seed=-1", "eval.seed")):
        with pytest.raises(ValueError, match=rf"^{key} must be in \[0, 2\*\*63\)"):
            apply_overrides(config, [override])
    assert apply_overrides(config, ["seed=9223372036854775807"]).seed == 2**63 - 1


@pytest.mark.parametrize("shift", ["1e-308", "1e308", "0.0001"])
def test_a_time_shift_that_breaks_float_arithmetic_is_refused_naming_the_key(shift):
    """Issue 29.7: rollout.shift=1e-308 ended in a ZeroDivisionError, 1e308 in a NaN grid."""
    with pytest.raises(ValueError, match=r"^rollout.shift must be in \[1e-3, 1e3\]"):
        apply_overrides(TrainConfig(), [f"rollout.shift={shift}"])
