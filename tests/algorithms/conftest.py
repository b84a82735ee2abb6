"""Shared fixtures: a tiny, fast testbed configuration on the 8x8 digits."""

from __future__ import annotations

import pytest

from vgrpo_lib.algorithms.presets import build_config

TINY = [
    "task=digits8",
    "iterations=2",
    "prompts_per_iteration=4",
    "group_size=4",
    "rollout.num_steps=6",
    "eval.per_prompt=3",
    "eval.num_steps=6",
    "eval.every=0",
    "checkpoint_every=1",
]


@pytest.fixture
def tiny_config():
    """``tiny_config(algo, *overrides)`` -> a TrainConfig that runs an iteration in about a second."""

    def make(algo: str = "vgrpo", *overrides: str):
        return build_config(algo, None, "testbed", TINY + list(overrides))

    return make


@pytest.fixture
def straight_and_resumed(tiny_config, tmp_path):
    """``straight_and_resumed(algo, overrides, until)`` -> ``(straight, resumed)``: trainers of one tiny config,
    one trained to the end in one go, the other stopped after ``until`` iterations and resumed from its checkpoint
    to the end; asserts that both end on identical policy weights (what an exact resume promises)."""
    import torch

    from vgrpo_lib.algorithms.trainer import Trainer

    def run(algo: str, overrides: list[str], until: int):
        straight = Trainer(tiny_config(algo, *overrides), tmp_path / "straight", progress=False)
        straight.train()
        Trainer(tiny_config(algo, *overrides), tmp_path / "resumed", progress=False).train(until=until)
        resumed = Trainer.resume(tmp_path / "resumed", progress=False)
        resumed.train()
        for a, b in zip(straight.policy.state_dict().values(), resumed.policy.state_dict().values()):
            assert torch.equal(a, b)
        return straight, resumed

    return run


def evaluation_table(text: str) -> dict[str, tuple[float, float]]:
    """``{metric: (base, trained)}`` from ``print_evaluation_table``'s rows."""
    from vgrpo_lib.algorithms.cli import EVALUATION_TABLE_KEYS

    rows = [line.split() for line in text.splitlines()]
    return {row[0]: (float(row[1]), float(row[2])) for row in rows if len(row) == 3 and row[0] in EVALUATION_TABLE_KEYS}
