"""Rewards without learned weights: OCR text accuracy and JPEG compressibility.

Both run on the CPU per image (rapidocr and PIL have no batched GPU path); images are moved to the
CPU once as one uint8 batch and the scores are returned on the images' device.
"""

from __future__ import annotations

import io
import os
import re

import torch
from PIL import Image

from vgrpo_lib.extras import needs_extra

from .base import Reward, register_reward

__all__ = [
    "ocr_engine", "to_uint8_hwc", "JPEGCompressibility", "quoted_text", "edit_distance", "text_similarity",
    "multiset_similarity", "OCRReward",
]


def ocr_engine(purpose: str = "The ocr reward (rapidocr)"):
    """A rapidocr-onnxruntime engine whose ONNX sessions run on torch's thread count (one in a run started with
    ``OMP_NUM_THREADS=1``), at most the machine's cores; ``purpose`` names what needs it if the extra is missing.
    rapidocr's default lets onnxruntime start a pool over every core whose threads set their own CPU affinity, so a
    run pinned to one core (``taskset -c 0``) used two anyway (measured: 1.33 CPU-seconds per second on a pinned
    process) and slowed whatever ran on the other core. Every OCR engine here is made by this function."""
    with needs_extra("rewards", purpose):
        from rapidocr_onnxruntime import RapidOCR

    threads = max(1, min(torch.get_num_threads(), os.cpu_count() or 1))
    return RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)


def to_uint8_hwc(images: torch.Tensor):
    """(B, 3, H, W) in [0, 1] -> numpy uint8 (B, H, W, 3), the layout PIL and OCR engines expect."""
    return (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


@register_reward("jpeg_compressibility")
class JPEGCompressibility(Reward):
    """DDPO's compressibility reward: minus the JPEG file size in kB (quality 95).

    Flat, low-detail images compress well and score high; noise scores low. Used in DDPO as a
    reward that is trivially verifiable and easy to hack, which makes it a good sanity task.
    """

    def __init__(self, quality: int = 95):
        super().__init__()
        self.quality = quality

    def score(self, images, prompts):
        sizes = []
        for array in to_uint8_hwc(images):
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, format="JPEG", quality=self.quality)
            sizes.append(buffer.tell() / 1000.0)
        return -torch.tensor(sizes, device=images.device)


_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”|\'([^\']+)\'')


def quoted_text(prompt: str) -> str | None:
    """The text to render, taken from the first quoted span of the prompt ("...", “...” or '...')."""
    match = _QUOTED.search(prompt)
    if match is None:
        return None
    return next(group for group in match.groups() if group is not None)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _normalise(text: str) -> str:
    return text.replace(" ", "").lower()


def text_similarity(recognised: str, target: str) -> float:
    """Flow-GRPO's OCR score (``flow_grpo/ocr.py``, ``OcrScorer.__call__``): spaces removed and both strings
    lower-cased; 1.0 when the target occurs anywhere in the recognised text, else
    ``1 - min(edit_distance, len(target)) / len(target)`` (0.0: nothing right). An empty target (where the
    official code divides by zero) scores 1.0 only for an empty recognition."""
    recognised, target = _normalise(recognised), _normalise(target)
    if not target:
        return 1.0 if not recognised else 0.0
    if target in recognised:
        return 1.0
    return 1.0 - min(edit_distance(recognised, target), len(target)) / len(target)


def multiset_similarity(recognised: str, target: str) -> float:
    """Which characters were read, not where: both strings normalised as in :func:`text_similarity` and sorted,
    then ``1 - min(edit_distance, len(target)) / len(target)``: Flow-GRPO's formula without its full credit for
    a target found inside a longer text (a meaningless test on sorted strings, and an incentive to draw an object
    twice), so every missing or extra character costs. An empty target scores 1.0 only for an empty recognition."""
    recognised, target = "".join(sorted(_normalise(recognised))), "".join(sorted(_normalise(target)))
    if not target:
        return 1.0 if not recognised else 0.0
    return 1.0 - min(edit_distance(recognised, target), len(target)) / len(target)


@register_reward("ocr")
class OCRReward(Reward):
    """Text-rendering accuracy: how well the image shows the prompt's target text (Flow-GRPO's OCR reward).

    The text recognised by rapidocr-onnxruntime (detection + recognition ONNX models shipped in its wheel, run
    on the CPU, offline) is concatenated in reading order, keeping boxes of positive confidence as the official
    scorer does, and compared with the target by :func:`text_similarity`. The target is ``target(prompt)`` when
    given, else the first quoted span of the prompt, or the whole prompt when it has no quotes (set
    ``require_quotes=True`` to make that an error instead).

    Args:
        engine: an OCR callable ``engine(uint8 HWC array, use_det=..., use_cls=False) -> (results, elapsed)`` in
            rapidocr's format; default: :func:`ocr_engine`.
        require_quotes: raise on prompts without a quoted target.
        target: ``target(prompt) -> text`` (e.g. the number a prompt asks for).
        single_line: the whole image is one line of text: recognition only, no text detection (small canvases
            such as a 32x96 number, where detection splits or drops characters).
        view: ``view(images) -> images`` applied before reading, e.g. light-on-dark strokes inverted and
            upscaled (rapidocr reads dark print on a light background, a few dozen pixels high).
        order_free: score which characters were read, not their order, by :func:`multiset_similarity` (a canvas
            of separate objects, read in any order) instead of :func:`text_similarity`.
    """

    def __init__(self, engine=None, require_quotes: bool = False, target=None, single_line: bool = False,
                 view=None, order_free: bool = False):
        super().__init__()
        self.engine = ocr_engine() if engine is None else engine
        self.require_quotes = require_quotes
        self.target_fn = target
        self.single_line, self.view, self.order_free = single_line, view, order_free

    def recognise(self, images: torch.Tensor) -> list[str]:
        """The text found in each image: with detection, boxes joined top-to-bottom, left-to-right."""
        texts = []
        for array in to_uint8_hwc(images if self.view is None else self.view(images)):
            results, _ = self.engine(array, use_det=not self.single_line, use_cls=False)
            if self.single_line:  # rec only: [[text, confidence]]
                texts.append("".join(text for text, confidence in results or [] if confidence > 0))
                continue
            boxes = sorted(results or [], key=lambda r: (min(p[1] for p in r[0]), min(p[0] for p in r[0])))
            texts.append("".join(r[1] for r in boxes if r[2] > 0))
        return texts

    def target(self, prompt: str) -> str:
        if self.target_fn is not None:
            return self.target_fn(prompt)
        text = quoted_text(prompt)
        if text is None:
            if self.require_quotes:
                raise ValueError(f"OCR reward: no quoted target text in prompt {prompt!r}")
            return prompt
        return text

    def score(self, images, prompts):
        similarity = multiset_similarity if self.order_free else text_similarity
        scores = [similarity(found, self.target(p)) for found, p in zip(self.recognise(images), prompts)]
        return torch.tensor(scores, device=images.device)
