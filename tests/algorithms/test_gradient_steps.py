"""``optim.max_kl`` (:func:`vgrpo_lib.control.exceeds_kl` reached from the config): the remaining epochs are skipped
once an epoch's mean approx KL exceeds it, and nothing else changes."""

from __future__ import annotations

import pytest
import torch

from vgrpo_lib.algorithms.trainer import Trainer

TWO_STEPS_PER_EPOCH = ["iterations=1", "optim.minibatch_size=none", "optim.minibatches=2"]


@pytest.mark.parametrize("algo", ["vgrpo", "flow_grpo"])
def test_max_kl_stops_after_the_epoch_that_exceeds_it(algo, tiny_config, tmp_path):
    stopped = Trainer(tiny_config(algo, *TWO_STEPS_PER_EPOCH, "optim.epochs=4", "optim.max_kl=1e-12"),
                      tmp_path / "stopped", progress=False)
    stopped.train()
    one_epoch = Trainer(tiny_config(algo, *TWO_STEPS_PER_EPOCH), tmp_path / "one", progress=False)
    one_epoch.train()
    row = stopped.metrics[-1]
    assert row["epochs_run"] == 1 and row["grad_steps"] == 2 and row["approx_kl_k3"] > 1e-12
    for key, value in one_epoch.policy.state_dict().items():  # the same steps as a one-epoch run, nothing more
        torch.testing.assert_close(stopped.policy.state_dict()[key], value, rtol=0, atol=0)

    loose = Trainer(tiny_config(algo, *TWO_STEPS_PER_EPOCH, "optim.epochs=4", "optim.max_kl=1e9"), tmp_path / "loose",
                    progress=False)
    loose.train()
    assert loose.metrics[-1]["epochs_run"] == 4 and loose.metrics[-1]["grad_steps"] == 8


def test_max_kl_is_refused_for_an_algorithm_without_an_importance_ratio(tiny_config):
    with pytest.raises(ValueError, match="optim.max_kl stops on the importance ratio's KL, which diffusion_nft does "
                                         "not have; it is used by vgrpo, flow_grpo"):
        tiny_config("diffusion_nft", "optim.max_kl=0.01")
