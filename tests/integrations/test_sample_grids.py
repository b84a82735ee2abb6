"""Sample grids a person reads: every MNIST-SD3 digit prompt gets its labelled row (the OCR task's 108 numbers: 30
evenly spaced, said in the title), no row label is cut at the figure's edge, and ``vgrpo sample --grid`` writes one."""

from __future__ import annotations

import matplotlib.image
import numpy as np
import pytest
import torch

import vgrpo_lib.integrations.tasks.hub as hub
import vgrpo_lib.integrations.testbed.tasks as testbed_tasks
from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.integrations.figures import prompt_rows, write_labelled_grid
from vgrpo_lib.integrations.testbed.mnist_sd3 import prompts as grammar


@pytest.fixture
def grids(monkeypatch):
    written = []

    def spy(images, row_labels, title, path):
        written.append((images.shape[0], list(row_labels), title))
        return write_labelled_grid(images, row_labels, title, path)

    monkeypatch.setattr(hub, "write_labelled_grid", spy)
    monkeypatch.setattr(testbed_tasks, "write_labelled_grid", spy)
    return written


def _write_hub_grid(prompts: list[str], per_prompt: int, path) -> None:
    repeated = [p for p in prompts for _ in range(per_prompt)]
    images = torch.rand(len(repeated), 3, 32, 32, generator=torch.Generator().manual_seed(0))
    task = object.__new__(hub.DiffusersTask)  # write_samples reads nothing of the task's state
    task.write_samples(images, repeated, path, "base policy on mnist-sd3")


def test_every_mnist_sd3_digit_prompt_has_its_whole_label(grids, tmp_path):
    prompts = [p for p, _ in grammar.digit_prompts("eval")]
    _write_hub_grid(prompts, 8, tmp_path / "digit.png")
    [(shown, labels, title)] = grids
    assert len(prompts) == 30 and labels == prompts and shown == 30 * 8
    assert title == "base policy on mnist-sd3"


def test_many_prompts_show_an_evenly_spaced_subset_said_in_the_title(grids, tmp_path):
    prompts = [p for p, _ in grammar.number_prompts("eval")]
    _write_hub_grid(prompts, 2, tmp_path / "ocr.png")
    [(shown, labels, title)] = grids
    assert len(labels) == 30 and shown == 60 and labels[0] == prompts[0] and labels[-1] == prompts[-1]
    assert labels == [prompts[i] for i in np.linspace(0, len(prompts) - 1, 30).round().astype(int)]
    assert title == "base policy on mnist-sd3 (30 of 108 prompts, evenly spaced)"
    index, starts = prompt_rows(num_images=12, per_prompt=2, max_per_row=1, max_rows=3, spread=True)
    assert starts == [0, 4, 10] and index.tolist() == [0, 4, 10]  # prompts 0, 2 (2.5 rounded to even), 5


def test_no_row_label_is_cut_at_the_left_edge(tmp_path):
    """The grid that cut "the digit seven" to "he digit seven": 8 rows of 8 images, labels of unequal length. The
    saved canvas holds every label, so its leftmost pixel columns are background (white)."""
    images = torch.rand(64, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    labels = [f"the digit {word}" for word in ("zero", "one", "two", "three", "four", "five", "six", "seven")]
    path = write_labelled_grid(images, labels, "vgrpo on mnist-sd3/digit, iteration 40 (CFG-free)", tmp_path / "g.png")
    png = matplotlib.image.imread(path)
    assert np.all(png[:, :3, :3] == 1.0)


def test_sample_writes_a_labelled_grid_beside_the_npz(grids, tmp_path, capsys):
    out, grid = tmp_path / "samples.npz", tmp_path / "samples.png"
    argv = ["sample", "--task", "digits8", "--per-prompt", "2", "--seed", "0", "--steps", "2"]
    assert cli_main([*argv, "--out", str(out), "--grid", str(grid)]) == 0
    assert np.load(out)["images"].shape == (20, 1, 8, 8)
    assert matplotlib.image.imread(grid).ndim == 3
    [(shown, labels, title)] = grids
    assert shown == 20 and labels == [str(d) for d in range(10)]
    assert title == "base policy on digits8, seed 0, 2 steps (vgrpo sample, CFG-free)"
    assert f"sample grid: {grid}" in capsys.readouterr().out
