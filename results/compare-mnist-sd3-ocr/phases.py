"""Per-phase seconds per iteration of each algorithm's reported runs (the README's last column).

    python results/compare-mnist-sd3-ocr/phases.py > results/compare-mnist-sd3-ocr/phases.txt
"""
import csv
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
PHASES = ("rollout_s", "reward_s", "prepare_s", "update_s", "iteration_s")
protocol = json.loads((HERE / "protocol.json").read_text())
for variant, chosen in protocol["chosen"].items():
    rows = [row for seed in protocol["reported_seeds"] for row in csv.DictReader(
        open(HERE / "runs" / f"{variant}_{chosen['step_control']}_lr{chosen['lr']:g}_seed{seed}" / "metrics.csv"))]
    means = {p: statistics.mean(float(r[p]) for r in rows) for p in PHASES}
    print(variant, " ".join(f"{p} {means[p]:.3f} ({100 * means[p] / means['iteration_s']:.0f}%)" for p in PHASES))
