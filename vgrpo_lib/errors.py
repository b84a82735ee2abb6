"""The error of a value a user chose: an argument, a config key, a name or a file they gave.

:class:`UsageError` is a ``ValueError`` (code that catches ``ValueError`` keeps working); raising it instead of a
plain ``ValueError`` says "the input is wrong, not the program". The ``vgrpo`` command prints a UsageError as one
line and exits with the usage status (2); any other ``ValueError`` is a bug and keeps its traceback (exit 1, see
:mod:`vgrpo_lib.algorithms.errors`). This module imports nothing (every layer may use it).
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A value the user gave is not valid; the message names the argument, key, name or file and what it must be."""
