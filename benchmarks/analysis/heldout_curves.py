"""How each algorithm's held-out reward rises per iteration in a finished comparison, beside its training reward.

    python -m vgrpo_lib.benchmarks.analysis.heldout_curves results/compare-mnist-sd3-ocr-lean \
        > results/compare-mnist-sd3-ocr-lean/heldout_curves.md

For each algorithm at the setting the comparison chose, the mean over its reported seeds at every evaluation of: the
held-out reward (one sampler for every algorithm, prompts held out of training), the training reward as the training
target reads it (its own rollouts of the training prompts, the mean of the last ``SMOOTHING`` iterations up to the
evaluated policy's first rollout), their difference, and the seconds trained so far. A protocol that gives every
algorithm the same iterations stops a cheap iteration early: the seconds column says where each algorithm stands at
the same clock, the held-out column whether it learns less per iteration, and the difference whether its training
reward promises more than the held-out sampler finds (so that it reaches the training target and not the held-out one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.benchmarks.compare.protocol import SMOOTHING, run_name
from vgrpo_lib.benchmarks.compare.stats import smoothed

__all__ = ["heldout_curves", "main"]


def _algorithm_rows(comparison: Path, protocol: dict, variant: str) -> list[tuple[int, float, float, float]]:
    """``(iteration, held-out, training, seconds)`` at each evaluation, each the mean over the reported seeds."""
    chosen, seeds = protocol["chosen"][variant], protocol["reported_seeds"]
    per_seed = []
    for seed in seeds:
        run = RunDir(comparison / "runs" / run_name(variant, chosen["step_control"], chosen["lr"], seed))
        metrics, evaluations = run.read_rows("metrics.csv"), run.read_jsonl("eval.jsonl")
        training = smoothed(metrics)
        per_seed.append({e["iteration"]: (e["reward_mean"], training[min(e["iteration"], len(training) - 1)],
                                          e["train_seconds"]) for e in evaluations})
    iterations = sorted(per_seed[0])
    if any(sorted(rows) != iterations for rows in per_seed):
        raise ValueError(f"{comparison}: {variant}'s reported seeds were evaluated at different iterations")
    return [(it, *(statistics.mean(rows[it][k] for rows in per_seed) for k in range(3))) for it in iterations]


def heldout_curves(comparison: Path) -> str:
    """The report of the finished comparison folder ``comparison`` (its ``summary.json``, compressed or not, and
    its reported runs under ``runs/``): one table per algorithm, then the held-out rewards side by side."""
    protocol = json.loads(read_stored_text(comparison / "summary.json"))["protocol"]
    curves = {variant: _algorithm_rows(comparison, protocol, variant) for variant in protocol["chosen"]}
    seeds = len(protocol["reported_seeds"])
    lines = [f"# Held-out and training reward per evaluation ({comparison.name})", "",
             f"Means over the {seeds} reported seeds of each algorithm's chosen setting. Targets: training "
             f"{protocol['target']:.4f} (the training reward, smoothed over {SMOOTHING} iterations), held-out "
             f"{protocol['heldout']['target']:.4f}.", ""]
    for variant, rows in curves.items():
        chosen = protocol["chosen"][variant]
        lines += [f"## {variant} ({chosen['step_control']}, lr {chosen['lr']:g})", "",
                  "| iteration | held-out reward | training reward | training - held-out | seconds |",
                  "|---|---|---|---|---|"]
        lines += [f"| {it} | {heldout:.3f} | {training:.3f} | {training - heldout:+.3f} | {seconds:.0f} |"
                  for it, heldout, training, seconds in rows]
        lines.append("")
    variants = list(curves)
    by_iteration = [{it: heldout for it, heldout, _, _ in curves[v]} for v in variants]
    shared = sorted(set.intersection(*(set(rows) for rows in by_iteration)))
    lines += ["## Held-out reward by iteration, side by side", "",
              "| iteration | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    lines += [f"| {it} | " + " | ".join(f"{rows[it]:.3f}" for rows in by_iteration) + " |" for it in shared]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("comparison", type=Path, help="a finished comparison's folder (summary.json and runs/)")
    sys.stdout.write(heldout_curves(parser.parse_args(argv).comparison))
    return 0


if __name__ == "__main__":
    sys.exit(main())
