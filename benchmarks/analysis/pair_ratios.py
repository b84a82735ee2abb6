"""One algorithm's median costs to a finished comparison's targets over another's, with the protocol's bootstrap
interval: a comparison's own ratio tables divide by its first variant (``vgrpo``); issue 30's target divides
``vgrpo+`` by DiffusionNFT. Reads the comparison's ``summary.json`` (or its compressed copy: the per-seed rows the
comparison reported), trains nothing.

    python -m vgrpo_lib.benchmarks.analysis.pair_ratios results/protocol-digit-beyond vgrpo+ diffusion_nft \\
        > results/protocol-digit-beyond/vgrpo+_over_diffusion_nft.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import read_stored_text
from vgrpo_lib.benchmarks.compare import HELDOUT_RATIO_KEYS, TRAINING_RATIO_KEYS, median_ratios, ratio_cell
from vgrpo_lib.errors import UsageError

__all__ = ["pair_ratios", "main"]


def pair_ratios(comparison: Path, numerator: str, denominator: str) -> str:
    """The table of ``numerator``'s median over ``denominator``'s for each cost to the training and held-out targets
    (:func:`vgrpo_lib.benchmarks.compare.median_ratios`), with the seeds that reached each and the final held-out
    rewards. A UsageError names an algorithm the comparison did not report."""
    summary = json.loads(read_stored_text(comparison / "summary.json"))
    per_seed, rows = summary["per_seed"], summary["algorithms"]
    missing = [name for name in (numerator, denominator) if name not in per_seed]
    if missing:
        raise UsageError(f"{comparison}: no reported runs of {', '.join(missing)}; it reported {', '.join(per_seed)}.")
    ratios = median_ratios(per_seed[numerator], per_seed[denominator])
    lines = [f"{comparison.name}: {numerator}'s median over {denominator}'s ({len(per_seed[numerator])} and "
             f"{len(per_seed[denominator])} seeds; a seed that never reached a target counts as infinite), 90% bootstrap "
             "interval.", "", f"| cost to target | {numerator} reached | {denominator} reached | ratio |", "|---|---|---|---|"]
    for key in TRAINING_RATIO_KEYS + HELDOUT_RATIO_KEYS:
        lines.append(f"| {key} | {rows[numerator][key + '_reached']} | {rows[denominator][key + '_reached']} | "
                     f"{ratio_cell(ratios[key])} |")
    lines += ["", "| final value (mean ± sd) | " + f"{numerator} | {denominator} |", "|---|---|---|"]
    for key in ("final_eval_reward", "final_reward", "final_accuracy", "judge_accuracy"):
        cells = [f"{rows[name][key]:.3f} ± {rows[name].get(key + '_std', 0.0):.3f}" if key in rows[name] else "—"
                 for name in (numerator, denominator)]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", type=Path, help="a finished comparison's folder (its summary.json)")
    parser.add_argument("numerator", help="the algorithm whose median costs are divided, e.g. vgrpo+")
    parser.add_argument("denominator", help="the algorithm they are divided by, e.g. diffusion_nft")
    args = parser.parse_args(argv)
    sys.stdout.write(pair_ratios(args.comparison, args.numerator, args.denominator))
    return 0


if __name__ == "__main__":
    sys.exit(main())
