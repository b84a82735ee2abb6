"""Synthetic GenEval compositions: MNIST-5k digits tinted, scaled and placed on a canvas, with their boxes.

`compose(specs, split, generator)` draws one canvas per GenEval spec that satisfies it under
GenEval's own rules: exactly the requested digits (`count` of each include clause), each in its
requested colour (a random one of COLORS otherwise), and for a position clause the relation holds
by `vgrpo_lib.integrations.rewards.geneval.relative_position` (the test the scorer applies). Ink boxes never
overlap (a gap of at least `MIN_GAP` pixels), so every digit stays readable. The canvases are the
training data of the digit detector (and of a composition pipeline), and their exact boxes the
detector's targets.

A digit is its 28x28 MNIST frame scaled to a side drawn from `frame_sizes` pixels and placed by
one batched `grid_sample` (no loop over images). Three layouts: `"free"` (anywhere on the canvas, frames of 22-34
pixels: the detector's data), `"cells"` (each object centred, +-`CELL_JITTER` pixels, in its own random cell of a
`CELLS` x `CELLS` grid, frames of 26-30 pixels: MNIST-SD3's digit scale at fixed places; left/right of then means
neighbouring cells of a row, above/below of a column) and `"slots"` (the same cells, but the prompt decides which:
the k-th object mentioned takes cell k in reading order, and a position prompt puts its two digits where the
relation says (`SLOTS_OF_RELATION`), as MNIST-SD3's numbers sit in fixed slots). Its colour
multiplies the grey stroke by the tint
in TINTS, MNIST-SD3's (so its VAE sees the colours it was trained on; the background stays black).
Boxes are the tight box of the stroke pixels above `INK_LEVEL`, mapped through the same transform,
as (x0, y0, x1, y1) in pixels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vgrpo_lib.integrations.rewards.geneval import RELATIONS, relative_position
from vgrpo_lib.integrations.testbed.data import load_mnist
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import COLORS
from vgrpo_lib.integrations.testbed.mnist_sd3.render import TINTS as MNIST_SD3_TINTS

__all__ = [
    "CANVAS", "MAX_OBJECTS", "MIN_GAP", "INK_LEVEL", "CELLS", "CELL_JITTER", "CELL_FRAME_SIZES", "FRAME_SIZES",
    "SLOTS_OF_RELATION", "TINTS", "Compositions", "ink_boxes", "render", "compose",
]

CANVAS = 64
MAX_OBJECTS = 4
MIN_GAP = 2.0
INK_LEVEL = 0.2
CELLS = 2
CELL_JITTER = 2.0
CELL_FRAME_SIZES = (26.0, 30.0)
FRAME_SIZES = {"free": (22.0, 34.0), "cells": CELL_FRAME_SIZES, "slots": CELL_FRAME_SIZES}
SLOTS_OF_RELATION = {"left of": (1, 0), "right of": (0, 1), "above": (2, 0), "below": (0, 2)}
"""Layout ``"slots"``: the cells (reading order) of a position prompt's (target, subject), for "a <subject> REL a
<target>" (the spec's first object is the target, its second the subject)."""
TINTS = torch.tensor([MNIST_SD3_TINTS[name] for name in COLORS])
"""RGB tint per colour of COLORS (rows in that order), MNIST-SD3's stroke colours: stroke = grey level x tint."""


@dataclass(frozen=True)
class Compositions:
    """A batch of canvases and their objects (slots beyond an image's objects are padding).

    images (N, 3, S, S) float32 in [0, 1]; boxes (N, K, 4) float32 x0, y0, x1, y1 in pixels;
    labels (N, K) int64 digit or -1; colors (N, K) int64 index into COLORS or -1; K = MAX_OBJECTS.
    """

    images: torch.Tensor
    boxes: torch.Tensor
    labels: torch.Tensor
    colors: torch.Tensor

    @property
    def present(self) -> torch.Tensor:
        """(N, K) bool: which slots hold an object."""
        return self.labels >= 0


def ink_boxes(digits: torch.Tensor) -> torch.Tensor:
    """Tight boxes of the stroke pixels (> INK_LEVEL) of digits (N, 1, H, W) -> (N, 4) x0, y0, x1, y1 in frame pixels.

    A blank digit gets the whole frame.
    """
    ink = digits[:, 0] > INK_LEVEL
    n, h, w = ink.shape
    cols, rows = ink.any(dim=1), ink.any(dim=2)
    col_idx, row_idx = torch.arange(w).expand(n, w), torch.arange(h).expand(n, h)
    x0 = torch.where(cols, col_idx, w).amin(dim=1)
    x1 = torch.where(cols, col_idx + 1, 0).amax(dim=1)
    y0 = torch.where(rows, row_idx, h).amin(dim=1)
    y1 = torch.where(rows, row_idx + 1, 0).amax(dim=1)
    boxes = torch.stack([x0, y0, x1, y1], dim=1).float()
    blank = ~cols.any(dim=1)
    return torch.where(blank[:, None], torch.tensor([0.0, 0.0, w, h]), boxes)


def _layout_ok(boxes: torch.Tensor, present: torch.Tensor, relations: torch.Tensor) -> torch.Tensor:
    """(N,) bool: no two present boxes within MIN_GAP and every required relation holds.

    relations (N, K, K) int64: r >= 0 requires RELATIONS[r] of box i relative to box j, -1 nothing.
    """
    a, b = boxes[:, :, None, :], boxes[:, None, :, :]
    apart = ((a[..., 0] >= b[..., 2] + MIN_GAP) | (b[..., 0] >= a[..., 2] + MIN_GAP)
             | (a[..., 1] >= b[..., 3] + MIN_GAP) | (b[..., 1] >= a[..., 3] + MIN_GAP))
    pair = present[:, :, None] & present[:, None, :] & ~torch.eye(boxes.shape[1], dtype=torch.bool)
    rel = relative_position(a, b)  # (N, K, K, 4)
    needed = relations >= 0
    holds = torch.gather(rel, -1, relations.clamp_min(0)[..., None])[..., 0]
    return (apart | ~pair).all(dim=(1, 2)) & (holds | ~needed).all(dim=(1, 2))


def _ink_in_frame(frame_boxes: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left and bottom-right of the ink relative to the frame's corner, for frames of side ``size`` pixels."""
    return frame_boxes[..., :2] / 28 * size[..., None], frame_boxes[..., 2:] / 28 * size[..., None]


def _free_draw(frame_boxes: torch.Tensor, canvas: int):
    """Layout ``"free"``: corners uniform over the places that keep the ink (not the whole frame) on the canvas."""
    def draw(idx: torch.Tensor, size: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        ink_lo, ink_hi = _ink_in_frame(frame_boxes[idx], size)
        span = (canvas - (ink_hi - ink_lo)).clamp_min(0)
        return torch.rand(*size.shape, 2, generator=generator) * span - ink_lo
    return draw


def _cell_draw(canvas: int, slots: torch.Tensor | None = None):
    """Layouts ``"cells"`` and ``"slots"``: every object in a distinct cell of the ``CELLS`` x ``CELLS`` grid (random,
    or ``slots`` (N, K) cell indices in reading order), its frame centred there up to ``CELL_JITTER`` pixels per axis."""
    centres = (torch.arange(CELLS) + 0.5) * canvas / CELLS

    def draw(idx: torch.Tensor, size: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        m, k = size.shape
        if slots is None:
            cells = torch.rand(m, CELLS * CELLS, generator=generator).argsort(dim=1)[:, :k]
        else:
            cells = slots[idx]
        centre = torch.stack([centres[cells % CELLS], centres[cells // CELLS]], dim=-1)
        centre = centre + (2 * torch.rand(m, k, 2, generator=generator) - 1) * CELL_JITTER
        return centre - size[..., None] / 2
    return draw


def _slots(relations: torch.Tensor) -> torch.Tensor:
    """Layout ``"slots"``: the cell of every object (N, K): object k in cell k, except a position prompt's two
    objects, placed by ``SLOTS_OF_RELATION``. ValueError for a relation the GenEval grammar does not have (any
    but the second object's to the first)."""
    n, k = relations.shape[:2]
    other = relations.clone()
    other[:, 1, 0] = -1
    if (other >= 0).any():
        raise ValueError('layout "slots" places only a position prompt\'s second object relative to its first')
    table = torch.tensor([SLOTS_OF_RELATION[r] for r in RELATIONS])
    cells = torch.arange(k).repeat(n, 1)
    rel = relations[:, 1, 0]
    has = rel >= 0
    cells[has, :2] = table[rel[has]]
    return cells


def _place(frame_boxes: torch.Tensor, present: torch.Tensor, relations: torch.Tensor,
           frame_sizes: tuple[float, float], draw, generator: torch.Generator,
           max_rounds: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection-sample frame sizes and corners (``draw(rows, sizes, generator)``) until `_layout_ok`; rows that
    keep failing shrink their digits.

    Returns (corners (N, K, 2) frame top-left in pixels, sizes (N, K) frame sides in pixels).
    """
    n, k = present.shape
    sizes = torch.empty(n, k)
    corners = torch.empty(n, k, 2)
    todo = torch.ones(n, dtype=torch.bool)
    shrink = torch.ones(n)
    for round_ in range(max_rounds):
        idx = todo.nonzero()[:, 0]
        low, high = frame_sizes
        size = (low + (high - low) * torch.rand(len(idx), k, generator=generator)) * shrink[idx, None]
        corner = draw(idx, size, generator)
        sizes[idx], corners[idx] = size, corner
        ink_lo, ink_hi = _ink_in_frame(frame_boxes[idx], size)
        boxes = torch.cat([corner + ink_lo, corner + ink_hi], dim=-1)
        ok = _layout_ok(boxes, present[idx], relations[idx])
        todo[idx[ok]] = False
        if not todo.any():
            return corners, sizes
        if round_ % 20 == 19:
            shrink[todo] *= 0.9
    raise RuntimeError(f"could not place {int(todo.sum())} compositions in {max_rounds} rounds")


def render(digits: torch.Tensor, tints: torch.Tensor, corners: torch.Tensor, sizes: torch.Tensor,
           canvas: int = CANVAS) -> torch.Tensor:
    """Draw digits (N, K, 1, 28, 28) (zeros for empty slots) tinted by tints (N, K, 3), frames of side
    sizes (N, K) at top-left corners (N, K, 2), onto black canvases -> (N, 3, canvas, canvas) in [0, 1].

    Overlapping strokes keep the brighter value per channel.
    """
    n, k = sizes.shape
    scale = canvas / sizes.reshape(-1)
    # Output pixel u in [-1, 1] (align_corners=False) -> frame coordinate v = scale * (u + 1) - 2 corner / size - 1.
    shift = scale[:, None] - 2 * corners.reshape(-1, 2) / sizes.reshape(-1, 1) - 1
    theta = torch.zeros(n * k, 2, 3)
    theta[:, 0, 0], theta[:, 1, 1] = scale, scale
    theta[:, :, 2] = shift
    grid = F.affine_grid(theta, [n * k, 1, canvas, canvas], align_corners=False)
    grey = F.grid_sample(digits.reshape(n * k, 1, 28, 28), grid, padding_mode="zeros", align_corners=False)
    colored = grey.reshape(n, k, 1, canvas, canvas) * tints[..., None, None]
    return colored.amax(dim=1).clamp(0, 1)


@dataclass(frozen=True)
class _Source:
    digits: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor


_SOURCES: dict[str, _Source] = {}


def _source(split: str) -> _Source:
    if split not in _SOURCES:
        digits, labels = load_mnist(split)
        _SOURCES[split] = _Source(digits, labels, ink_boxes(digits))
    return _SOURCES[split]


def _objects_of(spec: Mapping) -> list[tuple[int, int | None, tuple[str, int] | None]]:
    """(digit, colour index or None, (relation, target object index) or None) per object of a spec."""
    objects, first = [], []
    for req in spec["include"]:
        first.append(len(objects))
        color = COLORS.index(req["color"]) if "color" in req else None
        position = (req["position"][0], first[req["position"][1]]) if "position" in req else None
        objects += [(int(req["class"]), color, position)] * req["count"]
    if not 1 <= len(objects) <= MAX_OBJECTS:
        raise ValueError(f"spec {spec.get('prompt')!r} asks for {len(objects)} objects; 1 to {MAX_OBJECTS} fit")
    return objects


def compose(specs: Sequence[Mapping], split: str = "train", generator: torch.Generator | None = None,
            frame_sizes: tuple[float, float] | None = None, canvas: int = CANVAS, layout: str = "free") -> Compositions:
    """One canvas per GenEval spec, drawn from MNIST-5k digits of `split` in `layout` (see the module docstring),
    frames of `frame_sizes` pixels (default: the layout's `FRAME_SIZES`).

    A spec's objects are its include clauses' `count` copies of `class` (different MNIST digits);
    exclude clauses hold automatically since nothing else is drawn.
    """
    if layout not in FRAME_SIZES:
        raise ValueError(f"unknown composition layout {layout!r}; expected one of {', '.join(FRAME_SIZES)}")
    generator = generator or torch.Generator().manual_seed(0)
    source = _source(split)
    n = len(specs)
    labels = torch.full((n, MAX_OBJECTS), -1)
    colors = torch.full((n, MAX_OBJECTS), -1)
    relations = torch.full((n, MAX_OBJECTS, MAX_OBJECTS), -1)
    for i, spec in enumerate(specs):
        for j, (digit, color, position) in enumerate(_objects_of(spec)):
            labels[i, j] = digit
            colors[i, j] = color if color is not None else -2
            if position is not None:
                relations[i, j, position[1]] = RELATIONS.index(position[0])
    present = labels >= 0
    unset = colors == -2
    colors[unset] = torch.randint(len(COLORS), (int(unset.sum()),), generator=generator)
    # A random MNIST digit of the requested class per slot.
    per_class = [torch.nonzero(source.labels == d)[:, 0] for d in range(10)]
    counts = torch.tensor([len(p) for p in per_class])
    pick = (torch.rand(n, MAX_OBJECTS, generator=generator) * counts[labels.clamp_min(0)]).long()
    table = torch.nn.utils.rnn.pad_sequence(per_class, batch_first=True)
    index = table[labels.clamp_min(0), pick]
    digits = source.digits[index] * present[..., None, None, None]
    frame_boxes = source.boxes[index]
    if layout == "free":
        draw = _free_draw(frame_boxes, canvas)
    else:
        draw = _cell_draw(canvas, slots=_slots(relations) if layout == "slots" else None)
    corners, sizes = _place(frame_boxes, present, relations, frame_sizes or FRAME_SIZES[layout], draw, generator)
    images = render(digits, TINTS[colors.clamp_min(0)], corners, sizes, canvas)
    scale = (sizes / 28)[..., None]  # not _ink_in_frame: this order of the float ops made the detectors' data
    boxes = torch.cat([corners + frame_boxes[..., :2] * scale, corners + frame_boxes[..., 2:] * scale], dim=-1)
    boxes = torch.where(present[..., None], boxes, torch.zeros(()))
    return Compositions(images, boxes, labels, torch.where(present, colors, -1))
