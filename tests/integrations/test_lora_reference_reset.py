"""GARDO's reference reset (``schedule.reference_reset``) on a LoRA model: the reference is the base until the first
reset, then a frozen third adapter ``"reference"`` that each reset copies the trained adapter into, as the official
code keeps its reference (tinnerhrhe/GARDO, scripts/train_sd3_grpo_gardo.py, ``main``: the "old" adapter takes the
trained weights). Trained by the real trainer on a tiny SD3 pipeline; the reset's cadence against the official loop
is tested on the testbed (tests/algorithms/test_reference_reset.py)."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.step_control import ResettableReference  # noqa: E402
from vgrpo_lib.algorithms.trainer import Trainer  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters import AdapterReference  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters.lora import lora_parameters  # noqa: E402
from tests.integrations.test_diffusers_task import base_model, config, hub_model, pipelines, probe  # noqa: E402,F401

# A threshold every positive KL exceeds: the reference is reset after each iteration whose policy left it.
RESET_EVERY_MOVE = ["vgrpo.num_pairs=2", "vgrpo.ref_kl_coef=1.0", "schedule.reference_reset=kl=1e-12"]


def adapter(transformer, name):
    return {key: p.detach().clone() for key, p in lora_parameters(transformer, name).items()}


def test_each_reset_makes_the_reference_adapter_the_trained_one(hub_model, pipelines, tmp_path):
    trainer = Trainer(config("vgrpo", "iterations=5", *RESET_EVERY_MOVE, *hub_model("sd3")), tmp_path / "run",
                      progress=False)
    reference, transformer = trainer.algorithm.loss_module.ref_model, trainer.policy.transformer
    assert isinstance(reference, AdapterReference) and isinstance(reference, ResettableReference)
    assert set(transformer.peft_config) == {"default", "reference"}  # added before training, frozen
    assert all(not p.requires_grad for p in lora_parameters(transformer, "reference").values())
    x, t, c = probe(trainer.task)
    base = base_model(pipelines["sd3"])
    with torch.no_grad():
        torch.testing.assert_close(reference(x, t, c), base(x, t, c), rtol=0, atol=0)  # the base until a reset
    assert reference.state_dict() == {}

    trainer.step()  # iteration 0: the policy is the base (KL 0), no reset; its step moves the policy
    trainer.step()  # iteration 1: KL > 0, so the reference takes the trained adapter after it
    assert reference.adapter_name == "reference"
    trained, held = adapter(transformer, "default"), adapter(transformer, "reference")
    assert trained.keys() == held.keys() and all(torch.equal(trained[k], held[k]) for k in trained)
    with torch.no_grad():
        torch.testing.assert_close(reference(x, t, c), trainer.policy(x, t, c), rtol=0, atol=0)
        assert not torch.allclose(reference(x, t, c), base(x, t, c))
    assert all(p.requires_grad for p in lora_parameters(transformer, "default").values())  # still the trained one
    trainer.train()
    kls = [row["ref_kl"] for row in trainer.metrics]
    # Each iteration after a reset starts at its reference (KL exactly 0: the same weights, the same computation).
    assert kls[0] == 0.0 and kls[2] == 0.0 and kls[4] == 0.0 and kls[1] > 0 and kls[3] > 0
    assert [row["reference_resets"] for row in trainer.metrics] == [0, 0, 1, 1, 2]


def test_a_resumed_run_keeps_the_reset_reference_adapter(hub_model, tmp_path):
    cfg = config("vgrpo", "iterations=4", *RESET_EVERY_MOVE, *hub_model("sd3"))
    straight = Trainer(cfg, tmp_path / "straight", progress=False)
    straight.train()
    Trainer(cfg, tmp_path / "cut", progress=False).train(until=2)  # stopped after the first reset
    resumed = Trainer.resume(tmp_path / "cut", progress=False)
    assert resumed.algorithm.loss_module.ref_model.adapter_name == "reference"
    resumed.train()
    assert [r["ref_kl"] for r in resumed.metrics] == pytest.approx([r["ref_kl"] for r in straight.metrics], rel=1e-5)
    assert [r["reference_resets"] for r in resumed.metrics] == [0, 0, 1, 1]
    for name in ("default", "reference"):
        ours, theirs = adapter(resumed.policy.transformer, name), adapter(straight.policy.transformer, name)
        for key, value in theirs.items():
            torch.testing.assert_close(ours[key], value, rtol=1e-5, atol=1e-6)


def test_without_the_reset_no_reference_adapter_is_added(hub_model, tmp_path):
    trainer = Trainer(config("vgrpo", "vgrpo.num_pairs=2", "vgrpo.ref_kl_coef=1.0", *hub_model("sd3")), tmp_path,
                      progress=False)
    assert set(trainer.policy.transformer.peft_config) == {"default"}
    assert trainer.algorithm.loss_module.ref_model.adapter_name is None  # adapters off: the base


def test_the_reference_adapter_refuses_a_reset_before_it_exists_and_a_state_of_other_keys(hub_model, tmp_path):
    trainer = Trainer(config("vgrpo", "vgrpo.num_pairs=2", "vgrpo.ref_kl_coef=1.0", *hub_model("sd3")), tmp_path,
                      progress=False)
    reference = trainer.algorithm.loss_module.ref_model
    with pytest.raises(RuntimeError, match="reset_ before hold_resets"):
        reference.reset_()
    with pytest.raises(RuntimeError, match="load_state_dict before hold_resets"):  # added in one place only
        reference.load_state_dict({"unused": torch.zeros(1)})
    assert set(trainer.policy.transformer.peft_config) == {"default"}
    reference.hold_resets()
    reference.hold_resets()  # a second call adds nothing
    assert set(trainer.policy.transformer.peft_config) == {"default", "reference"}
    reference.reset_()
    state = reference.state_dict()
    assert state.keys() == lora_parameters(trainer.policy.transformer, "reference").keys()
    with pytest.raises(KeyError, match="reference adapter state does not match"):
        reference.load_state_dict(dict(list(state.items())[1:]))
