"""Peak memory per phase in the metrics (issue 32.2): ``PhaseClock`` on a CUDA device records
``torch.cuda.max_memory_allocated`` over each phase and resets the counter at each mark; a CPU run has no such
columns. No GPU here: the CUDA counters are stood in for by a scripted allocator."""

import torch

from vgrpo_lib.algorithms import trainer as trainer_module
from vgrpo_lib.algorithms.costs import PhaseClock
from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.trainer import Trainer
from tests.algorithms.conftest import TINY


class ScriptedAllocator:
    """``max_memory_allocated`` returns the peaks in ``script`` (bytes) one after the other; resets are counted."""

    def __init__(self, monkeypatch, script: list[int]):
        self.script, self.resets = list(script), 0
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.script.pop(0))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)

    def reset(self, device=None) -> None:
        self.resets += 1


def test_each_phase_reports_its_own_peak_on_a_cuda_device(monkeypatch):
    allocator = ScriptedAllocator(monkeypatch, [3 * 2**30, 2**29])
    clock = PhaseClock("cuda:0")
    clock.mark("rollout")
    clock.mark("reward")
    assert clock.peak_memory() == {"rollout_peak_gib": 3.0, "reward_peak_gib": 0.5}
    assert allocator.resets == 3  # at the start and after each phase: a phase's peak is its own
    assert list(clock.seconds()) == ["rollout_s", "reward_s", "iteration_s"]


def test_a_cpu_clock_records_no_memory():
    clock = PhaseClock(torch.device("cpu"))
    clock.mark("rollout")
    assert clock.peak_memory() == {} and PhaseClock().peak_memory() == {}


def test_the_trainer_logs_each_phase_peak(monkeypatch, tmp_path):
    """The trainer's metrics row carries the clock's peaks (here a clock told it runs on CUDA)."""
    ScriptedAllocator(monkeypatch, [2**30 * (i + 1) for i in range(8)])
    monkeypatch.setattr(trainer_module, "PhaseClock", lambda device: PhaseClock("cuda:0"))
    trainer = Trainer(build_config("vgrpo", None, "testbed", TINY + ["iterations=1"]), tmp_path / "run", progress=False)
    row = trainer.step()
    assert [row[f"{phase}_peak_gib"] for phase in ("rollout", "reward", "prepare", "update")] == [1.0, 2.0, 3.0, 4.0]
