"""Range rules of scalar settings, each written once and used by the config, the schedules and the losses.

A :class:`Rule` says which values a setting takes (``rule.ok(value)``) and how an error puts it
(``{name} must be {rule.text}``). The same object checks a config key (``setting(0.01, rule=CLIP_RANGE)`` in
:mod:`vgrpo_lib.algorithms.config`), every value of a schedule of that key before a run starts, and each
assignment to a loss's schedulable buffer (``loss.clip_range = 0.02``; see ``_schedulable_buffers`` in
:mod:`vgrpo_lib.losses`).
"""

from __future__ import annotations

from vgrpo_lib.errors import UsageError
import math
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Real
from typing import Any

__all__ = ["AT_LEAST_ONE", "CLIP_RANGE", "FRACTION", "NON_NEGATIVE", "POSITIVE", "SEED", "TIME_SHIFT", "UNIT_INTERVAL", "Rule"]


@dataclass(frozen=True)
class Rule:
    """A range check of a value: ``ok(value)``, described as ``text`` in the error (``must be {text}``)."""

    ok: Callable[[Any], bool]
    text: str

    def check(self, name: str, value: Any) -> Any:
        """Return ``value`` when it is a finite real number (or a pair of them) that obeys the rule; else a
        TypeError (not a number) or a ValueError naming ``name`` and the rule."""
        parts = value if isinstance(value, (tuple, list)) else (value,)
        for part in parts:
            if isinstance(part, bool) or not isinstance(part, Real):
                raise TypeError(f"{name} must be a real number, got {type(part).__name__} {part!r}.")
        if not all(math.isfinite(part) for part in parts):
            raise UsageError(f"{name} must be finite, got {value!r}.")
        if not self.ok(value):
            raise UsageError(f"{name} must be {self.text}, got {value!r}.")
        return value


POSITIVE = Rule(lambda v: v > 0, "> 0")
NON_NEGATIVE = Rule(lambda v: v >= 0, ">= 0")
AT_LEAST_ONE = Rule(lambda v: v >= 1, ">= 1")
UNIT_INTERVAL = Rule(lambda v: 0 <= v <= 1, "in [0, 1]")
FRACTION = Rule(lambda v: 0 < v <= 1, "in (0, 1]")
# The SD3 time shift of a grid: past these bounds float arithmetic breaks the grid (1e-308: 1 + (s - 1) t is 0).
TIME_SHIFT = Rule(lambda v: 1e-3 <= v <= 1e3, "in [1e-3, 1e3]")
# A seed: torch, NumPy and Python take it, with room for the offsets runs add to it (per iteration, per rank).
SEED = Rule(lambda v: 0 <= v < 2**63, "in [0, 2**63)")


def _valid_clip_range(value) -> bool:
    if isinstance(value, (tuple, list)) and len(value) != 2:
        return False
    low, high = value if isinstance(value, (tuple, list)) else (value, value)
    return 0 <= low < 1 and 0 <= high < math.inf


CLIP_RANGE = Rule(_valid_clip_range, "eps or a (low, high) pair with 0 <= low < 1 and high >= 0, finite")
"""A clipped ratio's range: ``eps`` (``[1 - eps, 1 + eps]``) or ``(low, high)`` (``[1 - low, 1 + high]``)."""
