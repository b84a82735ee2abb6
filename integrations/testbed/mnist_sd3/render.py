"""Image geometry and data rendering of MNIST-SD3, and the views its rewards read.

Images are RGB float32 ``(N, 3, H, W)`` in ``[0, 1]`` with light strokes on a dark background (the
MNIST convention), made from the real MNIST-5k digits (``vgrpo_lib.integrations.testbed.data.load_mnist``):

* ``render_digits``: one 28x28 digit centred on a ``DIGIT_SIZE`` (32x32) canvas;
* ``render_numbers``: a two- or three-digit number on a ``NUMBER_SIZE`` (32x96) canvas, one random
  real digit image per position, ``NUMBER_STRIDE`` pixels apart (overlaps keep the brighter pixel);
* ``TINTS``: the stroke colours (red, green, blue, yellow, white); every tint has a channel at full
  intensity, so the per-pixel maximum over channels recovers the grey digit exactly.

The VAE downsamples 4x into 4 channels (``latent_shape``): 32x32 -> 4x8x8, 32x96 -> 4x8x24.

Reward views: ``classifier_view`` (the testbed digit classifier's 28x28 grey input) and ``ocr_view``
(dark text on a light background, upscaled: what rapidocr reads best).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "DIGIT_SIZE", "NUMBER_SIZE", "LATENT_CHANNELS", "VAE_DOWNSAMPLE", "MNIST_SIDE", "NUMBER_STRIDE", "TINTS",
    "TINT_NAMES", "latent_shape", "tint", "render_digits", "render_numbers", "grey", "classifier_view", "ocr_view",
]

DIGIT_SIZE = (32, 32)  # (H, W) pixels of the digit task
NUMBER_SIZE = (32, 96)  # (H, W) pixels of the number (OCR) task
LATENT_CHANNELS = 4
VAE_DOWNSAMPLE = 4
MNIST_SIDE = 28
NUMBER_STRIDE = 20  # pixels between the left edges of neighbouring digits of a number
TINTS = {"white": (1.0, 1.0, 1.0), "red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0),
         "yellow": (1.0, 1.0, 0.0)}
TINT_NAMES = tuple(TINTS)


def latent_shape(size: tuple[int, int]) -> tuple[int, int, int]:
    """VAE latent shape ``(C, H/4, W/4)`` of an image of ``size`` (H, W); both must be multiples of 16."""
    h, w = size
    if h % 16 or w % 16 or h <= 0 or w <= 0:
        raise ValueError(f"size must be positive multiples of 16 (VAE 4x, patch 2, even token grid), got {size}")
    return LATENT_CHANNELS, h // VAE_DOWNSAMPLE, w // VAE_DOWNSAMPLE


def tint(gray: torch.Tensor, tint_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Colour grey strokes ``(N, 1, H, W)`` by ``TINT_NAMES[tint_ids]`` ``(N,)`` (default white) -> ``(N, 3, H, W)``."""
    if gray.ndim != 4 or gray.shape[1] != 1:
        raise ValueError(f"gray must be (N, 1, H, W), got {tuple(gray.shape)}")
    if tint_ids is None:
        return gray.expand(-1, 3, -1, -1).contiguous()
    if tint_ids.shape != (gray.shape[0],) or tint_ids.min() < 0 or tint_ids.max() >= len(TINTS):
        raise ValueError(f"tint_ids must be ({gray.shape[0]},) ints in 0..{len(TINTS) - 1}")
    colours = torch.tensor(list(TINTS.values()), dtype=gray.dtype, device=gray.device)[tint_ids]
    return gray * colours[:, :, None, None]


def render_digits(digits: torch.Tensor, tint_ids: torch.Tensor | None = None) -> torch.Tensor:
    """MNIST digits ``(N, 1, 28, 28)`` in [0, 1] -> RGB ``(N, 3, 32, 32)``, centred with a 2-pixel border."""
    if digits.ndim != 4 or tuple(digits.shape[1:]) != (1, MNIST_SIDE, MNIST_SIDE):
        raise ValueError(f"digits must be (N, 1, 28, 28), got {tuple(digits.shape)}")
    pad = (DIGIT_SIZE[0] - MNIST_SIDE) // 2
    return tint(F.pad(digits, (pad, pad, pad, pad)), tint_ids)


def _by_class(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    order = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=10)
    if (counts == 0).any():
        raise ValueError(f"every digit 0-9 needs at least one image; counts {counts.tolist()}")
    return order, torch.cumsum(counts, 0) - counts, counts


def render_numbers(digits: torch.Tensor, labels: torch.Tensor, numbers: list[str], generator: torch.Generator | None = None,
                   tint_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Numbers drawn with real handwritten digits: ``(len(numbers), 3, 32, 96)``.

    ``digits`` ``(N, 1, 28, 28)`` with ``labels`` ``(N,)`` is the pool; for every position of every
    number one image of that digit is drawn uniformly (``generator``). A number of L digits spans
    ``28 + (L - 1) * NUMBER_STRIDE`` pixels, centred horizontally, 2 pixels from the top.
    """
    if not numbers or any(not (s.isdigit() and 2 <= len(s) <= 3) for s in numbers):
        raise ValueError(f"numbers must be a non-empty list of 2- or 3-digit strings, got {numbers[:5]!r}")
    order, start, count = _by_class(labels)
    h, w = NUMBER_SIZE
    canvas = torch.zeros(len(numbers), 1, h, w, dtype=digits.dtype)
    top = (h - MNIST_SIDE) // 2
    for length in (2, 3):
        rows = [i for i, s in enumerate(numbers) if len(s) == length]
        if not rows:
            continue
        wanted = torch.tensor([[int(c) for c in numbers[i]] for i in rows])  # (n, L)
        u = torch.rand(wanted.shape, generator=generator)
        picks = order[start[wanted] + (u * count[wanted]).long().clamp_max(count[wanted] - 1)]
        left = (w - MNIST_SIDE - (length - 1) * NUMBER_STRIDE) // 2
        sub = canvas[rows]
        for pos in range(length):
            x0 = left + pos * NUMBER_STRIDE
            region = sub[:, :, top:top + MNIST_SIDE, x0:x0 + MNIST_SIDE]
            sub[:, :, top:top + MNIST_SIDE, x0:x0 + MNIST_SIDE] = torch.maximum(region, digits[picks[:, pos]])
        canvas[rows] = sub
    return tint(canvas, tint_ids)


def grey(images: torch.Tensor) -> torch.Tensor:
    """RGB ``(B, 3, H, W)`` -> stroke intensity ``(B, 1, H, W)``: the maximum over channels (exact for ``TINTS``)."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be (B, 3, H, W), got {tuple(images.shape)}")
    return images.amax(dim=1, keepdim=True)


def classifier_view(images: torch.Tensor) -> torch.Tensor:
    """Digit-task images ``(B, 3, 32, 32)`` -> the testbed classifier's input ``(B, 1, 28, 28)`` in [0, 1].

    The grey stroke intensity, centre-cropped by the 2-pixel border ``render_digits`` adds, so a
    rendered real digit comes back exactly.
    """
    if tuple(images.shape[-2:]) != DIGIT_SIZE:
        raise ValueError(f"classifier_view expects {DIGIT_SIZE} images, got {tuple(images.shape)}")
    pad = (DIGIT_SIZE[0] - MNIST_SIDE) // 2
    return grey(images)[..., pad:pad + MNIST_SIDE, pad:pad + MNIST_SIDE].clamp(0, 1)


def ocr_view(images: torch.Tensor, scale: int = 2) -> torch.Tensor:
    """Images ``(B, 3, H, W)`` -> dark strokes on white, ``scale`` times larger (bilinear): ``(B, 3, sH, sW)``.

    rapidocr's models were trained on dark print on light paper; light-on-dark MNIST strokes are read
    far better once inverted, and its detector needs text a few dozen pixels high.
    """
    inverted = 1.0 - grey(images).clamp(0, 1)
    if scale != 1:
        inverted = F.interpolate(inverted, scale_factor=scale, mode="bilinear", align_corners=False)
    return inverted.clamp(0, 1).expand(-1, 3, -1, -1)
