#!/usr/bin/env bash
# The device command's body: 5 seeds of each SETTING, all side by side on one GPU, one CPU thread each, every
# run cut at LIMIT seconds (its evaluations so far are kept), then nvidia-smi's view after 60 s.
# A SETTING is VARIANT (the protocol's chosen setting) or VARIANT:STEP_CONTROL:LR.
#
#   bash results/gpu-geneval/run.sh OUT ITERATIONS LIMIT SETTING ...
set -uo pipefail
out=$1 iterations=$2 limit=$3
shift 3
mkdir -p "$out/runs" "$out/stdout"
start=$(date +%s)
for setting in "$@"; do
  IFS=: read -r variant control lr <<< "$setting"
  extra=() name=$variant
  if [[ -n $control ]]; then
    extra=(--step-control "$control" --lr "$lr") name=${variant}_${control}_lr$lr
  fi
  for seed in 0 1 2 3 4; do
    OMP_NUM_THREADS=1 timeout "$limit" python3 -m vgrpo_lib.benchmarks.analysis.gpu_geneval_train_one "$variant" "$seed" "$iterations" \
      "$out/runs/${name}_seed$seed" "${extra[@]}" > "$out/stdout/${name}_seed$seed.log" 2>&1 &
  done
done
sleep 60 && nvidia-smi > "$out/nvidia_smi_at_60s.txt" 2>&1 &
wait
echo "all $(( 5 * $# )) ended after $(( $(date +%s) - start )) s"
grep -l "done$" "$out"/stdout/*.log | wc -l | xargs echo "finished:"
