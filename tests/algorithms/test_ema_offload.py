"""The EMA average in CPU memory (``optim.ema_offload``, issue 32.2): copied to for each update and into the
weights for evaluation instead of kept beside them. On the CPU both placements compute the same numbers, so a run
with the average offloaded equals one without, in every checkpointed stream and evaluation."""

import pytest
import torch
from torch import nn

from vgrpo_lib.algorithms.policies import WeightEMA
from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.algorithms.trainer import Trainer
from tests.algorithms.conftest import TINY


def test_an_offloaded_average_updates_and_swaps_in_like_the_resident_one():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    resident, offloaded = WeightEMA(model.parameters(), 0.9), WeightEMA(model.parameters(), 0.9, offload=True)
    assert all(a.device.type == "cpu" for a in offloaded.average)
    for step in range(1, 4):
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param))
        resident.update(step)
        offloaded.update(step)
    for a, b in zip(resident.average, offloaded.average):
        assert torch.equal(a, b)
    trained = [p.detach().clone() for p in model.parameters()]
    with offloaded.swapped_in():
        assert all(torch.equal(p, a) for p, a in zip(model.parameters(), resident.average))
    assert all(torch.equal(p, t) for p, t in zip(model.parameters(), trained))


def test_a_run_with_the_average_offloaded_equals_one_without(tmp_path):
    runs = {}
    for offload in (False, True):
        config = build_config("vgrpo", None, "testbed", TINY + ["optim.ema_decay=0.9", f"optim.ema_offload={offload}"])
        trainer = Trainer(config, tmp_path / str(offload), progress=False)
        runs[offload] = (trainer.train(), RunDir(tmp_path / str(offload)).load_latest_checkpoint())
    (evaluations, state), (offloaded_evaluations, offloaded_state) = runs[False], runs[True]
    assert [e["reward_mean"] for e in offloaded_evaluations] == [e["reward_mean"] for e in evaluations]
    for a, b in zip(state["ema"]["average"], offloaded_state["ema"]["average"], strict=True):
        assert torch.equal(a, b)
    for key, value in state["policy"].items():
        assert torch.equal(offloaded_state["policy"][key], value), key


def test_offload_without_an_average_is_refused():
    with pytest.raises(ValueError, match="optim.ema_offload places the EMA average, which is off"):
        build_config("vgrpo", None, "testbed", TINY + ["optim.ema_offload=true"])
