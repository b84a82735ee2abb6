"""The comparison knows the peers: every step control of every peer builds a valid config at its official settings."""

from __future__ import annotations

import pytest

from vgrpo_lib.benchmarks.compare import VARIANTS, build

PEERS = ("fpo", "awm", "grpo_guard", "flow_grpo_fast")


@pytest.mark.parametrize("variant", PEERS)
def test_each_peer_is_a_comparison_variant_with_buildable_step_controls(variant):
    controls = VARIANTS[variant].step_controls
    assert set(controls) == {"one_step", "two_epochs", "two_minibatches"}
    for control in controls:
        config = build(variant, "digits8", 100, 1e-3, control, [])
        assert config.algo == variant and config.seed == 100 and config.optim.lr == 1e-3
        assert (config.optim.epochs, config.optim.minibatches) == {"one_step": (1, 1), "two_epochs": (2, 1),
                                                                     "two_minibatches": (1, 2)}[control]
    # The base-policy KL is off for every algorithm in the comparison.
    assert config.flow_grpo.ref_kl_coef is None and config.awm.ref_kl_coef is None
