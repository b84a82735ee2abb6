"""Where a few-step rollout's training reward parts from its held-out reward: each run trained twice, evaluated once
with the protocol's sampler and once with the rollout's own, separates the sampler from the rest.

    python -m vgrpo_lib.benchmarks.analysis.sampler_gap results/sampler-gap-mnist-sd3-digit \
        --comparison results/compare-mnist-sd3-digit-nfe-decay > results/sampler-gap-mnist-sd3-digit/gap.md

A protocol comparison reads an algorithm's training reward on its own rollouts of the training prompts, and its
held-out reward with one sampler for every algorithm (the evaluation's, 20 Euler steps on MNIST-SD3) on prompts held
out of training. ``vgrpo+lean`` rolls out with 6 Euler steps, so its training reward and its held-out reward differ
in both the sampler and the prompts. The folder holds, for each seed, the same run (the comparison's chosen setting)
trained twice, ``runs/eval<N>_seed<S>`` evaluated with ``eval.num_steps=N``: the evaluation draws nothing from the
training's random streams, so both train alike (checked here, every iteration's training reward and loss), and the
difference of their held-out rewards is the sampler's alone. The rest of the gap (the training reward over the
held-out reward at the rollout's sampler) is the prompts' and the training reward's own noise: one batch of rollouts
per iteration, smoothed over a few iterations, crosses a target on a high draw first.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, read_stored_text
from vgrpo_lib.benchmarks.analysis import first_heldout_iteration, study_parser
from vgrpo_lib.benchmarks.compare.protocol import SMOOTHING
from vgrpo_lib.benchmarks.compare.stats import smoothed

__all__ = ["main", "sampler_gap"]

RUN_NAME = re.compile(r"eval(?P<steps>\d+)_seed(?P<seed>\d+)")
TRAINING_COLUMNS = ("reward_mean", "loss_objective")  # equal row by row in both runs of a seed


@dataclass
class _PairedSeed:
    """One seed's two runs: the sampler steps of each (``few`` < ``many``), whether they trained alike, the smoothed
    training reward per iteration and each run's evaluations."""
    seed: int
    few: int
    many: int
    same_training: bool
    training: list[float]
    evaluations: dict[int, list[dict]]  # {steps: the run's eval.jsonl rows}

    @property
    def heldout(self) -> dict[int, dict[int, float]]:
        """``{steps: {iteration: held-out reward}}``."""
        return {steps: {e["iteration"]: e["reward_mean"] for e in rows} for steps, rows in self.evaluations.items()}

    def rows(self) -> list[tuple[int, float, float, float]]:
        """``(iteration, training, held-out with many steps, held-out with few)`` at each evaluation of both runs."""
        heldout = self.heldout
        return [(it, self.training[min(it, len(self.training) - 1)], heldout[self.many][it], heldout[self.few][it])
                for it in sorted(set(heldout[self.few]) & set(heldout[self.many]))]


def _paired_seeds(folder: Path) -> list[_PairedSeed]:
    """Every seed of ``folder/runs`` (``eval<steps>_seed<seed>``), each with exactly two runs."""
    runs: dict[int, dict[int, RunDir]] = {}
    for path in sorted((folder / "runs").iterdir()):
        match = RUN_NAME.fullmatch(path.name)
        if match is None:
            raise ValueError(f"{path}: not a run of this study (expected runs/eval<steps>_seed<seed>)")
        runs.setdefault(int(match["seed"]), {})[int(match["steps"])] = RunDir(path)
    seeds = []
    for seed, by_steps in sorted(runs.items()):
        if len(by_steps) != 2:
            raise ValueError(f"{folder}/runs: seed {seed} has {len(by_steps)} runs, not one per sampler (two)")
        (few, few_run), (many, many_run) = sorted(by_steps.items())
        metrics = [few_run.read_rows("metrics.csv"), many_run.read_rows("metrics.csv")]
        if len(metrics[0]) != len(metrics[1]):
            raise ValueError(f"seed {seed}: the two runs trained {len(metrics[0])} and {len(metrics[1])} iterations")
        same = all(a[key] == b[key] for a, b in zip(*metrics) for key in TRAINING_COLUMNS)
        evaluations = {steps: run.read_jsonl("eval.jsonl") for steps, run in by_steps.items()}
        seeds.append(_PairedSeed(seed, few, many, same, smoothed(metrics[1]), evaluations))
    return seeds


def _seed_section(paired: _PairedSeed, training_target: float, heldout_target: float) -> list[str]:
    few, many = paired.few, paired.many
    rows = paired.rows()
    lines = [f"## Seed {paired.seed}", "",
             f"Training identical in both runs (each iteration's {' and '.join(TRAINING_COLUMNS)}): "
             f"{'yes' if paired.same_training else 'NO: the held-out columns are not paired'}.", "",
             f"| iteration | training reward (smoothed) | held-out, {many} steps | held-out, {few} steps "
             f"| sampler gap ({few} - {many}) | rest (training - held-out {few}) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {it} | {train:.3f} | {high:.3f} | {low:.3f} | {low - high:+.3f} | {train - low:+.3f} |"
              for it, train, high, low in rows]
    reached = next((str(i) for i, v in enumerate(paired.training) if v >= training_target), "never")
    lines += ["", f"First iteration at the training target ({training_target:.4f}): {reached}; first evaluation at "
                  f"the held-out target ({heldout_target:.4f}) with {many} steps: "
                  f"{first_heldout_iteration(paired.evaluations[many], heldout_target)}, with {few} steps: "
                  f"{first_heldout_iteration(paired.evaluations[few], heldout_target)}.", ""]
    return lines


def _mean_gaps(seeds: list[_PairedSeed]) -> list[str]:
    """The sampler's gap and the rest averaged over the seeds and their evaluations after the base one."""
    rows = [row for paired in seeds for row in paired.rows() if row[0] > 0]
    sampler = [low - high for _, _, high, low in rows]
    rest = [train - low for _, train, _, low in rows]
    return [f"Over {len(seeds)} seeds and {len(rows)} evaluations after the base one: sampler gap "
            f"{statistics.mean(sampler):+.3f} (range {min(sampler):+.3f} to {max(sampler):+.3f}), the rest "
            f"{statistics.mean(rest):+.3f} (range {min(rest):+.3f} to {max(rest):+.3f}).", ""]


def sampler_gap(folder: Path, comparison: Path) -> str:
    """The study's report: per seed, the training reward and both held-out rewards at each evaluation, the
    sampler's gap and the rest, and when each reaches the targets of ``comparison`` (its ``summary.json``)."""
    protocol = json.loads(read_stored_text(comparison / "summary.json"))["protocol"]
    training_target, heldout_target = protocol["target"], protocol["heldout"]["target"]
    seeds = _paired_seeds(folder)
    lines = [f"# Training reward against held-out reward, by sampler ({folder.name})", "",
             f"Targets from `{comparison.name}`: training {training_target:.4f}, held-out {heldout_target:.4f}. "
             f"Training reward: the mean of the last {SMOOTHING} iterations' rollout rewards, as the training "
             f"target reads it.", ""]
    lines += _mean_gaps(seeds)
    for paired in seeds:
        lines += _seed_section(paired, training_target, heldout_target)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    args = study_parser(__doc__, "the study's folder (its runs/eval<N>_seed<S>)").parse_args(argv)
    sys.stdout.write(sampler_gap(args.folder, args.comparison))
    return 0


if __name__ == "__main__":
    sys.exit(main())
