"""Do a comparison's reported runs, made again in a later session, repeat the earlier session's? Prints each
earlier seed's final held-out evaluation from the folder's runs beside the earlier summary's, and the mean
seconds per iteration of both (the machines differed), for every algorithm whose chosen setting is the same in
both (a rerun selected by the held-out target may choose another). A summary is read as it is or from its compressed
copy (``summary.json.gz``, as results/ keeps it), so the commands below name ``summary.json`` either way. The earlier summaries are the ones committed
before the reruns (ocr at 7e6e3aa, rerun in session 14; geneval at 6307a69, rerun in session 15), or the original
comparison of a held-out-selected rerun:

    python -m vgrpo_lib.benchmarks.analysis.repeat_check results/compare-mnist-sd3-ocr \
        <(git show 7e6e3aa:results/compare-mnist-sd3-ocr/summary.json) > results/compare-mnist-sd3-ocr/repeat_check.txt
    python -m vgrpo_lib.benchmarks.analysis.repeat_check results/compare-mnist-sd3-geneval \
        <(git show 6307a69:results/compare-mnist-sd3-geneval/summary.json) > results/compare-mnist-sd3-geneval/repeat_check.txt
    python -m vgrpo_lib.benchmarks.analysis.repeat_check results/compare-mnist-sd3-digit-heldout \
        results/compare-mnist-sd3-digit/summary.json > results/compare-mnist-sd3-digit-heldout/repeat_check.txt
    python -m vgrpo_lib.benchmarks.analysis.repeat_check results/compare-mnist-sd3-ocr-heldout \
        results/compare-mnist-sd3-ocr/summary.json > results/compare-mnist-sd3-ocr-heldout/repeat_check.txt
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.benchmarks.compare import run_name

__all__ = ["main", "repeat_check"]

KEYS = (("final_eval_reward", "reward_mean"), ("final_accuracy", "accuracy"), ("judge_accuracy", "judge_accuracy"))


def repeat_check(folder: Path, earlier: dict) -> str:
    """The comparison in ``folder`` (its ``summary.json`` and runs) against the ``earlier`` summary."""
    now = json.loads(read_stored_text(folder / "summary.json"))
    lines = []
    for variant, chosen in earlier["protocol"]["chosen"].items():
        if now["protocol"]["chosen"].get(variant) != chosen:
            lines.append(f"{variant:<14} chosen {chosen} earlier, {now['protocol']['chosen'].get(variant)} now: not compared")
            continue
        for seed in earlier["protocol"]["reported_seeds"]:
            run = folder / "runs" / run_name(variant, chosen["step_control"], chosen["lr"], seed)
            final = RunDir(run).read_jsonl("eval.jsonl")[-1]
            before = earlier["per_seed"][variant][seed]
            cells = "  ".join(f"{key} {before[key]:.4f} -> {final[column]:.4f}" for key, column in KEYS)
            same = all(before[key] == final[column] for key, column in KEYS)
            lines.append(f"{variant:<14} seed {seed}: {cells}  {'identical' if same else 'DIFFERENT'}")
        lines.append(f"{variant:<14} mean seconds per iteration: earlier "
                     f"{earlier['algorithms'][variant]['mean_iteration_s']:.2f}, now "
                     f"{now['algorithms'][variant]['mean_iteration_s']:.2f}")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the comparison made again (its summary.json and runs/)")
    parser.add_argument("earlier", type=Path, help="the earlier session's summary.json (or the path of one kept as "
                        "summary.json.gz)")
    args = parser.parse_args(argv)
    sys.stdout.write(repeat_check(args.folder, json.loads(read_stored_text(args.earlier))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
