"""Schedules, the adaptive KL controller and multi-reward runs reach a training run through the config."""

import math
import re

import pytest
import torch

from vgrpo_lib.algorithms.config import TrainConfig, apply_overrides
from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.config import AlgorithmSection, _algorithm_sections
from vgrpo_lib.algorithms.step_control import SCHEDULED_LR, StepControl, parse_schedule
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.testbed.rewards import DigitProbability, WeightedReward
from vgrpo_lib.integrations.testbed.tasks import Task
from vgrpo_lib.advantages import group_advantage
from vgrpo_lib.control import AdaptiveKLController, Cosine, Linear, Piecewise, Warmup
from vgrpo_lib.losses import AWMLoss, DGPOLoss, DiffusionNFTLoss, FlowGRPOLoss, GRPOGuardLoss, VGRPOLoss
from vgrpo_lib.rules import CLIP_RANGE, NON_NEGATIVE


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("constant", lambda s: 0.5),
        ("linear:end=0.1,steps=4", Linear(0.5, 0.1, 4)),
        ("cosine:end=0,steps=10", Cosine(0.5, 0.0, 10)),
        ("piecewise:at=3/6,values=0/0.3/0.2", Piecewise((3, 6), (0.0, 0.3, 0.2))),
        ("cosine:end=0,steps=10,warmup=3", Warmup(Cosine(0.5, 0.0, 10), 3)),
    ],
)
def test_a_schedule_spec_is_the_library_schedule_from_the_configured_value(spec, expected):
    schedule = parse_schedule(spec, 0.5, "schedule.lr", SCHEDULED_LR)
    assert [schedule(step) for step in range(16)] == [expected(step) for step in range(16)]


def test_adaptive_is_the_adaptive_kl_controller_and_only_for_kl_coefficients():
    controller = parse_schedule("adaptive:target=0.1,horizon=20", 0.3, "schedule.ref_kl_coef", NON_NEGATIVE,
                                adaptive=True)
    assert isinstance(controller, AdaptiveKLController)
    assert (controller.value, controller.target, controller.horizon) == (0.3, 0.1, 20)
    with pytest.raises(ValueError, match="Unknown schedule.lr schedule 'adaptive'"):
        parse_schedule("adaptive:target=0.1,horizon=20", 0.3, "schedule.lr", SCHEDULED_LR)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("cosin", "Unknown schedule.lr schedule 'cosin'; expected one of constant, linear, cosine, piecewise"),
        ("linear:end=0", "schedule.lr: the linear schedule needs steps=..."),
        ("linear:end=0,steps=x", "schedule.lr (linear schedule): steps='x' does not parse"),
        ("linear:end=0,steps=4,speed=2", "schedule.lr (linear schedule) takes end, steps, warmup, got 'speed=2'"),
        ("linear:end=0,steps=0", "schedule.lr: steps must be a positive integer"),
        ("piecewise:at=3,values=1", "schedule.lr: Piecewise needs one more value than boundaries"),
        ("constant:warmup=0", "schedule.lr: warmup must be >= 1"),
    ],
)
def test_bad_schedules_name_the_key(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_schedule(spec, 1.0, "schedule.lr", SCHEDULED_LR)


def test_the_config_refuses_schedules_of_values_the_run_does_not_have(tiny_config):
    with pytest.raises(ValueError, match="schedule.behaviour_kl_coef needs vgrpo.behaviour_kl_coef set"):
        tiny_config("vgrpo", "schedule.behaviour_kl_coef=linear:end=1,steps=3")
    with pytest.raises(ValueError, match="schedule.clip_range: diffusion_nft has no clip_range to schedule"):
        tiny_config("diffusion_nft", "schedule.clip_range=linear:end=0.1,steps=3")
    with pytest.raises(ValueError, match=r"schedule.clip_range needs a single eps in vgrpo.clip_range, got the pair"):
        tiny_config("vgrpo", "vgrpo.clip_range=0.01,0.02", "schedule.clip_range=linear:end=0.1,steps=3")
    with pytest.raises(ValueError, match="Unknown schedule.lr schedule 'fast'"):
        tiny_config("vgrpo", "schedule.lr=fast")


@pytest.mark.parametrize(
    "algo, override, message",
    [
        ("vgrpo", "schedule.lr=cosine:end=-1,steps=3", "schedule.lr=cosine:end=-1,steps=3 reaches -1.0; every value of "
         "the schedule must be >= 0"),
        ("vgrpo", "schedule.ref_kl_coef=linear:end=-100,steps=3", "schedule.ref_kl_coef=linear:end=-100,steps=3 "
         "reaches -100.0; every value of the schedule must be >= 0"),
        ("vgrpo", "schedule.clip_range=linear:end=-0.01,steps=3", "schedule.clip_range=linear:end=-0.01,steps=3 "
         "reaches -0.01; every value of the schedule must be eps or a \\(low, high\\) pair with 0 <= low < 1"),
        ("flow_grpo", "schedule.clip_range=linear:end=1.5,steps=3", "schedule.clip_range=.* reaches 1.5"),
        ("vgrpo", "schedule.lr=piecewise:at=2/4,values=1e-4/-1e-5/0", "schedule.lr=.* reaches -1e-05"),
        ("diffusion_nft", "schedule.ref_kl_coef=constant:warmup=2", "schedule.ref_kl_coef needs diffusion_nft.ref_kl_coef"),
        ("awm", "schedule.behaviour_kl_coef=linear:end=nan,steps=3", "schedule.behaviour_kl_coef=.* reaches nan"),
    ],
)
def test_every_value_of_a_schedule_is_checked_by_the_rule_of_its_key_before_the_run_starts(
        tiny_config, tmp_path, algo, override, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(algo, override)
    out = tmp_path / "run"  # the command line refuses it in one line, before writing anything
    assert cli_main(["train", "--algo", algo, "--out", str(out), "iterations=3", override]) == 2
    assert not out.exists()


def test_a_scheduled_value_is_declared_once_on_its_loss_with_its_rule():
    """Each loss declares its schedulable scalars with their rule (TorchRL's _schedulable_buffers follows from
    it); each config key a schedule may drive has that same rule object, and the loss refuses an assignment by it."""
    declared = {VGRPOLoss: {"clip_range": CLIP_RANGE, "behaviour_kl_coef": NON_NEGATIVE, "ref_kl_coef": NON_NEGATIVE},
                FlowGRPOLoss: {"clip_range": CLIP_RANGE, "ref_kl_coef": NON_NEGATIVE},
                GRPOGuardLoss: {"clip_range": CLIP_RANGE, "ref_kl_coef": NON_NEGATIVE},
                AWMLoss: {"behaviour_kl_coef": NON_NEGATIVE, "ref_kl_coef": NON_NEGATIVE},
                DiffusionNFTLoss: {"ref_kl_coef": NON_NEGATIVE},
                DGPOLoss: {"clip_range": CLIP_RANGE, "ref_kl_coef": NON_NEGATIVE}}
    for loss, rules in declared.items():
        assert loss._schedulable_rules == rules and loss._all_schedulable_buffers == frozenset(rules)
    schedulable = {}
    for name, section in _algorithm_sections().items():
        assert issubclass(section, AlgorithmSection)
        for key, rule in section.schedulable().items():
            assert section.__dataclass_fields__[key].metadata["rule"] is rule, f"{name}.{key}"
            schedulable[f"{name}.{key}"] = rule
    assert set(schedulable) == {"vgrpo.clip_range", "vgrpo.behaviour_kl_coef", "vgrpo.ref_kl_coef",
                                "flow_grpo.clip_range", "flow_grpo.ref_kl_coef", "diffusion_nft.ref_kl_coef",
                                "fpo.clip_range", "awm.behaviour_kl_coef", "awm.ref_kl_coef", "dgpo.clip_range",
                                "dgpo.ref_kl_coef"}
    model = torch.nn.Linear(2, 2)
    loss = FlowGRPOLoss(model, ref_model=model, ref_kl_coef=0.1)
    with pytest.raises(ValueError, match="ref_kl_coef must be >= 0, got -1"):
        loss.ref_kl_coef = -1
    with pytest.raises(ValueError, match="clip_range must be eps or a \\(low, high\\) pair"):
        loss.clip_range = (0.5, 0.1, 0.2)
    assert loss.ref_kl_coef.item() == pytest.approx(0.1) and loss.clip_range.tolist() == pytest.approx([1e-4, 1e-4])


def test_schedules_and_the_adaptive_kl_controller_drive_the_run(tiny_config, tmp_path):
    """lr and clip range follow their schedules iteration by iteration (the optimizer's and the loss's values);
    the reference-KL coefficient follows Ziegler et al.'s update from the KL each iteration measured, and the
    loss used it."""
    config = tiny_config(
        "vgrpo", "iterations=3", "vgrpo.num_pairs=2", "schedule.lr=linear:end=0,steps=2",
        "schedule.clip_range=linear:end=0.03,steps=2", "schedule.ref_kl_coef=adaptive:target=1e-5,horizon=2",
    )  # the testbed preset sets vgrpo.ref_kl_coef=3
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.train()
    rows = trainer.metrics
    assert [row["lr"] for row in rows] == [Linear(1e-4, 0.0, 2)(i) for i in range(3)] == [1e-4, 5e-5, 0.0]
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0
    assert [row["clip_range"] for row in rows] == pytest.approx([0.01, 0.02, 0.03])
    assert trainer.algorithm.loss_module.clip_range.tolist() == pytest.approx([0.03, 0.03])
    coef = 3.0
    for row in rows:
        assert row["ref_kl_coef"] == pytest.approx(coef, rel=1e-12)
        assert row["loss_ref_kl"] == pytest.approx(coef * row["ref_kl"], rel=1e-5)
        coef *= 1.0 + min(max(row["ref_kl"] / 1e-5 - 1.0, -0.2), 0.2) / 2
    assert rows[0]["ref_kl"] == 0.0 and rows[1]["ref_kl"] > 1e-5, "the check covers both directions"
    assert trainer.control.schedules["ref_kl_coef"].value == pytest.approx(coef, rel=1e-12)


def test_resume_continues_the_adaptive_coefficient_exactly(tiny_config, tmp_path):
    overrides = ["iterations=3", "checkpoint_every=1", "vgrpo.num_pairs=2",
                 "schedule.ref_kl_coef=adaptive:target=1e-5,horizon=2"]
    straight = Trainer(tiny_config("vgrpo", *overrides), tmp_path / "straight", progress=False)
    straight.train()
    Trainer(tiny_config("vgrpo", *overrides), tmp_path / "resumed", progress=False).train(until=2)
    resumed = Trainer.resume(tmp_path / "resumed", progress=False)
    resumed.train()
    assert resumed.metrics[-1]["ref_kl_coef"] == straight.metrics[-1]["ref_kl_coef"]
    assert resumed.control.state_dict() == straight.control.state_dict()
    for a, b in zip(straight.policy.state_dict().values(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b)


def test_step_control_refuses_a_loss_without_the_scheduled_term():
    class NoKL(torch.nn.Module):
        pass

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="schedule.ref_kl_coef: the loss has no ref_kl_coef"):
        StepControl({"ref_kl_coef": (0.1, "constant")}, NoKL(), optimizer)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="schedule.ref_kl_coef: the loss has no ref_kl_coef .*is its term configured"):
        StepControl({"ref_kl_coef": (0.1, "constant")}, FlowGRPOLoss(model), optimizer)
    with pytest.raises(ValueError, match="schedule.clip_range=linear:end=2,steps=2 reaches 2.0"):
        StepControl({"clip_range": (0.1, "linear:end=2,steps=2")}, FlowGRPOLoss(model), optimizer)


@pytest.mark.parametrize("mode", ["normalize_then_sum", "sum_then_normalize"])
def test_multi_reward_runs_score_each_reward_and_combine_them_as_configured(tiny_config, tmp_path, monkeypatch, mode):
    """A task whose reward has several named parts: each part is a column [N, R]; normalize_then_sum normalises
    each within its prompt group before the weighted sum (a reward on a 100x scale does not dominate),
    sum_then_normalize normalises the weighted sum. Per-reward means are logged and plotted."""
    ink = lambda images, prompts: 100.0 * images.flatten(1).mean(1)  # noqa: E731 (another scale)
    monkeypatch.setattr(Task, "reward", lambda self: WeightedReward(
        {"digit": (DigitProbability(self.classifier()), 1.0), "ink": (ink, 0.5)}))
    trainer = Trainer(tiny_config("vgrpo", "iterations=1", "advantage.soft_clip=none", f"advantage.multi_reward={mode}"),
                      tmp_path / mode, progress=False)
    calls = []
    advantage = trainer.advantage
    trainer.advantage = lambda scores, groups: calls.append((scores, groups, advantage(scores, groups))) or calls[-1][2]
    row = trainer.step()
    scores, groups, got = calls[0]
    assert scores.shape == (16, 2)
    weights = torch.tensor([1.0, 0.5])
    if mode == "normalize_then_sum":
        expected = sum(w * group_advantage(scores[:, r], groups) for r, w in enumerate(weights))
    else:
        expected = group_advantage(scores @ weights, groups)
    torch.testing.assert_close(got, expected)
    assert row["reward_digit_mean"] == pytest.approx(scores[:, 0].mean().item())
    assert row["reward_ink_mean"] == pytest.approx(scores[:, 1].mean().item())
    assert row["reward_mean"] == pytest.approx((scores @ weights).mean().item())
    assert math.isfinite(row["loss_objective"])
    trainer._write_files()
    assert (tmp_path / mode / "reward.png").stat().st_size > 0


def test_the_multi_reward_option_is_checked():
    with pytest.raises(ValueError, match="Unknown advantage.multi_reward 'mean'; expected one of 'normalize_then_sum'"):
        apply_overrides(TrainConfig(), ["advantage.multi_reward=mean"])
