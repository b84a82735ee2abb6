"""Atomic file writes: write to a temporary file in the target folder, fsync, rename into place, fsync the folder.

A process killed at any moment leaves either the old file or the new one, never a torn one; after the folder's
fsync the rename itself survives a power loss. The new file gets the mode a plain ``open(path, "w")`` would give
it (0666 minus the process's umask). Temporary files are named ``.<name>.<8 random>.vgrpo.tmp``
(:func:`is_temp_name`), so a run directory can find and remove the leftovers of its killed writes and never takes a
user's ``.draft.tmp`` for one.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["TEMP_GLOB", "TEMP_SUFFIX", "atomic_write", "atomic_write_bytes", "atomic_write_text", "fsync_directory",
           "is_temp_name", "plain_file_mode"]

TEMP_SUFFIX = ".vgrpo.tmp"
TEMP_GLOB = f".*{TEMP_SUFFIX}"
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))  # mkstemp's 8 random characters


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is the temporary name of an :func:`atomic_write` (``.<name>.<8 random>.vgrpo.tmp``)."""
    return _TEMP_NAME.fullmatch(name) is not None


def _umask() -> int:
    """The process's umask (read by setting it and putting it back: the only portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def plain_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0666 minus the process's umask (0644 under the usual 022)."""
    return 0o666 & ~_umask()


def fsync_directory(path: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(temporary_path)`` and rename the result to ``path`` (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, plain_file_mode())  # mkstemp made it 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())
