"""Does the OCR reward of ``--task geneval_ocr`` add legibility beyond what GenEval training gives? Scores samples
(``vgrpo sample`` npz files: ``images``, ``prompts``) by both rewards of ``geneval_ocr`` and GenEval's overall
score (reward detector, GenEval's rules): the base pipeline, the multi-reward run and its control (``--task geneval``,
the same command and iterations).

    vgrpo sample --preset mnist-sd3 --task geneval --per-prompt 4 --seed 0 --out base.npz
    vgrpo sample --run RUN --per-prompt 4 --seed 0 --out RUN.npz                  # each run
    python -m vgrpo_lib.benchmarks.analysis.reading_control base.npz multi.npz control.npz
"""

from __future__ import annotations

import sys
from pathlib import Path
import numpy as np
import torch
from vgrpo_lib.integrations.tasks.mnist_sd3 import geneval_metrics, geneval_reading_reward, geneval_reward

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    reading, geneval = geneval_reading_reward(), geneval_reward()
    print(f"{'samples':24s} {'images':>6s} {'GenEval reward':>14s} {'OCR reward':>10s} {'OCR exact':>9s} "
          f"{'GenEval overall':>15s} {'judge':>6s}")
    for path in argv[1:]:
        data = np.load(path)
        images, prompts = torch.from_numpy(data["images"]), [str(p) for p in data["prompts"]]
        ocr = reading(images, prompts)
        table = geneval_metrics(images, prompts, torch.zeros(len(prompts)))
        print(f"{Path(path).stem:24s} {len(prompts):6d} {geneval(images, prompts).mean():14.3f} {ocr.mean():10.3f} "
              f"{(ocr == 1).float().mean():9.3f} {table['accuracy']:15.3f} {table['judge_accuracy']:6.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
