"""Schedules, the adaptive KL controller and multi-reward runs reach a training run through the config."""

import math

import pytest
import torch

from vgrpo_lib.algorithms.config import TrainConfig, apply_overrides
from vgrpo_lib.algorithms.step_control import StepControl, parse_schedule
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.testbed.rewards import DigitProbability, WeightedReward
from vgrpo_lib.integrations.testbed.tasks import Task
from vgrpo_lib.advantages import group_advantage
from vgrpo_lib.control import AdaptiveKLController, Cosine, Linear, Piecewise, Warmup


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
    schedule = parse_schedule(spec, 0.5, "schedule.lr")
    assert [schedule(step) for step in range(16)] == [expected(step) for step in range(16)]


def test_adaptive_is_the_adaptive_kl_controller_and_only_for_kl_coefficients():
    controller = parse_schedule("adaptive:target=0.1,horizon=20", 0.3, "schedule.ref_kl_coef", adaptive=True)
    assert isinstance(controller, AdaptiveKLController)
    assert (controller.value, controller.target, controller.horizon) == (0.3, 0.1, 20)
    with pytest.raises(ValueError, match="Unknown schedule.lr schedule 'adaptive'"):
        parse_schedule("adaptive:target=0.1,horizon=20", 0.3, "schedule.lr")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("cosin", "Unknown schedule.lr schedule 'cosin'; expected one of constant, linear, cosine, piecewise"),
        ("linear:end=0", "schedule.lr: the linear schedule needs steps=..."),
        ("linear:end=0,steps=x", "schedule.lr: linear schedule parameter steps='x' does not parse"),
        ("linear:end=0,steps=4,speed=2", "schedule.lr: the linear schedule takes end, steps, warmup, got 'speed'"),
        ("linear:end=0,steps=0", "schedule.lr: steps must be a positive integer"),
        ("piecewise:at=3,values=1", "schedule.lr: Piecewise needs one more value than boundaries"),
        ("constant:warmup=0", "schedule.lr: warmup must be >= 1"),
    ],
)
def test_bad_schedules_name_the_key(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_schedule(spec, 1.0, "schedule.lr")


def test_the_config_refuses_schedules_of_values_the_run_does_not_have(tiny_config):
    with pytest.raises(ValueError, match="schedule.behaviour_kl_coef needs vgrpo.behaviour_kl_coef set"):
        tiny_config("vgrpo", "schedule.behaviour_kl_coef=linear:end=1,steps=3")
    with pytest.raises(ValueError, match="schedule.clip_range: diffusion_nft has no clip_range to schedule"):
        tiny_config("diffusion_nft", "schedule.clip_range=linear:end=0.1,steps=3")
    with pytest.raises(ValueError, match=r"schedule.clip_range needs a single eps in vgrpo.clip_range, got the pair"):
        tiny_config("vgrpo", "vgrpo.clip_range=0.01,0.02", "schedule.clip_range=linear:end=0.1,steps=3")
    with pytest.raises(ValueError, match="Unknown schedule.lr schedule 'fast'"):
        tiny_config("vgrpo", "schedule.lr=fast")


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
