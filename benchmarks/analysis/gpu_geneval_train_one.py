"""One reported run of the MNIST-SD3 GenEval comparison at a longer budget: the setting the comparison's protocol
chose for VARIANT (``results/compare-mnist-sd3-geneval/protocol.json``, kept compressed as ``.gz``: tuned on seed 100 at 40 iterations, fixed
before any reported run) unless ``--step-control`` and ``--lr`` name another of its tuning grid, seed SEED,
ITERATIONS iterations, evaluated every 25, on ``--device`` (default cuda). Everything else is the comparison's
config (``vgrpo_lib.benchmarks.compare.build``), so a run differs from the comparison's reported run of the same seed only
in its length, its evaluation interval and where it computes.

    python -m vgrpo_lib.benchmarks.analysis.gpu_geneval_train_one VARIANT SEED ITERATIONS OUT [--step-control C --lr LR] [--device D]
"""

from __future__ import annotations

import sys
import argparse
import json
from pathlib import Path
from vgrpo_lib.algorithms.run_dir import read_stored_text
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.benchmarks.compare import build

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    PROTOCOL = Path("results") / "compare-mnist-sd3-geneval" / "protocol.json"
    EVAL_EVERY = 25
    parser = argparse.ArgumentParser()
    parser.add_argument("variant")
    parser.add_argument("seed", type=int)
    parser.add_argument("iterations", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--step-control", default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv[1:])
    protocol = json.loads(read_stored_text(PROTOCOL))
    chosen = protocol["chosen"][args.variant]
    control, lr = args.step_control or chosen["step_control"], args.lr or chosen["lr"]
    if control not in protocol["step_controls"][args.variant] or lr not in protocol["learning_rates"]:
        parser.error(f"{control} at lr {lr:g} is not in the comparison's tuning grid")
    config = build(args.variant, protocol["task"], args.seed, lr, control,
                   [f"iterations={args.iterations}", f"eval.every={EVAL_EVERY}", *protocol["overrides"],
                    f"model.device={args.device}"], protocol["pipeline"])
    Trainer(config, args.out, progress=False).train()
    print(f"{args.variant} ({control}, lr {lr:g}) seed {args.seed}: done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
