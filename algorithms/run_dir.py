"""A run directory: config, metrics, plots and checkpoints, all written atomically, used by one run at a time.

    RUN_DIR/.lock                  the run's lock: held (flock) by the live process, which wrote "pid P host H"
    RUN_DIR/config.json            the full TrainConfig, plus the run's ``run_id`` (config.json.gz once compressed:
                                   RunDir.compress_tables; RunDir.stored_config_path is the file read)
    RUN_DIR/metrics.csv            one row per iteration (training metrics and costs)
    RUN_DIR/eval.csv               one row per evaluation (held-out seeds, CFG-free)
    RUN_DIR/eval.jsonl             the same evaluations with per-prompt accuracy
    (RUN_DIR/NAME.gz               the config or a table compressed by RunDir.compress_tables, read back the same
                                   (a resume too); any file kept so by compress_file, e.g. a comparison's
                                   summary.json, reads back through read_stored_text)
    RUN_DIR/checkpoints/iter_NNNNNN.pt    policy, optimizer, algorithm state, RNG streams, the metrics rows and
                                          evaluations so far, run_id (the newest two kept)
    RUN_DIR/checkpoints/iter_NNNNNN.json  its manifest: SHA-256 and size of the .pt, iteration, run_id, and what
                                          made it: the resolved config, its SHA-256, algo, task, library version
    RUN_DIR/reward.png, samples_iter_NNNNNN.png, logs/ (TorchRL logger: log.backend, see vgrpo_lib.algorithms.run_logging)

Every file is written to a temporary name in the same folder and renamed into place, so a run killed at any moment
leaves either the old or the new version; a run removes the temporary files of killed writes when it starts: only
names of its own temporary files (:func:`~vgrpo_lib.integrations.atomic.is_temp_name`), so a user's ``.draft.tmp``
is never deleted. A checkpoint's manifest is written before the checkpoint, and a checkpoint is used only when its
bytes have the manifest's SHA-256 and its run_id is the run's: a damaged or unverifiable one (its bytes, or a
manifest whose run_id, iteration or config is not the checkpoint's) is reported by name and the previous one used;
an intact checkpoint of another run is refused. A resume whose config differs from the one that made the checkpoint
in any key but :data:`RESUME_MAY_CHANGE` is refused naming the keys. Checkpoints hold only tensors and plain Python
values and are read back with ``torch.load(weights_only=True)``.

The lock (:meth:`RunDir.lock`) is an ``fcntl.flock`` on ``.lock``: the kernel releases it when its process dies,
so the lock of a killed run is never in the way (its leftover "pid host" line is reported as stale and replaced).
A run that ends (finished, or stopped by an error it raised) removes its lock file, while still holding it; a
process that takes a lock checks, under the flock, that ``.lock`` is still the file it locked, so a lock file
removed under a waiting process is never held twice. ``.lock`` is never opened through a symlink; one that is a
symlink, not a regular file, or holds anything but an empty file or a "pid P host H" line is refused with
:class:`RunDirError`, untouched.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import socket
import stat
import uuid
import warnings
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy
import torch

from vgrpo_lib import __version__
from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.errors import DamagedFileError, RunDirError, RunDirExists, RunDirInUse
from vgrpo_lib.integrations.atomic import (
    TEMP_GLOB, atomic_write_bytes, atomic_write_text, is_temp_name, os_error_naming,
)
from vgrpo_lib.integrations.figures import pyplot, save_figure

__all__ = [
    "CHECKPOINT_KEYS", "COMPRESSED_SUFFIX", "CONFIG_NAME", "RESUME_MAY_CHANGE", "TABLES", "CompressedTable", "RunDir",
    "atomic_write_bytes", "atomic_write_text", "compress_file", "compressed_path", "config_differences", "made_by",
    "float32_snapped", "new_run_id", "run_environment", "pyplot", "read_csv", "read_stored_text", "rows_to_csv",
    "save_figure", "stored_path", "write_uncompressed_text",
]

TABLES = ("metrics.csv", "eval.csv", "eval.jsonl")
CONFIG_NAME = "config.json"
COMPRESSED_SUFFIX = ".gz"
CHECKPOINT_PREFIX = "iter_"
KEEP_CHECKPOINTS = 2
# What every training checkpoint holds (the trainer's _state; "ema" only with optim.ema_decay): checked on load.
CHECKPOINT_KEYS = ("iteration", "policy", "optimizer", "algorithm", "generator", "rng", "counters")
LOCK_NAME = ".lock"
_LOCK_TEXT = re.compile(r"pid \d+ host \S*\n?")  # what a run writes into its lock file
# The config keys a resume may change (config.json edited between runs): none of them changes what is trained.
# A larger `iterations` continues the run; checkpoints, evaluations (own seeded streams) and the logger backend
# only decide what is recorded when. Every other key must be what made the checkpoint.
RESUME_MAY_CHANGE = ("iterations", "checkpoint_every", "eval.every", "log.backend")
_FLOAT32_MAX = float(numpy.finfo(numpy.float32).max)


def rows_to_csv(rows: list[dict]) -> str:
    """CSV text of ``rows`` with the union of their keys as columns, in first-seen order (missing cells empty)."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def float32_snapped(value):
    """``value`` itself, except a float that is exactly a float32 (a metric a float32 tensor gave, through
    ``.item()``): then the float of the shortest decimal that reads back as that float32 ("0.41451305", not
    "0.4145130515098572": the digits past a float32's precision are the conversion's, and cost a third of a run
    table's compressed size). How the trainer records each metrics row, so the row in memory, in metrics.csv and
    read back from it (a resume, a comparison continued) is the same number. Lossless for the float32
    (``numpy.float32`` of the result is the value) and idempotent; a float64 that is no float32 (a clock reading)
    is kept whole."""
    if not isinstance(value, float) or not abs(value) <= _FLOAT32_MAX:  # not a float, NaN, or out of float32's range
        return value
    single = numpy.float32(value)
    return float(str(single)) if float(single) == value else value


class CompressedTable(NamedTuple):
    """A file :func:`compress_file` compressed (a run's table, a comparison's summary): its ``.gz`` and its size in
    bytes before and after."""

    path: Path
    bytes_before: int
    bytes_after: int


def compressed_path(path: Path) -> Path:
    """Where :func:`compress_file` keeps the file ``path`` (a table, a summary): ``NAME.gz`` beside it."""
    return path.with_name(path.name + COMPRESSED_SUFFIX)


def stored_path(path: Path) -> Path:
    """The file that holds ``path``'s content: ``path`` itself, else its compressed copy (:func:`compressed_path`,
    which need not exist either)."""
    return path if path.exists() else compressed_path(path)


def compress_file(path: Path) -> CompressedTable:
    """Replace the file ``path`` by its gzip copy ``NAME.gz``, which :func:`read_stored_text` (and the table
    readers) read back unchanged. The copy is written atomically, keeps ``path``'s modification time (when it was
    made) and is checked against ``path``'s bytes before ``path`` is removed."""
    data, written = path.read_bytes(), path.stat()
    target = atomic_write_bytes(compressed_path(path), gzip.compress(data, compresslevel=9, mtime=0))
    if gzip.decompress(target.read_bytes()) != data:
        raise RunDirError(f"{target} does not read back as {path}; {path} is kept.")
    os.utime(target, ns=(written.st_atime_ns, written.st_mtime_ns))
    path.unlink()
    return CompressedTable(target, len(data), target.stat().st_size)


def write_uncompressed_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically; its compressed copy, if any, is out of date then and removed."""
    atomic_write_text(path, text)
    compressed_path(path).unlink(missing_ok=True)


def read_stored_text(path: Path) -> str:
    """The text of ``path``, or of its compressed copy (:func:`compress_file`) when ``path`` is not there: how a
    comparison's ``summary.json`` or ``protocol.json`` kept compressed in results/ is read. FileNotFoundError
    naming both when neither exists; :class:`DamagedFileError` naming the file when it is not gzip'd text."""
    return _read_stored(path)[1]


def _read_stored(path: Path) -> tuple[Path, str]:
    """The file ``path``'s text is read from (``path``, else its compressed copy) and that text, as
    :func:`read_stored_text` reads it."""
    found = _read_table_text(path, "text file")
    if found is None:
        raise FileNotFoundError(f"Neither {path} nor its compressed copy {compressed_path(path).name} exists.")
    return found


def _read_table_text(path: Path, kind: str) -> tuple[Path, str] | None:
    """The file a table ``path`` is read from (``path``, else its compressed copy) and its text; None when neither
    exists. Bytes that are not such a file raise :class:`DamagedFileError` naming it (``kind``: e.g. "CSV file")."""
    source = stored_path(path)
    if not source.exists():
        return None
    data = source.read_bytes()
    try:
        if source != path:
            data = gzip.decompress(data)
        return source, data.decode()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as error:
        raise DamagedFileError(f"{source} is not a readable {kind} ({error}).") from error


def read_csv(path: Path, required: tuple[str, ...] = ()) -> list[dict]:
    """Rows of a metrics CSV (or of its compressed copy, :func:`compressed_path`) with numbers parsed (empty cells
    dropped, missing ones None); every cell there must be a number and every row must have one in each ``required``
    column. A file that is not
    such a CSV raises :class:`DamagedFileError` naming it, the line and the column."""
    found = _read_table_text(path, "CSV file")
    if found is None:
        return []
    path, text = found
    try:
        rows = [{k: _number(v) for k, v in row.items() if v != ""}
                for row in csv.DictReader(io.StringIO(text, newline=""), strict=True)]
    except csv.Error as error:
        raise DamagedFileError(f"{path} is not a readable CSV file ({error}).") from error
    for line, row in enumerate(rows, start=2):
        if None in row:
            raise DamagedFileError(f"{path} is damaged: line {line} has more cells than the header.")
        for column in required:
            if not isinstance(row.get(column), (int, float)):
                raise DamagedFileError(f"{path} is damaged: line {line} has no number in column {column!r}.")
        for column, value in row.items():  # None: a cell missing from a row cut short (its record restores it)
            if value is not None and not isinstance(value, (int, float)):
                raise DamagedFileError(f"{path} is damaged: line {line}, column {column!r} holds {value!r}, not a number.")
    return rows


def _numeric(value) -> bool:
    """Whether a JSON value is a number or a mapping / list of them (an evaluation record's values)."""
    if isinstance(value, dict):
        return all(map(_numeric, value.values()))
    if isinstance(value, list):
        return all(map(_numeric, value))
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(text: str | None):
    if text is None:  # a short row: DictReader fills the missing cells with None
        return text
    try:
        value = float(text)
    except (TypeError, ValueError):
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _read_json(path: Path, what: str):
    """``path`` parsed as JSON (read from its compressed copy where ``path`` is absent: :func:`read_stored_text`);
    :class:`DamagedFileError` naming the file read and the problem otherwise."""
    source, text = _read_stored(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DamagedFileError(f"{source} ({what}) is not valid JSON: {error}.") from error


def _flat(config: dict, prefix: str = "") -> dict:
    """``{"section.key": value}`` of a nested config dict."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


def config_differences(recorded: dict, current: dict) -> list[str]:
    """The keys (``section.key``) whose values differ between two configs (dicts as ``config.json`` holds them),
    except :data:`RESUME_MAY_CHANGE`, each as "key (recorded -> current)", "key (added)" or "key (dropped)"; a
    section one of them lacks (another algorithm's) is named once."""
    old, new = _flat(recorded), _flat(current)
    differences = []
    for key in sorted(old.keys() | new.keys()):
        if key in RESUME_MAY_CHANGE or old.get(key) == new.get(key):
            continue
        if key in old and key in new:
            differences.append(f"{key} ({old[key]!r} -> {new[key]!r})")
        else:  # a key of a section one config lacks is named by its section, once
            section = key.split(".")[0]
            whole = section if section not in (recorded if key in new else current) else key
            entry = f"{whole} ({'dropped' if key in old else 'added'})"
            if entry not in differences:
                differences.append(entry)
    return differences


def made_by(config: TrainConfig) -> dict:
    """What a checkpoint's manifest records of the run that made it: the resolved config, its SHA-256, the
    algorithm, the task, the library version and :func:`run_environment`."""
    text = config.to_json()
    return {"config": json.loads(text), "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "algo": config.algo, "task": config.task, "library_version": __version__,
            "environment": run_environment()}


def run_environment() -> dict:
    """What a bitwise resume depends on beyond the config (device and precision are config keys): torch's thread
    count, which changes the order of its reductions, and the versions of the libraries that compute."""
    import platform

    import tensordict
    import torchrl

    return {"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "tensordict": tensordict.__version__, "torchrl": torchrl.__version__, "python": platform.python_version()}


def new_run_id() -> str:
    """A random id that tells this run's files from another run's (from ``os.urandom``: no RNG stream is used)."""
    return uuid.uuid4().hex


class RunDir:
    """Paths, lock and atomic I/O of one run."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"
        self._lock_handle = None
        self._lock_file_is_ours = False  # whether unlock() removes .lock: made by this or a killed run

    @property
    def config_path(self) -> Path:
        """Where the run writes its config: ``config.json``."""
        return self.root / CONFIG_NAME

    @property
    def stored_config_path(self) -> Path:
        """The file the run's config is read from: ``config.json``, else its compressed copy ``config.json.gz``
        (:meth:`compress_tables`; :func:`stored_path`: it need not exist either). Its modification time is when the
        run started (:func:`compress_file` keeps it)."""
        return stored_path(self.config_path)

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    def exists(self) -> bool:
        """Whether the directory already holds a run (its ``config.json``, or ``config.json.gz``)."""
        return self.stored_config_path.exists()

    # -- who may use the folder --------------------------------------------------------------------------

    def lock_holder(self) -> str | None:
        """"pid P host H" of the live process holding the lock, or None when no process holds it (nothing is
        written: the lock file is only opened for reading)."""
        try:
            handle = self._open_lock_file(os.O_RDONLY)
        except FileNotFoundError:
            return None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._lock_text(handle) or "a process that has not written its pid yet"
            fcntl.flock(handle, fcntl.LOCK_UN)
            self._lock_text(handle)  # a file that is not a run's lock is refused now, before anything is written
        return None

    def _open_lock_file(self, flags: int):
        """``.lock`` opened (binary) with ``flags``, never through a symlink; :class:`RunDirError` when it is a
        symlink or not a regular file (FileNotFoundError when it does not exist)."""
        try:
            fd = os.open(self.lock_path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise
        except OSError as error:  # ELOOP: a symlink; EISDIR: a directory
            raise self._not_a_lock_error(os.strerror(error.errno)) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self._not_a_lock_error("not a regular file")
        return os.fdopen(fd, "r+b" if flags & os.O_RDWR else "rb")

    def _not_a_lock_error(self, what: str) -> RunDirError:
        return RunDirError(f"{self.lock_path} is not a run's lock file ({what}); it is left untouched: remove it "
                           f"if it is yours to remove, or choose another --out.")

    def _lock_text(self, handle) -> str:
        """The "pid P host H" line of an open lock file ("" when empty); :class:`RunDirError` for anything else."""
        handle.seek(0)
        data = handle.read(4096)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = None
        if text is not None and (text == "" or _LOCK_TEXT.fullmatch(text)):
            return text.strip()
        raise self._not_a_lock_error(f"it holds {len(data)}{'+' if len(data) == 4096 else ''} bytes that are not "
                                     f"'pid P host H'")

    def _in_use_error(self, holder: str) -> RunDirInUse:
        return RunDirInUse(f"{self.root} is in use by another run ({holder}, lock file {self.lock_path}); "
                           f"wait for it to finish or choose another --out.")

    def refuse_unless_fresh(self) -> None:
        """Raise unless a new run may start in ``root``: it must not exist, or be empty (the lock file and the
        temporary files of killed writes aside). Writes nothing."""
        if not self.root.exists():
            return
        if not self.root.is_dir():
            raise RunDirError(f"--out {self.root} exists and is not a folder.")
        holder = None if self._lock_handle is not None else self.lock_holder()  # not us
        if holder is not None:
            raise self._in_use_error(holder)
        if self.exists():
            raise RunDirExists(f"{self.root} already holds a run; resume it with --resume or choose another --out.")
        found = sorted(p.name + ("/" if p.is_dir() else "") for p in self.root.iterdir() if not self._ours(p))
        if found:
            shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
            raise RunDirError(f"{self.root} is not empty and is not a run directory (it holds {shown}); "
                              f"choose a new or empty folder for --out.")

    def _ours(self, path: Path) -> bool:
        """The lock file, and temporary files of killed writes: what a run killed before its config leaves."""
        return path.name == LOCK_NAME or is_temp_name(path.name)

    def lock(self) -> None:
        """Take the run's exclusive lock for this process (until :meth:`unlock` or the process's death), writing
        "pid P host H" into it; another live holder makes this raise :class:`RunDirInUse` naming it."""
        if self._lock_handle is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        handle, created = self._open_locked()
        try:
            stale = self._lock_text(handle)  # anything but a run's lock line: refused, untouched
        except RunDirError:
            handle.close()
            raise
        # An empty .lock that this process did not make may be anyone's file: left in place at the end.
        self._lock_file_is_ours = created or stale.startswith("pid ")
        if stale:
            warnings.warn(f"{self.lock_path}: the previous holder ({stale}) is gone without releasing it "
                          f"(killed?); taking it over.")
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()} host {socket.gethostname()}\n".encode())
            handle.flush()
        except OSError as error:  # a full disk: the lock is given up (removed when this call made it), named
            with contextlib.suppress(OSError):
                handle.close()  # its unwritten line cannot be flushed either
            if created:
                self.lock_path.unlink(missing_ok=True)
            raise os_error_naming(error, self.lock_path) or error from error
        self._lock_handle = handle

    def _open_locked(self):
        """``.lock`` opened (never through a symlink) and exclusively flocked, and whether this call created it.
        Retried when the file was removed or replaced between the open and the flock (its holder's
        :meth:`unlock`)."""
        while True:
            try:
                handle = os.fdopen(os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666),
                                   "r+b")
                created = True
            except FileExistsError:  # also a symlink, which O_EXCL never follows
                try:
                    handle, created = self._open_lock_file(os.O_RDWR), False
                except FileNotFoundError:  # removed since: try again
                    continue
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    holder = self._lock_text(handle) or "a process that has not written its pid yet"
                finally:
                    handle.close()
                raise self._in_use_error(holder) from None
            if self._is_lock_file(handle):
                return handle, created
            handle.close()  # we locked a removed file: the folder's .lock is another (or none)

    def _is_lock_file(self, handle) -> bool:
        """Whether ``handle`` is the file at ``.lock`` now (not one removed or replaced since it was opened)."""
        try:
            return os.path.samestat(os.fstat(handle.fileno()), os.stat(self.lock_path))
        except FileNotFoundError:
            return False

    def unlock(self) -> None:
        """Release the lock and remove its file (when made by this run or a killed one, and still the folder's
        ``.lock``; otherwise it is left empty: a later run finds no stale holder)."""
        if self._lock_handle is None:
            return
        if self._lock_file_is_ours and self._is_lock_file(self._lock_handle):
            self.lock_path.unlink()  # under the flock: a process waiting on this file sees it gone and retries
        else:
            self._lock_handle.truncate(0)
            self._lock_handle.flush()
        fcntl.flock(self._lock_handle, fcntl.LOCK_UN)
        self._lock_handle.close()
        self._lock_handle = None

    def take(self, fresh: bool) -> None:
        """Take the lock for a run (a new one, ``fresh``, checks again under the lock that the folder is fresh) and
        remove the temporary files of killed writes; released again if anything fails."""
        self.lock()
        try:
            if fresh:
                self.refuse_unless_fresh()
            self.remove_leftovers()
        except BaseException:
            self.unlock()
            raise

    def remove_leftovers(self) -> list[Path]:
        """Delete the temporary files of killed writes and manifests without their checkpoint (call under the
        lock); returns what was removed."""
        leftovers = [path for path in [*self.root.glob(TEMP_GLOB), *self.checkpoints.glob(TEMP_GLOB)]
                     if is_temp_name(path.name) and path.is_file() and not path.is_symlink()]
        leftovers += [m for m in self.checkpoints.glob(f"{CHECKPOINT_PREFIX}*.json") if not m.with_suffix(".pt").exists()]
        for path in leftovers:
            path.unlink(missing_ok=True)
        return leftovers

    # -- config and tables -------------------------------------------------------------------------------

    def write_config(self, config_json: str, run_id: str) -> None:
        """Write ``config.json`` atomically: the run's config (JSON text) with its ``run_id`` added; a compressed
        copy ``config.json.gz`` (a run restarted from iteration 0) is out of date then and removed."""
        data = json.loads(config_json) | {"run_id": run_id}
        write_uncompressed_text(self.config_path, json.dumps(data, indent=2, sort_keys=True) + "\n")

    def read_config(self) -> dict:
        """The saved TrainConfig as a dict (without the run id: see :meth:`run_id`)."""
        config = dict(self._config_file())
        config.pop("run_id", None)
        return config

    def train_config(self) -> TrainConfig:
        """The saved config as a :class:`~vgrpo_lib.algorithms.config.TrainConfig`; a ``DamagedFileError`` naming the file
        when it does not make one."""
        try:
            return TrainConfig.from_dict(self.read_config())
        except (TypeError, ValueError) as error:
            raise DamagedFileError(f"{self.stored_config_path} is not a valid run config: {error}") from error

    def run_id(self) -> str:
        """The run id stored in ``config.json`` (or ``config.json.gz``); a ``DamagedFileError`` naming the file when it
        has none."""
        run_id = self._config_file().get("run_id")
        if not isinstance(run_id, str):
            raise DamagedFileError(f"{self.stored_config_path} has no run_id (written by an older vgrpo-lib, or "
                                   f"edited): its checkpoints cannot be told from another run's.")
        return run_id

    def _config_file(self) -> dict:
        """The stored config (``config.json``, else ``config.json.gz``) as a dict; :class:`DamagedFileError` naming the
        file read when it is not gzip'd text, JSON or an object."""
        if not self.exists():
            if self.root.is_dir() and all(map(self._ours, self.root.iterdir())):
                raise RunDirError(f"{self.root} holds no run yet (no config.json: a run stopped before writing it): "
                                  f"start it again with the same command without --resume.")
            raise RunDirError(f"{self.root} is not a run directory: no config.json.")
        data = _read_json(self.config_path, "the run's config")
        if not isinstance(data, dict):
            raise DamagedFileError(f"{self.stored_config_path} is damaged: it holds a JSON {type(data).__name__}, "
                                   f"not an object.")
        return data

    def write_rows(self, name: str, rows: list[dict]) -> None:
        """Write ``rows`` as the CSV file ``name`` atomically."""
        self._write_table(name, rows_to_csv(rows))

    def read_rows(self, name: str) -> list[dict]:
        """The rows of a run table (each with a numeric ``iteration``)."""
        return read_csv(self.root / name, required=("iteration",))

    def write_jsonl(self, name: str, records: list[dict]) -> None:
        """Write ``records`` as JSON lines to ``name`` atomically."""
        self._write_table(name, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def _write_table(self, name: str, text: str) -> None:
        """Write a table atomically; its compressed copy, if any, is out of date then and removed."""
        write_uncompressed_text(self.root / name, text)

    def read_jsonl(self, name: str) -> list[dict]:
        """The records of a JSON-lines table (each an object with an integer ``iteration`` whose every value is a number
    or a mapping / list of numbers); a :class:`DamagedFileError` naming the file, the line and the key otherwise."""
        found = _read_table_text(self.root / name, "text file")
        if found is None:
            return []
        path, text = found
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DamagedFileError(f"{path} is damaged: line {number} is not valid JSON ({error}).") from error
            if not isinstance(record, dict) or not isinstance(record.get("iteration"), int):
                raise DamagedFileError(f"{path} is damaged: line {number} is not a record with an integer iteration.")
            wrong = next((key for key, value in record.items() if not _numeric(value)), None)
            if wrong is not None:
                raise DamagedFileError(f"{path} is damaged: line {number}, {wrong!r} holds {record[wrong]!r}, not a "
                                       f"number.")
            records.append(record)
        return records

    def compress_tables(self) -> list[CompressedTable]:
        """Replace the run's config (``config.json``) and tables (:data:`TABLES`) by gzip copies ``NAME.gz`` that
        every reader here reads back unchanged (a resume as well), to keep finished runs (as results/ does) at about
        35-45% of the size (:func:`compress_file`: each copy keeps the file's modification time and is checked
        before the file is removed; a file already compressed is left as it is); a run in use by a live process is
        refused (under its lock); a file written again later (a resumed run's tables, the config of a run restarted
        from iteration 0) replaces its copy."""
        self.lock()
        try:
            return [compress_file(self.root / name) for name in (CONFIG_NAME, *TABLES) if (self.root / name).exists()]
        finally:
            self.unlock()

    # -- checkpoints -------------------------------------------------------------------------------------

    def checkpoint_paths(self) -> list[Path]:
        """Existing checkpoints, oldest first: ordered by their iteration, not as text (``iter_1000000.pt`` is newer
        than ``iter_999999.pt``); a name that is not ``iter_<digits>.pt`` is not a checkpoint. A ``checkpoints``
        that is not a folder is a :class:`RunDirError`."""
        if self.checkpoints.exists() and not self.checkpoints.is_dir():
            raise RunDirError(f"{self.checkpoints} is not a folder (a file took its place?): move it away to resume "
                              f"from iteration 0, or put the run's checkpoints folder back.")
        found = [(path.stem[len(CHECKPOINT_PREFIX):], path) for path in self.checkpoints.glob(f"{CHECKPOINT_PREFIX}*.pt")]
        return [path for _, path in sorted((int(n), p) for n, p in found if n.isascii() and n.isdigit())]

    def save_checkpoint(self, iteration: int, state: dict, run_id: str, config: TrainConfig | None = None) -> Path:
        """Write ``state`` (with ``run_id``) as checkpoint ``iteration``: its manifest first (with :func:`made_by`
        ``config``, which a resume checks), then the checkpoint, then the checkpoints beyond the newest
        ``KEEP_CHECKPOINTS`` are deleted."""
        buffer = io.BytesIO()
        torch.save({**state, "run_id": run_id}, buffer)
        data = buffer.getvalue()
        path = self.checkpoints / f"{CHECKPOINT_PREFIX}{iteration:06d}.pt"
        manifest = {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                    "iteration": iteration, "run_id": run_id, **({} if config is None else made_by(config))}
        atomic_write_text(path.with_suffix(".json"), json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        atomic_write_bytes(path, data)
        for old in self.checkpoint_paths()[:-KEEP_CHECKPOINTS]:
            old.unlink()
            old.with_suffix(".json").unlink(missing_ok=True)
        return path

    def load_latest_checkpoint(self, run_id: str | None = None) -> dict | None:
        """The newest usable checkpoint (see :meth:`newest_checkpoint`) loaded, or None when there is none."""
        run_id = self.run_id() if run_id is None else run_id
        path = self.newest_checkpoint(run_id)
        return None if path is None else self.load_checkpoint(path, run_id)

    def newest_checkpoint(self, run_id: str) -> Path | None:
        """The newest checkpoint that is intact (the SHA-256 of its manifest) and loads; a damaged one is reported
        by name and the previous one used. None when there is no checkpoint file at all; :class:`RunDirError`
        when there are some and none is usable, or when one belongs to another run than ``run_id``."""
        problems = []
        for path in reversed(self.checkpoint_paths()):
            try:
                self.load_checkpoint(path, run_id)
                return path
            except DamagedFileError as error:
                warnings.warn(f"Checkpoint {path} could not be loaded: {error}; falling back to an older one.")
                problems.append(f"{path.name}: {error}")
        if problems:
            raise RunDirError(f"{self.checkpoints} has no usable checkpoint ({'; '.join(problems)}).")
        return None

    def check_resume_config(self, path: Path, config: TrainConfig) -> None:
        """Raise :class:`RunDirError` naming the keys when ``config`` (the stored config now) differs from the config
        that made checkpoint ``path`` in any key but :data:`RESUME_MAY_CHANGE`, or asks for fewer iterations than
        it has; warn when another library version made it, or when its manifest records no config (older)."""
        manifest = _read_json(path.with_suffix(".json"), "a checkpoint manifest")
        if not isinstance(manifest.get("config"), dict):
            warnings.warn(f"{path.with_suffix('.json')} records no config (written by an older vgrpo-lib): "
                          f"{self.stored_config_path} cannot be checked against it.")
            return
        changed = config_differences(manifest["config"], json.loads(config.to_json()))
        if changed:
            raise RunDirError(f"{self.stored_config_path} differs from the config that made {path} in "
                              f"{', '.join(changed)}: a resume continues the same run, and only "
                              f"{', '.join(RESUME_MAY_CHANGE)} may change; put the keys back or start a new run "
                              f"in another --out.")
        if config.iterations < manifest["iteration"]:
            raise RunDirError(f"{self.stored_config_path} asks for iterations={config.iterations}, but {path} is "
                              f"already at iteration {manifest['iteration']}; a resume may only raise iterations.")
        if manifest.get("library_version") != __version__:
            warnings.warn(f"{path} was made by vgrpo-lib {manifest.get('library_version')}, this is {__version__}: "
                          f"the resumed run may not continue bitwise.")
        recorded, now = manifest.get("environment"), run_environment()
        if isinstance(recorded, dict) and recorded != now:
            changed = ", ".join(f"{key} {recorded.get(key)} -> {value}" for key, value in now.items()
                                if recorded.get(key) != value)
            warnings.warn(f"{path} was made with {changed}: the resumed run may not continue bitwise (the same "
                          f"OMP_NUM_THREADS and cores, e.g. taskset, restore the thread count).")

    def load_checkpoint(self, path: Path, run_id: str) -> dict:
        """Checkpoint ``path`` verified against its manifest and ``run_id`` (:class:`DamagedFileError` or
        :class:`RunDirError` saying what is wrong)."""
        manifest_path = path.with_suffix(".json")
        if not manifest_path.exists():
            raise DamagedFileError(f"its manifest {manifest_path.name} is missing, so it cannot be verified")
        manifest = _read_json(manifest_path, "a checkpoint manifest")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("sha256"), str):
            raise DamagedFileError(f"its manifest {manifest_path.name} is damaged")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise DamagedFileError(f"its SHA-256 is not the one in {manifest_path.name} ({len(data)} bytes, "
                                   f"{manifest.get('bytes')} written): the file is damaged")
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # intact bytes that torch cannot read (not a checkpoint of this format)
            raise DamagedFileError(f"torch cannot read it ({type(error).__name__}: {error})") from error
        if not isinstance(state, dict) or "iteration" not in state:
            raise DamagedFileError("it is not a training checkpoint")
        missing = [key for key in CHECKPOINT_KEYS if key not in state]
        if missing:
            raise DamagedFileError(f"it is not a complete training checkpoint: it has no {', '.join(missing)}")
        if state.get("run_id") == manifest.get("run_id") != run_id:  # intact, and of another run
            raise RunDirError(f"Checkpoint {path} belongs to run {manifest['run_id']}, not to this folder's run "
                              f"{run_id} ({self.stored_config_path.name}): the folder mixes two runs; refusing to "
                              f"resume it.")
        if state.get("run_id") != run_id:
            raise DamagedFileError("it is not a training checkpoint of this run")
        config = manifest.get("config")
        config_intact = config is None or (isinstance(config, dict) and manifest.get("config_sha256") == hashlib.sha256(
            json.dumps(config, indent=2, sort_keys=True).encode()).hexdigest())
        if manifest.get("run_id") != run_id or manifest.get("iteration") != state["iteration"] or not config_intact:
            raise DamagedFileError(f"its manifest {manifest_path.name} is damaged (its run_id, iteration or config "
                                   f"is not what the checkpoint holds)")
        return state
