"""Probe: how well rapidocr reads MNIST-SD3 numbers (60 held-out numbers) at digit strides 20, 24 and 28,
through five views (inverted, thickened, binarised, both, blurred): the probe behind ``render.NUMBER_STRIDE``
and ``ocr_view``.

    python -m vgrpo_lib.benchmarks.analysis.mnist_sd3_ocr_layout_probe
"""

from __future__ import annotations

import sys
import time, torch, torch.nn.functional as F
from vgrpo_lib.integrations.testbed.data import load_mnist
import vgrpo_lib.integrations.testbed.mnist_sd3.render as R
from vgrpo_lib.integrations.testbed.mnist_sd3.prompts import number_prompts
from vgrpo_lib.integrations.rewards.simple import to_uint8_hwc
from vgrpo_lib.integrations.rewards.simple import ocr_engine

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    torch.set_num_threads(1)
    imgs, labels = load_mnist("eval")
    nums = [n for _, n in number_prompts("eval")][:60]
    eng = ocr_engine()
    def rec(view):
        out=[]
        for a in to_uint8_hwc(view):
            res, _ = eng(a, use_det=False, use_cls=False, use_rec=True)
            out.append(res[0][0] if res else "")
        return out
    def acc(view):
        texts = rec(view); return sum(a.replace(" ","")==b for a,b in zip(texts,nums))/len(nums)
    for stride in (20, 24, 28):
        R.NUMBER_STRIDE = stride
        x = R.render_numbers(imgs, labels, nums, torch.Generator().manual_seed(0))
        g = R.grey(x)
        thick = F.max_pool2d(g, 3, 1, 1)
        thick2 = F.max_pool2d(g, (3,2), 1, (1,0))[..., :96] if False else F.max_pool2d(F.pad(g,(0,1,1,1)), (3,2), 1)
        binar = (g > 0.3).float()
        for name, v in [("inv", 1-g), ("thick", 1-thick), ("bin", 1-binar), ("thickbin", 1-(thick>0.3).float()), ("blur", 1-F.avg_pool2d(thick,3,1,1))]:
            print(stride, name, acc(v.expand(-1,3,-1,-1)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
