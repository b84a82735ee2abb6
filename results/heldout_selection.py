"""Would selecting each algorithm's setting by the held-out target have chosen differently? The protocol selects
on the tuning seed by the training-reward target (``vgrpo_lib.benchmarks.compare.selection_key``, ``by="training"``); the
training reward is scored on each algorithm's own rollout, which is not neutral between samplers
(``first_iteration_rewards.txt``), while the held-out evaluation is one ODE sampler for all. This reads every kept
comparison's tuning results (``summary.json``: one row per setting, no training) and prints, per algorithm, the
setting chosen by each target, the held-out time to target of both on the tuning seed and their final held-out
reward there. A comparison whose choices all agree would report the same runs under either selection.

    python results/heldout_selection.py > results/heldout_selection.txt
"""
import json
from pathlib import Path

from vgrpo_lib.benchmarks.compare import selection_key

RESULTS = Path(__file__).parent


def describe(name: str, row: dict) -> str:
    time = row["heldout_time_to_target_s"]
    reached = "never" if time is None else f"{time:.1f} s"
    return f"{name} (held-out target: {reached}; final held-out reward {row['final_eval_reward']:.3f})"


changed = 0
for summary_path in sorted(RESULTS.glob("*/summary.json")):
    summary = json.loads(summary_path.read_text())
    protocol = summary.get("protocol", {})
    if "heldout" not in protocol or "tuning" not in summary:
        continue  # kept without the held-out target (its runs' tables were not kept) or before the protocol
    if protocol.get("selection", "training") != "training":
        continue  # a rerun selected by the held-out target (its tuning runs are another folder's)
    print(f"{summary_path.parent.name} (held-out target {protocol['heldout']['target']:.4f})")
    for variant, settings in summary["tuning"].items():
        by_training = min(settings, key=lambda name: selection_key(settings[name]))
        by_heldout = min(settings, key=lambda name: selection_key(settings[name], by="heldout"))
        chosen = protocol["chosen"][variant]
        if by_training != f"{chosen['step_control']} lr {chosen['lr']:g}":
            raise SystemExit(f"{summary_path}: {variant}'s recorded choice {chosen} is not the training key's {by_training}")
        same = by_training == by_heldout
        changed += not same
        verdict = "same" if same else "DIFFERENT: " + describe(by_heldout, settings[by_heldout])
        print(f"  {variant:<15} chosen {describe(by_training, settings[by_training])}; by held-out: {verdict}")
print(f"algorithms whose choice would change: {changed}")
