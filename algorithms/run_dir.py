"""A run directory: config, metrics, plots and checkpoints, all written atomically.

    RUN_DIR/config.json            the full TrainConfig
    RUN_DIR/metrics.csv            one row per iteration (training metrics and costs)
    RUN_DIR/eval.csv               one row per evaluation (held-out seeds, CFG-free)
    RUN_DIR/eval.jsonl             the same evaluations with per-prompt accuracy
    RUN_DIR/checkpoints/iter_NNNNNN.pt   policy, optimizer, algorithm state, RNG streams (newest two kept)
    RUN_DIR/reward.png, samples_iter_NNNNNN.png, logs/ (TorchRL logger: TensorBoard when installed, else CSV)

Every file is written to a temporary name in the same folder and renamed into place, so a run killed at any
moment leaves either the old or the new version. Checkpoints hold only tensors and plain Python values and
are read back with ``torch.load(weights_only=True)``; a checkpoint that fails to load falls back to the
previous one with a warning.
"""

from __future__ import annotations

import csv
import io
import json
import os
import warnings
from pathlib import Path

import torch

from integrations.atomic import atomic_write_bytes, atomic_write_text

__all__ = ["RunDir", "atomic_write_bytes", "atomic_write_text", "pyplot", "read_csv", "rows_to_csv", "save_figure"]

CHECKPOINT_PREFIX = "iter_"
KEEP_CHECKPOINTS = 2


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (plots are files, never windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 100) -> None:
    """Write ``fig`` as a PNG atomically and close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    pyplot().close(fig)
    atomic_write_bytes(path, buffer.getvalue())


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


def read_csv(path: Path) -> list[dict]:
    """Rows of a metrics CSV with numbers parsed (empty cells dropped)."""
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return [{k: _number(v) for k, v in row.items() if v != ""} for row in csv.DictReader(handle)]


def _number(text: str):
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


class RunDir:
    """Paths and atomic I/O of one run."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.checkpoints = self.root / "checkpoints"

    @property
    def config_path(self) -> Path:
        return self.root / "config.json"

    def exists(self) -> bool:
        """Whether the directory already holds a run (its ``config.json``)."""
        return self.config_path.exists()

    def write_config(self, config_json: str) -> None:
        """Write ``config.json`` atomically."""
        atomic_write_text(self.config_path, config_json + "\n")

    def read_config(self) -> dict:
        """The saved config as a dict (FileNotFoundError naming the directory when it is not a run)."""
        if not self.config_path.exists():
            raise FileNotFoundError(f"{self.root} is not a run directory: no config.json.")
        return json.loads(self.config_path.read_text())

    def write_rows(self, name: str, rows: list[dict]) -> None:
        """Write ``rows`` as the CSV file ``name`` atomically."""
        atomic_write_text(self.root / name, rows_to_csv(rows))

    def read_rows(self, name: str) -> list[dict]:
        """The rows of the CSV file ``name`` (numbers parsed)."""
        return read_csv(self.root / name)

    def write_jsonl(self, name: str, records: list[dict]) -> None:
        """Write ``records`` as JSON lines to ``name`` atomically."""
        atomic_write_text(self.root / name, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def read_jsonl(self, name: str) -> list[dict]:
        """The records of the JSON-lines file ``name`` (none when it does not exist)."""
        path = self.root / name
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def checkpoint_paths(self) -> list[Path]:
        """Existing checkpoints, oldest first."""
        return sorted(self.checkpoints.glob(f"{CHECKPOINT_PREFIX}*.pt"))

    def save_checkpoint(self, iteration: int, state: dict) -> Path:
        """Write ``state`` as the checkpoint of ``iteration`` atomically; returns its path."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path = self.checkpoints / f"{CHECKPOINT_PREFIX}{iteration:06d}.pt"
        atomic_write_bytes(path, buffer.getvalue())
        for old in self.checkpoint_paths()[:-KEEP_CHECKPOINTS]:
            old.unlink()
        return path

    def load_latest_checkpoint(self) -> dict | None:
        """The newest checkpoint that loads; a broken one is reported and the previous one used."""
        for path in reversed(self.checkpoint_paths()):
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as error:  # a truncated or corrupted file: fall back to the previous one
                warnings.warn(f"Checkpoint {path} could not be loaded ({error}); falling back to an older one.")
                continue
            if not isinstance(state, dict) or "iteration" not in state:
                warnings.warn(f"Checkpoint {path} is not a training checkpoint; falling back to an older one.")
                continue
            return state
        return None
