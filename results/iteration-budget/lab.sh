#!/bin/bash
# The estimator lab on the base policies of MNIST-SD3's digit, ocr and geneval tasks (README.md): V-GRPO's
# surrogate at K = 4 and 8 and the naive one, run_lab's quick setting, no ground-truth check.
#   bash results/iteration-budget/lab.sh OUT     (from the repository root; writes OUT/TASK/estimators.json, OUT/TASK.log)
# Kept here from its run with OUT=/work/runs/iteration-budget-lab: estimators-TASK.json (OUT/TASK/estimators.json), lab-TASK.log (OUT/TASK.log).
set -e
out=${1:?usage: lab.sh OUT}
for task in digit ocr geneval; do
  /usr/bin/time -v env OMP_NUM_THREADS=1 taskset -c 0 nice -n 5 python -c "
from vgrpo_lib.benchmarks.estimator_lab import run_lab
run_lab('$out/$task', task='$task', preset='mnist-sd3', names=('naive', 'vgrpo', 'vgrpo_k8'), ground_truth=False, quick=True)
" > "$out/$task.log" 2>&1
done
