"""Adversarial trials: what a careless or hostile user does to a run, each through the real ``vgrpo`` command.

The companion of :mod:`vgrpo_lib.benchmarks.reliability` (random kills) for the other classes of the reliability
issue: a ``config.json`` edited before ``--resume``, user files in ``--out``, damaged manifests and files, a full
disk under every command that writes, and bad input. Each trial prepares a folder (from one finished tiny run,
copied), runs one ``vgrpo`` command in a fresh process and checks three things: the exit status is the one its
class promises, an expected failure is one line (``vgrpo COMMAND: error: ...``, no traceback) holding what it
must name, and the trial's own invariant (a user's file untouched, nothing half-written left, the run resumed).

The full-disk class needs a small file system to fill: a 16 MB tmpfs mounted under the work folder, which needs
root; without it those trials are reported as not run, with the reason.

    python -m vgrpo_lib.benchmarks.adversarial [--json OUT.json] [--only CLASS]
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text, write_uncompressed_text
from vgrpo_lib.benchmarks.reliability import REPO, WAIT_S

__all__ = ["BASE_ARGS", "Trial", "TRIALS", "TrialFolder", "edit_config", "fill", "full_disk", "run_trial", "run_trials", "main"]

# The finished run every trial copies: the tiny testbed configuration of the tests (8x8 digits, 2 iterations).
BASE_ARGS = ["task=digits8", "iterations=2", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=6",
             "eval.per_prompt=3", "eval.num_steps=6", "eval.every=0", "checkpoint_every=1"]


@dataclass
class TrialFolder:
    """Where a trial runs: ``work`` (its own folder), ``base`` (the finished run, read-only) and ``disk`` (a full
    file system, or None)."""

    work: Path
    base: Path
    disk: Path | None

    def run_copy(self, where: Path | None = None) -> Path:
        """A copy of the finished run (in ``where``, default the trial's folder)."""
        return Path(shutil.copytree(self.base, (where or self.work) / "run", symlinks=True))


@dataclass(frozen=True)
class Trial:
    """One adversarial trial: ``prepare(folder)`` sets it up and returns the ``vgrpo`` arguments and a check of
    the invariant afterwards (``() -> list of what broke``); ``exit_code`` and ``named`` (substrings of the error
    line) are what the command must answer."""

    name: str
    kind: str
    prepare: Callable[[TrialFolder], tuple[list[str], Callable[[], list[str]]]]
    exit_code: int
    named: tuple[str, ...] = ()


def edit_config(run: Path, drop: tuple[str, ...] = (), **changes) -> None:
    """Edit ``run/config.json`` as a user would: drop the top-level keys ``drop``, set each dotted key of ``changes``
    (a compressed run's ``config.json.gz`` is read, and replaced by the edited ``config.json``)."""
    path = RunDir(run).config_path
    config = {key: value for key, value in json.loads(read_stored_text(path)).items() if key not in drop}
    for key, value in changes.items():
        *sections, name = key.split(".")
        target = config
        for section in sections:
            target = target[section]
        target[name] = value
    write_uncompressed_text(path, json.dumps(config))


def _config_edit(drop: tuple[str, ...] = (), **changes):
    """A resume after ``config.json`` was edited: refused with nothing written, or (a key that may change, a
    larger ``iterations``) continued to the new end."""
    def prepare(folder: TrialFolder):
        run = folder.run_copy()
        edit_config(run, drop, **changes)
        if changes.get("iterations", 0) > 2:
            return ["train", "--out", str(run), "--resume"], lambda: _resumed_to(run, changes["iterations"])
        return ["train", "--out", str(run), "--resume"], _unchanged(run / "checkpoints", *(run / "checkpoints").iterdir())

    return prepare


def _unchanged(*paths: Path) -> Callable[[], list[str]]:
    """A check that each path (a file, a symlink or a folder) is as it was."""
    def state(path: Path):
        return (path.is_symlink(), os.readlink(path) if path.is_symlink() else
                sorted(p.name for p in path.iterdir()) if path.is_dir() else path.read_bytes() if path.exists() else None)

    before = [state(path) for path in paths]
    return lambda: [f"{path} changed" for path, was in zip(paths, before) if state(path) != was]


def _fresh_out_holding(make: Callable[[Path, Path], None]):
    def prepare(folder: TrialFolder):
        out, precious = folder.work / "out", folder.work / "precious.txt"
        out.mkdir()
        precious.write_text("a user's file\n")
        make(out, precious)
        return (["train", "--algo", "vgrpo", "--out", str(out), *BASE_ARGS],
                _unchanged(precious, *sorted(out.iterdir())))

    return prepare


def _damaged_manifest(damage: Callable[[dict], None]):
    def prepare(folder: TrialFolder):
        run = folder.run_copy()
        edit_config(run, iterations=3)
        manifest = sorted((run / "checkpoints").glob("*.json"))[-1]
        data = json.loads(manifest.read_text())
        damage(data)
        manifest.write_text(json.dumps(data))
        return ["train", "--out", str(run), "--resume"], lambda: _resumed_to(run, 3)

    return prepare


def _resumed_to(run: Path, iteration: int) -> list[str]:
    newest = sorted((run / "checkpoints").glob("iter_*.pt"))
    return [] if newest and newest[-1].name == f"iter_{iteration:06d}.pt" else [f"no checkpoint of iteration {iteration}"]


def _flip_run_id(manifest: dict) -> None:
    manifest["run_id"] = manifest["run_id"][:-1] + ("0" if manifest["run_id"][-1] != "0" else "1")


def _checkpoint_without(key: str):
    def prepare(folder: TrialFolder):
        import torch

        run = folder.run_copy()
        edit_config(run, iterations=3)
        rundir = RunDir(run)
        state = torch.load(rundir.checkpoint_paths()[-1], weights_only=True)
        del state[key]
        run_id = state.pop("run_id")
        rundir.save_checkpoint(state["iteration"], state, run_id, rundir.train_config())
        return ["train", "--out", str(run), "--resume"], lambda: _resumed_to(run, 3)

    return prepare


def _garbled_eval_value(folder: TrialFolder):
    run = folder.run_copy()
    path = run / "eval.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[0]) | {"reward_mean": "high"}
    path.write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    edit_config(run, iterations=3)
    return ["train", "--out", str(run), "--resume"], _unchanged(path, run / "checkpoints")


def _checkpoints_file(folder: TrialFolder):
    run = folder.run_copy()
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").write_text("my notes\n")
    return ["train", "--out", str(run), "--resume"], _unchanged(run / "checkpoints")


def _on_full_disk(command: Callable[[TrialFolder, Path], list[str]]):
    """A command whose output goes onto the full file system (``command(folder, disk)`` gives its arguments);
    afterwards no temporary file of its writes may be left there."""
    def prepare(folder: TrialFolder):
        args = command(folder, folder.disk)
        fill(folder.disk)
        return args, lambda: [f"temporary file left: {p}" for p in folder.disk.rglob("*.vgrpo.tmp")]

    return prepare


def fill(disk: Path) -> None:
    """Fill the file system of ``disk`` to its last byte (a file ``filler`` written until ENOSPC)."""
    try:
        with open(disk / "filler", "ab", buffering=0) as handle:  # unbuffered: nothing left to flush at close
            while True:
                handle.write(b"\0" * 4096)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise


def _usage(args: list[str]):
    """A command refused for its input (``{work}`` is the trial's folder): nothing may appear in the folder."""
    def prepare(folder: TrialFolder):
        return [arg.replace("{work}", str(folder.work)) for arg in args], _unchanged(folder.work)

    return prepare


def _sample_into_folder(folder: TrialFolder):
    target = folder.work / "samples"
    target.mkdir()
    (target / "mine.txt").write_text("keep\n")
    return (["sample", "--task", "digits8", "--per-prompt", "1", "--seed", "0", "--out", str(target)],
            _unchanged(target, target / "mine.txt"))


TRIALS: tuple[Trial, ...] = (
    Trial("config edited: algo vgrpo -> flow_grpo (its vgrpo section left)", "config edits",
          _config_edit(algo="flow_grpo"), 4, ("config.json is not a valid run config", "vgrpo.")),
    Trial("config edited: algo vgrpo -> flow_grpo (its vgrpo section removed)", "config edits",
          _config_edit(algo="flow_grpo", drop=("vgrpo",)), 3, ("algo ('vgrpo' -> 'flow_grpo')",)),
    Trial("config edited: task digits8 -> digit", "config edits", _config_edit(task="digit"), 3, ("task",)),
    Trial("config edited: group_size 4 -> 2", "config edits", _config_edit(group_size=2), 3, ("group_size",)),
    Trial("config edited: seed", "config edits", _config_edit(seed=7), 3, ("seed",)),
    Trial("config edited: optim.lr", "config edits", _config_edit(**{"optim.lr": 0.5}), 3, ("optim.lr",)),
    Trial("config edited: iterations 2 -> 3 (allowed)", "config edits", _config_edit(iterations=3), 0),
    Trial("config edited: iterations 2 -> 1", "config edits", _config_edit(iterations=1), 3, ("iterations",)),
    Trial("--out holds a user's .draft.tmp", "user files in --out",
          _fresh_out_holding(lambda out, precious: (out / ".draft.tmp").write_text("draft\n")), 3, (".draft.tmp",)),
    Trial("--out's .lock is a symlink to a user file", "user files in --out",
          _fresh_out_holding(lambda out, precious: (out / ".lock").symlink_to(precious)), 3, (".lock",)),
    Trial("--out's .lock is a directory", "user files in --out",
          _fresh_out_holding(lambda out, precious: (out / ".lock").mkdir()), 3, (".lock",)),
    Trial("--out's .lock holds non-UTF-8 garbage", "user files in --out",
          _fresh_out_holding(lambda out, precious: (out / ".lock").write_bytes(b"\xff\xfe garbage")), 3, (".lock",)),
    Trial("newest manifest: one character of run_id flipped", "damaged manifests", _damaged_manifest(_flip_run_id), 0),
    Trial("newest manifest: run_id null", "damaged manifests",
          _damaged_manifest(lambda manifest: manifest.update(run_id=None)), 0),
    Trial("newest manifest: sha256 removed", "damaged manifests",
          _damaged_manifest(lambda manifest: manifest.pop("sha256")), 0),
    Trial("newest checkpoint: no policy (hand-made)", "damaged files", _checkpoint_without("policy"), 0),
    Trial("eval.jsonl: a value that is not a number", "damaged files", _garbled_eval_value, 4,
          ("eval.jsonl", "reward_mean")),
    Trial("checkpoints replaced by a file", "damaged files", _checkpoints_file, 3, ("checkpoints is not a folder",)),
    Trial("train --out on a full disk", "full disk",
          _on_full_disk(lambda folder, disk: ["train", "--algo", "vgrpo", "--out", str(disk / "out"), *BASE_ARGS]),
          5, ("No space left on device", "/out/")),
    Trial("train --resume of a run on a full disk", "full disk",
          _on_full_disk(lambda folder, disk: ["train", "--out", str(_grown(folder.run_copy(disk))), "--resume"]),
          5, ("No space left on device", "/run/")),
    Trial("sample --out on a full disk", "full disk",
          _on_full_disk(lambda folder, disk: ["sample", "--task", "digits8", "--per-prompt", "1", "--seed", "0",
                                              "--out", str(disk / "s.npz")]), 5,
          ("No space left on device", "s.npz")),
    Trial("eval --run of a run on a full disk", "full disk",
          _on_full_disk(lambda folder, disk: ["eval", "--run", str(folder.run_copy(disk))]), 5,
          ("No space left on device", "eval_grid.png")),
    Trial("export --out on a full disk", "full disk",
          _on_full_disk(lambda folder, disk: ["export", "--run", str(folder.base), "--out", str(disk / "export")]), 5, ("No space left on device", "export")),
    Trial("compress a run on a full disk", "full disk",
          _on_full_disk(lambda folder, disk: ["compress", str(folder.run_copy(disk))]), 5,
          ("No space left on device", "/run/")),
    Trial("model.path on a testbed task", "bad input",
          _usage(["train", "--algo", "vgrpo", "--out", "{work}/out", *BASE_ARGS, "model.path=/models/x"]), 2,
          ("model.path",)),
    Trial("log.backend=wandb without an API key", "bad input",
          _usage(["train", "--algo", "vgrpo", "--out", "{work}/out", *BASE_ARGS, "log.backend=wandb"]), 2,
          ("WANDB_API_KEY",)),
    Trial("schedule reaching a negative lr", "bad input",
          _usage(["train", "--algo", "vgrpo", "--out", "{work}/out", *BASE_ARGS, "schedule.lr=cosine:end=-1,steps=3"]),
          2, ("schedule.lr",)),
    Trial("seed beyond 64 bits", "bad input",
          _usage(["train", "--algo", "vgrpo", "--out", "{work}/out", *BASE_ARGS, f"seed={2**70}"]), 2, ("seed",)),
    Trial("rollout.shift=1e308", "bad input",
          _usage(["train", "--algo", "vgrpo", "--out", "{work}/out", *BASE_ARGS, "rollout.shift=1e308"]), 2,
          ("rollout.shift",)),
    Trial("sample --out an existing folder", "bad input", _sample_into_folder, 2, ("is a folder",)),
    Trial("--out with a path component over 255 bytes", "bad input",
          _usage(["train", "--algo", "vgrpo", "--out", "{work}/" + "n" * 300 + "/out", *BASE_ARGS]), 2,
          ("too long",)),
    Trial("--resume of a folder without config.json", "bad input",
          _usage(["train", "--out", "{work}", "--resume"]), 3, ("no config.json",)),
)


def _grown(run: Path) -> Path:
    edit_config(run, iterations=3)
    return run


def run_trial(trial: Trial, folder: TrialFolder) -> dict:
    """Run one trial; its record: exit code, the error line, and what broke (empty when it held)."""
    args, check = trial.prepare(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    env["HOME"] = str(folder.work)  # no wandb credentials, no user settings
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "vgrpo_lib.algorithms.cli", *args], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT_S)
    lines = done.stderr.rstrip("\n").split("\n")
    line = lines[-1] if done.returncode else ""
    broke = [] if done.returncode == trial.exit_code else [f"exit {done.returncode}, expected {trial.exit_code}"]
    if trial.exit_code:
        broke += ["a traceback"] if "Traceback" in done.stderr else []
        broke += [] if line.startswith(f"vgrpo {args[0]}: error: ") else ["no one-line error"]
        broke += [f"the error does not name {word!r}" for word in trial.named if word not in line]
    broke += check()
    return {"trial": trial.name, "class": trial.kind, "command": " ".join(["vgrpo", *args])[:300],
            "exit_code": done.returncode, "error": line[:400], "seconds": round(time.perf_counter() - start, 1),
            "held": not broke, "broke": broke}


def full_disk(work: Path) -> tuple[Path | None, str]:
    """A 16 MB tmpfs mounted at ``work/disk`` (the full-disk trials fill it), or None and why not."""
    disk = work / "disk"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True,
                          text=True)
    if done.returncode:
        return None, f"cannot mount a tmpfs ({done.stderr.strip() or 'mount failed'}; needs root)"
    return disk, ""


def run_trials(work: Path, only: str | None = None, log=print) -> dict:
    """Every trial of :data:`TRIALS` (of class ``only``), each in its own folder under ``work``; the record."""
    base = work / "base"
    subprocess.run([sys.executable, "-m", "vgrpo_lib.algorithms.cli", "train", "--algo", "vgrpo", "--out", str(base),
                    *BASE_ARGS], cwd=REPO, check=True, capture_output=True, timeout=WAIT_S)
    records = []
    for number, trial in enumerate(t for t in TRIALS if only in (None, t.kind)):
        trial_work = work / f"trial_{number:02d}"
        trial_work.mkdir()
        disk, why = full_disk(trial_work) if trial.kind == "full disk" else (None, "")
        if trial.kind == "full disk" and disk is None:
            records.append({"trial": trial.name, "class": trial.kind, "held": None, "not_run": why})
            log(f"not run: {trial.name}: {why}")
            continue
        try:
            record = run_trial(trial, TrialFolder(trial_work, base, disk))
        finally:
            if disk is not None:
                subprocess.run(["umount", str(disk)], check=True)
        records.append(record)
        log(f"{'held ' if record['held'] else 'BROKE'} {trial.name}: exit {record['exit_code']} "
            f"{record['error'] or ''} {record['broke'] or ''}")
    run = [r for r in records if r["held"] is not None]
    return {"trials": records, "run": len(run), "held": sum(r["held"] for r in run),
            "not_run": len(records) - len(run), "all_held": all(r["held"] for r in run)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the record to this file")
    parser.add_argument("--only", default=None, choices=sorted({t.kind for t in TRIALS}), help="one class of trials")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        record = run_trials(Path(work), args.only)
    text = json.dumps(record, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(f"{record['held']} of {record['run']} trials held ({record['not_run']} not run)")
    return 0 if record["all_held"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
