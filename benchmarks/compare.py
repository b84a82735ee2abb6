"""The controlled comparison: V-GRPO against its baselines and peers on the same task, base policy, prompts,
reward, group size and iteration budget, under a protocol that favours no algorithm (issue 12):

1. **Tuning** on ``TUNING_SEED``, which is not among the reported seeds. Every algorithm gets the same budget: the
   grid ``LEARNING_RATES`` x its step controls (``Variant.step_controls``, as many for each): one gradient step
   per rollout, two epochs over the rollout (with the algorithm's ratio clip where it has one), and the
   several-steps setting of its own paper.
2. **Target**, by a rule that depends on no algorithm's pilot, fixed after tuning and before any reported run:
   ``base + TARGET_FRACTION * (ceiling - base)``, where ``base`` is the mean first-iteration training reward of
   every tuning run (the base policy's) and ``ceiling`` the best smoothed training reward any tuning run reaches.
   It is written to ``DIR/protocol.json`` before the reported runs start and stated in the summary. Beside it,
   the same rule on the held-out evaluation reward (``heldout``: base the iteration-0 evaluation, ceiling the best
   evaluation of any tuning run): the training reward is scored on each algorithm's own rollout, and rollouts
   that are SDEs or have SDE windows score differently from the ODE at the same weights, while the evaluation
   is one sampler for all; its clock ticks once per evaluation.
3. **Selection**: per algorithm the tuning setting with the shortest wall-clock time to the target (else the best
   final reward); ``select="heldout"`` selects by the held-out target instead (else the best final held-out
   reward), the check that a training-reward target, biased between rollout samplers, did not decide the choice.
4. **Reported runs**: the chosen setting on seeds ``0 .. seeds - 1`` (at least ``MIN_SEEDS``; ``quick`` runs are
   smoke tests and may use fewer).
5. **Statistics**: medians over seeds of the time (wall-clock and CPU seconds), NFE and gradient steps to the
   target (a seed that never reaches it counts as infinite), the same to the held-out target (``heldout_*``), and,
   against ``REFERENCE`` (V-GRPO), the ratio of medians with a bootstrap 90% interval (seeds resampled within each
   algorithm). ``protocol.json`` records which target selected (``selection``).

Every run records training reward, held-out evaluation, seconds, NFE and gradient steps (:mod:`vgrpo_lib.algorithms.trainer`);
time to target is read off the training-reward curve smoothed over ``SMOOTHING`` iterations. Writes
``DIR/protocol.json``, ``DIR/summary.json``, ``DIR/summary.md``, reward plots against wall-clock, NFE and gradient
steps with seed bands, and each run's directory. KL terms to the base policy are off for every algorithm and
Flow-GRPO rolls out without CFG (the reward of CFG rollouts is not the CFG-free policy's), so the algorithms'
cores are compared; the other official settings are on (``--preset official``, README "Fidelity"). Run again
with the same ``DIR``, an interrupted comparison continues: finished runs are read back from their tables (no
checkpoint needed), a cut one resumes from its newest checkpoint (:func:`start_or_resume`).

Add an algorithm by adding a :class:`Variant` to ``VARIANTS`` (its step controls default to
``DEFAULT_STEP_CONTROLS``).
"""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from vgrpo_lib.algorithms.cli import build_config
from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.algorithms.presets import OFFICIAL_ON_PIPELINE, PRESETS
from vgrpo_lib.algorithms.run_dir import RunDir, atomic_write_text, pyplot, save_figure
from vgrpo_lib.algorithms.trainer import Trainer

TUNING_SEED = 100
MIN_SEEDS = 5
TARGET_FRACTION = 0.8
SMOOTHING = 3
LEARNING_RATES = (1e-4, 3e-4, 1e-3)
REFERENCE = "vgrpo"
BOOTSTRAP_RESAMPLES = 2000
INTERVAL = 0.9
DIAGNOSTICS = ("clip_fraction", "clip_fraction_active", "approx_kl_k3", "approx_kl_sq")
TRAINING_RATIO_KEYS = ("time_to_target_s", "cpu_time_to_target_s", "nfe_to_target")
HELDOUT_RATIO_KEYS = ("heldout_time_to_target_s", "heldout_nfe_to_target")

# One step per rollout; two epochs (clipped where the algorithm clips its ratio); two minibatches per rollout.
DEFAULT_STEP_CONTROLS = {
    "one_step": ("optim.epochs=1", "optim.minibatches=1"),
    "two_epochs": ("optim.epochs=2", "optim.minibatches=1"),
    "two_minibatches": ("optim.epochs=1", "optim.minibatches=2"),
}


@dataclass(frozen=True)
class Variant:
    """An algorithm as the comparison runs it: ``algo`` at ``preset`` with ``overrides``, tuned over
    ``step_controls`` (name -> overrides) x the learning rates."""

    algo: str
    overrides: tuple[str, ...] = ()
    step_controls: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_STEP_CONTROLS))
    preset: str = "official"


FLOW_GRPO_CORE = ("flow_grpo.ref_kl_coef=none", "flow_grpo.cfg_scale=1.0")
VARIANTS: dict[str, Variant] = {
    # The paper's preference-stage control (one step, soft-clipped advantages) replaces a plain two-minibatch
    # setting; two epochs use the ratio clip (0.01) the paper uses over several steps.
    "vgrpo": Variant("vgrpo", ("vgrpo.ref_kl_coef=none",), {
        "one_step": ("optim.epochs=1", "optim.minibatches=1", "advantage.soft_clip=none"),
        "two_epochs": ("optim.epochs=2", "optim.minibatches=1", "advantage.soft_clip=none", "vgrpo.clip_range=0.01"),
        "paper_soft_clip": ("optim.epochs=1", "optim.minibatches=1", "advantage.soft_clip=3.0"),
    }),
    # Official: two minibatches per rollout (the default controls hold it), clip 1e-4.
    "flow_grpo": Variant("flow_grpo", FLOW_GRPO_CORE),
    # MixGRPO: Flow-GRPO with a sliding SDE window of 4 steps (its window replaces the timestep fraction).
    "mixgrpo": Variant("flow_grpo", (*FLOW_GRPO_CORE, "flow_grpo.timestep_fraction=1.0", "flow_grpo.window_size=4",
                                     "flow_grpo.window_shift_interval=10")),
    # Official: one gradient step per rollout (GenEval, PickScore), two minibatches for OCR.
    "diffusion_nft": Variant("diffusion_nft", ("diffusion_nft.ref_kl_coef=none",)),
    # The peers (README "The closest peers"), each at its official settings with the base-policy KL off.
    # FPO: its paper's several steps per rollout are the PPO epochs (two_epochs, clip 0.05).
    "fpo": Variant("fpo"),
    # AWM: official one on-policy step; its KL to the soft-updated copy is its own step control and stays on.
    "awm": Variant("awm", ("awm.ref_kl_coef=none",)),
    "grpo_guard": Variant("grpo_guard", FLOW_GRPO_CORE),
    "flow_grpo_fast": Variant("flow_grpo_fast", FLOW_GRPO_CORE),
}
TASK_OVERRIDES = {"pair": ["eval.per_prompt=4"]}


def variant_preset(variant: str, pipeline: str | None) -> str:
    """The preset ``variant`` runs at: its own (``official``), or that preset on a pipeline (``official-mnist-sd3``)."""
    preset = VARIANTS[variant].preset if pipeline is None else f"{VARIANTS[variant].preset}-{pipeline}"
    if preset not in PRESETS:
        raise ValueError(f"No preset {preset!r} for the comparison on {pipeline!r}; pipelines: "
                         f"{', '.join(OFFICIAL_ON_PIPELINE.values())}.")
    return preset


def build(variant: str, task: str, seed: int, lr: float, control: str, overrides: list[str], pipeline: str | None = None):
    v = VARIANTS[variant]
    extra = [*v.overrides, *v.step_controls[control], *TASK_OVERRIDES.get(task, []), f"seed={seed}", f"optim.lr={lr}",
             *overrides]
    return build_config(v.algo, task, variant_preset(variant, pipeline), extra)


def run_name(variant: str, control: str, lr: float, seed: int) -> str:
    """The folder under ``DIR/runs`` of one run of the comparison."""
    return f"{variant}_{control}_lr{lr:g}_seed{seed}"


def smoothed(metrics: list[dict]) -> list[float]:
    """Training reward averaged over the last ``SMOOTHING`` iterations, per iteration."""
    rewards = [m["reward_mean"] for m in metrics]
    return [statistics.mean(rewards[max(0, i - SMOOTHING + 1): i + 1]) for i in range(len(rewards))]


def _rule(bases: list[float], ceilings: list[float], fraction: float, measured: str) -> dict:
    base, ceiling = statistics.mean(bases), max(ceilings)
    return {"base": base, "ceiling": ceiling, "fraction": fraction, "target": base + fraction * (ceiling - base),
            "rule": f"base + {fraction} x (ceiling - base); {measured}"}


def target_rule(tuning_curves: list[list[dict]], fraction: float = TARGET_FRACTION) -> dict:
    """``base + fraction * (ceiling - base)`` from the tuning runs of every algorithm (see the module doc)."""
    return _rule([curve[0]["reward_mean"] for curve in tuning_curves], [max(smoothed(curve)) for curve in tuning_curves],
                 fraction, f"base: mean first-iteration training reward of every tuning run; ceiling: best "
                           f"{SMOOTHING}-iteration smoothed training reward of any tuning run")


def heldout_target_rule(tuning_evaluations: list[list[dict]], fraction: float = TARGET_FRACTION) -> dict:
    """The same rule on the held-out evaluation reward, which one sampler (CFG-free Euler ODE, the evaluation
    seeds) scores for every algorithm, unlike the training reward, scored on each algorithm's own rollout."""
    return _rule([runs[0]["reward_mean"] for runs in tuning_evaluations],
                 [max(e["reward_mean"] for e in runs) for runs in tuning_evaluations], fraction,
                 "base: mean iteration-0 held-out evaluation reward of every tuning run (the base policy's); "
                 "ceiling: best held-out evaluation reward of any tuning run")


TO_TARGET = {"time_to_target_s": "train_seconds", "cpu_time_to_target_s": "train_cpu_s",
             "nfe_to_target": "nfe_cumulative", "steps_to_target": "grad_steps"}
OPTIONAL_COSTS = ("train_cpu_s",)  # runs made before the trainer logged CPU time have none


def _costs_at(row: dict | None, prefix: str = "") -> dict:
    """Wall-clock and CPU seconds, NFE and gradient steps of the run at ``row`` (None for each when None). A
    row without one of them (CPU time aside) is a KeyError, not a target silently never reached."""
    if row is None:
        return {prefix + key: None for key in TO_TARGET}
    return {prefix + key: row.get(column) if column in OPTIONAL_COSTS else row[column] for key, column in TO_TARGET.items()}


def time_to_target(metrics: list[dict], target: float) -> dict:
    """First iteration whose smoothed training reward reaches ``target``: wall-clock and CPU seconds, NFE and
    gradient steps then (None where it never does)."""
    return _costs_at(next((row for row, value in zip(metrics, smoothed(metrics)) if value >= target), None))


def heldout_time_to_target(evaluations: list[dict], target: float) -> dict:
    """The same at the first evaluation after the base one (iteration 0) whose held-out reward reaches ``target``,
    keys prefixed ``heldout_``. Its clock ticks once per evaluation (``eval.every`` iterations)."""
    return _costs_at(next((e for e in evaluations if e["iteration"] > 0 and e["reward_mean"] >= target), None),
                     "heldout_")


def summarise_run(metrics: list[dict], evaluations: list[dict], target: float, heldout_target: float) -> dict:
    final = evaluations[-1]
    tail = [m["reward_mean"] for m in metrics[-SMOOTHING:]]
    out = {
        **time_to_target(metrics, target),
        **heldout_time_to_target(evaluations, heldout_target),
        "final_reward": statistics.mean(tail),
        "final_eval_reward": final["reward_mean"],
        "final_accuracy": final.get("accuracy"),
        "judge_accuracy": final.get("judge_accuracy"),
        "judge_gap": final.get("judge_gap"),
        "diversity": final.get("diversity"),
        "base_accuracy": evaluations[0].get("accuracy"),
        "seconds_per_iteration": statistics.median(m["iteration_s"] for m in metrics),
        "cpu_seconds_per_iteration": metrics[-1]["train_cpu_s"] / len(metrics),
        "nfe_per_sample_per_iteration": metrics[-1]["nfe_per_sample"],
    }
    # Where the time goes: mean seconds per iteration of each phase.
    out.update({f"mean_{phase}": statistics.mean(m[phase] for m in metrics) for phase in ITERATION_PHASES})
    # The ratio diagnostics, averaged over iterations, for the losses that have a ratio.
    out.update({key: statistics.mean(m[key] for m in metrics) for key in DIAGNOSTICS if key in metrics[0]})
    # The evaluation's breakdowns (``geneval/<category>``, ``judge_geneval/<category>``, ``reward/<name>``), base
    # and final.
    for key in sorted(k for k in final if "/" in k):
        out[f"base_{key}"], out[f"final_{key}"] = evaluations[0][key], final[key]
    return out


def _finite(value) -> float:
    return math.inf if value is None else float(value)


def median_ratio_interval(reference: list, other: list, *, resamples: int = BOOTSTRAP_RESAMPLES,
                          level: float = INTERVAL, seed: int = 0) -> dict:
    """``median(reference) / median(other)`` and its bootstrap ``level`` interval (each list resampled with
    replacement on its own, ``resamples`` times, fixed RNG). None stands for a seed that never reached the
    target (infinite); a ratio with an infinite median is reported as None (not estimable)."""
    rng = random.Random(seed)
    a, b = [_finite(v) for v in reference], [_finite(v) for v in other]

    def ratio(x, y):
        mx, my = statistics.median(x), statistics.median(y)
        return None if math.isinf(mx) or math.isinf(my) or my == 0 else mx / my

    draws = [ratio(rng.choices(a, k=len(a)), rng.choices(b, k=len(b))) for _ in range(resamples)]
    finite = sorted(d for d in draws if d is not None)
    tail = (1.0 - level) / 2
    interval = None
    if len(finite) >= 0.9 * resamples:  # at most 10% of the resamples not estimable
        interval = [finite[int(tail * (len(finite) - 1))], finite[int((1 - tail) * (len(finite) - 1))]]
    return {"ratio": ratio(a, b), "interval": interval, "level": level, "resamples": resamples,
            "estimable_share": len(finite) / resamples}


def _aggregate(per_seed: list[dict]) -> dict:
    out = {}
    for key in per_seed[0]:
        values = [run[key] for run in per_seed]
        if key.endswith("to_target") or key.endswith("to_target_s"):
            median = statistics.median(_finite(v) for v in values)
            out[key] = None if math.isinf(median) else median
            out[f"{key}_reached"] = f"{sum(v is not None for v in values)}/{len(values)}"
        elif all(v is not None for v in values):
            out[key] = statistics.mean(values)
            if len(values) > 1:
                out[f"{key}_std"] = statistics.stdev(values)
    return out


@dataclass(frozen=True)
class Selection:
    """A target that can choose each algorithm's setting: the summary columns of its time to target and of the
    final reward that breaks ties among settings that never reach it, and its name in the summary."""

    time_key: str
    reward_key: str
    label: str


SELECTIONS = {"training": Selection("time_to_target_s", "final_reward", "training-reward"),
              "heldout": Selection("heldout_time_to_target_s", "final_eval_reward", "held-out")}


def _check_selection(by: str) -> None:
    if by not in SELECTIONS:
        raise ValueError(f"select/by={by!r}: expected one of {sorted(SELECTIONS)} (the target that selects)")


def selection_key(result: dict, by: str = "training") -> tuple:
    """Sort key of a tuning run (its :func:`summarise_run` row): reached the target first, then earlier, then the
    higher final reward. ``by`` names the target: the protocol selects by ``"training"``; ``"heldout"`` asks which
    setting the held-out target would have chosen (``results/heldout_selection.py``)."""
    _check_selection(by)
    selection = SELECTIONS[by]
    time = result[selection.time_key]
    return (time is None, 0.0 if time is None else time, -result[selection.reward_key])


def _check_variants(variants) -> None:
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"Unknown variant(s) {', '.join(map(repr, unknown))}; expected some of {', '.join(VARIANTS)}.")
    sizes = {v: len(VARIANTS[v].step_controls) for v in variants}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"Every variant needs the same tuning budget (number of step controls), got {sizes}.")


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
    up where it stopped. A run of another config there is refused."""
    if not (run_dir / "config.json").exists():
        return Trainer(config, run_dir, progress=False)
    if RunDir(run_dir).train_config().to_json() != config.to_json():
        raise ValueError(f"{run_dir} holds a run of another setting than this comparison's; remove it or choose "
                         f"another --out.")
    return finished_run(config, run_dir) or Trainer.resume(run_dir, progress=False)


def run_compare(out: str | Path, *, task: str = "digit", seeds: int = MIN_SEEDS, quick: bool = False,
                variants=tuple(VARIANTS), learning_rates=LEARNING_RATES, overrides: list[str] | None = None,
                iterations: int | None = None, pipeline: str | None = None, select: str = "training") -> dict:
    """Tune, fix the target, run the reported seeds and write the summary (see the module doc). ``pipeline``
    (e.g. ``"mnist-sd3"``) runs every variant's preset on that pipeline preset's model and ``task``; ``select``
    names the target that chooses each algorithm's setting (``"training"`` or ``"heldout"``)."""
    _check_selection(select)
    if seeds < MIN_SEEDS and not quick:
        raise ValueError(f"The protocol reports at least {MIN_SEEDS} seeds, got seeds={seeds} (use --quick for a smoke test).")
    _check_variants(variants)
    out = Path(out)
    iterations = iterations or (30 if quick else 80)
    budget = [f"iterations={iterations}", "eval.every=10"]
    extra = budget + list(overrides or [])
    for variant in variants:  # every setting must build before any run starts
        for control in VARIANTS[variant].step_controls:
            build(variant, task, TUNING_SEED, learning_rates[0], control, extra, pipeline)

    total = len(variants) * (len(VARIANTS[variants[0]].step_controls) * len(learning_rates) + seeds)
    counter = itertools.count(1)

    def train(variant: str, seed: int, lr: float, control: str) -> Trainer | FinishedRun:
        config = build(variant, task, seed, lr, control, extra, pipeline)
        start = time.monotonic()
        run = start_or_resume(config, out / "runs" / run_name(variant, control, lr, seed))
        if isinstance(run, Trainer):
            run.train()
        how = "read back" if isinstance(run, FinishedRun) else f"{(time.monotonic() - start) / 60:.1f} min"
        print(f"[{next(counter)}/{total}] {variant:<14} {control:<16} lr {lr:<7g} seed {seed}: final reward "
              f"{statistics.mean(m['reward_mean'] for m in run.metrics[-SMOOTHING:]):.3f} ({how})", flush=True)
        return run

    tuning = {variant: {(control, lr): train(variant, TUNING_SEED, lr, control)
                        for control in VARIANTS[variant].step_controls for lr in learning_rates}
              for variant in variants}
    target = target_rule([t.metrics for runs in tuning.values() for t in runs.values()])
    heldout = heldout_target_rule([t.evaluations for runs in tuning.values() for t in runs.values()])
    chosen, sweep = {}, {}
    for variant, runs in tuning.items():
        results = {key: summarise_run(t.metrics, t.evaluations, target["target"], heldout["target"])
                   for key, t in runs.items()}
        chosen[variant] = min(results, key=lambda key: selection_key(results[key], by=select))
        sweep[variant] = {f"{control} lr {lr:g}": result for (control, lr), result in results.items()}
    protocol = {"task": task, "pipeline": pipeline, "tuning_seed": TUNING_SEED, "reported_seeds": list(range(seeds)), "budget": budget,
                "overrides": list(overrides or []), "learning_rates": list(learning_rates),
                "step_controls": {v: VARIANTS[v].step_controls for v in variants}, **target, "heldout": heldout,
                "selection": select, "chosen": {v: {"step_control": c, "lr": lr} for v, (c, lr) in chosen.items()}}
    atomic_write_text(out / "protocol.json", json.dumps(protocol, indent=2) + "\n")  # fixed before the reported runs
    print(f"target {target['target']:.4f} (base {target['base']:.4f}, ceiling {target['ceiling']:.4f})", flush=True)

    runs, curves = {}, {}
    for variant in variants:
        control, lr = chosen[variant]
        trainers = [train(variant, seed, lr, control) for seed in range(seeds)]
        runs[variant] = [summarise_run(t.metrics, t.evaluations, target["target"], heldout["target"]) for t in trainers]
        curves[variant] = [t.metrics for t in trainers]
    ratios = {}
    if REFERENCE in runs:
        for variant in runs:
            if variant != REFERENCE:
                ratios[variant] = {key: median_ratio_interval([r[key] for r in runs[REFERENCE]], [r[key] for r in runs[variant]])
                                   for key in TRAINING_RATIO_KEYS + HELDOUT_RATIO_KEYS}
    summary = {"protocol": protocol, "task": task, "target_reward": target["target"], "seeds": seeds,
               "algorithms": {v: _aggregate(r) | protocol["chosen"][v] for v, r in runs.items()},
               "ratios_vs_" + REFERENCE: ratios, "per_seed": runs, "tuning": sweep}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out / "summary.md", markdown_table(summary))
    for x_key, label in (("train_seconds", "wall-clock seconds"), ("nfe_cumulative", "NFE per sample"),
                         ("grad_steps", "gradient steps")):
        plot_curves(curves, x_key, label, target["target"], out / f"reward_vs_{x_key}.png")
    return summary


def _cell(value) -> str:
    return "—" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value))


def markdown_table(summary: dict) -> str:
    p = summary["protocol"]
    keys = ["step_control", "lr", "time_to_target_s", "cpu_time_to_target_s", "nfe_to_target", "steps_to_target",
            "final_reward", "final_accuracy", "judge_gap", "diversity", "seconds_per_iteration",
            "nfe_per_sample_per_iteration", "clip_fraction", "approx_kl_sq"]
    selected = SELECTIONS[p.get("selection", "training")].label  # protocols before --select have no key
    lines = [f"Task `{summary['task']}`, {summary['seeds']} reported seed(s) (tuning seed {p['tuning_seed']}; each "
             f"algorithm's setting selected by the {selected} target). "
             f"Target {p['target']:.4f} = {p['rule']}: base {p['base']:.4f}, ceiling {p['ceiling']:.4f}.", "",
             "Medians over seeds (to target; a seed that never reaches it counts as infinite), means otherwise.", "",
             "| algorithm | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for algo, row in summary["algorithms"].items():
        lines.append(f"| {algo} | " + " | ".join(_cell(row.get(k)) for k in keys) + " |")
    ratios = summary[f"ratios_vs_{REFERENCE}"]
    if ratios:
        lines += ["", f"Ratio of {REFERENCE}'s median to each algorithm's, bootstrap {INTERVAL:.0%} interval:", "",
                  "| algorithm | time | CPU time | NFE |", "|---|---|---|---|"]
        lines += _ratio_rows(ratios, TRAINING_RATIO_KEYS)
    lines += _heldout_table(summary) + _phase_table(summary["algorithms"]) + _breakdown_table(summary["algorithms"])
    return "\n".join(lines) + "\n"


def _ratio_cell(ratio: dict) -> str:
    """The ratio and its interval; a ratio whose interval is not estimable says so, with the share of resamples
    in which both medians were finite (the interval needs 90%)."""
    if ratio["ratio"] is None:
        return "—"
    if ratio["interval"] is None:
        return f"{ratio['ratio']:.2f} (no interval: {ratio['estimable_share']:.0%} of resamples estimable)"
    return f"{ratio['ratio']:.2f} [{ratio['interval'][0]:.2f}, {ratio['interval'][1]:.2f}]"


def _ratio_rows(ratios: dict, keys: tuple[str, ...]) -> list[str]:
    return [f"| {algo} | " + " | ".join(_ratio_cell(by_key[key]) for key in keys) + " |" for algo, by_key in ratios.items()]


def _heldout_table(summary: dict) -> list[str]:
    heldout, ratios = summary["protocol"]["heldout"], summary[f"ratios_vs_{REFERENCE}"]
    lines = ["", f"Held-out target {heldout['target']:.4f} = {heldout['rule']}: base {heldout['base']:.4f}, ceiling "
             f"{heldout['ceiling']:.4f} (one sampler for every algorithm; a clock that ticks once per evaluation). "
             f"Medians over seeds, and the ratio of {REFERENCE}'s median to each algorithm's:", "",
             "| algorithm | reached | time (s) | NFE | ratio: time | ratio: NFE |", "|---|---|---|---|---|---|"]
    for algo, row in summary["algorithms"].items():
        cells = [row["heldout_time_to_target_s_reached"], _cell(row["heldout_time_to_target_s"]),
                 _cell(row["heldout_nfe_to_target"])]
        cells += [_ratio_cell(ratios[algo][key]) if algo in ratios else "—" for key in HELDOUT_RATIO_KEYS]
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return lines


def _phase_table(algorithms: dict) -> list[str]:
    lines = ["", "Where the time goes: mean seconds per iteration of each phase (share of the iteration):", "",
             "| algorithm | " + " | ".join(phase.removesuffix("_s") for phase in ITERATION_PHASES) + " |",
             "|---" * (len(ITERATION_PHASES) + 1) + "|"]
    for algo, row in algorithms.items():
        total = row["mean_iteration_s"]
        lines.append(f"| {algo} | " + " | ".join(f"{row[f'mean_{p}']:.2f} ({100 * row[f'mean_{p}'] / total:.0f}%)"
                                                 for p in ITERATION_PHASES) + " |")
    return lines


def _breakdown_table(algorithms: dict) -> list[str]:
    keys = sorted({key.removeprefix("final_") for row in algorithms.values() for key in row
                   if key.startswith("final_") and "/" in key and not key.endswith("_std")})
    if not keys:
        return []
    lines = ["", "The held-out evaluation by part, base -> final (means over seeds):", "",
             "| part | " + " | ".join(algorithms) + " |", "|---" * (len(algorithms) + 1) + "|"]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(f"{_cell(row.get(f'base_{key}'))} -> {_cell(row.get(f'final_{key}'))}"
                                                for row in algorithms.values()) + " |")
    return lines


def plot_curves(curves: dict, x_key: str, label: str, target: float, path: Path) -> None:
    """Mean training reward (seed band: min to max over seeds) against ``x_key``."""
    plt = pyplot()

    fig, axis = plt.subplots(figsize=(6, 4))
    for algo, seeds in curves.items():
        length = min(len(run) for run in seeds)
        x = [statistics.mean(run[i][x_key] for run in seeds) for i in range(length)]
        values = [[run[i]["reward_mean"] for run in seeds] for i in range(length)]
        axis.plot(x, [statistics.mean(v) for v in values], label=algo)
        if len(seeds) > 1:
            axis.fill_between(x, [min(v) for v in values], [max(v) for v in values], alpha=0.2)
    axis.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    axis.set(xlabel=label, ylabel="mean training reward")
    axis.legend()
    fig.tight_layout()
    save_figure(fig, path)
