"""Figures written as files: matplotlib on the Agg backend, PNGs saved atomically, and sample grids a person reads
(one row per prompt, the prompt as the row's label, a title saying what and when).

    figure = labelled_grid(images, ["3", "7"], "vgrpo on digit, iteration 40")   # a matplotlib Figure
    write_labelled_grid(images, ["3", "7"], "vgrpo on digit, iteration 40", "samples.png")

``images`` ``(N, C, H, W)`` in ``[0, 1]`` (C = 1 grey or 3 RGB) fill the rows in order, ``N / len(row_labels)``
per row (evaluation prompts repeat consecutively). :func:`tile` assembles images into one array with grey
padding (the testbed's plain grid PNG uses it too).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from vgrpo_lib.integrations.atomic import atomic_write_bytes

__all__ = ["MAX_GRID_INCHES", "pyplot", "tile", "prompt_rows", "labelled_grid", "save_figure", "write_labelled_grid"]


MAX_GRID_INCHES = 16.0  # the tallest a labelled grid's images are drawn (30 rows: about half an inch each)


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (figures are files, never windows)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def tile(images: torch.Tensor, per_row: int, padding: int = 2) -> torch.Tensor:
    """Images ``(N, C, H, W)`` as one grid ``(C, rows * (H + padding) + padding, per_row * (W + padding) +
    padding)`` filled row by row, grey (0.5) between and after them."""
    n, channels, h, w = images.shape
    rows = -(-n // per_row)
    grid = torch.full((channels, rows * (h + padding) + padding, per_row * (w + padding) + padding), 0.5)
    for i, image in enumerate(images.detach().float().clamp(0, 1).cpu()):
        r, c = divmod(i, per_row)
        top, left = padding + r * (h + padding), padding + c * (w + padding)
        grid[:, top:top + h, left:left + w] = image
    return grid


def prompt_rows(num_images: int, per_prompt: int, max_per_row: int, max_rows: int, spread: bool = False
                ) -> tuple[torch.Tensor, list[int]]:
    """Which of ``num_images`` images (each prompt ``per_prompt`` times in a row) a grid shows: the first
    ``min(per_prompt, max_per_row)`` of each of the first ``max_rows`` prompts (``spread``: of ``max_rows`` prompts
    evenly spaced over all of them, first and last included, a representative subset). Returns their indices
    ``(n,)`` and the index of each row's first image (where its prompt is)."""
    prompts = num_images // per_prompt
    rows, shown = min(prompts, max_rows), min(per_prompt, max_per_row)
    chosen = torch.arange(rows) if not spread or rows <= 1 else torch.linspace(0, prompts - 1, rows).round().long()
    starts = chosen * per_prompt
    return (starts[:, None] + torch.arange(shown)).flatten(), starts.tolist()


def labelled_grid(images: torch.Tensor, row_labels: Sequence[str], title: str, padding: int = 2):
    """A matplotlib Figure of ``images`` ``(N, C, H, W)``: ``N / len(row_labels)`` images per row, each row
    labelled (y tick label) with its entry of ``row_labels``, under ``title``."""
    rows = len(row_labels)
    if images.ndim != 4 or images.shape[0] == 0 or rows == 0 or images.shape[0] % rows:
        raise ValueError(f"images (N, C, H, W) must fill {rows} row(s) equally, got {tuple(images.shape)}")
    per_row, (h, w) = images.shape[0] // rows, images.shape[-2:]
    grid = tile(images, per_row, padding)
    plt = pyplot()
    # inches per pixel: each image about 1.2 inches, smaller when the rows would pass MAX_GRID_INCHES
    scale = min(1.2 / max(h, w), MAX_GRID_INCHES / grid.shape[1])
    width = grid.shape[2] * scale + 0.08 * max(len(label) for label in row_labels) + 0.5
    figure, axes = plt.subplots(figsize=(max(width, 4.0), grid.shape[1] * scale + 0.7), layout="constrained")
    if grid.shape[0] == 1:
        axes.imshow(grid[0].numpy(), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        axes.imshow(grid.permute(1, 2, 0).numpy(), interpolation="nearest")
    axes.set_yticks([padding + r * (h + padding) + (h - 1) / 2 for r in range(rows)], list(row_labels))
    axes.set_xticks([])
    axes.tick_params(left=False)
    for spine in axes.spines.values():
        spine.set_visible(False)
    axes.set_title(title)
    return figure


def save_figure(figure, path: str | os.PathLike, dpi: int = 100, tight: bool = False) -> Path:
    """Write ``figure`` as a PNG atomically and close it (``tight``: the canvas grown or cut to hold every text whole,
    row labels included); returns the path."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, **({"bbox_inches": "tight", "pad_inches": 0.1} if tight else {}))
    pyplot().close(figure)
    return atomic_write_bytes(path, buffer.getvalue())


def write_labelled_grid(images: torch.Tensor, row_labels: Sequence[str], title: str, path: str | os.PathLike) -> Path:
    """:func:`labelled_grid` written as a PNG atomically, no label cut at the edge; returns the path."""
    return save_figure(labelled_grid(images, row_labels, title), path, tight=True)
