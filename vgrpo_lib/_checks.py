"""Input validation shared by the public API: every error names the problem and the argument."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from numbers import Real

import torch


def renamed_keywords(**renamed: str) -> Callable[[Callable], Callable]:
    """A decorator: a call that passes an old keyword (``old=new`` in ``renamed``) raises a TypeError naming both,
    instead of Python's bare "unexpected keyword argument" (the changelog's migration table lists them)."""

    def decorate(function: Callable) -> Callable:
        caller = function.__qualname__.removesuffix(".__init__")

        @functools.wraps(function)
        def call(*args, **kwargs):
            for old in sorted(renamed.keys() & kwargs.keys()):
                raise TypeError(f"{caller}() got the old keyword {old}=; it is now {renamed[old]}= (see the "
                                f"changelog's migration table).")
            return function(*args, **kwargs)

        return call

    return decorate


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


def check_real(name: str, value) -> float:
    """Return ``value`` as a float, or raise a TypeError naming ``name`` when it is not a real number."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}.")
    return float(value)


def check_positive(name: str, value, *, allow_inf: bool = False) -> float:
    """Return ``value`` if it is a real number > 0 (finite unless ``allow_inf``), else raise naming ``name``.

    NaN is refused: ``nan <= 0`` is False, so a plain ``if value <= 0`` check lets it through.
    """
    number = check_real(name, value)
    if not (number > 0 and (allow_inf or math.isfinite(number))):
        raise ValueError(f"{name} must be > 0{'' if allow_inf else ' and finite'}, got {value!r}.")
    return number


def check_non_negative(name: str, value) -> float:
    """Return ``value`` if it is a finite real number >= 0, else raise naming ``name``."""
    number = check_real(name, value)
    if not (number >= 0 and math.isfinite(number)):
        raise ValueError(f"{name} must be >= 0 and finite, got {value!r}.")
    return number


def check_tensor(name: str, value) -> torch.Tensor:
    """Raise a TypeError naming ``name`` when ``value`` is not a torch.Tensor."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}.")
    return value


def check_not_empty(name: str, tensor: torch.Tensor) -> None:
    """Raise a ValueError when the batch dimension of ``tensor`` is empty (a mean over it would be NaN)."""
    if tensor.ndim > 0 and tensor.shape[0] == 0:
        raise ValueError(f"{name} is an empty batch (batch size 0, shape {tuple(tensor.shape)}).")


def check_same_device(name: str, tensor: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    """Raise a ValueError when two inputs live on different devices (metadata only: no device sync)."""
    if tensor.device != other.device:
        raise ValueError(f"{name} is on {tensor.device} but {other_name} is on {other.device}; move them to one device.")


SELF_CASTING_FLAGS = ("casts_inputs", "moves_inputs")  # attributes by which a model says it casts its own inputs


def check_model_dtype(model, name: str, tensor: torch.Tensor) -> None:
    """Raise a TypeError naming both dtypes when ``tensor`` (an input of ``model``) is floating and its dtype is not
    that of the model's floating parameters (torch's own error comes from deep inside the forward). Skipped under
    autocast, for a model that is not an ``nn.Module`` or has no floating parameter, and for one that declares
    ``casts_inputs = True`` (it casts its inputs to its own dtype, as the diffusers velocity adapters) or
    ``moves_inputs = True`` (it casts and moves its inputs itself, as the diffusers ``LoRAPolicy``)."""
    if not isinstance(model, torch.nn.Module) or any(getattr(model, flag, False) for flag in SELF_CASTING_FLAGS):
        return
    if not tensor.is_floating_point() or torch.is_autocast_enabled(tensor.device.type):
        return
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    if weight is not None and weight.dtype != tensor.dtype:
        raise TypeError(
            f"dtype mismatch: {name} is {tensor.dtype} but the model's parameters are {weight.dtype}; cast one to "
            f"the other (the inputs with .to({weight.dtype}), or the model with .to({tensor.dtype}))."
        )


def check_key(td, key, what: str) -> None:
    """Raise a KeyError naming the missing TensorDict entry and what it is for."""
    if key not in td.keys(include_nested=True):
        raise KeyError(f"The batch has no entry {key!r} ({what}); present: {sorted(map(str, td.keys()))}.")
