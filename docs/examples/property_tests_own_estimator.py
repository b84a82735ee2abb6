"""Property-based tests of your own estimator with the library's test helpers (vgrpo_lib.testing).

Your estimator here: an :class:`vgrpo_lib.ELBOSurrogate` with your own per-pair loss, a velocity loss whose weight
falls off at high noise (``truncated_v_loss``: ``min(1, (1 - t) / 0.2) ||v - v*||^2``). hypothesis draws the inputs
from the strategies of :mod:`vgrpo_lib.testing.strategies` (prompt groups of any sizes, sample batches of any data
shape, estimator configurations of every registered timestep sampler, sharing scope and noise scheme, with your
weighting) and checks properties that must hold for ANY input:

1. pairs are ``(B, K)`` with timesteps in [0, 1], and members of a group share them under ``sharing="group"``;
2. common random numbers: a model's log-ratio to itself is exactly 0;
3. the surrogate is minus a mean of non-negative losses: ``s <= 0``;
4. chunking the ``B * K`` model rows (``chunk_size``) changes nothing;
5. identical members of a group with group-shared pairs get equal surrogates, so zero-sum advantages give a zero
   policy gradient (the reason for group sharing).

Run it as a script (each ``@given`` test runs its examples when called; a failure raises and exits non-zero), or
with pytest (``pytest docs/examples/property_tests_own_estimator.py``). Needs the test extra
(``pip install 'vgrpo-lib[test]'``). About 10 s on one CPU core:

    python docs/examples/property_tests_own_estimator.py
"""

from __future__ import annotations

import torch
from hypothesis import given, settings

from vgrpo_lib import ELBOSurrogate, GroupAdvantage
from vgrpo_lib.diagnostics import policy_gradient
from vgrpo_lib.testing import MLPVelocity, perturb
from vgrpo_lib.testing.strategies import estimator_configs, sample_batches


def truncated_v_loss(v, x, noise, z, t, path, x_pred):
    """Your weighting: the flow-matching loss ``mean_d ||v - v*||^2`` with weight ``min(1, (1 - t) / 0.2)``.
    Arguments as :func:`vgrpo_lib.weighting.v_loss`; ``t`` is ``(B, K)``, the data tensors ``(B, K, *D)``."""
    error = (v - path.velocity(x, noise, t)).square().mean(dim=tuple(range(t.ndim, v.ndim)))
    return ((1 - t) / 0.2).clamp(max=1.0) * error


YOUR_ESTIMATORS = estimator_configs(weightings=[truncated_v_loss])
PROPERTIES = settings(max_examples=20, deadline=None, derandomize=True, database=None)


def model_for(batch) -> MLPVelocity:
    return MLPVelocity(data_shape=batch["sample"].shape[1:], cond_dim=2)


@PROPERTIES
@given(config=YOUR_ESTIMATORS, batch=sample_batches(cond_dim=2))
def test_pairs_have_one_set_per_sample_and_groups_share_them(config, batch):
    estimator = ELBOSurrogate(**config)
    pairs = estimator.sample_pairs(batch["sample"], batch["group"], torch.Generator().manual_seed(0))
    assert pairs.batch_size == (batch.shape[0], config["num_pairs"])
    assert ((pairs["t"] >= 0) & (pairs["t"] <= 1)).all()
    if config["sharing"] == "group":
        for label in torch.unique(batch["group"]):
            members = pairs[batch["group"] == label]
            assert (members["t"] == members["t"][:1]).all() and (members["noise"] == members["noise"][:1]).all()


@PROPERTIES
@given(config=YOUR_ESTIMATORS, batch=sample_batches(cond_dim=2))
def test_log_ratio_to_itself_is_zero_and_the_surrogate_is_not_positive(config, batch):
    estimator, model = ELBOSurrogate(**config), model_for(batch)
    pairs = estimator.sample_pairs(batch["sample"], batch["group"])
    with torch.no_grad():
        s = estimator(model, batch["sample"], batch["cond"], pairs)
        again = estimator(model, batch["sample"], batch["cond"], pairs)
        other = estimator(perturb(model), batch["sample"], batch["cond"], pairs)
    assert s.shape == (batch.shape[0],) and torch.isfinite(s).all()
    assert torch.equal(again - s, torch.zeros_like(s))  # common random numbers: exactly 0
    assert (s <= 0).all() and torch.isfinite(other - s).all()


@PROPERTIES
@given(config=YOUR_ESTIMATORS, batch=sample_batches(cond_dim=2))
def test_chunking_the_model_rows_changes_nothing(config, batch):
    model = model_for(batch)
    whole, chunked = ELBOSurrogate(**config), ELBOSurrogate(**config, chunk_size=3)
    pairs = whole.sample_pairs(batch["sample"], batch["group"])
    with torch.no_grad():
        torch.testing.assert_close(chunked(model, batch["sample"], batch["cond"], pairs),
                                   whole(model, batch["sample"], batch["cond"], pairs))


@PROPERTIES
@given(config=estimator_configs(sharing=["group"], weightings=[truncated_v_loss]), batch=sample_batches(cond_dim=2))
def test_identical_members_sharing_pairs_give_a_zero_gradient(config, batch):
    group = batch["group"]
    first_member = torch.tensor([int((group == label).nonzero()[0]) for label in group])
    sample, cond = batch["sample"][first_member], batch["cond"][first_member]  # each member copies its group's first
    advantage = GroupAdvantage()(torch.arange(len(group), dtype=torch.float32), group)  # zero mean per group
    gradient = policy_gradient(ELBOSurrogate(**config), model_for(batch), sample, cond, group, advantage,
                               torch.Generator().manual_seed(0))
    assert gradient.abs().max() < 1e-5


if __name__ == "__main__":
    for test in (test_pairs_have_one_set_per_sample_and_groups_share_them,
                 test_log_ratio_to_itself_is_zero_and_the_surrogate_is_not_positive,
                 test_chunking_the_model_rows_changes_nothing,
                 test_identical_members_sharing_pairs_give_a_zero_gradient):
        test()  # hypothesis runs the examples; the first failing one raises (shrunk to a minimal input)
        print(f"holds: {test.__name__}")
    print("every property holds")
