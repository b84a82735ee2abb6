"""Cost accounting: per-iteration time split and NFE per algorithm at equal batch, and how V-GRPO's cost grows
with group size, K and image size.

Each measurement is a short training run (``ITERATIONS`` iterations after one warm-up iteration) through the
real trainer; the per-phase seconds are medians over iterations. NFE is model evaluations per sample per
iteration as the trainer counts it (paper accounting for V-GRPO: rollout steps + K without grad, unless
single-step, + K with grad per gradient step).

    python -m vgrpo_lib.benchmarks.cost --out results/cost.json
    python -m vgrpo_lib.benchmarks.cost --task pair --phases-only --out results/cost-pair.json   # the per-phase split on a task
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from vgrpo_lib.algorithms.presets import build_config
from vgrpo_lib.algorithms.costs import ITERATION_PHASES
from vgrpo_lib.algorithms.run_dir import atomic_write_text
from vgrpo_lib.algorithms.trainer import Trainer

__all__ = ["ITERATIONS", "QUIET_EVAL", "measure", "phase_split", "run", "main"]

ITERATIONS = 4
QUIET_EVAL = ["eval.per_prompt=1", "eval.num_steps=2", "eval.every=0"]


def measure(algo: str, overrides: list[str]) -> dict:
    config = build_config(algo, None, "testbed", [f"iterations={ITERATIONS + 1}", *QUIET_EVAL, *overrides])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(config, Path(tmp) / "run", progress=False)
        trainer.train()
    rows = trainer.metrics[1:]
    out = {phase: statistics.median(row[phase] for row in rows) for phase in ITERATION_PHASES}
    out.update({key: rows[-1][key] for key in ("nfe_rollout", "nfe_prepare", "nfe_update", "nfe_per_sample")})
    out["cpu_s_per_iteration"] = (rows[-1]["train_cpu_s"] - trainer.metrics[0]["train_cpu_s"]) / len(rows)
    return out


def phase_split(task: str) -> dict:
    """Per-phase seconds of each algorithm's iteration on ``task`` as the comparison runs it (no KL to the base)."""
    report = {}
    for algo, extra in (("vgrpo", ["vgrpo.ref_kl_coef=none"]), ("flow_grpo", []), ("diffusion_nft", [])):
        report[algo] = measure(algo, [f"task={task}", *extra])
        print(algo, json.dumps(report[algo]), flush=True)
    return {"task": task, "algorithms": report}


def run(quick: bool = False) -> dict:
    report = {"algorithms": {}, "vgrpo_scaling": {}}
    for algo, extra in (("vgrpo", []), ("vgrpo", ["optim.epochs=2"]), ("flow_grpo", []), ("diffusion_nft", [])):
        name = algo + ("_2_epochs" if extra else "")
        report["algorithms"][name] = measure(algo, extra)
        print(name, json.dumps(report["algorithms"][name]), flush=True)
    sweeps = {
        "group_size": [f"group_size={g}" for g in ((4, 16) if quick else (4, 8, 16, 32))],
        "num_pairs": [f"vgrpo.num_pairs={k}" for k in ((1, 8) if quick else (1, 2, 4, 8))],
        "image": ["task=digit", "task=pair"],
    }
    for axis, settings in sweeps.items():
        for setting in settings:
            report["vgrpo_scaling"][setting] = measure("vgrpo", [setting, "vgrpo.ref_kl_coef=none"])
            print(setting, json.dumps(report["vgrpo_scaling"][setting]), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--task", default=None, help="with --phases-only: the task (default the testbed's digit)")
    parser.add_argument("--phases-only", action="store_true", help="only the per-phase split of each algorithm")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = phase_split(args.task or "digit") if args.phases_only else run(args.quick)
    if args.out:
        atomic_write_text(Path(args.out), json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
