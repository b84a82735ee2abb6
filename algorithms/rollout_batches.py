"""The rollout in micro-batches (``rollout.micro_batch_size``), each scored on its own, in order.

    with MicroBatchScores(decode, score, overlap=True) as scores:
        batch = rollout_in_micro_batches(rollout, cond, group, size=8, then=scores.add)   # rollout(cond[i:i+8], ...)
        reward = scores.result()                                                           # (N,), in row order

Each micro-batch is one call of the algorithm's rollout on its rows, in order, with the trainer's generator: each
draws its own initial noise (and SDE noise, and Flow-GRPO-Fast's window) in turn, so the samples depend on the
micro-batch size (a run is reproduced with the same size) but not on anything else.

Each micro-batch's samples are decoded and scored as one reward call. With ``rollout.overlap_rewards`` the call
runs in a background thread as soon as the micro-batch is decoded, while the next micro-batch rolls out (a served
reward, ``model.reward=http://...``, then scores on its own machine meanwhile); without, the same calls run one
after another once the rollout is done. The rewards are the same either way (same calls, same order), and a
reward's failure is the same error. Without overlap it is raised once the rollout is done, when the rewards are
collected; with overlap at the first micro-batch boundary after the failed call has ended (:meth:`MicroBatchScores.add`
looks at the calls handed over so far before the next micro-batch rolls out), so a reward server that went away
stops the rollout within a micro-batch instead of after all of them. Nothing of the iteration has been written
then: the run resumes from its last checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from tensordict import TensorDict

__all__ = ["MicroBatchScores", "micro_batch_rows", "rollout_in_micro_batches"]


def micro_batch_rows(rows: int, size: int) -> list[slice]:
    """The row ranges of ``rows`` rows in micro-batches of ``size`` (the last may be shorter)."""
    if size < 1:
        raise ValueError(f"micro_batch_rows: size must be >= 1, got {size}.")
    return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]


def rollout_in_micro_batches(rollout: Callable[[object, torch.Tensor], TensorDict], cond, group: torch.Tensor,
                             size: int, then: Callable[[TensorDict, slice], None] | None = None) -> TensorDict:
    """``rollout(cond, group)`` (``group`` ``(N,)``, ``cond`` a Tensor or TensorDict with N rows, or None) run on
    micro-batches of ``size`` rows in order and joined along the batch: a TensorDict ``[N]``. ``then(part, rows)``
    is called after each micro-batch, before the next is rolled out."""
    parts = []
    for rows in micro_batch_rows(group.shape[0], size):
        parts.append(rollout(None if cond is None else cond[rows], group[rows]))
        if then is not None:
            then(parts[-1], rows)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class MicroBatchScores:
    """The rewards of a rollout's micro-batches, in their order.

    Args:
        decode: ``decode(samples) -> images`` (called in the caller's thread).
        score: ``score(images, prompts) -> (n,)`` or ``(n, R)``, one call per micro-batch.
        prompts: the rollout's prompts (N of them), sliced by each micro-batch's rows.
        overlap: score each micro-batch in one background thread as soon as :meth:`add` hands it over; else decode
            and score each in turn at :meth:`result`.

    Use as a context manager: leaving it (also on an error) cancels the calls not started and waits for the running
    one, so no thread outlives the rollout.
    """

    def __init__(self, decode: Callable[[torch.Tensor], torch.Tensor],
                 score: Callable[[torch.Tensor, Sequence], torch.Tensor], prompts: Sequence, overlap: bool):
        self.decode, self.score, self.prompts, self.overlap = decode, score, prompts, overlap
        self._pending: list[Future | tuple[torch.Tensor, Sequence]] = []
        self._failed = False  # a background call raised: the calls queued after it are not made
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="micro-batch-reward") if overlap else None

    def add(self, part: TensorDict, rows: slice) -> None:
        """Hand over the micro-batch ``part`` (its ``"sample"``) of the rollout's rows ``rows``. With overlap, first
        raise the error of a background call that has already failed (the rollout stops at this boundary)."""
        prompts = self.prompts[rows]
        if self.overlap:
            self._raise_finished_failure()
            self._pending.append(self._pool.submit(self._score_unless_failed, self.decode(part["sample"]), prompts))
        else:
            self._pending.append((part["sample"], prompts))

    def _score_unless_failed(self, images: torch.Tensor, prompts: Sequence) -> torch.Tensor | None:
        """``score`` in the background thread, skipped (None) once an earlier call failed: :meth:`result` raises
        that failure, so no reward is asked for past it (as when scoring one micro-batch after another)."""
        if self._failed:
            return None
        try:
            return self.score(images, prompts)
        except BaseException:
            self._failed = True
            raise

    def _raise_finished_failure(self) -> None:
        """Raise the error of the first background call that has ended with one; the calls run one at a time in
        order, so the scan stops at the first call still running or waiting."""
        for future in self._pending:
            if not future.done():
                return
            if future.exception() is not None:
                future.result()

    def result(self) -> torch.Tensor:
        """Every micro-batch's rewards, joined in row order: ``(N,)`` or ``(N, R)``; a reward's error is raised
        here, the first micro-batch's first."""
        scores = [item.result() if isinstance(item, Future) else self.score(self.decode(item[0]), item[1])
                  for item in self._pending]
        return scores[0] if len(scores) == 1 else torch.cat(scores)

    def __enter__(self) -> MicroBatchScores:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
