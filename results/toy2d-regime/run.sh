#!/usr/bin/env bash
# The regime map's question on a user's 2-D flow-matching toy (issue 33.6): V-GRPO's estimator defaults against the
# naive estimator, each technique removed in turn and K = 8, 5 seeds, through the public extension path
# (--task custom_task:make_task, the custom-task tutorial's task and settings). From the repository root:
#   OMP_NUM_THREADS=1 taskset -c 1 bash results/toy2d-regime/run.sh
set -euo pipefail
PYTHONPATH="docs/examples${PYTHONPATH:+:$PYTHONPATH}" python -m vgrpo_lib.benchmarks.cli ablations \
  optim.lr=3e-3 prompts_per_iteration=4 group_size=16 rollout.num_steps=10 eval.per_prompt=512 eval.num_steps=10 \
  log.backend=csv \
  --set paper --task custom_task:make_task --seeds 5 --out "${1:-results/toy2d-regime}" \
  --cells vgrpo naive without_sharing without_stratified "without_adaptive (v)" k8
