"""The official presets run end to end at toy size and do what the official code does with their settings:
Flow-GRPO trains the first 9 of 10 SDE steps of the samples with a non-zero advantage, in two gradient steps,
with CFG; DiffusionNFT's first old-policy update already keeps 0.1% (decay counted in gradient steps); the EMA of
the weights is what evaluation sees."""

from __future__ import annotations

import pytest
import torch

from vgrpo_lib.algorithms.flow_grpo import FlowGRPO
from vgrpo_lib.algorithms.policies import Policies
from vgrpo_lib.algorithms.presets import OFFICIAL, build_config, preset_overrides
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.testbed.sampling import null_prompts
from tests.algorithms.conftest import TINY

TEN_STEPS = [*TINY, "rollout.num_steps=10"]


def official(algo: str, *overrides: str):
    return build_config(algo, None, "official", [*TEN_STEPS, *overrides])


@pytest.mark.parametrize("algo", sorted(OFFICIAL))
def test_official_preset_trains_and_evaluates(tmp_path, algo):
    trainer = Trainer(official(algo), tmp_path / algo, progress=False)
    trainer.train()
    assert len(trainer.metrics) == 2 and all(torch.isfinite(torch.tensor(m["reward_mean"])) for m in trainer.metrics)
    assert len(trainer.evaluations) == 2


def test_official_preset_contents_and_unknown_algorithm():
    config = official("flow_grpo")
    assert (config.advantage.scale, config.advantage.eps) == ("batch", 1e-4)
    assert (config.flow_grpo.kl_form, config.flow_grpo.ref_kl_coef, config.flow_grpo.timestep_fraction) == ("flow_grpo", 0.04, 0.99)
    assert (config.flow_grpo.clip_range, config.advantage.clip) == (1e-4, 5.0)
    assert (config.optim.minibatches, config.optim.minibatch_size, config.optim.weight_decay) == (2, None, 1e-4)
    nft = official("diffusion_nft")
    assert (nft.diffusion_nft.timestep_fraction, nft.diffusion_nft.ref_kl_coef, nft.optim.ema_decay) == (0.99, 1e-4, 0.9)
    assert nft.diffusion_nft.advantage_max == 5.0
    sd3 = {algo: build_config(algo, None, "official-sd3.5-medium", []) for algo in ("flow_grpo", "vgrpo")}
    assert (sd3["flow_grpo"].rollout.num_steps, sd3["flow_grpo"].group_size, sd3["flow_grpo"].optim.lr) == (10, 24, 3e-4)
    assert (sd3["vgrpo"].rollout.num_steps, sd3["vgrpo"].rollout.solver) == (40, "dpmpp_2m")  # the paper's rollout
    with pytest.raises(ValueError, match="No official settings"):
        preset_overrides("official", "mixgrpo")


def test_flow_grpo_trains_nine_of_ten_steps_of_nonzero_advantage_samples(make_digits8_policy):
    config = official("flow_grpo")
    policy = make_digits8_policy()
    algorithm = FlowGRPO(config, Policies(policy, make_digits8_policy(), null_cond=null_prompts), (1, 8, 8), [1 - i / 10 for i in range(11)])
    generator = torch.Generator().manual_seed(0)
    cond = torch.arange(8) % 4
    batch = algorithm.rollout(cond, torch.arange(8) // 2, generator, 0)
    batch["advantage"] = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, 0.0, -0.5, 2.0])
    rows = algorithm.prepare(batch, generator)
    # 5 non-zero advantages, one zero-advantage sample kept back so that 2 minibatches split evenly; 9 steps each.
    assert rows.shape == (6 * 9,)
    assert int((rows["advantage"] == 0).sum()) == 9
    assert torch.equal(rows["t"].view(6, 9)[0], batch["trajectory"]["t"][0, :9])
    assert algorithm.nfe() == {"rollout": 20, "prepare": 0, "update": 2 * 9 * 2}  # CFG doubles; the KL's reference


def test_diffusion_nft_first_old_policy_update_keeps_a_thousandth(tmp_path):
    trainer = Trainer(build_config("diffusion_nft", None, "testbed", [*TINY, "iterations=1"]), tmp_path / "run",
                      progress=False)
    behaviour = trainer.algorithm.behaviour
    before = [p.detach().clone() for p in behaviour.model.parameters()]
    trainer.train()
    assert trainer.counters["grad_steps"] == 1
    for old, new, trained in zip(before, behaviour.model.parameters(), trainer.policy.parameters()):
        torch.testing.assert_close(new, 0.001 * old + 0.999 * trained.detach())


def test_evaluation_sees_the_ema_weights(tmp_path):
    config = build_config("vgrpo", None, "testbed", [*TINY, "iterations=1", "optim.ema_decay=0.9"])
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.train()
    seen = []

    class Recording:  # the task, recording the weights it samples with
        def __getattr__(self, name):
            return getattr(task, name)

        def sample(self, policy, prompts, **kwargs):
            seen.append([p.detach().clone() for p in policy.parameters()])
            return task.sample(policy, prompts, **kwargs)

    task, trainer.task = trainer.task, Recording()
    trainer.evaluate()
    for got, average in zip(seen[0], trainer.ema.average):
        torch.testing.assert_close(got, average)
    assert any(not torch.equal(a, t.detach()) for a, t in zip(trainer.ema.average, trainer.policy.parameters()))


def test_minibatches_split_rows_into_that_many_gradient_steps(tmp_path):
    config = build_config("flow_grpo", None, "testbed", [*TINY, "iterations=1", "optim.minibatch_size=none",
                                                        "optim.minibatches=3"])
    trainer = Trainer(config, tmp_path / "run", progress=False)
    trainer.train()
    assert trainer.counters["grad_steps"] == 3
    with pytest.raises(ValueError, match="set one"):
        build_config("flow_grpo", None, "testbed", ["optim.minibatches=2"])  # the testbed preset sets minibatch_size


def test_configuration_errors_name_the_key():
    with pytest.raises(ValueError, match="flow_grpo.timestep_fraction"):
        build_config("flow_grpo", None, "testbed", ["rollout.num_steps=4", "flow_grpo.timestep_fraction=0.2"])
    with pytest.raises(ValueError, match="diffusion_nft.adv_mode"):
        build_config("diffusion_nft", None, "testbed", ["diffusion_nft.adv_mode=positive"])
    with pytest.raises(ValueError, match="flow_grpo.kl_form"):
        build_config("flow_grpo", None, "testbed", ["flow_grpo.kl_form=official"])
    with pytest.raises(ValueError, match="window_size both"):
        build_config("flow_grpo", None, "testbed", ["flow_grpo.window_size=4", "flow_grpo.timestep_fraction=0.9"])


def test_flow_grpo_cfg_needs_a_null_condition(make_digits8_policy):
    config = official("flow_grpo")
    with pytest.raises(ValueError, match="unconditional condition"):
        FlowGRPO(config, Policies(make_digits8_policy()), (1, 8, 8), [1 - i / 10 for i in range(11)])


@pytest.fixture
def make_digits8_policy():
    from vgrpo_lib.algorithms.tasks import load_task

    return lambda: load_task("digits8").load_policy()

