"""GARDO's reference reset (``schedule.reference_reset``): the cadence of the official code, the reset itself in the
shared trainer, exact resumes, and the settings it refuses.

Official (tinnerhrhe/GARDO, scripts/train_sd3_grpo_gardo.py, ``main``): before an epoch's training the reference
("old" adapter) takes the trained weights when the previous epoch's KL exceeded ``kl_thres`` or when
``epoch - prev_epoch > reset_freq`` (``prev_epoch``: the last reset, initially 0); config/gardo.py: ``reset_freq =
15``, ``kl_thres = 3e-4``.
"""

from __future__ import annotations

import pytest
import torch

from vgrpo_lib import ELBOSurrogate, VGRPOLoss
from vgrpo_lib.algorithms.step_control import ReferenceReset, StepControl
from vgrpo_lib.algorithms.trainer import Trainer


def official_reset_epochs(kl_per_epoch, kl_thres, reset_freq):
    """The epochs before whose training the official loop resets the reference (transcribed)."""
    resets, prev_epoch, reset = [], 0, False
    for epoch in range(len(kl_per_epoch) + 1):
        if (epoch != 0 and reset) or (epoch - prev_epoch) > reset_freq:
            resets.append(epoch)
            reset, prev_epoch = False, epoch
        if epoch < len(kl_per_epoch) and kl_per_epoch[epoch] > kl_thres:
            reset = True
    return resets


@pytest.mark.parametrize("kl, every", [(None, 15), (3e-4, None), (3e-4, 15), (3e-4, 3)])
def test_the_resets_follow_the_official_cadence(kl, every):
    generator = torch.Generator().manual_seed(0)
    measured = (torch.rand(60, generator=generator) * 4e-4 * (torch.rand(60, generator=generator) < 0.2)).tolist()
    control = ReferenceReset(kl=kl, every=every)
    # Observing iteration i's KL decides the reset before iteration i + 1 (the official epoch i + 1).
    ours = [i + 1 for i, value in enumerate(measured) if control.due(value)]
    assert ours == official_reset_epochs(measured, kl if kl is not None else float("inf"), every or 10**9)
    assert control.resets == len(ours)


def test_every_reset_makes_the_reference_the_policy_and_the_next_kl_zero(tiny_config, tmp_path):
    trainer = Trainer(tiny_config("vgrpo", "iterations=5", "schedule.reference_reset=kl=1e-12"), tmp_path / "r",
                      progress=False)
    reference = trainer.algorithm.loss_module.ref_model
    base = [p.detach().clone() for p in reference.parameters()]
    trainer.train()
    kls = [row["ref_kl"] for row in trainer.metrics]
    # Iteration 0 starts at the base (KL 0); each iteration after a reset starts at its reference (KL 0), and the
    # one step it takes moves the policy away again (KL > 0), which resets the reference once more.
    assert kls[0] == 0.0 and kls[2] == 0.0 and kls[4] == 0.0 and kls[1] > 0 and kls[3] > 0
    assert [row["reference_resets"] for row in trainer.metrics] == [0, 0, 1, 1, 2]
    assert not all(torch.equal(a, b) for a, b in zip(base, reference.parameters()))


def test_a_resumed_run_keeps_the_reset_reference(straight_and_resumed):
    overrides = ["iterations=5", "checkpoint_every=1", "schedule.reference_reset=kl=1e-12,every=2"]
    straight, resumed = straight_and_resumed("vgrpo", overrides, until=3)
    references = (t.algorithm.loss_module.ref_model.parameters() for t in (straight, resumed))
    assert all(torch.equal(a, b) for a, b in zip(*references))
    assert [r["ref_kl"] for r in straight.metrics] == [r["ref_kl"] for r in resumed.metrics]


@pytest.mark.parametrize(
    "algo, overrides, message",
    [
        ("vgrpo", ["schedule.reference_reset=kl=0"], r"schedule.reference_reset: kl must be finite and > 0"),
        ("vgrpo", ["schedule.reference_reset=every=0"], r"schedule.reference_reset: every must be >= 1"),
        ("vgrpo", ["schedule.reference_reset=often"], r"schedule.reference_reset takes kl=K and/or every=N"),
        ("vgrpo", ["schedule.reference_reset=every=2", "vgrpo.ref_kl_coef=none"], r"needs vgrpo.ref_kl_coef set"),
        ("fpo", ["schedule.reference_reset=every=2"], r"schedule.reference_reset: fpo has no ref_kl_coef to reset"),
    ],
)
def test_reset_settings_are_checked_naming_the_key(algo, overrides, message, tiny_config):
    with pytest.raises(ValueError, match=message):
        tiny_config(algo, *overrides)


def test_a_reference_that_is_not_a_separate_copy_is_refused():
    model = torch.nn.Linear(4, 4)
    loss = VGRPOLoss(model, ELBOSurrogate(2), ref_model=model, ref_kl_coef=1.0)  # the model itself: no copy
    with pytest.raises(ValueError, match="must be a separate copy"):
        StepControl({"reference_reset": (1.0, "every=2")}, loss, torch.optim.SGD(model.parameters(), lr=0.1))
