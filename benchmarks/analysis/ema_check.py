"""Does evaluating an EMA of the weights (decay 0.9 every gradient step, DiffusionNFT's official setting, which its
reported runs here use) change V-GRPO's held-out numbers? V-GRPO's chosen setting and reported seeds, with only
``optim.ema_decay=0.9`` added; prints the final evaluation of each seed beside the comparison's run without EMA.

    python -m vgrpo_lib.benchmarks.analysis.ema_check OUT > results/compare-mnist-sd3-ocr/ema_check.txt
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.benchmarks.compare import chosen_config, run_name, start_or_resume

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run it with ``argv`` (default: the command line's arguments)."""
    argv = [__name__, *(sys.argv[1:] if argv is None else argv)]
    HERE, OUT = Path("results/compare-mnist-sd3-ocr"), Path(argv[1])
    protocol = json.loads(read_stored_text(HERE / "protocol.json"))
    chosen = protocol["chosen"]["vgrpo"]
    KEYS = ("reward_mean", "accuracy", "judge_accuracy", "judge_gap", "diversity")
    finals = {"without EMA": [], "EMA 0.9": []}
    for seed in protocol["reported_seeds"]:
        name = run_name("vgrpo", chosen["step_control"], chosen["lr"], seed)
        finals["without EMA"].append(RunDir(HERE / "runs" / name).read_jsonl("eval.jsonl")[-1])
        config = chosen_config(protocol, "vgrpo", seed, ["optim.ema_decay=0.9", "optim.ema_every=1"])
        run = start_or_resume(config, OUT / f"{name}_ema0.9")
        if isinstance(run, Trainer):
            run.train()
        finals["EMA 0.9"].append(run.evaluations[-1])
    print("V-GRPO (" + f"{chosen['step_control']}, lr {chosen['lr']:g}" + "), final held-out evaluation, mean over seeds "
          f"{protocol['reported_seeds']} (per seed in brackets)")
    for label, rows in finals.items():
        print(f"{label:<12} " + "  ".join(f"{k} {statistics.mean(r[k] for r in rows):.3f} "
                                          f"[{', '.join(f'{r[k]:.3f}' for r in rows)}]" for k in KEYS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
