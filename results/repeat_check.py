"""Do a comparison's reported runs, made again in a later session, repeat the earlier session's? Prints each
earlier seed's final held-out evaluation from the folder's runs beside the earlier summary's, and the mean
seconds per iteration of both (the machines differed), for every algorithm whose chosen setting is the same in
both (a rerun selected by the held-out target may choose another). The earlier summaries are the ones committed
before the reruns (ocr at 7e6e3aa, rerun in session 14; geneval at 6307a69, rerun in session 15), or the original
comparison of a held-out-selected rerun:

    python results/repeat_check.py results/compare-mnist-sd3-ocr <(git show 7e6e3aa:results/compare-mnist-sd3-ocr/summary.json) \
        > results/compare-mnist-sd3-ocr/repeat_check.txt
    python results/repeat_check.py results/compare-mnist-sd3-geneval \
        <(git show 6307a69:results/compare-mnist-sd3-geneval/summary.json) > results/compare-mnist-sd3-geneval/repeat_check.txt
    python results/repeat_check.py results/compare-mnist-sd3-digit-heldout results/compare-mnist-sd3-digit/summary.json \
        > results/compare-mnist-sd3-digit-heldout/repeat_check.txt
    python results/repeat_check.py results/compare-mnist-sd3-ocr-heldout results/compare-mnist-sd3-ocr/summary.json \
        > results/compare-mnist-sd3-ocr-heldout/repeat_check.txt
"""
import json
import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.compare import run_name

folder = Path(sys.argv[1])
earlier, now = json.loads(Path(sys.argv[2]).read_text()), json.loads((folder / "summary.json").read_text())
KEYS = (("final_eval_reward", "reward_mean"), ("final_accuracy", "accuracy"), ("judge_accuracy", "judge_accuracy"))
for variant, chosen in earlier["protocol"]["chosen"].items():
    if now["protocol"]["chosen"].get(variant) != chosen:
        print(f"{variant:<14} chosen {chosen} earlier, {now['protocol']['chosen'].get(variant)} now: not compared")
        continue
    for seed in earlier["protocol"]["reported_seeds"]:
        final = RunDir(folder / "runs" / run_name(variant, chosen["step_control"], chosen["lr"], seed)).read_jsonl("eval.jsonl")[-1]
        before = earlier["per_seed"][variant][seed]
        cells = "  ".join(f"{key} {before[key]:.4f} -> {final[column]:.4f}" for key, column in KEYS)
        same = all(before[key] == final[column] for key, column in KEYS)
        print(f"{variant:<14} seed {seed}: {cells}  {'identical' if same else 'DIFFERENT'}")
    print(f"{variant:<14} mean seconds per iteration: earlier {earlier['algorithms'][variant]['mean_iteration_s']:.2f}, "
          f"now {now['algorithms'][variant]['mean_iteration_s']:.2f}")
