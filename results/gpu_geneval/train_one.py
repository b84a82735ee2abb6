"""One reported run of the MNIST-SD3 GenEval comparison at a longer budget: the setting the comparison's protocol
chose for VARIANT (``results/compare-mnist-sd3-geneval/protocol.json``: tuned on seed 100 at 40 iterations, fixed
before any reported run), seed SEED, ITERATIONS iterations, evaluated every 25, on DEVICE (default cuda).
Everything else is the comparison's config (``benchmarks.compare.build``), so a run differs from the comparison's
reported run of the same seed only in its length, its evaluation interval and where it computes.

    python results/gpu_geneval/train_one.py VARIANT SEED ITERATIONS OUT [DEVICE]
"""
import json
import sys
from pathlib import Path

from algorithms.trainer import Trainer
from benchmarks.compare import build

PROTOCOL = Path(__file__).parents[1] / "compare-mnist-sd3-geneval" / "protocol.json"
EVAL_EVERY = 25

if __name__ == "__main__":
    variant, seed, iterations, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    device = sys.argv[5] if len(sys.argv) > 5 else "cuda"
    protocol = json.loads(PROTOCOL.read_text())
    chosen = protocol["chosen"][variant]
    config = build(variant, protocol["task"], seed, chosen["lr"], chosen["step_control"],
                   [f"iterations={iterations}", f"eval.every={EVAL_EVERY}", *protocol["overrides"],
                    f"model.device={device}"], protocol["pipeline"])
    Trainer(config, out, progress=False).train()
    print(f"{variant} seed {seed}: done")
