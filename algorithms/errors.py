"""The errors a run reports as one line, and the ``vgrpo`` exit code of each kind.

    0  success
    1  an unexpected error (a bug, an out-of-memory): Python's traceback is kept
    2  usage or configuration: bad arguments or config values (a vgrpo_lib.errors.UsageError; a plain ValueError
       is a bug, exit 1), missing or unreadable model weights, an output path that cannot be one
    3  the run directory refused: in use by another run, not empty, not a run, no or foreign checkpoints; an
       export folder (`vgrpo export --out`) that holds files
    4  a damaged or unreadable file (named, with what is wrong)
    5  the file system refused a write: disk full, read-only, no permission (the file is named)
    6  training failed: the policy diverged (non-finite weights, samples or evaluation) or the reward failed
"""

from __future__ import annotations

import errno

from vgrpo_lib.errors import UsageError  # the usage status (2): defined in the core, every layer raises it

__all__ = [
    "FILESYSTEM_ERRNOS", "UsageError", "RunDirError", "RunDirInUse", "RunDirExists", "DamagedFileError",
    "DivergenceError", "PATH_ERRNOS", "filesystem_message", "path_message",
]

EXIT_USAGE, EXIT_RUN_DIR, EXIT_DAMAGED, EXIT_FILESYSTEM, EXIT_TRAINING = 2, 3, 4, 5, 6

# OSErrors that describe the machine, not a bug: reported as one line naming the file.
FILESYSTEM_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


class RunDirError(Exception):
    """The run directory cannot be used for what was asked (exit code 3)."""


class RunDirInUse(RunDirError):
    """Another live process holds the run directory's lock."""


class RunDirExists(RunDirError, FileExistsError):
    """A new run was asked for in a folder that already holds one."""


class DamagedFileError(ValueError):
    """A run file cannot be read or parsed; the message names the file and the problem (exit code 4)."""


class DivergenceError(FloatingPointError):
    """The policy diverged: non-finite weights, optimizer state, samples or evaluation (exit code 6)."""


# OSErrors of a path the user gave that cannot be one: reported as one line naming it, with the usage status.
PATH_ERRNOS = {errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR}


def path_message(error: OSError) -> str | None:
    """One line for an OSError of a path that cannot be used as given (a name too long for the file system, a
    folder where a file is written, a file where a folder is needed), naming it; None for any other OSError."""
    if error.errno not in PATH_ERRNOS:
        return None
    return f"{error.filename or 'a path'}: {error.strerror or error}"


def filesystem_message(error: OSError) -> str | None:
    """One line for an OSError the file system raised for a machine-level reason (disk full, read-only, no
    permission), naming the file; None for any other OSError."""
    if error.errno not in FILESYSTEM_ERRNOS:
        return None
    name = f" {error.filename}" if error.filename else ""
    return f"cannot write{name}: {error.strerror or error}"
