"""Whether a comparison's held-out lag is the held-out phrasings': each chosen run trained again, evaluated on the
training prompts instead of the held-out ones.

    python -m vgrpo_lib.benchmarks.analysis.phrasing_gap results/phrasing-gap-mnist-sd3-digit \
        --comparison results/compare-mnist-sd3-digit-k4 > results/phrasing-gap-mnist-sd3-digit/gap.md

On MNIST-SD3 ``digit`` the evaluation prompts are phrasings held out of training ("the digit seven" against "a
handwritten seven"), so a policy that learns its training phrasings faster than the digits would show a held-out
reward that lags its training reward. The folder holds, per algorithm and seed, the comparison's run
(``runs/heldout_<setting>_seed<S>``, evaluated on the held-out prompts) and the same config trained again with the
evaluation on the training prompts (``runs/training_<setting>_seed<S>``). The evaluation draws nothing from the
training's random streams, so both train alike up to float rounding (the prompt encodings are computed in batches
of another composition, and rounding grows with the learning rate): the report says for how many iterations their
training rewards are equal and their largest difference after, and the difference of their evaluations is the
phrasings' (and, where the runs part, that of two nearly equal trainings).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.benchmarks.analysis import first_heldout_iteration, study_parser
from vgrpo_lib.benchmarks.compare.protocol import SMOOTHING
from vgrpo_lib.benchmarks.compare.stats import smoothed

__all__ = ["main", "phrasing_gap"]

RUN_NAME = re.compile(r"(?P<prompts>heldout|training)_(?P<setting>.+)_seed(?P<seed>\d+)")


def _pairs(folder: Path) -> dict[str, dict[int, dict[str, RunDir]]]:
    """``{setting: {seed: {"heldout": run, "training": run}}}`` of ``folder/runs``; a seed without both is refused."""
    runs: dict[str, dict[int, dict[str, RunDir]]] = {}
    for path in sorted((folder / "runs").iterdir()):
        match = RUN_NAME.fullmatch(path.name)
        if match is None:
            raise ValueError(f"{path}: not a run of this study (expected runs/heldout|training_<setting>_seed<S>)")
        runs.setdefault(match["setting"], {}).setdefault(int(match["seed"]), {})[match["prompts"]] = RunDir(path)
    for setting, seeds in runs.items():
        for seed, pair in seeds.items():
            if len(pair) != 2:
                raise ValueError(f"{folder}/runs: {setting} seed {seed} has only its {', '.join(pair)} run")
    return runs


def _setting_section(setting: str, seeds: dict[int, dict[str, RunDir]], heldout_target: float) -> list[str]:
    lines = [f"## {setting}", ""]
    gaps, read_gaps, firsts = [], [], []
    for seed, pair in sorted(seeds.items()):
        rows = {name: run.read_rows("metrics.csv") for name, run in pair.items()}
        if len(rows["heldout"]) != len(rows["training"]):
            raise ValueError(f"{setting} seed {seed}: the two runs trained {len(rows['heldout'])} and "
                             f"{len(rows['training'])} iterations")
        differences = [abs(a["reward_mean"] - b["reward_mean"]) for a, b in zip(rows["heldout"], rows["training"])]
        equal = next((i for i, d in enumerate(differences) if d > 0), len(differences))
        training = smoothed(rows["heldout"])
        evaluations = {name: run.read_jsonl("eval.jsonl") for name, run in pair.items()}
        heldout, on_training = ({e["iteration"]: e["reward_mean"] for e in evaluations[name]}
                                for name in ("heldout", "training"))
        iterations = sorted(set(heldout) & set(on_training))
        lines += [f"Seed {seed}: the two runs' training rewards are equal for the first {equal} iterations, then "
                  f"differ by at most {max(differences):.1e}.", "",
                  "| iteration | training reward (smoothed) | evaluation, held-out prompts | evaluation, training "
                  "prompts | training - held-out prompts |", "|---|---|---|---|---|"]
        for it in iterations:
            lines.append(f"| {it} | {training[min(it, len(training) - 1)]:.3f} | {heldout[it]:.3f} | "
                         f"{on_training[it]:.3f} | {on_training[it] - heldout[it]:+.3f} |")
            gaps.append((it, on_training[it] - heldout[it]))
            read_gaps.append((it, heldout[it] - training[min(it, len(training) - 1)]))
        firsts.append((seed, *(first_heldout_iteration(evaluations[name], heldout_target) for name in ("heldout", "training"))))
        lines.append("")
    base = [gap for it, gap in gaps if it == 0]
    after = [gap for it, gap in gaps if it > 0]
    lines.append(f"Over {len(seeds)} seeds: phrasing gap (training-prompt evaluation minus held-out) "
                 f"{statistics.mean(base):+.3f} at the base policy, {statistics.mean(after):+.3f} on average over "
                 f"the {len(after)} evaluations after it (range {min(after):+.3f} to {max(after):+.3f}).")
    read = [gap for it, gap in read_gaps if it > 0]
    lines.append(f"The held-out-prompt evaluation minus the smoothed training reward: {statistics.mean(read):+.3f} on "
                 f"average over those evaluations (range {min(read):+.3f} to {max(read):+.3f}).")
    lines += [f"Seed {seed}: first evaluation at the held-out target ({heldout_target:.4f}) on the held-out prompts "
              f"{held}, on the training prompts {on}." for seed, held, on in firsts]
    return lines + [""]


def phrasing_gap(folder: Path, comparison: Path) -> str:
    """The study's report: per setting and seed, the smoothed training reward and the evaluation on each prompt set
    at every evaluation, their difference, and when each evaluation first reaches ``comparison``'s held-out target
    (its ``summary.json``)."""
    protocol = json.loads(read_stored_text(comparison / "summary.json"))["protocol"]
    heldout_target = protocol["heldout"]["target"]
    lines = [f"# Evaluation on the training prompts against the held-out ones ({folder.name})", "",
             f"Held-out target from `{comparison.name}`: {heldout_target:.4f}. Training reward: the mean of the last "
             f"{SMOOTHING} iterations' rollout rewards (the rollout's own sampler), as the training target reads it; "
             f"both evaluations use the protocol's sampler.", ""]
    for setting, seeds in sorted(_pairs(folder).items()):
        lines += _setting_section(setting, seeds, heldout_target)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    args = study_parser(__doc__, "the study's folder (its runs/heldout|training_<setting>_seed<S>)").parse_args(argv)
    sys.stdout.write(phrasing_gap(args.folder, args.comparison))
    return 0


if __name__ == "__main__":
    sys.exit(main())
