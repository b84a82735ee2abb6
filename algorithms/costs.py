"""What an iteration costs: wall-clock seconds per phase and the process's CPU seconds.

    clock = PhaseClock()
    ...rollout...; clock.mark("rollout")
    ...reward...;  clock.mark("reward")
    clock.seconds()   # {"rollout_s": ..., "reward_s": ..., "iteration_s": ...}

CPU seconds (``time.process_time``) stay meaningful when other jobs share the machine; wall-clock seconds do not.
"""

from __future__ import annotations

import time

__all__ = ["ITERATION_PHASES", "PhaseClock"]

# The metrics columns of a training iteration's phases, in order, as :class:`vgrpo_lib.algorithms.trainer.Trainer` marks them,
# and the whole iteration's.
ITERATION_PHASES = ("rollout_s", "reward_s", "prepare_s", "update_s", "iteration_s")


class PhaseClock:
    """Started at construction; :meth:`mark` ends a phase (each phase runs from the previous mark)."""

    def __init__(self):
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        self.ends: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """End ``phase`` now."""
        self.ends[f"{phase}_s"] = time.perf_counter()

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
