#!/usr/bin/env bash
# Choosing the estimator before training (issue 30.5): the pilot of `vgrpo estimators --recommend` on the 2-D toy
# (the custom-task tutorial's, at results/toy2d-regime's batch shape) and on the testbed's digit and pair tasks, and
# the toy's training check of the recommendation (no sharing; K = 8 next to results/toy2d-regime's K = 4 cells).
# From the repository root, pinned to one core with one thread:
#   OMP_NUM_THREADS=1 taskset -c 0 bash results/regime-rule/run.sh
set -euo pipefail
OUT="${1:-results/regime-rule}"
TOY=(prompts_per_iteration=4 group_size=16 rollout.num_steps=10)
export PYTHONPATH="docs/examples${PYTHONPATH:+:$PYTHONPATH}"
vgrpo() { python -m vgrpo_lib.benchmarks.cli "$@"; }
vgrpo estimators --recommend --task custom_task:make_task --out "$OUT/toy" "${TOY[@]}"
vgrpo estimators --recommend --task digit --out "$OUT/digit"
vgrpo estimators --recommend --task pair --out "$OUT/pair"
vgrpo ablations --set paper --task custom_task:make_task --seeds 5 --cells k8 --out "$OUT/toy-none-k8" \
  optim.lr=3e-3 "${TOY[@]}" eval.per_prompt=512 eval.num_steps=10 log.backend=csv vgrpo.sharing=none
# Two more batch shapes of the toy (the same 64 samples per iteration): the pilot, then both cells trained.
for shape in "2 32" "16 4"; do
  set -- $shape
  vgrpo estimators --recommend --task custom_task:make_task --out "$OUT/toy-p$1-g$2" \
    prompts_per_iteration=$1 group_size=$2 rollout.num_steps=10
  vgrpo ablations --set paper --task custom_task:make_task --seeds 5 --cells vgrpo without_sharing \
    --out "$OUT/toy-p$1-g$2" optim.lr=3e-3 prompts_per_iteration=$1 group_size=$2 rollout.num_steps=10 \
    eval.per_prompt=512 eval.num_steps=10 log.backend=csv
done
