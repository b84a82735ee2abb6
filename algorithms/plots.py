"""``reward.png``: what a run's curves say at a glance.

    figure = run_figure(metrics, evaluations, {"accuracy": "classifier (reward model)", "judge_accuracy": "judge"})
    plot_run(metrics, evaluations, evaluation_metrics, run_dir / "reward.png")

Left: the mean training reward per iteration. Middle (multi-reward runs only): each reward's raw mean, one curve
each (their scales differ), with its held-out mean at each evaluation where the evaluation reports it
(``reward/<name>``, e.g. a diffusers task's weighted reward). Right: the task's declared evaluation metrics (``task.evaluation_metrics``, e.g. the
classifier's and the independent judge's accuracy) at each evaluation, held-out seeds, guided as ``guidance`` says
(CFG-free unless the task evaluates under true CFG, :func:`vgrpo_lib.algorithms.evaluation.guidance_label`).
"""

from __future__ import annotations

from pathlib import Path

from vgrpo_lib.integrations.figures import pyplot, save_figure

__all__ = ["run_figure", "plot_run"]


def run_figure(metrics: list[dict], evaluations: list[dict], evaluation_metrics: dict[str, str],
               guidance: str = "CFG-free"):
    """The figure of :func:`plot_run` (``metrics``: metrics.csv rows; ``evaluations``: eval rows; metric -> label;
    ``guidance``: how the evaluation samples were guided)."""
    parts = [k for k in (metrics[0] if metrics else {}) if k.startswith("reward_") and k.endswith("_mean")
             and k != "reward_mean"]
    figure, (left, *each, right) = pyplot().subplots(1, 3 if parts else 2, figsize=(15 if parts else 10, 3.6),
                                                      layout="constrained")
    steps = [m["iteration"] + 1 for m in metrics]
    left.plot(steps, [m["reward_mean"] for m in metrics], marker=".")
    left.set(xlabel="iteration", ylabel="mean training reward", title="training reward")
    for key in parts:
        name = key[len("reward_"):-len("_mean")]
        [line] = each[0].plot(steps, [m[key] for m in metrics], label=name)
        held_out = [(e["iteration"], e[f"reward/{name}"]) for e in evaluations if f"reward/{name}" in e]
        if held_out:
            each[0].plot(*zip(*held_out), marker="o", color=line.get_color(), label=f"{name}, held out")
    if parts:
        each[0].legend()
        each[0].set(xlabel="iteration", ylabel="mean raw score", title="each reward")
    x = [e["iteration"] for e in evaluations]
    for key, label in evaluation_metrics.items():
        right.plot(x, [e.get(key, float("nan")) for e in evaluations], marker="o", label=label)
    if evaluations:
        right.legend()
    right.set(xlabel="iteration", ylabel=f"held-out seeds, {guidance}", title="evaluation: " + ", ".join(evaluation_metrics))
    return figure


def plot_run(metrics: list[dict], evaluations: list[dict], evaluation_metrics: dict[str, str], path: Path,
             guidance: str = "CFG-free") -> None:
    """Write :func:`run_figure` to ``path`` atomically."""
    save_figure(run_figure(metrics, evaluations, evaluation_metrics, guidance), path)
