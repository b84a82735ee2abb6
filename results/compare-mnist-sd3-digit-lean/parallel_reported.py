"""Train DiffusionNFT's reported runs of the running MNIST-SD3 digit comparison on core 0 once its protocol.json is
written, last seed first; before each run it stops if the comparison has started the run before it in the
comparison's order (the last reported run of vgrpo+lean comes just before DiffusionNFT's seed 0).
usage: OMP_NUM_THREADS=1 PYTHONPATH=/work/runs/site-6432e7b taskset -c 0 python parallel_mnist_sd3_reported.py OUT"""
import json
import sys
import time
from pathlib import Path

from vgrpo_lib.benchmarks.compare import build, run_name, train_to_end

out = Path(sys.argv[1])
budget = ["iterations=40", "eval.every=10", "eval.per_prompt=2"]
while not (out / "protocol.json").exists():
    time.sleep(10)
chosen = json.loads((out / "protocol.json").read_text())["chosen"]
lean, nft = chosen["vgrpo+lean"], chosen["diffusion_nft"]
order = [("vgrpo+lean", lean["step_control"], lean["lr"], 4)] + [
    ("diffusion_nft", nft["step_control"], nft["lr"], seed) for seed in range(5)]
for index in reversed(range(1, len(order))):
    variant, control, lr, seed = order[index]
    run_dir = out / "runs" / run_name(variant, control, lr, seed)
    if run_dir.exists():  # this script's own finished runs
        continue
    if (out / "runs" / run_name(*order[index - 1])).exists():
        print(f"the comparison reached the run before {run_dir.name}: stopping", flush=True)
        break
    config = build(variant, "digit", seed, lr, control, budget, "mnist-sd3")
    run, how = train_to_end(config, run_dir)
    print(f"{run_dir.name}: {how}", flush=True)
