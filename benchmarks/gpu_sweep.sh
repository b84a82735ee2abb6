#!/usr/bin/env bash
# The GPU throughput sweep of issue 32 item 3 in one prepared script (vgrpo_lib.benchmarks.gpu_sweep says what it
# measures and how to read it): one JSON line per cell, written as it goes, so a call cut short keeps what finished.
#
#   timeout 530 bash benchmarks/gpu_sweep.sh OUT_DIR     on a CUDA device (about 8 minutes on an H100)
#   bash benchmarks/gpu_sweep.sh --cpu OUT_DIR           the same cells at toy size on the CPU (what the test runs):
#                                                        out of memory simulated above 2 samples, no compilation
#
# OUT_DIR/sweep.jsonl        the records: "device" first (torch, CUDA, device name, the peak used), one "cell" per
#                            measurement, "summary" last
# OUT_DIR/sweep.txt          the printed lines (one per cell, then the summary)
# OUT_DIR/commands.txt       the exact command, for results/README.md
# Extra arguments after OUT_DIR go to python -m vgrpo_lib.benchmarks.gpu_sweep (e.g. --budget-s 300).
set -uo pipefail

mode=cuda
if [[ "${1:-}" == "--cpu" ]]; then
  mode=cpu
  shift
fi
out=${1:?usage: gpu_sweep.sh [--cpu] OUT_DIR [gpu_sweep arguments]}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
# Run from OUT_DIR, not the repository root: there the vgrpo_lib/ folder would shadow an installed vgrpo-lib (a
# wheel, as on a bare device image), whose vgrpo_lib.benchmarks exists only as installed (package-dir mapping).
cd "$out" || exit 1

if [[ $mode == cuda ]]; then
  sweep=(python -m vgrpo_lib.benchmarks.gpu_sweep --out "$out" --budget-s 420 "$@")
else
  sweep=(python -m vgrpo_lib.benchmarks.gpu_sweep --tiny --out "$out" --steps 2 --sde-steps 2 --repeats 1
         --lora-rank 4 --max-micro-batch 4 --iteration-samples 2 --simulate-oom-above 2 --no-compile "$@")
fi

printf '%s\n' "${sweep[*]}" > "$out/commands.txt"
"${sweep[@]}" | tee "$out/sweep.txt"
status=$?
echo "gpu_sweep.sh: outputs in $out (exit status $status)"
exit $status
