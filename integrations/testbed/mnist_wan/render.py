"""Clip geometry and data rendering of MNIST-Wan, and the measurements its rewards read.

A clip is RGB float32 ``(N, 3, FRAMES, 32, 32)`` in ``[0, 1]`` (the ``(B, C, F, H, W)`` layout of
``WanPipeline``'s VAE), a white real MNIST-5k digit (``vgrpo_lib.integrations.testbed.data.load_mnist``)
on black, translating ``SPEED`` pixel per frame in one of ``DIRECTIONS``:

* ``render_clips``: the digit's 28x28 box starts at a seeded offset chosen so that its 20x20 ink box (where
  MNIST normalises the strokes) stays on the 32x32 canvas for the whole path (``FRAMES - 1`` pixels along
  the motion, up to ``PERPENDICULAR_JITTER`` pixels off centre across it). Integer shifts: every frame is
  the digit image exactly, translated and cut by the canvas where the box leaves it.
* ``centre_of_mass`` / ``measured_displacement`` / ``measured_direction``: the ink's centre of mass per frame,
  its least-squares velocity across frames (pixels per frame), and the nearest of ``DIRECTIONS``.
* ``classifier_view``: per frame, the 28x28 window centred on the ink's centre of mass (clamped to the
  canvas): what the testbed digit classifier reads. A rendered frame whose box is on the canvas comes back
  exactly (MNIST centres every digit's mass in its box).

The causal VAE keeps the first frame and compresses the rest 4x in time and space (``latent_shape``):
9 frames of 32x32 -> 16 x 3 x 8 x 8.
"""

from __future__ import annotations

import torch

__all__ = [
    "FRAMES", "FRAME_SIZE", "MNIST_SIDE", "INK_MARGIN", "SPEED", "PERPENDICULAR_JITTER", "DIRECTIONS",
    "DIRECTION_VECTORS", "LATENT_CHANNELS", "VAE_SPATIAL", "VAE_TEMPORAL", "latent_shape", "check_clips", "grey",
    "render_clips", "centre_of_mass", "measured_displacement", "measured_direction", "classifier_view",
]

FRAMES = 9  # 4k + 1: the causal VAE's first frame, then two groups of four
FRAME_SIZE = (32, 32)  # (H, W) pixels
MNIST_SIDE = 28
INK_MARGIN = 4  # MNIST strokes lie in the central 20x20 of the 28x28 box
SPEED = 1  # pixels per frame
PERPENDICULAR_JITTER = 2  # pixels off centre across the motion, at most
DIRECTIONS = ("left", "right", "up", "down")
DIRECTION_VECTORS = torch.tensor([[0.0, -1.0], [0.0, 1.0], [-1.0, 0.0], [1.0, 0.0]])
"""``(4, 2)`` unit motion ``(dy, dx)`` of each of ``DIRECTIONS`` in image coordinates (y grows downwards)."""
LATENT_CHANNELS = 16
VAE_SPATIAL = 4
VAE_TEMPORAL = 4


def latent_shape(frames: int = FRAMES, size: tuple[int, int] = FRAME_SIZE) -> tuple[int, int, int, int]:
    """VAE latent shape ``(C, 1 + (F - 1) / 4, H / 4, W / 4)`` of a clip of ``frames`` frames of ``size`` (H, W)."""
    h, w = size
    if frames < 1 or (frames - 1) % VAE_TEMPORAL:
        raise ValueError(f"frames must be 4k + 1 (the causal VAE keeps the first frame), got {frames}")
    if h % 16 or w % 16 or h <= 0 or w <= 0:
        raise ValueError(f"size must be positive multiples of 16 (VAE 4x, patch 2, even token grid), got {size}")
    return LATENT_CHANNELS, 1 + (frames - 1) // VAE_TEMPORAL, h // VAE_SPATIAL, w // VAE_SPATIAL


def check_clips(clips: torch.Tensor, who: str = "clips") -> None:
    """Raise ``ValueError`` naming ``who`` unless ``clips`` is ``(B, C, F, H, W)`` with C in {1, 3}."""
    if not isinstance(clips, torch.Tensor) or clips.ndim != 5 or clips.shape[1] not in (1, 3):
        shape = tuple(clips.shape) if isinstance(clips, torch.Tensor) else type(clips).__name__
        raise ValueError(f"{who} must be a (B, C, F, H, W) tensor with C in (1, 3), got {shape}")


def grey(clips: torch.Tensor) -> torch.Tensor:
    """Clips ``(B, C, F, H, W)`` -> ink intensity ``(B, F, H, W)``: the maximum over channels, clamped to [0, 1]."""
    check_clips(clips)
    return clips.amax(dim=1).clamp(0, 1)


def render_clips(digits: torch.Tensor, directions: torch.Tensor, generator: torch.Generator | None = None,
                 frames: int = FRAMES) -> torch.Tensor:
    """Moving-digit clips: ``digits`` ``(N, 1, 28, 28)`` in [0, 1], ``directions`` ``(N,)`` indices into
    ``DIRECTIONS`` -> white clips ``(N, 3, frames, 32, 32)`` (see the module doc); start offsets from ``generator``."""
    if digits.ndim != 4 or tuple(digits.shape[1:]) != (1, MNIST_SIDE, MNIST_SIDE):
        raise ValueError(f"digits must be (N, 1, 28, 28), got {tuple(digits.shape)}")
    n = digits.shape[0]
    if directions.shape != (n,) or directions.dtype != torch.int64 or n == 0 or not (
            0 <= int(directions.min()) and int(directions.max()) < len(DIRECTIONS)):
        raise ValueError(f"directions must be ({n},) int64 indices into {DIRECTIONS}")
    travel = (frames - 1) * SPEED
    lowest, highest = -INK_MARGIN, FRAME_SIZE[0] - MNIST_SIDE + INK_MARGIN  # box offsets keeping the ink on canvas
    if highest - lowest < travel:
        raise ValueError(f"{frames} frames at {SPEED} px/frame leave the {FRAME_SIZE} canvas")
    velocity = DIRECTION_VECTORS[directions].long() * SPEED  # (N, 2)
    u = torch.rand(n, 2, generator=generator)
    centre = (lowest + highest) // 2
    across = centre + ((u * (2 * PERPENDICULAR_JITTER + 1)).long() - PERPENDICULAR_JITTER)
    along_slack = (u * (highest - lowest - travel + 1)).long()
    along = torch.where(velocity > 0, lowest + along_slack, highest - along_slack)  # start so that the path fits
    start = torch.where(velocity != 0, along, across)  # (N, 2) box offset (y, x) of frame 0
    offsets = start[:, None, :] + torch.arange(frames)[None, :, None] * velocity[:, None, :]  # (N, F, 2)
    ys = torch.arange(FRAME_SIZE[0])[None, None, :, None] - offsets[..., 0, None, None]  # (N, F, H, 1)
    xs = torch.arange(FRAME_SIZE[1])[None, None, None, :] - offsets[..., 1, None, None]  # (N, F, 1, W)
    inside = (ys >= 0) & (ys < MNIST_SIDE) & (xs >= 0) & (xs < MNIST_SIDE)
    rows = torch.arange(n)[:, None, None, None]
    frames_grey = digits[rows, 0, ys.clamp(0, MNIST_SIDE - 1), xs.clamp(0, MNIST_SIDE - 1)] * inside
    return frames_grey[:, None].expand(-1, 3, -1, -1, -1).contiguous()


def centre_of_mass(clips: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Ink centre of mass ``(B, F, 2)`` as ``(y, x)`` pixels of every frame of ``clips`` ``(B, C, F, H, W)``
    (the canvas centre for an empty frame)."""
    ink = grey(clips)
    h, w = ink.shape[-2:]
    mass = ink.sum(dim=(-2, -1))
    y = (ink.sum(-1) * torch.arange(h, dtype=ink.dtype)).sum(-1)
    x = (ink.sum(-2) * torch.arange(w, dtype=ink.dtype)).sum(-1)
    centre = torch.tensor([(h - 1) / 2, (w - 1) / 2], dtype=ink.dtype)
    com = torch.stack([y, x], dim=-1) / mass.clamp_min(eps)[..., None]
    return torch.where(mass[..., None] > eps, com, centre)


def measured_displacement(clips: torch.Tensor) -> torch.Tensor:
    """Least-squares velocity ``(B, 2)`` ``(dy, dx)`` in pixels per frame of the ink's centre of mass."""
    com = centre_of_mass(clips)
    frames = com.shape[1]
    if frames < 2:
        raise ValueError(f"measuring motion needs at least 2 frames, got {frames}")
    t = torch.arange(frames, dtype=com.dtype)
    t = t - t.mean()
    return (com * t[None, :, None]).sum(1) / t.pow(2).sum()


def measured_direction(clips: torch.Tensor) -> torch.Tensor:
    """Index into ``DIRECTIONS`` ``(B,)`` of the direction closest to ``measured_displacement`` (the largest dot
    product)."""
    return (measured_displacement(clips) @ DIRECTION_VECTORS.T.to(clips.dtype)).argmax(-1)


def classifier_view(clips: torch.Tensor) -> torch.Tensor:
    """Clips ``(B, C, F, H, W)`` -> ``(B, F, 1, 28, 28)``: per frame the 28x28 window centred on the ink's centre
    of mass (rounded, clamped to the canvas), the testbed classifier's input in [0, 1]."""
    ink = grey(clips)
    b, f, h, w = ink.shape
    if h < MNIST_SIDE or w < MNIST_SIDE:
        raise ValueError(f"classifier_view needs frames of at least {MNIST_SIDE}x{MNIST_SIDE}, got {h}x{w}")
    half = MNIST_SIDE // 2
    com = centre_of_mass(clips)
    top = (com[..., 0] - half).round().long().clamp(0, h - MNIST_SIDE)  # (B, F)
    left = (com[..., 1] - half).round().long().clamp(0, w - MNIST_SIDE)
    ys = top[..., None, None] + torch.arange(MNIST_SIDE)[:, None]  # (B, F, 28, 1)
    xs = left[..., None, None] + torch.arange(MNIST_SIDE)[None, :]  # (B, F, 1, 28)
    windows = ink[torch.arange(b)[:, None, None, None], torch.arange(f)[None, :, None, None], ys, xs]
    return windows[:, :, None]
