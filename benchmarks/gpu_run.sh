#!/usr/bin/env bash
# GPU evidence in one prepared script: SD3.5-Medium-size timing (MFU, seconds per iteration at 1024 px) and a
# V-GRPO run on the shipped MNIST-SD3 pipeline, raw outputs written to one folder.
#
#   benchmarks/gpu_run.sh [OUT_DIR]          on a CUDA device (default OUT_DIR: results/gpu-run)
#   benchmarks/gpu_run.sh --cpu OUT_DIR      the same steps at toy size on the CPU (what the test runs)
#
# OUT_DIR/environment.json   torch / CUDA versions and the device name
# OUT_DIR/gpu_timing.json    python -m vgrpo_lib.benchmarks.gpu_timing (SD3.5-M config, bf16, LoRA r=32, 1024 px)
# OUT_DIR/gpu_timing.txt     its printed report
# OUT_DIR/mnist_sd3_vgrpo/   the run directory of `vgrpo train --preset mnist-sd3 --algo vgrpo` (config.json,
#                            metrics.csv with seconds per iteration and the per-phase split, eval.jsonl)
# OUT_DIR/commands.txt       the exact commands, for results/README.md
# Extra arguments after OUT_DIR go to the training run as key=value overrides. The timing and the training run
# are independent evidence: a failure of one does not stop the other; the script fails if either did.
set -uo pipefail

mode=cuda
if [[ "${1:-}" == "--cpu" ]]; then
  mode=cpu
  shift
fi
out=${1:-results/gpu-run}
shift || true
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [[ $mode == cuda ]]; then
  timing=(python -m vgrpo_lib.benchmarks.gpu_timing --out "$out/gpu_timing.json")
  train=(python -m vgrpo_lib.benchmarks.cli train --preset mnist-sd3 --algo vgrpo --out "$out/mnist_sd3_vgrpo" model.device=cuda "$@")
else
  timing=(python -m vgrpo_lib.benchmarks.gpu_timing --tiny --steps 4 --sde-steps 3 --repeats 1 --lora-rank 4
          --out "$out/gpu_timing.json")
  train=(python -m vgrpo_lib.benchmarks.cli train --preset mnist-sd3 --algo vgrpo --out "$out/mnist_sd3_vgrpo" model.device=cpu
         iterations=1 prompts_per_iteration=2 group_size=2 rollout.num_steps=2 eval.num_steps=2 eval.per_prompt=1
         "$@")
fi

python - "$mode" > "$out/environment.json" <<'EOF' || exit 1
import json, platform, sys
import torch
cuda = torch.cuda.is_available()
if sys.argv[1] == "cuda" and not cuda:
    sys.exit("gpu_run.sh: no CUDA device is visible; run with --cpu for the CPU mode.")
print(json.dumps({"mode": sys.argv[1], "torch": torch.__version__, "cuda": torch.version.cuda,
                  "device": torch.cuda.get_device_name(0) if cuda and sys.argv[1] == "cuda" else platform.processor() or "cpu",
                  "python": platform.python_version()}, indent=2))
EOF

printf '%s\n' "${timing[*]}" "${train[*]}" > "$out/commands.txt"
"${timing[@]}" | tee "$out/gpu_timing.txt"
timing_status=$?
"${train[@]}"
train_status=$?
echo "gpu_run.sh: outputs in $out (timing exit status $timing_status, training $train_status)"
[[ $timing_status == 0 && $train_status == 0 ]]
