"""Would selecting each algorithm's setting by the held-out target have chosen differently? The protocol selects
on the tuning seed by the training-reward target (``vgrpo_lib.benchmarks.compare.selection_key``, ``by="training"``);
the training reward is scored on each algorithm's own rollout, which is not neutral between samplers
(``first_iteration_rewards.txt``), while the held-out evaluation is one ODE sampler for all. This reads every kept
comparison's tuning results (``summary.json``, or its compressed copy: one row per setting, no training) and prints, per algorithm, the
setting chosen by each target, the held-out time to target of both on the tuning seed and their final held-out
reward there. A comparison whose choices all agree would report the same runs under either selection.

    python -m vgrpo_lib.benchmarks.analysis.heldout_selection > results/heldout_selection.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

from vgrpo_lib.benchmarks.analysis import heldout_comparisons, results_parser
from vgrpo_lib.benchmarks.compare import selection_key

__all__ = ["heldout_selection", "main"]


def _describe(name: str, row: dict) -> str:
    time = row["heldout_time_to_target_s"]
    reached = "never" if time is None else f"{time:.1f} s"
    return f"{name} (held-out target: {reached}; final held-out reward {row['final_eval_reward']:.3f})"


def heldout_selection(results: Path) -> str:
    """The report over every ``results/*/summary.json`` (or ``summary.json.gz``) selected by the training target. A
    recorded choice that is not the training key's is a ValueError naming the file."""
    lines, changed = [], 0
    for summary_path, summary in heldout_comparisons(results):
        protocol = summary["protocol"]
        if protocol.get("selection", "training") != "training":
            continue  # a rerun selected by the held-out target (its tuning runs are another folder's)
        lines.append(f"{summary_path.parent.name} (held-out target {protocol['heldout']['target']:.4f})")
        for variant, settings in summary["tuning"].items():
            by_training = min(settings, key=lambda name: selection_key(settings[name]))
            by_heldout = min(settings, key=lambda name: selection_key(settings[name], by="heldout"))
            chosen = protocol["chosen"][variant]
            if by_training != f"{chosen['step_control']} lr {chosen['lr']:g}":
                raise ValueError(f"{summary_path}: {variant}'s recorded choice {chosen} is not the training key's "
                                 f"{by_training}")
            same = by_training == by_heldout
            changed += not same
            verdict = "same" if same else "DIFFERENT: " + _describe(by_heldout, settings[by_heldout])
            lines.append(f"  {variant:<15} chosen {_describe(by_training, settings[by_training])}; by held-out: {verdict}")
    lines.append(f"algorithms whose choice would change: {changed}")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(heldout_selection(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
