"""``log.backend``: TorchRL's WandbLogger in wandb's offline mode records the run's metrics and its sample grids."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.config import apply_overrides
from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.algorithms.run_logging import resolve_backend
from vgrpo_lib.extras import MissingExtraError
from vgrpo_lib.algorithms.trainer import Trainer


def wandb_history(path: Path) -> list[dict]:
    """The history records (``{key: value}``) of an offline wandb run file ``run-<id>.wandb``.

    The file is W&B's transaction log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then LevelDB's log
    format (blocks of 32768 bytes; a chunk is a 7-byte header crc32 / length / type (1 full, 2 first, 3 middle,
    4 last) and its payload; a block tail under 7 bytes is padding), each record a ``wandb_internal_pb2.Record``
    (see wandb's ``core/pkg/leveldb`` and ``wandb/proto/wandb_internal.proto``).
    """
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, chunks, records = 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        chunks += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            if record.WhichOneof("record_type") == "history":
                records.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                for item in record.history.item})
    return records


def test_wandb_offline_run_holds_the_metrics_and_the_sample_grids(tiny_config, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    for variable in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = Trainer(tiny_config("vgrpo", "iterations=1", "log.backend=wandb", "log.project=tests"),
                      tmp_path / "run", progress=False)
    trainer.train()
    # The run is finished (RunLogger.close), but wandb's service process writes the transaction log on its own
    # schedule (the file sometimes still held only its 7-byte header here under load); stopping the service, as the
    # end of the process does, writes it out before it is read.
    wandb.teardown()

    [run_file] = (tmp_path / "run" / "logs" / "wandb").glob("offline-run-*/run-*.wandb")
    assert run_file.name == f"run-{trainer.run_id}.wandb"  # the run's id: a resume continues the wandb run
    history = wandb_history(run_file)
    [train] = [h for h in history if "train/reward_mean" in h]
    row = RunDir(tmp_path / "run").read_rows("metrics.csv")[0]
    for key in ("reward_mean", "loss_objective", "grad_norm", "nfe_per_sample"):
        assert train[f"train/{key}"] == pytest.approx(row[key], rel=1e-12)
    evaluations = [h for h in history if "eval/accuracy" in h]
    assert [e["eval/accuracy"] for e in evaluations] == pytest.approx([e["accuracy"] for e in trainer.evaluations])

    images = [h for h in history if "eval/samples/_type" in h]
    assert [h["eval/samples/_type"] for h in images] == ["image-file"] * 2  # iteration 0 and 1
    for image, iteration in zip(images, (0, 1)):
        grid = (tmp_path / "run" / f"samples_iter_{iteration:06d}.png").read_bytes()
        assert image["eval/samples/sha256"] == hashlib.sha256(grid).hexdigest()
        assert (run_file.parent / "files" / image["eval/samples/path"]).read_bytes() == grid


def test_a_missing_logger_package_and_a_project_without_wandb_are_refused(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "wandb" else find_spec(name))
    with pytest.raises(MissingExtraError, match=r"^log.backend=wandb needs the 'wandb' extra: pip install 'vgrpo-lib\[wandb\]'"):
        resolve_backend("wandb")
    assert resolve_backend("csv") == "csv"
    config = build_config("vgrpo", None, "testbed", [])
    with pytest.raises(ValueError, match="log.project names a wandb project; it needs log.backend=wandb, got auto"):
        apply_overrides(config, ["log.project=digits"])
    with pytest.raises(ValueError, match="Unknown log.backend 'mlflow'"):
        apply_overrides(config, ["log.backend=mlflow"])
