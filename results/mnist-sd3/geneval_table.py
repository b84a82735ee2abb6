"""GenEval's table of a `--task geneval` run: the base (iteration 0) and every later held-out evaluation, by the
reward detector and by the judge, per category and overall, with the run's training minutes at each evaluation.

    python results/mnist-sd3/geneval_table.py results/mnist-sd3/main-geneval > results/mnist-sd3/main-geneval/geneval_table.md
"""
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.integrations.rewards.geneval import GENEVAL_TAGS

run = Path(sys.argv[1])
evaluations = RunDir(run).read_jsonl("eval.jsonl")  # eval.jsonl or its .gz
print(f"| iteration | training min | reader | {' | '.join(GENEVAL_TAGS)} | overall | diversity |")
print("|---" * (len(GENEVAL_TAGS) + 5) + "|")
for e in evaluations:
    for reader, prefix, overall in (("detector", "geneval/", "accuracy"), ("judge", "judge_geneval/", "judge_accuracy")):
        cells = " | ".join(f"{e[prefix + tag]:.3f}" for tag in GENEVAL_TAGS)
        print(f"| {e['iteration']} | {e['train_seconds'] / 60:.1f} | {reader} | {cells} | {e[overall]:.3f} | "
              f"{e['diversity']:.3f} |")
