"""GenEval's table of a `--task geneval` run: the base (iteration 0) and every later held-out evaluation, by the
reward detector and by the judge, per category and overall, with the run's training minutes at each evaluation.

    python -m vgrpo_lib.benchmarks.analysis.geneval_table results/mnist-sd3/main-geneval \
        > results/mnist-sd3/main-geneval/geneval_table.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.integrations.rewards.geneval import GENEVAL_TAGS

__all__ = ["geneval_table", "main"]


def geneval_table(run: Path) -> str:
    """The Markdown table of the evaluations in the run directory ``run`` (``eval.jsonl`` or its .gz)."""
    lines = [f"| iteration | training min | reader | {' | '.join(GENEVAL_TAGS)} | overall | diversity |",
             "|---" * (len(GENEVAL_TAGS) + 5) + "|"]
    for e in RunDir(run).read_jsonl("eval.jsonl"):
        for reader, prefix, overall in (("detector", "geneval/", "accuracy"), ("judge", "judge_geneval/", "judge_accuracy")):
            cells = " | ".join(f"{e[prefix + tag]:.3f}" for tag in GENEVAL_TAGS)
            lines.append(f"| {e['iteration']} | {e['train_seconds'] / 60:.1f} | {reader} | {cells} | {e[overall]:.3f} | "
                         f"{e['diversity']:.3f} |")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run directory of a --task geneval run")
    sys.stdout.write(geneval_table(parser.parse_args(argv).run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
