"""Train some runs of a running `vgrpo compare` on the other core, so that the comparison reads them back.
usage: python parallel_runs.py OUT variant:control:lr:seed ...   (MNIST-Wan comparison settings below)"""
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.benchmarks.compare import build, run_name, train_to_end

out = Path(sys.argv[1])
extra = ["iterations=30", "eval.every=10", "eval.per_prompt=1"]
for spec in sys.argv[2:]:
    variant, control, lr, seed = spec.split(":")
    lr, seed = float(lr), int(seed)
    run_dir = out / "runs" / run_name(variant, control, lr, seed)
    if RunDir(run_dir).lock_holder() is not None:
        print(f"{run_dir.name}: in use, skipped", flush=True)
        continue
    config = build(variant, "motion", seed, lr, control, extra, "mnist-wan")
    run, how = train_to_end(config, run_dir)
    print(f"{run_dir.name}: {how}", flush=True)
