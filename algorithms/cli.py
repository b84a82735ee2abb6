"""The ``vgrpo`` command: train, sample and evaluate (testbed tasks, the shipped MNIST-SD3 pipeline, hub models).

    vgrpo train --algo vgrpo [--task digit] [--preset testbed] [key=value ...] --out RUN_DIR [--resume]
    vgrpo train --preset mnist-sd3 [--task digit|ocr] --out RUN_DIR      (the shipped diffusers pipeline)
    torchrun --nproc_per_node N -m vgrpo_lib.algorithms.cli train ...   (or: torchrun ... --no-python vgrpo train ...;
                                                             N processes, see vgrpo_lib.integrations.distributed)
    vgrpo sample [--preset P] [--task T] --per-prompt N --seed S --out FILE.npz [--grid FILE.png]  (base policy)
    vgrpo sample --run RUN_DIR --per-prompt N --seed S --out FILE.npz              (a trained policy)
    vgrpo eval --run RUN_DIR
    vgrpo export --run RUN_DIR --out DIR          (the trained LoRA in the diffusers format / the testbed policy as
                                                   safetensors, with a model card; see vgrpo_lib.algorithms.export)
    vgrpo compress PATH ...                       (gzip the configs and tables of the runs in PATH, e.g. a finished
                                                   comparison kept in results/, or the file PATH, e.g. its summary.json;
                                                   every command reads them back unchanged)
    vgrpo config [--algo A] [--preset P] [--task T] [--format text|markdown|json]
                                                  (every config key with its value, type, allowed values, help and
                                                   algorithms: of one run, or of every algorithm without --algo)

An expected failure prints one line, ``vgrpo COMMAND: error: ...``, and exits with its own code (see
:mod:`vgrpo_lib.algorithms.errors`: 2 usage or configuration, 3 run directory (or export folder) refused, 4 damaged file, 5 disk full / read-only
/ no permission, 6 the policy diverged or the reward failed); an unexpected error keeps its traceback (exit 1).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from vgrpo_lib.algorithms.config import ALGORITHMS, TrainConfig
from vgrpo_lib.algorithms.config_reference import FORMATS, describe_config
from vgrpo_lib.algorithms.errors import (
    EXIT_DAMAGED, EXIT_FILESYSTEM, EXIT_RUN_DIR, EXIT_TRAINING, EXIT_USAGE, DamagedFileError, DivergenceError,
    RunDirError, UsageError, filesystem_message, path_message,
)
from vgrpo_lib.algorithms.presets import BEYOND_PAPER, PRESETS, build_config
from vgrpo_lib.algorithms.evaluation import evaluate_policy, guidance_label
from vgrpo_lib.algorithms.export import export_run, load_run_policy
from vgrpo_lib.algorithms.run_dir import (
    COMPRESSED_SUFFIX, CONFIG_NAME, TABLES, RunDir, atomic_write_bytes, compress_file, stored_path,
)
from vgrpo_lib.algorithms.tasks import TaskProtocolError, load_task, task_names
from vgrpo_lib.integrations.tasks import resolve_task_name
from vgrpo_lib.algorithms.trainer import RewardError, Trainer
from vgrpo_lib.integrations.atomic import check_file_target
from vgrpo_lib.integrations.distributed import init_from_env
from vgrpo_lib.integrations.rewards.loading import MissingWeightsError
from vgrpo_lib.extras import MissingExtraError

__all__ = [
    "run_folders", "EVALUATION_TABLE_KEYS", "print_evaluation_table", "task_help", "Command", "make_parser", "run",
    "expected_error", "main",
]


def _train(args) -> int:
    if args.resume and (args.overrides or args.task or args.algo_given or args.preset_given):
        raise UsageError("--resume continues a run with its saved config; drop --algo/--task/--preset/overrides.")
    with init_from_env() as shard:  # joins the process group under torchrun; a no-op otherwise
        if args.resume:
            trainer = Trainer.resume(args.out)
        else:
            trainer = Trainer(build_config(args.algo, args.task, args.preset, args.overrides), args.out)
        evaluations = trainer.train()
        del trainer  # its DDP wrapper must go before the process group (see vgrpo_lib.integrations.distributed.shutdown)
    if shard.is_main:
        # The base column is the iteration-0 evaluation; a resumed run whose eval.jsonl lost it has none.
        base = evaluations[0] if evaluations and evaluations[0]["iteration"] == 0 else None
        print_evaluation_table(base, evaluations[-1])
        print(f"run directory: {args.out}")
    return 0


def _sample(args) -> int:
    for path in filter(None, (args.out, args.grid)):  # before any sampling: the outputs can be written
        check_file_target(path)
    if args.run:
        if args.preset is not None or args.overrides:
            raise UsageError("--preset and overrides apply to the base policy; a --run samples with its saved config.")
        config, task, policy, _, _ = load_run_policy(args.run)
        if args.task and resolve_task_name(args.task, config.task.split("/")[0]) != config.task:
            raise UsageError(f"--task {args.task} does not match the run's task {config.task}.")
    else:
        config = build_config("vgrpo", args.task, args.preset or "testbed", args.overrides)
        task = load_task(config.task, config.model)
        policy = task.load_policy().eval()
    prompts = task.eval_prompts(args.per_prompt)
    steps = config.eval.num_steps if args.steps is None else args.steps
    images = task.sample(policy, prompts, num_steps=steps, generator=torch.Generator().manual_seed(args.seed))
    arrays = {"images": images.float().numpy()}
    # Testbed prompts are digit ids (saved as "labels"); a diffusers task's are strings (saved as "prompts", with
    # "labels" when the task says what each prompt asks for: a digit, or a number as a string).
    if isinstance(prompts, torch.Tensor):
        arrays["labels"] = prompts.to(torch.int64).numpy()
    else:
        arrays["prompts"] = np.array(prompts, dtype=str)
        labels = task.labels(prompts)
        if labels is not None:
            arrays["labels"] = np.array(labels, dtype=np.int64 if isinstance(labels[0], int) else str)
    out = Path(args.out)
    atomic_write_bytes(out, _npz_bytes(**arrays))
    shapes = ", ".join(f"{key} {value.shape}" for key, value in arrays.items())
    print(f"wrote {shapes} to {out} ({steps} steps, {guidance_label(config.model)})")
    if args.grid:
        policy_name = f"{config.algo} (run {Path(args.run).name})" if args.run else "base policy"
        title = (f"{policy_name} on {config.task}, seed {args.seed}, {steps} steps (vgrpo sample, "
                 f"{guidance_label(config.model)})")
        print(f"sample grid: {task.write_samples(images, prompts, args.grid, title)}")
    return 0


def _npz_bytes(**arrays) -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _eval(args) -> int:
    config, task, policy, state, base = load_run_policy(args.run)
    settings = replace(config.eval, per_prompt=args.per_prompt or config.eval.per_prompt)
    base_result, _, _ = evaluate_policy(task, base, settings, iteration=0)
    result, images, prompts = evaluate_policy(task, policy, settings, iteration=state["iteration"])
    print_evaluation_table(base_result, result)
    title = f"{config.algo} on {config.task}, iteration {state['iteration']} (vgrpo eval, {guidance_label(config.model)})"
    print(f"sample grid: {task.write_samples(images, prompts, Path(args.run) / 'eval_grid.png', title)}")
    return 0


def _export(args) -> int:
    files = export_run(args.run, args.out)
    print(f"wrote {', '.join(path.name for path in files)} to {args.out}")
    return 0


def run_folders(path: Path) -> list[Path]:
    """The run directories at or under ``path`` (folders with a ``config.json`` or ``config.json.gz`` and a table,
    either stored form), sorted."""
    if not path.is_dir():
        raise UsageError(f"{path} is not a folder.")
    configs = [config for name in (CONFIG_NAME, CONFIG_NAME + COMPRESSED_SUFFIX) for config in path.rglob(name)]
    runs = sorted({c.parent for c in configs if any(stored_path(c.parent / name).exists() for name in TABLES)})
    if not runs:
        raise UsageError(f"{path} holds no run directory (a folder with config.json and metrics.csv).")
    return runs


def _config(args) -> int:
    given = args.algo is not None or args.preset is not None or args.task is not None
    config = TrainConfig.for_algo(args.algo or "vgrpo", args.preset or "testbed", args.task) if given else None
    print(describe_config(config, args.format), end="" if args.format == "markdown" else "\n")
    return 0


def _compress(args) -> int:
    for path in map(Path, args.paths):
        if path.is_file():
            done = compress_file(_single_file_to_compress(path))
            print(f"{path}: compressed to {done.path.name}, {done.bytes_before / 1e6:.2f} MB -> "
                  f"{done.bytes_after / 1e6:.2f} MB")
            continue
        runs = run_folders(path)
        done = [entry for run in runs for entry in RunDir(run).compress_tables()]
        before, after = sum(t.bytes_before for t in done), sum(t.bytes_after for t in done)
        print(f"{path}: {len(done)} files (configs and tables) of {len(runs)} runs compressed, {before / 1e6:.2f} MB "
              f"-> {after / 1e6:.2f} MB")
    return 0


def _single_file_to_compress(path: Path) -> Path:
    """``path`` if ``vgrpo compress`` may gzip it alone (a comparison's summary.json, a log): not already gzip'd,
    and not one of a run's own files (its config, compressed with its tables; its lock and checkpoints, never)."""
    if path.name.endswith(COMPRESSED_SUFFIX):
        raise UsageError(f"{path} is already compressed.")
    run = RunDir(path.parent.parent if path.parent.name == "checkpoints" else path.parent)
    if run.exists() and (path in (run.config_path, run.lock_path) or path.parent == run.checkpoints):
        raise UsageError(f"{path} is one of the run {run.root}'s own files (its config, lock or checkpoints), not "
                         f"compressed alone; `vgrpo compress {run.root}` compresses its config and tables (never "
                         f"its lock or checkpoints).")
    return path


EVALUATION_TABLE_KEYS = ("reward_mean", "accuracy", "judge_accuracy", "judge_gap", "diversity")


def print_evaluation_table(base: dict | None, trained: dict) -> None:
    """Side-by-side table of the base policy's and the trained policy's evaluation (base "n/a" when None)."""
    print(f"{'metric':<22}{'base':>10}{'trained':>10}")
    for key in [k for k in EVALUATION_TABLE_KEYS if k in trained]:  # diffusers tasks have no accuracy / judge
        before = f"{base[key]:>10.3f}" if base is not None and key in base else f"{'n/a':>10}"
        print(f"{key:<22}{before}{trained[key]:>10.3f}")
    if base is None:
        print("(no base evaluation in eval.jsonl; `vgrpo eval --run RUN_DIR` computes one)")
    per_prompt = trained.get("accuracy_per_prompt", {})
    if per_prompt and len(per_prompt) <= 20:
        print("accuracy per prompt: " + ", ".join(f"{k}: {v:.2f}" for k, v in per_prompt.items()))


def task_help() -> str:
    """``--task``'s help: the task names by kind (testbed, pipeline preset, hub model, registered) and import paths;
    checked by :func:`vgrpo_lib.integrations.tasks.resolve_task_name` (an unknown name lists the valid ones)."""
    pipelines: dict[str, list[str]] = {}
    for name in task_names("pipeline"):
        preset, short = name.split("/", 1)
        pipelines.setdefault(preset, []).append(short)
    kinds = [f"a testbed task ({', '.join(task_names('testbed'))}; --preset testbed, the default)",
             *(f"a pipeline preset's task by its short name (--preset {preset} --task {'|'.join(shorts)})"
               for preset, shorts in pipelines.items()),
             f"a hub model ({', '.join(task_names('hub'))}; its weights and model.prompts=FILE needed)"]
    if task_names("registered"):
        kinds.append(f"a registered task ({', '.join(task_names('registered'))})")
    kinds.append("your own task: the import path of its factory, package.module:factory (importable, e.g. on "
                 "PYTHONPATH; saved with the run, so --resume rebuilds it)")
    return "the task: " + "; ".join(kinds) + ". Default: the preset's task."


@dataclass(frozen=True)
class Command:
    """A ``vgrpo`` subcommand that another layer adds to :func:`make_parser` (the benchmarks add theirs this way):
    its ``name``, the ``help`` line of ``vgrpo --help``, ``add_arguments(subparser)`` declaring its flags, and
    ``handler(args) -> exit status``."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]


def make_parser(extra_commands: Sequence[Command] = ()) -> argparse.ArgumentParser:
    """The ``vgrpo`` argument parser: ``train``, ``sample``, ``eval``, ``export`` and ``compress``, then each of
    ``extra_commands`` in order. A name taken twice is a ValueError naming it."""
    parser = argparse.ArgumentParser(prog="vgrpo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a policy on a task (testbed, pipeline preset, hub model or your own)")
    train.add_argument("--algo", choices=[*ALGORITHMS, *BEYOND_PAPER], default=None,
                       help="the algorithm (default: vgrpo); vgrpo+ is the library's own V-GRPO, beyond the paper")
    train.add_argument("--task", default=None, help=task_help())
    train.add_argument("--preset", choices=PRESETS, default=None, help="the run's preset (default: testbed)")
    train.add_argument("--out", required=True, help="run directory (refused if it exists, unless --resume)")
    train.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    train.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. optim.lr=3e-4 vgrpo.num_pairs=8")
    train.set_defaults(handler=_train)

    sample = commands.add_parser("sample", help="write samples of a run (or the base policy) to .npz under the "
                                 "task's evaluation guidance: CFG-free, or true CFG against model.negative_prompt "
                                 "(--grid: and a labelled PNG)")
    sample.add_argument("--run", default=None)
    sample.add_argument("--preset", choices=PRESETS, default=None, help="the base policy's preset (default testbed; "
                        "not with --run)")
    sample.add_argument("--task", default=None, help=task_help())
    sample.add_argument("--per-prompt", type=int, required=True)
    sample.add_argument("--seed", type=int, required=True)
    sample.add_argument("--steps", type=int, default=None, help="ODE steps (default: the evaluation's, eval.num_steps)")
    sample.add_argument("--out", required=True)
    sample.add_argument("--grid", default=None, metavar="PNG", help="also write a labelled sample grid (one row per "
                        "prompt) to this PNG file")
    sample.add_argument("overrides", nargs="*", help="config overrides of the base policy, e.g. model.device=cuda")
    sample.set_defaults(handler=_sample)

    evaluate = commands.add_parser("eval", help="evaluate a run against its base policy and write a sample grid")
    evaluate.add_argument("--run", required=True)
    evaluate.add_argument("--per-prompt", type=int, default=None)
    evaluate.set_defaults(handler=_eval)

    export = commands.add_parser("export", help="write a run's policy for other tools (diffusers LoRA / safetensors) "
                                 "with a model card")
    export.add_argument("--run", required=True)
    export.add_argument("--out", required=True, help="a new (or empty) folder")
    export.set_defaults(handler=_export)

    compress = commands.add_parser("compress", help="gzip the configs and tables of the runs in a folder "
                                   "(config.json, metrics.csv, eval.csv, eval.jsonl -> NAME.gz), or single files (a "
                                   "comparison's summary.json, protocol.json), read back unchanged by every command")
    compress.add_argument("paths", nargs="+", help="run directories or folders holding them (e.g. a comparison's "
                          "--out), or files")
    compress.set_defaults(handler=_compress)

    config = commands.add_parser("config", help="list the config keys with their values, types, allowed values, help "
                                 "and algorithms (of one run with --algo/--preset/--task; else every key)")
    config.add_argument("--algo", choices=[*ALGORITHMS, *BEYOND_PAPER], default=None, help="the run's algorithm (default vgrpo when "
                        "--preset or --task is given; none of the three: every key of every algorithm)")
    config.add_argument("--preset", choices=PRESETS, default=None, help="the run's preset (default testbed)")
    config.add_argument("--task", default=None, help=task_help())
    config.add_argument("--format", choices=FORMATS, default="text", help="text (default), markdown (the docs' "
                        "reference: docs/reference/config.md) or json")
    config.set_defaults(handler=_config)
    for command in extra_commands:
        if command.name in commands.choices:
            raise ValueError(f"extra_commands: the command name {command.name!r} is taken")
        subparser = commands.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(subparser)
        subparser.set_defaults(handler=command.handler)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse ``argv`` with ``parser`` and run the chosen command; user errors print one line and return 2."""
    args = parser.parse_args(argv)
    if args.command == "train":
        args.algo_given, args.preset_given = args.algo is not None, args.preset is not None
        args.algo, args.preset = args.algo or "vgrpo", args.preset or "testbed"

    try:
        if getattr(args, "per_prompt", None) is not None and args.per_prompt < 1:
            raise UsageError("--per-prompt must be >= 1.")
        return args.handler(args)
    except Exception as error:
        reported = expected_error(error)
        if reported is None:
            raise  # a bug or a machine failure (e.g. out of memory): its traceback is what helps
        code, line = reported
        print(f"vgrpo {args.command}: error: {line}", file=sys.stderr)
        return code


def expected_error(error: Exception) -> tuple[int, str] | None:
    """The exit code and one-line message of an expected failure (see :mod:`vgrpo_lib.algorithms.errors`), or None."""
    if isinstance(error, RunDirError):
        return EXIT_RUN_DIR, str(error)
    if isinstance(error, DamagedFileError):
        return EXIT_DAMAGED, str(error)
    if isinstance(error, (DivergenceError, RewardError)):
        return EXIT_TRAINING, str(error)
    if isinstance(error, OSError) and filesystem_message(error):
        return EXIT_FILESYSTEM, filesystem_message(error)
    if isinstance(error, OSError) and path_message(error):
        return EXIT_USAGE, path_message(error)
    if isinstance(error, (UsageError, MissingWeightsError, MissingExtraError, FileNotFoundError, TaskProtocolError)):
        # arguments, config, paths, a missing extra or missing weights; any other ValueError is a bug (traceback)
        return EXIT_USAGE, str(error)
    return None


def main(argv: list[str] | None = None) -> int:
    """Run ``vgrpo`` with ``argv`` (default: the command line); returns the exit status."""
    return run(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
