"""Running the controlled comparison: :func:`run_compare` tunes, fixes the targets, runs the reported seeds and
writes the summary; an interrupted comparison continues where it stopped (:func:`start_or_resume`).

Several processes may run the same comparison command on the same ``--out`` (one per core: two cores finish it in
about half the time): each trains, in the protocol's order, the runs no other process holds (a run's lock,
:meth:`~vgrpo_lib.algorithms.run_dir.RunDir.lock_holder`), then waits for the runs the others hold and reads them
back (:func:`train_stage`); a run whose process died before finishing it is continued by the next that finds it
free. Every process chooses the same settings from the same runs and writes the same protocol and summary."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from vgrpo_lib.algorithms.errors import RunDirExists, RunDirInUse
from vgrpo_lib.algorithms.run_dir import RunDir, atomic_write_text, write_uncompressed_text
from vgrpo_lib.algorithms.trainer import Trainer, iteration_nfe
from vgrpo_lib.benchmarks.compare.protocol import (
    LEARNING_RATES, MIN_SEEDS, REFERENCE, SMOOTHING, TUNING_SEED, VARIANTS, build, check_lr_decay, check_selection,
    check_variants, run_name, setting_config,
)
from vgrpo_lib.benchmarks.compare.report import markdown_table, plot_curves
from vgrpo_lib.benchmarks.compare.stats import (
    aggregate_seeds, heldout_target_rule, median_ratios, selection_key, summarise_run, target_rule,
)
from vgrpo_lib.errors import UsageError
from vgrpo_lib.integrations.atomic import is_temp_name

__all__ = [
    "COMPARISON_ENTRIES", "FinishedRun", "POLL_SECONDS", "check_comparison_folder", "finished_run", "run_compare",
    "setting_iterations", "start_or_resume", "train_stage", "train_to_end",
]

# What a comparison writes into its folder (besides its plots, *.png); its protocol and summary may be kept compressed
# (`vgrpo compress DIR/summary.json`, as results/ keeps them), and a continued comparison writes them afresh.
COMPARISON_ENTRIES = frozenset({"runs", "protocol.json", "summary.json", "summary.md", "protocol.json.gz",
                                "summary.json.gz"})
POLL_SECONDS = 10.0  # how often a process looks again at the runs another process of the comparison holds


@dataclass(frozen=True)
class FinishedRun:
    """A run that reached its last iteration, read back from its tables: all a comparison uses of it."""

    metrics: list[dict]
    evaluations: list[dict]


def finished_run(config, run_dir: Path) -> FinishedRun | None:
    """The run of ``config`` in ``run_dir`` read back from ``metrics.csv`` and ``eval.jsonl`` if it is finished
    (every iteration's row and the last iteration's evaluation written), else None. Needs no checkpoint, so a
    comparison copied without its checkpoints (as results/ keeps them) is summarised or continued as it is."""
    run = RunDir(run_dir)
    metrics, evaluations = run.read_rows("metrics.csv"), run.read_jsonl("eval.jsonl")
    if [row["iteration"] for row in metrics] != list(range(config.iterations)):
        return None
    if not evaluations or evaluations[-1]["iteration"] != config.iterations:
        return None
    return FinishedRun(metrics, evaluations)


def start_or_resume(config, run_dir: Path) -> Trainer | FinishedRun:
    """A new run of ``config`` in ``run_dir``; or the run already there: read back if finished
    (:func:`finished_run`), else continued from its newest checkpoint, so that an interrupted comparison picks
    up where it stopped (its config and tables may be kept compressed, as ``vgrpo compress`` leaves them). A run of
    another config there is refused."""
    run = RunDir(run_dir)
    if not run.exists():
        return Trainer(config, run_dir, progress=False)
    if run.train_config().to_json() != config.to_json():
        raise UsageError(f"{run_dir} holds a run of another setting than this comparison's; remove it or choose "
                         f"another --out.")
    return finished_run(config, run_dir) or Trainer.resume(run_dir, progress=False)


def train_to_end(config, run_dir: Path) -> tuple[FinishedRun, str]:
    """The run of ``config`` in ``run_dir`` trained to its last iteration (or read back, or resumed: see
    :func:`start_or_resume`), kept as its records only, and how it was had ("read back" or the minutes it took): a
    trainer holds its model (a whole pipeline on the hub path, hundreds of MB), and a comparison of 36 runs would
    hold them all."""
    start = time.monotonic()
    run = start_or_resume(config, run_dir)
    if isinstance(run, FinishedRun):
        return run, "read back"
    run.train()
    return FinishedRun(run.metrics, run.evaluations), f"{(time.monotonic() - start) / 60:.1f} min"


def _wait(seconds: float) -> None:
    """Sleep while other processes of the comparison train the runs this one waits for."""
    time.sleep(seconds)


def train_stage(jobs: dict, report) -> dict:
    """Every run of one stage of the comparison (its tuning runs, or its reported runs), as ``{key: FinishedRun}``
    for ``jobs = {key: (config, run_dir)}``: in order, each run trained, continued or read back by this process
    (:func:`train_to_end`) unless another live process holds it; then, every :data:`POLL_SECONDS`, the runs held
    elsewhere are looked at again until each is read back (finished by its holder) or free to continue (its holder
    died). ``report(key, run, how)`` is called once per run, as it is had."""
    done, pending, announced = {}, list(jobs), set()
    while pending:
        deferred = []
        for key in pending:
            config, run_dir = jobs[key]
            holder = RunDir(run_dir).lock_holder()  # None also for a run not started yet
            if holder is None:
                try:
                    run, how = train_to_end(config, run_dir)
                except (RunDirInUse, RunDirExists):  # another process took it after the look above
                    holder = RunDir(run_dir).lock_holder() or "another process"
                else:
                    done[key] = run
                    report(key, run, how)
                    continue
            deferred.append(key)
            if key not in announced:
                announced.add(key)
                print(f"{run_dir.name} is held by {holder}: training the next free run, then reading it back",
                      flush=True)
        if deferred and len(deferred) == len(pending):  # nothing left to train here: wait for the other processes
            _wait(POLL_SECONDS)
        pending = deferred
    return done


def setting_iterations(nfe_budget: int, variants, task: str, lr: float, overrides: list[str],
                       pipeline: str | None) -> dict[str, dict[str, int]]:
    """``{variant: {step control: iterations}}``: the most iterations of each setting whose model evaluations per
    sample (:func:`~vgrpo_lib.algorithms.trainer.iteration_nfe`, which the learning rate and the seed do not change)
    stay within ``nfe_budget``; a budget under one iteration of a setting is refused naming it. Each setting is
    costed on a task and policy of its own: building an algorithm changes its policy (a hub or MNIST-SD3 task adds
    the behaviour adapter to the policy's transformer), so one policy cannot be shared between settings."""
    table = {}
    for variant in variants:
        table[variant] = {}
        for control in VARIANTS[variant].step_controls:
            per_iteration = iteration_nfe(build(variant, task, TUNING_SEED, lr, control, overrides, pipeline))
            if nfe_budget < per_iteration:
                raise UsageError(f"--nfe-budget {nfe_budget} is under one iteration of {variant} ({control}), "
                                 f"which costs {per_iteration} NFE per sample.")
            table[variant][control] = int(nfe_budget // per_iteration)  # a down-sampled update costs a fraction
    return table


def check_comparison_folder(out: Path) -> None:
    """``out`` is new, empty, or a comparison's own folder (continued where it stopped, or shared with another
    process running the same comparison, whose temporary files of atomic writes it may hold): a file, or a folder
    holding anything a comparison does not write, is refused naming it before any run starts."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; a comparison writes a folder.")
    foreign = sorted(entry.name for entry in out.iterdir()
                     if not (entry.name in COMPARISON_ENTRIES or entry.suffix == ".png" or is_temp_name(entry.name))
                     ) if out.is_dir() else []
    if foreign:
        raise UsageError(f"--out {out} holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}, which a "
                         f"comparison does not write; give a new or empty folder (or a comparison's, to continue it).")


def run_compare(out: str | Path, *, task: str = "digit", seeds: int = MIN_SEEDS, quick: bool = False,
                variants=tuple(VARIANTS), learning_rates=LEARNING_RATES, overrides: list[str] | None = None,
                iterations: int | None = None, pipeline: str | None = None, select: str = "training",
                tuning_seeds: int = 1, nfe_budget: int | None = None, lr_decay: float | None = None) -> dict:
    """Tune, fix the target, run the reported seeds and write the summary (see the module doc). ``pipeline``
    (e.g. ``"mnist-sd3"``) runs every variant's preset on that pipeline preset's model and ``task``; ``select``
    names the target that chooses each algorithm's setting (``SELECTIONS``: ``"training"``, ``"heldout"`` or ``"heldout-kept"``); ``tuning_seeds``
    tunes every setting on that many seeds (``TUNING_SEED``, ``TUNING_SEED + 1``, ...) and selects by all of them
    (:func:`selection_key`), where one seed can mis-choose (``docs/results/vgrpo-plus.md``). ``nfe_budget``, in
    place of ``iterations``: every setting gets the compute, not the iterations: as many iterations as its model
    evaluations per sample and iteration (:func:`~vgrpo_lib.algorithms.trainer.iteration_nfe`) fit in ``nfe_budget``
    per sample (:func:`setting_iterations`), so that an algorithm with a cheaper iteration trains longer.
    ``lr_decay``: every setting's learning rate falls by a cosine to that fraction of it over the setting's own
    iterations (tuning included, so the rate is chosen for the decayed run), in place of a constant rate under
    which a rate that crosses a target first can fall back by the run's end."""
    check_selection(select)
    if seeds < 1:
        raise UsageError(f"--seeds must be at least 1, got {seeds}.")
    if tuning_seeds < 1:
        raise UsageError(f"--tuning-seeds must be at least 1, got {tuning_seeds}.")
    if seeds > TUNING_SEED:
        raise UsageError(f"--seeds must be at most {TUNING_SEED}: the tuning seeds start at {TUNING_SEED}, "
                         f"got {seeds}.")
    if seeds < MIN_SEEDS and not quick:
        raise UsageError(f"The protocol reports at least {MIN_SEEDS} seeds, got seeds={seeds} (use --quick for a smoke test).")
    if iterations is not None and iterations < 1:
        raise UsageError(f"--iterations must be at least 1, got {iterations}.")
    overrides = list(overrides or [])
    check_lr_decay(lr_decay, overrides)
    if nfe_budget is not None and (iterations is not None or any(o.startswith("iterations=") for o in overrides)):
        raise UsageError("--nfe-budget sets each setting's iterations: give it without --iterations or an "
                         "iterations= override.")
    check_variants(variants)
    if not learning_rates or any(not lr > 0 for lr in learning_rates) or len(set(learning_rates)) < len(learning_rates):
        raise UsageError(f"--learning-rates must be distinct positive numbers, got {list(learning_rates)}.")
    out = Path(out)
    check_comparison_folder(out)
    if nfe_budget is None:
        iterations = iterations if iterations is not None else (30 if quick else 80)
        budget_entries = {"budget": [f"iterations={iterations}", "eval.every=10"]}
    else:
        budget_entries = {"budget": ["eval.every=10"], "nfe_budget": nfe_budget}
        budget_entries["setting_iterations"] = setting_iterations(
            nfe_budget, variants, task, learning_rates[0], ["eval.every=10", *overrides], pipeline)

    decay_entry = {} if lr_decay is None else {"lr_decay": lr_decay}  # protocols without a decay as before
    fixed = {"task": task, "pipeline": pipeline, **budget_entries, "overrides": overrides, **decay_entry}

    def config(variant: str, seed: int, lr: float, control: str):
        """The config of one run: the setting's budget, the user's overrides and the protocol's decay."""
        return setting_config(fixed, variant, control, seed, lr)

    for variant in variants:  # every setting must build before any run starts
        for control in VARIANTS[variant].step_controls:
            config(variant, TUNING_SEED, learning_rates[0], control)

    tuning_seed_list = [TUNING_SEED + k for k in range(tuning_seeds)]
    total = len(variants) * (len(VARIANTS[variants[0]].step_controls) * len(learning_rates) * tuning_seeds + seeds)
    counter = itertools.count(1)

    def job(variant: str, seed: int, lr: float, control: str) -> tuple:
        """The config and folder of one run."""
        return config(variant, seed, lr, control), out / "runs" / run_name(variant, control, lr, seed)

    def report(key: tuple, run: FinishedRun, how: str) -> None:
        variant, seed, lr, control = key
        print(f"[{next(counter)}/{total}] {variant:<14} {control:<16} lr {lr:<7g} seed {seed}: final reward "
              f"{statistics.mean(m['reward_mean'] for m in run.metrics[-SMOOTHING:]):.3f} ({how})", flush=True)

    keys = [(variant, seed, lr, control) for variant in variants for control in VARIANTS[variant].step_controls
            for lr in learning_rates for seed in tuning_seed_list]
    trained = train_stage({key: job(*key) for key in keys}, report)
    tuning = {variant: {(control, lr): [trained[variant, seed, lr, control] for seed in tuning_seed_list]
                        for control in VARIANTS[variant].step_controls for lr in learning_rates}
              for variant in variants}
    tuning_runs = [t for runs in tuning.values() for setting in runs.values() for t in setting]
    target = target_rule([t.metrics for t in tuning_runs])
    heldout = heldout_target_rule([t.evaluations for t in tuning_runs])
    chosen, sweep, sweep_per_seed = {}, {}, {}
    for variant, runs in tuning.items():
        results = {key: [summarise_run(t.metrics, t.evaluations, target["target"], heldout["target"]) for t in setting]
                   for key, setting in runs.items()}
        chosen[variant] = min(results, key=lambda key: selection_key(results[key], by=select))
        sweep_per_seed[variant] = {f"{control} lr {lr:g}": rows for (control, lr), rows in results.items()}
        sweep[variant] = {name: rows[0] for name, rows in sweep_per_seed[variant].items()}  # the first tuning seed's
    several = {"tuning_seeds": tuning_seed_list} if tuning_seeds > 1 else {}  # one seed: the protocol as before
    protocol = {**fixed, "tuning_seed": TUNING_SEED, **several, "reported_seeds": list(range(seeds)),
                "learning_rates": list(learning_rates),
                "step_controls": {v: VARIANTS[v].step_controls for v in variants}, **target, "heldout": heldout,
                "selection": select, "chosen": {v: {"step_control": c, "lr": lr} for v, (c, lr) in chosen.items()}}
    write_uncompressed_text(out / "protocol.json", json.dumps(protocol, indent=2) + "\n")  # fixed before the reported runs
    print(f"target {target['target']:.4f} (base {target['base']:.4f}, ceiling {target['ceiling']:.4f})", flush=True)

    keys = [(variant, seed, chosen[variant][1], chosen[variant][0]) for variant in variants for seed in range(seeds)]
    trained = train_stage({key: job(*key) for key in keys}, report)
    runs, curves = {}, {}
    for variant in variants:
        control, lr = chosen[variant]
        trainers = [trained[variant, seed, lr, control] for seed in range(seeds)]
        runs[variant] = [summarise_run(t.metrics, t.evaluations, target["target"], heldout["target"]) for t in trainers]
        curves[variant] = [t.metrics for t in trainers]
    ratios = {}
    if REFERENCE in runs:
        for variant in runs:
            if variant != REFERENCE:
                ratios[variant] = median_ratios(runs[REFERENCE], runs[variant])
    summary = {"protocol": protocol, "task": task, "target_reward": target["target"], "seeds": seeds,
               "algorithms": {v: aggregate_seeds(r) | protocol["chosen"][v] for v, r in runs.items()},
               "ratios_vs_" + REFERENCE: ratios, "per_seed": runs, "tuning": sweep,
               **({"tuning_per_seed": sweep_per_seed} if several else {})}
    write_uncompressed_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out / "summary.md", markdown_table(summary))
    for x_key, label in (("train_seconds", "wall-clock seconds"), ("nfe_cumulative", "NFE per sample"),
                         ("grad_steps", "gradient steps")):
        plot_curves(curves, x_key, label, target["target"], out / f"reward_vs_{x_key}.png")
    return summary
