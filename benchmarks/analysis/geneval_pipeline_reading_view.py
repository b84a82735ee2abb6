"""How well rapidocr reads exact renderings of GenEval digit specs through ``canvas_reading_view``, by number of
3x3 box blurs (the view's ``blurs``): the mean order-free OCR reward and the share read exactly, on the 96 canvases
of the task's test (two of every fourth held-out spec, seed 0) and on 128 training specs (seed 1).

    python -m vgrpo_lib.benchmarks.analysis.geneval_pipeline_reading_view > results/mnist-sd3-geneval-pipeline/reading_view.log
"""

from __future__ import annotations

import sys
import functools
import torch
from vgrpo_lib.integrations.rewards import get_reward
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import compose
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import geneval_specs
from vgrpo_lib.integrations.tasks.mnist_sd3 import canvas_reading_view, geneval_digits_text

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    SETS = {
        "test's 96 held-out canvases": ([s for s in geneval_specs("eval")[::4][:48] for _ in range(2)], "eval", 0),
        "128 training specs": (geneval_specs("train")[::7][:128], "train", 1),
    }
    for name, (specs, split, seed) in SETS.items():
        images = compose(specs, split, torch.Generator().manual_seed(seed), layout="slots").images
        prompts = [s["prompt"] for s in specs]
        for blurs in (0, 1, 2):
            view = functools.partial(canvas_reading_view, blurs=blurs)
            reward = get_reward("ocr", target=geneval_digits_text, single_line=True, view=view, order_free=True)
            scores = reward(images, prompts)
            print(f"{name:28s} blurs {blurs}: mean reward {scores.mean():.3f}, read exactly {(scores == 1).float().mean():.3f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
