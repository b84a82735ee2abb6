"""One algorithm's median costs to a finished comparison's targets over another's, with the protocol's bootstrap
interval: a comparison's own ratio tables divide by its first variant (``vgrpo``); issue 30's target divides
``vgrpo+`` by DiffusionNFT. Reads the comparison's ``summary.json`` (or its compressed copy: the per-seed rows the
comparison reported), trains nothing. With ``--cell CELL`` it divides one lever cell by the same cell of another
algorithm (two ``vgrpo levers`` folders, their ``levers.json``): a lever applied to both sides of a comparison.

    python -m vgrpo_lib.benchmarks.analysis.pair_ratios results/protocol-digit-beyond vgrpo+ diffusion_nft \\
        > results/protocol-digit-beyond/vgrpo+_over_diffusion_nft.md
    python -m vgrpo_lib.benchmarks.analysis.pair_ratios --cell lr_cosine LEVERS_A LEVERS_B
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import read_stored_text
from vgrpo_lib.benchmarks.compare import HELDOUT_RATIO_KEYS, TRAINING_RATIO_KEYS, median_ratios, ratio_cell
from vgrpo_lib.errors import UsageError

__all__ = ["lever_pair_ratios", "pair_ratios", "main"]


def pair_ratios(comparison: Path, numerator: str, denominator: str) -> str:
    """The table of ``numerator``'s median over ``denominator``'s for each cost to the training and held-out targets
    (:func:`vgrpo_lib.benchmarks.compare.median_ratios`), with the seeds that reached each and the final held-out
    rewards. A UsageError names an algorithm the comparison did not report."""
    summary = json.loads(read_stored_text(comparison / "summary.json"))
    per_seed, rows = summary["per_seed"], summary["algorithms"]
    missing = [name for name in (numerator, denominator) if name not in per_seed]
    if missing:
        raise UsageError(f"{comparison}: no reported runs of {', '.join(missing)}; it reported {', '.join(per_seed)}.")
    return _table(comparison.name, (numerator, per_seed[numerator], rows[numerator]),
                  (denominator, per_seed[denominator], rows[denominator]))


def lever_pair_ratios(numerator: Path, denominator: Path, cell: str) -> str:
    """The same table for the lever ``cell`` of two ``vgrpo levers`` folders (each its ``levers.json``), each side
    named by its algorithm and cell; a UsageError names a folder without that cell, or two folders whose targets
    differ (levers of different comparisons: their rows would not be comparable)."""
    reports = [json.loads(read_stored_text(folder / "levers.json")) for folder in (numerator, denominator)]
    for folder, report in zip((numerator, denominator), reports):
        if cell not in report["cells"]:
            raise UsageError(f"{folder}: no cell {cell!r}; it has {', '.join(report['cells'])}.")
    if len({(r["target"], r["heldout_target"]) for r in reports}) > 1:
        raise UsageError(f"{numerator} and {denominator} measure against different targets; compare levers of one "
                         f"comparison.")
    sides = [(f"{r['variant']} {cell}", r["cells"][cell]["per_seed"], r["cells"][cell]) for r in reports]
    return _table(f"{cell} on {numerator.name} and {denominator.name}", *sides)


def _table(title: str, numerator: tuple[str, list, dict], denominator: tuple[str, list, dict]) -> str:
    """The ratio and final-value tables of two sides, each (name, per-seed rows, their aggregate row)."""
    (num, num_runs, num_row), (den, den_runs, den_row) = numerator, denominator
    ratios = median_ratios(num_runs, den_runs)
    lines = [f"{title}: {num}'s median over {den}'s ({len(num_runs)} and {len(den_runs)} seeds; a seed that never "
             "reached a target counts as infinite), 90% bootstrap interval.", "",
             f"| cost to target | {num} reached | {den} reached | ratio |", "|---|---|---|---|"]
    for key in TRAINING_RATIO_KEYS + HELDOUT_RATIO_KEYS:
        lines.append(f"| {key} | {num_row[key + '_reached']} | {den_row[key + '_reached']} | {ratio_cell(ratios[key])} |")
    lines += ["", f"| final value (mean ± sd) | {num} | {den} |", "|---|---|---|"]
    for key in ("final_eval_reward", "final_reward", "final_accuracy", "judge_accuracy"):
        cells = [f"{row[key]:.3f} ± {row.get(key + '_std', 0.0):.3f}" if key in row else "—"
                 for row in (num_row, den_row)]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="ARG",
                        help="COMPARISON NUMERATOR DENOMINATOR (a finished comparison's folder and two of its "
                             "algorithms, e.g. vgrpo+ diffusion_nft); with --cell: NUMERATOR_LEVERS DENOMINATOR_LEVERS "
                             "(two `vgrpo levers` folders)")
    parser.add_argument("--cell", default=None, help="a lever cell both levers folders ran, e.g. lr_cosine")
    args = parser.parse_args(argv)
    expected = 2 if args.cell else 3
    if len(args.paths) != expected:
        parser.error(f"expected {expected} arguments{' with --cell' if args.cell else ''}, got {len(args.paths)}")
    if args.cell:
        sys.stdout.write(lever_pair_ratios(Path(args.paths[0]), Path(args.paths[1]), args.cell))
    else:
        sys.stdout.write(pair_ratios(Path(args.paths[0]), *args.paths[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
