"""Input validation shared by the public API: every error names the problem and the argument."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def choose(name: str, value: str, options: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``options``, else raise a ValueError listing them."""
    options = tuple(options)
    if value not in options:
        raise ValueError(f"Unknown {name} {value!r}; expected one of {', '.join(map(repr, options))}.")
    return value


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """Raise a ValueError naming the first offending indices when ``tensor`` holds NaN or inf.

    This forces a device sync; call it on rewards and other inputs, not inside the update's hot path.
    """
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        where = bad.nonzero().tolist()
        shown = ", ".join(str(tuple(i)) if len(i) > 1 else str(i[0]) for i in where[:8])
        more = f" and {len(where) - 8} more" if len(where) > 8 else ""
        raise ValueError(f"{name} contains NaN or inf at index {shown}{more}.")


def check_batch(name: str, tensor: torch.Tensor, batch_size: int, ndim: int | None = None) -> None:
    """Raise a ValueError when ``tensor`` does not have leading dimension ``batch_size`` (and ``ndim`` dims)."""
    if tensor.ndim == 0 or tensor.shape[0] != batch_size:
        raise ValueError(f"{name} must have batch size {batch_size}, got shape {tuple(tensor.shape)}.")
    if ndim is not None and tensor.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(tensor.shape)}.")


def check_positive_int(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    return value


def check_key(td, key, what: str) -> None:
    """Raise a KeyError naming the missing TensorDict entry and what it is for."""
    if key not in td.keys(include_nested=True):
        raise KeyError(f"The batch has no entry {key!r} ({what}); present: {sorted(map(str, td.keys()))}.")
