"""The report of the controlled comparison: ``summary.md`` (the table per algorithm, the ratios to the reference
with their intervals, the held-out target, where the time goes, the evaluation by part) and the reward plots."""

from __future__ import annotations

import statistics
from pathlib import Path

from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.algorithms.run_dir import pyplot, save_figure
from vgrpo_lib.benchmarks.compare.protocol import REFERENCE, SELECTIONS
from vgrpo_lib.benchmarks.compare.stats import HELDOUT_RATIO_KEYS, INTERVAL, TRAINING_RATIO_KEYS

__all__ = ["markdown_table", "plot_curves", "ratio_cell"]


def _cell(value) -> str:
    return "—" if value is None else (f"{value:.3g}" if isinstance(value, float) else str(value))


def markdown_table(summary: dict) -> str:
    p = summary["protocol"]
    keys = ["step_control", "lr", "time_to_target_s", "cpu_time_to_target_s", "nfe_to_target", "steps_to_target",
            "final_reward", "final_accuracy", "judge_gap", "diversity", "seconds_per_iteration",
            "nfe_per_sample_per_iteration", "clip_fraction", "approx_kl_sq"]
    selected = SELECTIONS[p.get("selection", "training")].label  # protocols before --select have no key
    tuned_on = (f"tuning seeds {', '.join(map(str, p['tuning_seeds']))}" if "tuning_seeds" in p
                else f"tuning seed {p['tuning_seed']}")
    lines = [f"Task `{summary['task']}`, {summary['seeds']} reported seed(s) ({tuned_on}; each "
             f"algorithm's setting selected by the {selected} target). "
             f"Target {p['target']:.4f} = {p['rule']}: base {p['base']:.4f}, ceiling {p['ceiling']:.4f}.", "",
             *_compute_budget(summary), *_lr_decay(p),
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


def _compute_budget(summary: dict) -> list[str]:
    """Under an NFE budget (``vgrpo compare --nfe-budget``), the sentence that states it and the iterations of
    each algorithm's chosen setting; nothing under an iteration budget, which the table's rows share."""
    p = summary["protocol"]
    if "nfe_budget" not in p:
        return []
    iterations = ", ".join(f"{algo} {p['setting_iterations'][algo][row['step_control']]}"
                           for algo, row in summary["algorithms"].items())
    return [f"Equal compute: every setting ran the iterations that fit in {p['nfe_budget']} model evaluations per "
            f"sample; the chosen settings' iterations: {iterations}.", ""]


def _lr_decay(protocol: dict) -> list[str]:
    """Under a decayed learning rate (``vgrpo compare --lr-decay``), the sentence that states it; nothing under a
    constant rate."""
    if protocol.get("lr_decay") is None:
        return []
    return [f"Decayed rate: every setting's learning rate (the rate in its row) fell by a cosine to "
            f"{protocol['lr_decay']:g} of it over the setting's iterations.", ""]


def ratio_cell(ratio: dict) -> str:
    """The ratio and its interval; a ratio whose interval is not estimable says so, with the share of resamples
    in which both medians were finite (the interval needs 90%), and then gives the bound where one is known: the
    upper end of the interval with the other's misses counted at their run's end (``median_ratio_interval``)."""
    if ratio["ratio"] is None:
        return "—"
    if ratio["interval"] is None:
        cell = f"{ratio['ratio']:.2f} (no interval: {ratio['estimable_share']:.0%} of resamples estimable"
        upper = ratio.get("bound", {}).get("upper")
        return cell + ")" if upper is None else cell + f"; upper end ≤ {upper:.2f} with misses at their run's end)"
    return f"{ratio['ratio']:.2f} [{ratio['interval'][0]:.2f}, {ratio['interval'][1]:.2f}]"


def _ratio_rows(ratios: dict, keys: tuple[str, ...]) -> list[str]:
    return [f"| {algo} | " + " | ".join(ratio_cell(by_key[key]) for key in keys) + " |" for algo, by_key in ratios.items()]


def _heldout_table(summary: dict) -> list[str]:
    heldout, ratios = summary["protocol"]["heldout"], summary[f"ratios_vs_{REFERENCE}"]
    lines = ["", f"Held-out target {heldout['target']:.4f} = {heldout['rule']}: base {heldout['base']:.4f}, ceiling "
             f"{heldout['ceiling']:.4f} (one sampler for every algorithm; a clock that ticks once per evaluation). "
             f"Medians over seeds, and the ratio of {REFERENCE}'s median to each algorithm's:", "",
             "| algorithm | reached | time (s) | NFE | ratio: time | ratio: NFE |", "|---|---|---|---|---|---|"]
    for algo, row in summary["algorithms"].items():
        cells = [row["heldout_time_to_target_s_reached"], _cell(row["heldout_time_to_target_s"]),
                 _cell(row["heldout_nfe_to_target"])]
        cells += [ratio_cell(ratios[algo][key]) if algo in ratios else "—" for key in HELDOUT_RATIO_KEYS]
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

