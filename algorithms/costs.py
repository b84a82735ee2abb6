"""What an iteration costs: wall-clock seconds per phase, the process's CPU seconds and, on a GPU, peak memory.

    clock = PhaseClock(device)
    ...rollout...; clock.mark("rollout")
    ...reward...;  clock.mark("reward")
    clock.seconds()       # {"rollout_s": ..., "reward_s": ..., "iteration_s": ...}
    clock.peak_memory()   # {"rollout_peak_gib": ..., "reward_peak_gib": ...} on a CUDA device, {} elsewhere

CPU seconds (``time.process_time``) stay meaningful when other jobs share the machine; wall-clock seconds do not.
A phase's peak memory is ``torch.cuda.max_memory_allocated`` over the phase (the counter is reset at each mark): what
the phase needed at most, tensors held from earlier phases included, the allocator's cache not.
"""

from __future__ import annotations

import time

import torch

__all__ = ["ITERATION_PHASES", "PhaseClock"]

# The metrics columns of a training iteration's phases, in order, as :class:`vgrpo_lib.algorithms.trainer.Trainer` marks them,
# and the whole iteration's.
ITERATION_PHASES = ("rollout_s", "reward_s", "prepare_s", "update_s", "iteration_s")


class PhaseClock:
    """Started at construction; :meth:`mark` ends a phase (each phase runs from the previous mark). ``device``: where
    the model computes; a CUDA device also records each phase's peak memory (:meth:`peak_memory`)."""

    def __init__(self, device: torch.device | str | None = None):
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        self.ends: dict[str, float] = {}
        self.device = None if device is None or torch.device(device).type != "cuda" else torch.device(device)
        self.peaks: dict[str, float] = {}
        if self.device is not None:
            torch.cuda.reset_peak_memory_stats(self.device)

    def mark(self, phase: str) -> None:
        """End ``phase`` now."""
        self.ends[f"{phase}_s"] = time.perf_counter()
        if self.device is not None:
            self.peaks[f"{phase}_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> dict[str, float]:
        """``<phase>_peak_gib`` for each phase in order: the most GPU memory allocated during it, in GiB; ``{}``
        when the device is not a CUDA device."""
        return dict(self.peaks)

    @property
    def elapsed(self) -> float:
        """Wall-clock seconds from the start to the last mark."""
        return list(self.ends.values())[-1] - self.start

    def cpu_seconds(self) -> float:
        """The process's CPU seconds since the start."""
        return time.process_time() - self.cpu_start

    def seconds(self) -> dict[str, float]:
        """``<phase>_s`` for each phase in order, then ``iteration_s`` (:attr:`elapsed`)."""
        marks = [self.start, *self.ends.values()]
        return {phase: end - begin for phase, begin, end in zip(self.ends, marks, marks[1:])} | {"iteration_s": self.elapsed}
