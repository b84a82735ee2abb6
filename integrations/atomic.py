"""Atomic file writes: write to a temporary file in the target folder, fsync, rename into place, fsync the folder.

A process killed at any moment leaves either the old file or the new one, never a torn one; after the folder's
fsync the rename itself survives a power loss. The new file gets the mode a plain ``open(path, "w")`` would give
it (0666 minus the process's umask). Temporary files are named ``.<name>.<8 random>.vgrpo.tmp``
(:func:`is_temp_name`), so a run directory can find and remove the leftovers of its killed writes and never takes a
user's ``.draft.tmp`` for one; a long name is shortened in its temporary name, so any name the file system takes
can be written. A write that fails for a machine-level reason (disk full) raises an ``OSError`` naming the file
(:func:`os_error_naming`), even where the writer (``write()``, safetensors) did not name it.
"""

from __future__ import annotations

import errno
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError

__all__ = ["NAME_MAX", "TEMP_GLOB", "TEMP_SUFFIX", "atomic_write", "atomic_write_bytes", "atomic_write_text",
           "check_file_target", "fsync_directory", "is_temp_name", "os_error_naming", "plain_file_mode", "temp_prefix"]

TEMP_SUFFIX = ".vgrpo.tmp"
TEMP_GLOB = f".*{TEMP_SUFFIX}"
NAME_MAX = 255  # bytes in one path component on Linux, macOS and Windows file systems
_SAFETENSORS_OS_ERROR = re.compile(r"\(os error (\d+)\)")
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


def temp_prefix(name: str) -> str:
    """``.<name>.`` cut (at a character boundary) so that the temporary name, with mkstemp's 8 characters and
    :data:`TEMP_SUFFIX`, fits in :data:`NAME_MAX` bytes."""
    room = NAME_MAX - len(f"..12345678{TEMP_SUFFIX}".encode())
    return f".{name.encode()[:room].decode(errors='ignore')}."


def os_error_naming(error: BaseException, path: str | os.PathLike) -> OSError | None:
    """The ``OSError`` naming ``path`` that a failed write of it stands for: an ``OSError`` without a file name (a
    ``write()`` that found the disk full) or a safetensors error wrapping an OS error (``"... (os error 28)"``);
    None for any other error (an ``OSError`` that names its file is kept as it is)."""
    if isinstance(error, OSError):
        return None if error.filename or error.errno is None else OSError(error.errno, error.strerror, str(path))
    found = _SAFETENSORS_OS_ERROR.search(str(error)) if isinstance(error, SafetensorError) else None
    return None if found is None else OSError(int(found[1]), os.strerror(int(found[1])), str(path))


def check_file_target(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path`` when a file can be written there; an ``OSError`` naming it when its name is longer
    than the file system takes (``ENAMETOOLONG``) or it is a folder (``EISDIR``). Writes nothing (a command checks
    its output paths with it before working)."""
    path = Path(path)
    if len(path.name.encode()) > NAME_MAX:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file name", str(path))
    return path


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(temporary_path)`` and rename the result to ``path`` (parent folders are created). A name
    longer than the file system takes (``ENAMETOOLONG``) or a ``path`` that is a folder (``EISDIR``) is an ``OSError``
    naming it, before anything is written."""
    path = check_file_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path.name), suffix=TEMP_SUFFIX)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, plain_file_mode())  # mkstemp made it 0600
        os.replace(tmp, path)
    except BaseException as error:
        if os.path.exists(tmp):
            os.unlink(tmp)
        named = os_error_naming(error, path)
        if named is not None:
            raise named from error
        raise
    fsync_directory(path.parent)
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode())
