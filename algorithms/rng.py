"""Every global random stream a run touches, saved, restored and isolated.

Training draws from the trainer's own generator, but user code (a reward, an augmentation) may draw from the
global torch, CUDA, NumPy or Python streams. A checkpoint stores all of them (:func:`rng_state`), so a resumed run
continues every stream where the uninterrupted run was; evaluation runs in :func:`isolated_rng`, so it neither
consumes the training streams nor depends on when it happens (its draws depend only on ``eval.seed``).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

__all__ = ["isolated_rng", "rng_state", "seed_everything", "set_rng_state"]


def seed_everything(seed: int) -> None:
    """Seed the global torch (and CUDA), NumPy and Python streams."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def rng_state() -> dict:
    """The global streams as tensors and plain values (loadable with ``torch.load(weights_only=True)``)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    version, python_state, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "python": [version, list(python_state), gauss_next],
    }


def set_rng_state(state: dict) -> None:
    """Restore the streams saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    version, python_state, gauss_next = state["python"]
    random.setstate((version, tuple(python_state), gauss_next))


@contextlib.contextmanager
def isolated_rng(seed: int | None = None) -> Iterator[None]:
    """Run the block on its own global streams (seeded with ``seed`` when given) and restore the caller's after."""
    saved = rng_state()
    if seed is not None:
        seed_everything(seed)
    try:
        yield
    finally:
        set_rng_state(saved)
