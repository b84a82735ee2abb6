"""The micro-batch autotuner: the largest micro-batch that fits in the device's memory, found once and recorded.

    result, size = fit_micro_batch(attempt, 64, rewind=undo, what="the update")   # 64 rows, else 32, 16, ... 1

``rollout.micro_batch_size=auto`` and ``optim.micro_batch_size=auto`` run their phase through
:meth:`MicroBatchSizes.run`: the first attempt takes the whole batch (the rollout's samples, the minibatch's rows);
an attempt that raises ``torch.OutOfMemoryError`` is undone (``rewind``: the gradients it accumulated, the
generator's stream) and retried at half the size, down to 1 row. The size that fitted is kept: later attempts
start from it (and halve again should memory grow), it is logged per iteration (``micro_batch_rollout``,
``micro_batch_update``) and saved in every checkpoint, so a resumed run uses the size that made the checkpoint
instead of searching again. A run is reproduced by setting the recorded sizes by hand: the results depend on the
size, never on how it was found.

The prepare phase's forwards (:meth:`~vgrpo_lib.algorithms.base.Algorithm.prepare_forward`: V-GRPO's and FPO's
behaviour surrogates on the K pairs of each sample, once per rollout before the gradient steps) run in micro-batches
of the update's size, under the update's key and record, not a search of their own. They evaluate, without
gradient, the model the update then evaluates with gradient, on the same rows (a row: a sample and its K pairs).
What a forward without gradient holds at n rows (the weights, and one layer's activations at a time) is a part of
what the update holds at n rows at the same moment (the weights, the activations of every layer kept for the
backward, the gradients), so the size that fits the update fits the prepare. The converse does not hold, so under
AUTO the prepare searches only while the update has no size yet (iteration 0, where it runs first): a size the
forward without gradient does not fit, the update does not fit either, so the update's search starts where the
prepare's ended and loses nothing. From then on the prepare runs at the update's size. (Flow-GRPO's and
GRPO-Guard's old log-probabilities and means are recorded by the rollout, DiffusionNFT's old policy is evaluated
in the update: their prepare has no forwards.) The prepare's entries depend on each row alone, so its size changes
them only by float rounding: the one place where a tuned run and the run with its recorded size set by hand may
differ (iteration 0's prepare ran at the size of its own search).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from vgrpo_lib.rules import Rule

__all__ = ["AUTO", "KEYS", "MICRO_BATCH_SIZE", "PHASES", "MicroBatchSizes", "fit_micro_batch"]

AUTO = "auto"
PHASES = ("rollout", "update")
KEYS = {"rollout": "rollout.micro_batch_size", "update": "optim.micro_batch_size"}  # each phase's config key
# A micro-batch key's range: a row count, or AUTO.
MICRO_BATCH_SIZE = Rule(lambda v: v == AUTO or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                        f">= 1, or {AUTO} (the largest that fits in memory)")

T = TypeVar("T")


def _release_cached_memory() -> None:
    """Hand the failed attempt's cached blocks back to the device (a CPU run has none)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def fit_micro_batch(attempt: Callable[[int], T], size: int, *, rewind: Callable[[], None], what: str) -> tuple[T, int]:
    """``(attempt(n), n)`` for the largest ``n`` of ``size``, ``size // 2``, ... 1 whose attempt does not raise
    ``torch.OutOfMemoryError``; ``rewind()`` undoes a failed attempt before the next. An attempt that runs out of
    memory at 1 row raises ``torch.OutOfMemoryError`` naming ``what``. Any other error is not caught."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"fit_micro_batch: size must be an int >= 1, got {size!r}.")
    while True:
        try:
            return attempt(size), size
        except torch.OutOfMemoryError as error:
            if size == 1:
                raise torch.OutOfMemoryError(f"{what} runs out of memory even at a micro-batch of 1 row: {error}") from error
        # Retried outside the handler: the failed attempt's frames, and the tensors they held, are released first.
        rewind()
        _release_cached_memory()
        size //= 2


class MicroBatchSizes:
    """Each phase's micro-batch (``"rollout"``, ``"update"``) as configured: a row count, None (the whole batch at
    once) or :data:`AUTO` (searched with :func:`fit_micro_batch` and recorded in :attr:`tuned`)."""

    def __init__(self, rollout: int | str | None, update: int | str | None):
        self.settings = {"rollout": rollout, "update": update}
        for phase, value in self.settings.items():
            if value is not None and not MICRO_BATCH_SIZE.ok(value):
                raise ValueError(f"MicroBatchSizes: {phase} must be {MICRO_BATCH_SIZE.text} or None, got {value!r}.")
        self.tuned: dict[str, int | None] = {phase: None for phase in PHASES}  # None: not searched yet

    def run(self, phase: str, rows: int, attempt: Callable[[int], T], rewind: Callable[[], None], *,
            step: str | None = None) -> T:
        """``attempt(n)`` with ``n`` the phase's micro-batch for a batch of ``rows`` rows (at most ``rows``): its
        configured size, or under :data:`AUTO` the largest that fits, starting from the size recorded so far.
        ``step``: what runs, when not the phase itself (``"prepare"`` at the update's size), for the error."""
        setting = self.settings[phase]
        if setting != AUTO:
            return attempt(rows if setting is None else min(setting, rows))
        start = rows if self.tuned[phase] is None else min(self.tuned[phase], rows)
        what = f"The {step or phase} ({KEYS[phase]}={AUTO})"
        result, size = fit_micro_batch(attempt, start, rewind=rewind, what=what)
        if self.tuned[phase] is None or size < start:  # a smaller batch that fitted at its own size keeps the record
            self.tuned[phase] = size
        return result

    def metrics(self) -> dict[str, int]:
        """The searched sizes, ``micro_batch_<phase>``, for the metrics row (none for a phase not under AUTO)."""
        return {f"micro_batch_{phase}": size for phase, size in self.tuned.items()
                if self.settings[phase] == AUTO and size is not None}

    def state_dict(self) -> dict[str, int | None]:
        """The recorded sizes (what a checkpoint keeps)."""
        return dict(self.tuned)

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        """Continue from recorded sizes: a resumed run starts where its checkpoint's search ended."""
        self.tuned.update({phase: state[phase] for phase in PHASES if phase in state})
