"""Pictures a person reads: sample grids labelled with their prompts and the iteration, and reward.png with the
task's declared evaluation metrics (the testbed's classifier and judge accuracy)."""

from __future__ import annotations

import matplotlib.image
import pytest
import torch

from vgrpo_lib.algorithms.plots import run_figure
from vgrpo_lib.algorithms.trainer import Trainer
from vgrpo_lib.integrations.figures import labelled_grid, prompt_rows, tile, write_labelled_grid
from vgrpo_lib.integrations.testbed.tasks import get_task


def test_labelled_grid_shows_each_prompts_images_on_its_labelled_row():
    images = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    figure = labelled_grid(images, ["3", "3 then 7"], "vgrpo on pair, iteration 4")
    [axes] = figure.axes
    assert axes.get_title() == "vgrpo on pair, iteration 4"
    assert [label.get_text() for label in axes.get_yticklabels()] == ["3", "3 then 7"]
    assert axes.get_yticks().tolist() == [2 + 3.5, 2 + 10 + 3.5]  # the middle of each 8-pixel row
    [shown] = axes.get_images()
    grid = torch.as_tensor(shown.get_array().data)
    assert grid.shape == (2 * 10 + 2, 3 * 10 + 2)
    for i, image in enumerate(images):  # row i // 3, column i % 3, after 2 pixels of padding
        r, c = divmod(i, 3)
        torch.testing.assert_close(grid[2 + 10 * r: 10 + 10 * r, 2 + 10 * c: 10 + 10 * c], image[0].float())
    with pytest.raises(ValueError, match="must fill 4 row"):
        labelled_grid(images, ["0", "1", "2", "3"], "")


def test_prompt_rows_keep_the_first_images_of_the_first_prompts():
    index, starts = prompt_rows(num_images=12, per_prompt=4, max_per_row=3, max_rows=2)
    assert index.tolist() == [0, 1, 2, 4, 5, 6] and starts == [0, 4]
    assert tile(torch.ones(3, 1, 2, 2), per_row=2).shape == (1, 2 * 4 + 2, 2 * 4 + 2)


def test_run_figure_plots_the_declared_evaluation_metrics():
    metrics = [{"iteration": i, "reward_mean": 0.1 * i} for i in range(3)]
    evaluations = [{"iteration": 0, "accuracy": 0.5, "judge_accuracy": 0.4, "reward_mean": 0.3},
                   {"iteration": 3, "accuracy": 0.8, "judge_accuracy": 0.6, "reward_mean": 0.7}]
    figure = run_figure(metrics, evaluations, get_task("digit").evaluation_metrics)
    left, right = figure.axes
    [reward] = left.get_lines()
    assert reward.get_xdata().tolist() == [1, 2, 3] and reward.get_ydata().tolist() == pytest.approx([0, 0.1, 0.2])
    curves = {line.get_label(): (line.get_xdata().tolist(), line.get_ydata().tolist()) for line in right.get_lines()}
    assert curves == {"classifier (reward model)": ([0, 3], [0.5, 0.8]), "independent judge": ([0, 3], [0.4, 0.6])}
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["classifier (reward model)", "independent judge"]
    assert right.get_title() == "evaluation: accuracy, judge_accuracy"

    multi = [{**m, "reward_digit_mean": 0.5, "reward_thickness_mean": 0.2} for m in metrics]
    _, each, right = run_figure(multi, evaluations, {"reward_mean": "mean reward"}).axes
    assert [line.get_label() for line in each.get_lines()] == ["digit", "thickness"]
    assert [line.get_ydata().tolist() for line in right.get_lines()] == [[0.3, 0.7]]

    # Evaluations that report each reward (reward/<name>) add its held-out points, in its training curve's colour.
    scored = [{**e, "reward/digit": 0.6 + e["iteration"] / 10} for e in evaluations]
    _, each, _ = run_figure(multi, scored, {"reward_mean": "mean reward"}).axes
    lines = {line.get_label(): line for line in each.get_lines()}
    assert list(lines) == ["digit", "digit, held out", "thickness"]
    held_out = lines["digit, held out"]
    assert held_out.get_xdata().tolist() == [0, 3] and held_out.get_ydata().tolist() == pytest.approx([0.6, 0.9])
    assert held_out.get_color() == lines["digit"].get_color() != lines["thickness"].get_color()


def test_a_run_titles_its_grids_with_the_iteration_and_labels_rows_with_prompts(tiny_config, tmp_path, monkeypatch):
    import vgrpo_lib.integrations.testbed.tasks as testbed_tasks

    written = []

    def spy(images, row_labels, title, path):
        written.append((images.shape[0], list(row_labels), title))
        return write_labelled_grid(images, row_labels, title, path)

    monkeypatch.setattr(testbed_tasks, "write_labelled_grid", spy)
    Trainer(tiny_config("vgrpo", "iterations=1"), tmp_path / "run", progress=False).train()
    digits = [str(d) for d in range(10)]
    assert written == [(30, digits, f"vgrpo on digits8, iteration {i} (held-out seeds, CFG-free)") for i in (0, 1)]
    for iteration in (0, 1):
        picture = matplotlib.image.imread(tmp_path / "run" / f"samples_iter_{iteration:06d}.png")
        assert picture.ndim == 3 and picture.shape[0] > 10 * 8  # ten labelled rows of 8x8 digits, scaled up
    assert (tmp_path / "run" / "reward.png").stat().st_size > 0
