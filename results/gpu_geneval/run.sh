#!/usr/bin/env bash
# The device command's body: the 15 runs (3 algorithms x 5 seeds) of train_one.py side by side on one GPU, one
# CPU thread each, every run cut at LIMIT seconds (its evaluations so far are kept), then nvidia-smi's view.
#
#   bash results/gpu_geneval/run.sh OUT ITERATIONS LIMIT
set -uo pipefail
out=$1 iterations=$2 limit=$3
mkdir -p "$out/runs" "$out/stdout"
start=$(date +%s)
for variant in vgrpo diffusion_nft flow_grpo; do
  for seed in 0 1 2 3 4; do
    OMP_NUM_THREADS=1 timeout "$limit" python3 results/gpu_geneval/train_one.py "$variant" "$seed" "$iterations" \
      "$out/runs/${variant}_seed$seed" > "$out/stdout/${variant}_seed$seed.log" 2>&1 &
  done
done
sleep 60 && nvidia-smi > "$out/nvidia_smi_at_60s.txt" 2>&1 &
wait
echo "all 15 ended after $(( $(date +%s) - start )) s"
grep -l "done$" "$out"/stdout/*.log | wc -l | xargs echo "finished:"
