"""Train the DiffusionNFT tuning runs of the running MNIST-SD3 digit comparison on core 0, last first, so that the
comparison (which trains them last, first first) reads them back. It skips the runs it finished before; before
training a new one it stops if the comparison has started one of the two runs before it in the comparison's order
(its runs take at least 2.5 min, this script's at most 4.5), so the two never train the same run.
usage: OMP_NUM_THREADS=1 PYTHONPATH=/work/runs/site-6432e7b taskset -c 0 python parallel_mnist_sd3.py OUT"""
import sys
from pathlib import Path

from vgrpo_lib.benchmarks.compare import build, run_name, train_to_end

out = Path(sys.argv[1])
budget = ["iterations=40", "eval.every=10", "eval.per_prompt=2"]
order = [(control, lr, seed) for control in ("one_step", "two_epochs", "two_minibatches") for lr in (3e-4, 1e-3, 3e-3)
         for seed in (100, 101, 102)]  # the comparison's order of DiffusionNFT's tuning runs
for index in reversed(range(len(order))):
    control, lr, seed = order[index]
    run_dir = out / "runs" / run_name("diffusion_nft", control, lr, seed)
    if run_dir.exists():  # this script's own finished runs (it stops before any run the comparison starts)
        continue
    if any((out / "runs" / run_name("diffusion_nft", *order[k])).exists() for k in range(max(index - 2, 0), index)):
        print(f"the comparison reached one of the two runs before {run_dir.name}: stopping", flush=True)
        break
    config = build("diffusion_nft", "digit", seed, lr, control, budget, "mnist-sd3")
    run, how = train_to_end(config, run_dir)  # a run of an earlier start of this script is read back or resumed
    print(f"{run_dir.name}: {how}", flush=True)
