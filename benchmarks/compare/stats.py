"""The statistics of the controlled comparison: smoothed training reward, the two target rules, time (wall-clock,
CPU), NFE and gradient steps to a target, one run's summary row, medians over seeds and the bootstrap interval of
a ratio of medians, and the sort key that selects a tuning setting."""

from __future__ import annotations

import math
import random
import statistics

from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.benchmarks.compare.protocol import SELECTIONS, SMOOTHING, TARGET_FRACTION, check_selection

__all__ = [
    "BOOTSTRAP_RESAMPLES", "DIAGNOSTICS", "EXCEEDS_SUFFIX", "HELDOUT_RATIO_KEYS", "INTERVAL", "OPTIONAL_COSTS", "TO_TARGET",
    "TRAINING_RATIO_KEYS", "aggregate_seeds", "first_heldout_evaluation", "heldout_target_rule",
    "heldout_time_to_target", "median_ratio_interval", "median_ratios",
    "HELDOUT_KEPT", "keeps_heldout_target", "selection_key", "smoothed", "summarise_run", "target_rule",
    "time_to_target",
]

BOOTSTRAP_RESAMPLES = 2000
INTERVAL = 0.9
DIAGNOSTICS = ("clip_fraction", "clip_fraction_active", "approx_kl_k3", "approx_kl_sq")
TRAINING_RATIO_KEYS = ("time_to_target_s", "cpu_time_to_target_s", "nfe_to_target")
HELDOUT_RATIO_KEYS = ("heldout_time_to_target_s", "heldout_nfe_to_target")
HELDOUT_KEPT = SELECTIONS["heldout-kept"].kept_key  # the summary column: the run ended at or above the held-out target


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


EXCEEDS_SUFFIX = "_exceeds"  # KEY_exceeds: a missed target's lower bound (the run's cost at its end)
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


def first_heldout_evaluation(evaluations: list[dict], target: float) -> dict | None:
    """The first evaluation after the base one (iteration 0) whose held-out reward reaches ``target`` (None if none
    does): where the protocol's held-out clock stops."""
    return next((e for e in evaluations if e["iteration"] > 0 and e["reward_mean"] >= target), None)


def heldout_time_to_target(evaluations: list[dict], target: float) -> dict:
    """The same at :func:`first_heldout_evaluation`, keys prefixed ``heldout_``. Its clock ticks once per evaluation
    (``eval.every`` iterations)."""
    return _costs_at(first_heldout_evaluation(evaluations, target), "heldout_")


def _exceeds(costs: dict, end: dict) -> dict:
    """``KEY_exceeds`` for each cost to a target in ``costs``: where the run never reached the target (None), its
    cost at its end (``end``, the same keys), which the cost to the target exceeds; None where it reached it."""
    return {key + EXCEEDS_SUFFIX: end[key] if value is None else None for key, value in costs.items()}


def summarise_run(metrics: list[dict], evaluations: list[dict], target: float, heldout_target: float) -> dict:
    """One run's row of the summary from its ``metrics`` (one row per iteration) and ``evaluations`` (the base one
    first): costs to ``target`` and to ``heldout_target`` (and, for a target it missed, ``KEY_exceeds``: the cost
    at its end, a lower bound on the cost to the target), final rewards and evaluation, cost per iteration and per
    phase, the ratio diagnostics and the evaluation's breakdowns (base and final)."""
    final = evaluations[-1]
    tail = [m["reward_mean"] for m in metrics[-SMOOTHING:]]
    training, heldout = time_to_target(metrics, target), heldout_time_to_target(evaluations, heldout_target)
    out = {
        **training, **_exceeds(training, _costs_at(metrics[-1])),
        **heldout, **_exceeds(heldout, _costs_at(final, "heldout_")),
        "final_reward": statistics.mean(tail),
        "final_eval_reward": final["reward_mean"],
        HELDOUT_KEPT: keeps_heldout_target(final["reward_mean"], heldout_target),
        "final_accuracy": _defined(final.get("accuracy")),
        "judge_accuracy": _defined(final.get("judge_accuracy")),
        "judge_gap": _defined(final.get("judge_gap")),
        "diversity": _defined(final.get("diversity")),
        "base_accuracy": _defined(evaluations[0].get("accuracy")),
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
        out[f"base_{key}"], out[f"final_{key}"] = _defined(evaluations[0][key]), _defined(final[key])
    return out


def _defined(value: float | None) -> float | None:
    """``value``, or None where an evaluation leaves it undefined (NaN: e.g. the diversity of one sample per prompt,
    ``eval.per_prompt=1``), so the summary counts it as missing, as it does an absent one, instead of averaging a
    NaN. The headline numbers cannot be NaN (evaluation stops a diverged run), the diagnostics can."""
    return None if value is None or math.isnan(value) else value


def keeps_heldout_target(final_eval_reward: float, heldout_target: float) -> bool:
    """Whether a run's final held-out evaluation is still at or above the held-out target: its row's
    ``HELDOUT_KEPT`` column, which ``select="heldout-kept"`` reads."""
    return final_eval_reward >= heldout_target


def _finite(value) -> float:
    return math.inf if value is None else float(value)


def median_ratio_interval(reference: list, other: list, *, other_exceeds: list | None = None,
                          resamples: int = BOOTSTRAP_RESAMPLES, level: float = INTERVAL, seed: int = 0) -> dict:
    """``median(reference) / median(other)`` and its bootstrap ``level`` interval (each list resampled with
    replacement on its own, ``resamples`` times, fixed RNG). None stands for a seed that never reached the
    target (infinite); a ratio with an infinite median is reported as None (not estimable).

    ``other_exceeds`` (aligned with ``other``: for each seed of ``other`` that missed, the cost it exceeds, its run's
    cost at its end; :func:`summarise_run`'s ``KEY_exceeds``) adds ``"bound"`` where ``other`` missed: the ratio and
    the interval's upper end with those misses counted at their bounds and ``reference``'s misses as infinite, on
    the same resamples. A miss's cost is above its bound, so each bounded draw is at least the draw the unknown
    costs would give: the bound's ratio and upper end are upper bounds of the ratio and of the interval's upper end,
    finite even where half of ``other``'s seeds never reached the target."""
    rng = random.Random(seed)
    a, b = [_finite(v) for v in reference], [_finite(v) for v in other]
    bounded = None
    if other_exceeds is not None and any(v is None for v in other):
        if len(other_exceeds) != len(other) or any(v is None and e is None for v, e in zip(other, other_exceeds)):
            raise ValueError("other_exceeds needs a bound for each seed of other that never reached the target, "
                             f"got {other_exceeds} for {other}")
        bounded = [float(e) if v is None else float(v) for v, e in zip(other, other_exceeds)]

    def ratio(x, y):
        mx, my = statistics.median(x), statistics.median(y)
        return None if math.isinf(mx) or math.isinf(my) or my == 0 else mx / my

    draws, bound_draws = [], []
    for _ in range(resamples):
        # Indices drawn as random.choices draws values (one random() per pick), so the draws of earlier versions
        # of this function, which resampled the values, are unchanged.
        i, j = rng.choices(range(len(a)), k=len(a)), rng.choices(range(len(b)), k=len(b))
        draws.append(ratio([a[k] for k in i], [b[k] for k in j]))
        if bounded is not None:  # every bounded cost is finite: no ratio only where the reference's median is not
            bound_draws.append(ratio([a[k] for k in i], [bounded[k] for k in j]))
    finite = sorted(d for d in draws if d is not None)
    tail = (1.0 - level) / 2
    interval = None
    if len(finite) >= 0.9 * resamples:  # at most 10% of the resamples not estimable
        interval = [finite[int(tail * (len(finite) - 1))], finite[int((1 - tail) * (len(finite) - 1))]]
    out = {"ratio": ratio(a, b), "interval": interval, "level": level, "resamples": resamples,
           "estimable_share": len(finite) / resamples}
    if bounded is not None:  # a draw without a ratio is an infinite one here: it bounds nothing, and sorts last
        ordered = sorted(bound_draws, key=lambda d: math.inf if d is None else d)
        out["bound"] = {"ratio": ratio(a, bounded), "upper": ordered[int((1 - tail) * (resamples - 1))]}
    return out


def median_ratios(numerator: list[dict], denominator: list[dict]) -> dict:
    """Per cost to a target (:data:`TRAINING_RATIO_KEYS`, :data:`HELDOUT_RATIO_KEYS`): the median over the
    ``numerator`` runs' rows (:func:`summarise_run`) over the median over the ``denominator`` runs', with its
    bootstrap interval (:func:`median_ratio_interval`), and its bound where the ``denominator`` runs missed a target
    and their rows hold the cost they exceed (``KEY_exceeds``; summaries made before it have none)."""
    def exceeds(key):  # None where a missed run's bound is unknown (CPU time of runs made before it was logged)
        bounds = [r.get(key + EXCEEDS_SUFFIX) for r in denominator]
        return None if any(r[key] is None and bound is None for r, bound in zip(denominator, bounds)) else bounds

    return {key: median_ratio_interval([r[key] for r in numerator], [r[key] for r in denominator],
                                       other_exceeds=exceeds(key))
            for key in TRAINING_RATIO_KEYS + HELDOUT_RATIO_KEYS}


def aggregate_seeds(per_seed: list[dict]) -> dict:
    """One algorithm's row over seeds: the median of each cost to target (a seed that never reaches it counts as
    infinite; an infinite median is None) and how many seeds reached it (``KEY_reached``, "3/5"); the mean and
    standard deviation of every other value that no seed lacks."""
    out = {}
    for key in per_seed[0]:
        values = [run[key] for run in per_seed]
        if key.endswith(EXCEEDS_SUFFIX):
            continue  # a bound per missed seed, for the ratios (median_ratios), not a value to average
        if key.endswith("to_target") or key.endswith("to_target_s"):
            median = statistics.median(_finite(v) for v in values)
            out[key] = None if math.isinf(median) else median
            out[f"{key}_reached"] = f"{sum(v is not None for v in values)}/{len(values)}"
        elif all(v is not None for v in values):
            out[key] = statistics.mean(values)
            if len(values) > 1:
                out[f"{key}_std"] = statistics.stdev(values)
    return out



def selection_key(results: dict | list[dict], by: str = "training") -> tuple:
    """Sort key of a tuning setting from its run (a :func:`summarise_run` row) or its runs on several tuning seeds
    (a list of rows): fewer seeds that missed the target first, then the earlier median time to it (a miss counts
    as infinite), then the higher mean final reward. For one run: reached first, then earlier, then the higher final
    reward. ``by`` names the target: the protocol selects by ``"training"``; ``"heldout"`` asks which setting the
    held-out target would have chosen (``python -m vgrpo_lib.benchmarks.analysis.heldout_selection``);
    ``"heldout-kept"`` counts a run that reached the held-out target and ended below it as a miss."""
    check_selection(by)
    selection = SELECTIONS[by]
    rows = [results] if isinstance(results, dict) else list(results)
    times = [None if selection.kept_key and not row[selection.kept_key] else row[selection.time_key] for row in rows]
    return (sum(time is None for time in times), statistics.median(map(_finite, times)),
            -statistics.mean(row[selection.reward_key] for row in rows))
