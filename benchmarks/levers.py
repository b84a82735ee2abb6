"""Levers on the setting a comparison chose: each added alone, then together, under the same protocol.

A lever is a named config switch (:data:`LEVERS`: more pairs, K chosen from the measured noise, an extra epoch
under the ratio clip, a cheaper higher-order rollout, an EMA policy for evaluation) or a multiple of the comparison's
iteration budget (:data:`BUDGET_LEVERS`: the protocol gives every algorithm the same iterations, so an algorithm whose
iteration is cheaper stops sooner and a seed that has not reached a target by then counts as a miss; ``budget_x2``
asks what it does with more of the compute its competitors spent) or a decay of the chosen learning rate over the
run (:data:`DECAY_LEVERS`: ``lr_cosine``, for a rate that crosses a target first and falls back; any algorithm's).
The study takes one algorithm of a comparison (``vgrpo compare``) at the setting the comparison chose for it, adds a
lever, and trains it on the comparison's reported seeds with the comparison's budget; every run is summarised
against the comparison's OWN targets (training and held-out: the targets were fixed by its tuning runs, before any
lever was seen), so the lever's row reads like the comparison's rows::

    vgrpo levers --comparison results/protocol-digit-beyond --variant vgrpo --levers k8 two_epochs dpmpp_2m_6 ema_eval \\
        --out results/levers-digit
    vgrpo levers --comparison DIR --variant vgrpo+ --combine dpmpp_2m_6+ema_eval --out DIR2

Per cell (a lever, or ``A+B`` for levers combined) it reports the median costs to each target, the seconds per
iteration, the final training and held-out rewards, and ratios of median costs (time and NFE per sample) with the
protocol's bootstrap interval (:func:`vgrpo_lib.benchmarks.compare.median_ratio_interval`): against the unchanged
setting (the comparison's own reported runs of that algorithm, ``< 1`` means the lever made it faster) and against the
comparison's DiffusionNFT where it has one (the quantity issue 30's target names). The comparison's runs may have
trained on another machine than the levers': a lever that keeps the cost per iteration shows it in its seconds per
iteration, and the NFE ratios do not depend on it. The ``baseline`` cell (:data:`BASELINE`) trains the unchanged
setting again beside the levers, and every other cell's ratios over it are read on one machine. Any other cell that
leaves the config as it was (e.g. two epochs where the comparison already chose two) is refused by name: it measures
nothing.

Not tuned: a lever runs at the chosen learning rate; one that shifts the best learning rate (more steps per rollout
move the policy further) reads as worse than it is, which the report's text must say where it matters.
Runs are kept as ``OUT/runs/CELL_seedS`` and, like a comparison's, read back or resumed when the command is run again.
The levers can start as soon as the comparison has chosen its settings (its ``protocol.json``, written before its
reported runs): the ratios need its reported runs, so the command run again after the comparison has finished adds
them without training anything.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import atomic_write_text, read_stored_text
from vgrpo_lib.benchmarks.compare import (
    aggregate_seeds, chosen_config, cosine_decay, median_ratios, ratio_cell, summarise_run, train_to_end,
)
from vgrpo_lib.errors import UsageError

__all__ = ["LEVERS", "BUDGET_LEVERS", "DECAY_LEVERS", "BASELINE", "COMBINE_SEPARATOR", "COMPARED_WITH",
           "cell_overrides", "run_levers", "markdown"]

# Each lever as config overrides applied after the chosen setting's (so they win). Algorithm-specific keys name
# V-GRPO's section: the levers are for vgrpo and vgrpo+ (the same loss).
LEVERS: dict[str, tuple[str, ...]] = {
    # Twice the timestep-noise pairs per sample (the regime rule's K = 8 where the pilot's gradient cosine at
    # K = 4 is below 0.7; results/regime-rule/).
    "k8": ("vgrpo.num_pairs=8",),
    # Half the paper's pairs: the update (a quarter to a half of a testbed iteration) costs half, at twice the
    # surrogate's Monte-Carlo noise; whether the cheaper iteration or the noisier step wins is what the cell measures.
    "k2": ("vgrpo.num_pairs=2",),
    # Twice `vgrpo+lean`'s 2 pairs (its update's NFE per sample doubles, the rollout's stays): on MNIST-SD3 digit its
    # held-out reward rises more slowly per iteration than DiffusionNFT's; is the 2-pair surrogate's noise why?
    "k4": ("vgrpo.num_pairs=4",),
    # A second gradient step per rollout under the paper's ratio clip (rollout reuse; off-policy through the ELBO
    # ratio), the soft clip off as in the comparison's two_epochs control.
    "two_epochs": ("optim.epochs=2", "optim.minibatches=1", "advantage.soft_clip=none", "vgrpo.clip_range=0.01"),
    "three_epochs": ("optim.epochs=3", "optim.minibatches=1", "advantage.soft_clip=none", "vgrpo.clip_range=0.01"),
    # V-GRPO needs no SDE: a second-order deterministic rollout (DPM-Solver++(2M)) in 6 steps instead of Euler's
    # 10; the evaluation keeps its own solver and steps (eval.*).
    "dpmpp_2m_6": ("rollout.solver=dpmpp_2m", "rollout.num_steps=6"),
    # The same 6 Euler steps: separates the solver's order from the step count.
    "euler_6": ("rollout.num_steps=6",),
    # 4 Euler steps, for `vgrpo+lean`'s 6: on MNIST-SD3 digit a pilot on the tuning seeds learned as much per iteration
    # with 4 as with 6 at lr 3e-3, for 8 model evaluations per sample and iteration instead of 10
    # (results/rate-pilot-mnist-sd3-digit-k4/).
    "euler_4": ("rollout.num_steps=4",),
    # The update on 4 of each group's 8 samples, those whose rewards vary most (PODS max-variance down-sampling,
    # advantage.downsample): on MNIST-SD3 digit `vgrpo+lean-k4`'s update is half its iteration's time, and a smaller
    # batch per iteration did not learn more per sample (results/batch-pilot-mnist-sd3-digit-k4/): the rollout keeps
    # its 64 samples, the update its most informative contrasts.
    "downsample_4": ("advantage.downsample=4",),
    # The update on each group's best and worst sample only (a quarter of downsample_4's update cost).
    "downsample_2": ("advantage.downsample=2",),
    # Advantages scaled by the batch's reward std instead of each prompt group's (official Flow-GRPO / DiffusionNFT):
    # a group whose samples score alike no longer has its small differences, mostly the reward's noise, blown up to
    # unit scale.
    "batch_scale": ("advantage.scale=batch",),
    # Evaluate an EMA of the policy (DiffusionNFT's official decay 0.9 every step); training is unchanged.
    "ema_eval": ("optim.ema_decay=0.9", "optim.ema_every=1"),
    # K chosen from the noise measured on the training batch every 5th iteration: the smallest K in [2, 16] that
    # keeps the Monte-Carlo share of the within-group surrogate variance at most 0.5 (vgrpo.adaptive_pairs).
    "adaptive_k": ("vgrpo.adaptive_pairs=share=0.5,max=16,every=5",),
    # The same, choosing from moving averages of the measurements (each new one weighted 0.3): on digit one batch's
    # measurement swung K between 2 and 16 (results/levers-digit-vgrpo+/).
    "adaptive_k_smoothed": ("vgrpo.adaptive_pairs=share=0.5,max=16,every=5,smoothing=0.7",),
}
# Each budget lever as the factor on the comparison's iterations (its chosen config's ``iterations``); the evaluation
# keeps its period, so the held-out clock goes on ticking past the comparison's end. On MNIST-SD3 DiffusionNFT's 40
# iterations cost 40 x 46 = 1840 NFE per sample; twice V-GRPO's (22 per iteration) 1760 and three times
# vgrpo+lean's (12) 1440: each at most DiffusionNFT's compute.
BUDGET_LEVERS: dict[str, int] = {"budget_x2": 2, "budget_x3": 3}
# Each learning-rate lever as the fraction of the chosen rate it decays to, by a cosine over the cell's iterations
# (``schedule.lr``; a budget lever in the same cell lengthens the decay with the run): a rate chosen for how soon
# it crosses the target can settle instead of falling back. At DiffusionNFT's compute on MNIST-SD3 digit the
# protocol chose vgrpo+lean's one step at lr 3e-3, which crossed the held-out target first on every tuning seed and
# ended at 0.79, 0.34 and 0.78 (results/compare-mnist-sd3-digit-nfe/).
DECAY_LEVERS: dict[str, float] = {"lr_cosine": 0.1}
# The chosen setting unchanged, trained again beside the levers: the comparison's own runs may have trained on another
# machine (on MNIST-SD3 one 1.3x slower per iteration than a later one), so time ratios over this cell are the ones
# read on one machine. It takes no lever.
BASELINE = "baseline"
COMBINE_SEPARATOR = "+"
COMPARED_WITH = "diffusion_nft"  # the reference of issue 30's target: time over DiffusionNFT's


def cell_overrides(cell: str, iterations: int, lr: float) -> list[str]:
    """The overrides of a cell: one lever's, or several levers' joined by ``+`` (applied in that order);
    ``iterations`` and ``lr``: the comparison's iteration budget, which a budget lever multiplies, and the chosen
    learning rate, from which a decay lever decays over the cell's iterations."""
    if cell == BASELINE:
        return []
    names = cell.split(COMBINE_SEPARATOR)
    if BASELINE in names:
        raise UsageError(f"Cell {cell!r}: {BASELINE!r} is the unchanged setting and takes no lever; name it alone.")
    known = (*LEVERS, *BUDGET_LEVERS, *DECAY_LEVERS)
    unknown = [name for name in names if name not in known]
    if unknown or len(set(names)) < len(names):
        raise UsageError(f"Cell {cell!r}: expected distinct levers joined by {COMBINE_SEPARATOR!r} among "
                         f"{', '.join(known)}; "
                         f"{'unknown ' + ', '.join(map(repr, unknown)) if unknown else 'a repeat'}.")
    total = iterations * math.prod(BUDGET_LEVERS.get(name, 1) for name in names)

    def overrides(name: str) -> tuple[str, ...]:
        if name in BUDGET_LEVERS:
            return (f"iterations={total}",)
        if name in DECAY_LEVERS:
            return (cosine_decay(lr, DECAY_LEVERS[name], total),)
        return LEVERS[name]

    return [override for name in names for override in overrides(name)]


def _read_comparison(comparison: Path, variant: str) -> tuple[dict, dict | None]:
    """The protocol of a comparison whose settings are chosen, and its summary once it has finished (None before:
    the levers' runs need only the chosen setting and the targets, the ratios need the reported runs); refused by
    name before the tuning has chosen, or when the comparison lacks ``variant``."""
    try:
        protocol = json.loads(read_stored_text(comparison / "protocol.json"))
    except FileNotFoundError as error:
        raise UsageError(f"--comparison {comparison} has chosen no setting yet ({error}); run `vgrpo compare` there "
                         f"past its tuning first.") from error
    if variant not in protocol["chosen"]:
        raise UsageError(f"--variant {variant!r} is not in the comparison {comparison}; it has "
                         f"{', '.join(protocol['chosen'])}.")
    try:
        summary = json.loads(read_stored_text(comparison / "summary.json"))
    except FileNotFoundError:
        return protocol, None
    return protocol, summary


def run_levers(comparison: str | Path, out: str | Path, *, variant: str = "vgrpo", cells: list[str]) -> dict:
    """Train ``variant`` of ``comparison`` at the setting it chose with each cell's levers, on the comparison's
    reported seeds, and write ``OUT/levers.json`` and ``OUT/levers.md`` (see the module doc)."""
    comparison, out = Path(comparison), Path(out)
    if not cells:
        raise UsageError("Name at least one lever (--levers) or combination (--combine).")
    protocol, summary = _read_comparison(comparison, variant)
    chosen, seeds = protocol["chosen"][variant], protocol["reported_seeds"]
    unchanged = chosen_config(protocol, variant, seeds[0])  # its iterations: the budget a budget lever multiplies
    overrides = {cell: cell_overrides(cell, unchanged.iterations, unchanged.optim.lr) for cell in cells}
    # Every cell must build, and change something, before any run starts.
    first_seed = {cell: chosen_config(protocol, variant, seeds[0], overrides[cell]) for cell in cells}
    for cell in cells:
        if cell != BASELINE and first_seed[cell].to_json() == unchanged.to_json():
            raise UsageError(f"Cell {cell!r} leaves {variant}'s chosen setting ({chosen['step_control']}, lr "
                             f"{chosen['lr']:g}) unchanged: it measures nothing.")
    references = {} if summary is None else {name: summary["per_seed"][name] for name in (variant, COMPARED_WITH)
                                              if name in summary["per_seed"]}
    report = {"comparison": str(comparison), "variant": variant, "chosen": chosen, "seeds": seeds,
              "target": protocol["target"], "heldout_target": protocol["heldout"]["target"],
              "comparison_finished": summary is not None,
              "references": {name: aggregate_seeds(runs) | _spent(protocol, name, runs) for name, runs in references.items()},
              "cells": {}}
    for cell in cells:
        runs, nfe = [], []
        for seed in seeds:
            run, how = train_to_end(chosen_config(protocol, variant, seed, overrides[cell]),
                                    out / "runs" / f"{cell}_seed{seed}")
            runs.append(summarise_run(run.metrics, run.evaluations, protocol["target"], protocol["heldout"]["target"]))
            nfe.append(run.metrics[-1]["nfe_cumulative"])
            print(f"{cell:<24} seed {seed}: held-out reward {runs[-1]['final_eval_reward']:.3f} ({how})", flush=True)
        report["cells"][cell] = {"overrides": overrides[cell], **aggregate_seeds(runs),
                                 "iterations": first_seed[cell].iterations,
                                 "nfe_per_sample": statistics.mean(nfe), "per_seed": runs}
    if BASELINE in report["cells"]:  # trained on this machine: a reference beside the comparison's own runs
        references[BASELINE] = report["cells"][BASELINE]["per_seed"]
    for cell, row in report["cells"].items():
        row["over"] = {name: median_ratios(row["per_seed"], reference) for name, reference in references.items()
                       if name != cell}
    atomic_write_text(out / "levers.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out / "levers.md", markdown(report))
    return report


def _spent(protocol: dict, name: str, runs: list[dict]) -> dict:
    """The iterations and NFE per sample of ``name``'s reported ``runs`` in the comparison of ``protocol``: its
    chosen config's iterations (a comparison under an NFE budget gives each setting its own), each at the same NFE
    (no variant of a comparison chooses K as it goes)."""
    iterations = chosen_config(protocol, name, protocol["reported_seeds"][0]).iterations
    return {"iterations": iterations,
            "nfe_per_sample": iterations * statistics.mean(r["nfe_per_sample_per_iteration"] for r in runs)}


def _seconds(row: dict, key: str) -> str:
    return f"{row[key]:.0f} s ({row[key + '_reached']})" if row.get(key) is not None else f"— ({row[key + '_reached']})"


def markdown(report: dict) -> str:
    """The report as a table: a row per cell, the comparison's own rows of the algorithm (unchanged) and of
    DiffusionNFT first; ratios over each of them once the comparison has finished."""
    variant = report["variant"]
    lines = [f"{variant} at the setting {report['comparison']} chose ({report['chosen']['step_control']}, lr "
             f"{report['chosen']['lr']:g}), seeds {report['seeds']}; held-out target {report['heldout_target']:.4f}, "
             f"training target {report['target']:.4f}. Times: median over seeds (seeds that reached it). Ratios: "
             f"median time (or NFE per sample) over the other's, 90% bootstrap interval. Times are read on the "
             f"machine each run trained on, and the comparison's rows may come from another (the s / iteration "
             f"column shows it, where a cell's cost per iteration is the unchanged one's); NFE do not depend on it.",
             ""]
    if BASELINE in report["cells"]:
        lines += [f"The {BASELINE} cell is the unchanged setting trained again beside the levers: the ratios over it "
                  f"are read on one machine.", ""]
    if not report["comparison_finished"]:
        lines += ["The comparison has not finished: no ratios yet (run this command again after it: the runs are "
                  "read back).", ""]
    columns = ((variant, "heldout_time_to_target_s"), (variant, "heldout_nfe_to_target"),
               (COMPARED_WITH, "heldout_time_to_target_s"), (COMPARED_WITH, "heldout_nfe_to_target"),
               (COMPARED_WITH, "time_to_target_s"))
    if BASELINE in report["cells"]:
        columns += ((BASELINE, "heldout_time_to_target_s"), (BASELINE, "time_to_target_s"))
    names = {"heldout_time_to_target_s": "held-out time", "heldout_nfe_to_target": "held-out NFE",
             "time_to_target_s": "training time"}
    lines += ["| cell | iterations (NFE / sample) | s / iteration | held-out time | training time | final held-out reward | "
              + " | ".join(f"over {'unchanged ' if reference == variant else ''}{reference} ({names[key]})"
                           for reference, key in columns) + " |",
              "|---|" + "---|" * (5 + len(columns))]
    rows = [(f"{name} (comparison)", row, None) for name, row in report["references"].items()]
    rows += [(name, cell, cell["over"]) for name, cell in report["cells"].items()]
    for name, row, over in rows:
        ratios = [""] * len(columns) if over is None else [
            ratio_cell(over[reference][key]) if reference in over else "—" for reference, key in columns]
        reward = f"{row['final_eval_reward']:.3f} ± {row.get('final_eval_reward_std', 0.0):.3f}"
        budget = f"{row['iterations']} ({row['nfe_per_sample']:.0f})"
        lines.append(f"| {name} | {budget} | {row['seconds_per_iteration']:.2f} | "
                     f"{_seconds(row, 'heldout_time_to_target_s')} | {_seconds(row, 'time_to_target_s')} | "
                     f"{reward} | " + " | ".join(ratios) + " |")
    return "\n".join(lines) + "\n"
