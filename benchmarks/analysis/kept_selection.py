"""Would the ``heldout-kept`` selection (the held-out target reached and still met at the end) choose differently
from the ``heldout`` one (the held-out target reached first)? On MNIST-SD3 ``digit`` at equal compute the held-out
selection chose a rate of ``vgrpo+lean`` that crosses the target first and falls back; this asks where else the
held-out target picks such a setting. It reads each kept comparison's tuning rows (``summary.json``, or its compressed
copy: every tuning seed's rows where there are several, no training), marks a row kept when its final held-out reward
is at or above the comparison's held-out target, and prints per algorithm the held-out choice and, where it differs,
the kept one, each with its median held-out time to target (or how many tuning runs reached it), the tuning runs
that kept it and the mean final held-out reward. Whether the training target chose the same as the held-out one is
``heldout_selection``'s report.

    python -m vgrpo_lib.benchmarks.analysis.kept_selection > results/kept_selection.txt
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from vgrpo_lib.benchmarks.analysis import heldout_comparisons, results_parser
from vgrpo_lib.benchmarks.compare import HELDOUT_KEPT, keeps_heldout_target, selection_key

__all__ = ["kept_selection", "main"]

KEPT = "heldout-kept"


def _describe(name: str, rows: list[dict]) -> str:
    times = [row["heldout_time_to_target_s"] for row in rows]
    reached = [time for time in times if time is not None]
    median = (f"median {statistics.median(times):.1f} s" if len(reached) == len(times) else
              f"{len(reached)}/{len(times)} reached")
    kept = sum(row[HELDOUT_KEPT] for row in rows)
    return (f"{name} ({median}; kept {kept}/{len(rows)}; final held-out reward "
            f"{statistics.mean(row['final_eval_reward'] for row in rows):.3f})")


def kept_selection(results: Path) -> str:
    """The report over every ``results/*/summary.json`` (or ``summary.json.gz``) with a held-out target, one tuning
    seed or several; a comparison selected by either held-out rule whose recorded choice is not that rule's key's is
    a ValueError naming the file."""
    lines, changed, total = [], 0, 0
    for summary_path, summary in heldout_comparisons(results):
        protocol = summary["protocol"]
        target, recorded_by = protocol["heldout"]["target"], protocol.get("selection", "training")
        lines.append(f"{summary_path.parent.name} (selected by {recorded_by}; held-out target {target:.4f})")
        per_seed = summary.get("tuning_per_seed") or {v: {k: [row] for k, row in settings.items()}
                                                       for v, settings in summary["tuning"].items()}
        for variant, settings in per_seed.items():
            settings = {name: [{**row, HELDOUT_KEPT: keeps_heldout_target(row["final_eval_reward"], target)}
                               for row in rows] for name, rows in settings.items()}
            choice = {by: min(settings, key=lambda name: selection_key(settings[name], by=by))
                      for by in ("heldout", KEPT)}
            by_heldout, by_kept = choice["heldout"], choice[KEPT]
            chosen = protocol["chosen"][variant]
            if recorded_by in choice and choice[recorded_by] != f"{chosen['step_control']} lr {chosen['lr']:g}":
                raise ValueError(f"{summary_path}: {variant}'s recorded choice {chosen} is not the {recorded_by} "
                                 f"key's {choice[recorded_by]}")
            total += 1
            changed += by_kept != by_heldout
            verdict = "same" if by_kept == by_heldout else "DIFFERENT: " + _describe(by_kept, settings[by_kept])
            lines.append(f"  {variant:<15} by heldout {_describe(by_heldout, settings[by_heldout])}; by {KEPT}: "
                         f"{verdict}")
    lines.append(f"choices that {KEPT} would change from heldout's: {changed} of {total}")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(kept_selection(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
