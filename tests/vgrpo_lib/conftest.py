"""Shared small models for the vgrpo_lib tests, from the installed test helpers (:mod:`vgrpo_lib.testing`), exposed
as fixtures."""

from __future__ import annotations

import pytest

from vgrpo_lib.testing import MLPVelocity, make_loss_batches
from vgrpo_lib.testing import perturb as perturb_model


@pytest.fixture
def make_model():
    """Factory: ``make_model(data_shape=(4,), cond_dim=0, hidden=16, seed=0, dtype=torch.float32)``."""
    return MLPVelocity


@pytest.fixture
def perturb():
    """``perturb(model, scale=0.05, seed=1)``: a deep copy with every parameter shifted by ``scale * N(0, 1)``."""
    return perturb_model


@pytest.fixture
def batches():
    """Complete batches for the three losses: ``(model, estimator, vgrpo, flow_grpo, nft)``."""
    return make_loss_batches()
