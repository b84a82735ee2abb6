"""A small single-stage digit detector (boxes, class, score) and the crop colour classifier.

`DigitDetector` is a CenterNet-style dense detector (Zhou et al., 2019, "Objects as Points") with a
softmax head: a CNN maps a canvas (B, 3, 64, 64) in [0, 1] to a stride-4 grid (16 x 16 cells); each
cell predicts 11 logits (background + the ten digits), the sub-cell offset of an object centre and
the log box size. Training (see `train_detector`): the cell holding an object's centre is that
object's class, its 8 neighbours are ignored, every other cell is background; the cross-entropies
of the centre cells and of the background cells are averaged separately and added (a plain mean
is swamped by the ~250 background cells per canvas: trained so, the detector scored nothing above
0.3). A peak's score is its softmax probability, the confidence GenEval's 0.3 / 0.9 thresholds
read. Decoding (`decode`) keeps the cells whose object probability (1 - p(background)) is a 3 x 3
local maximum above `min_score`, with the top digit and its probability as label and score, the
box from the regressed centre and size.

Colour (`crop_colors`) is classified from each object's crop, as GenEval does; GenEval runs CLIP
zero-shot on the crop masked to the object's segment, which needs downloaded weights. The
replacement: the stroke-weighted mean colour of the crop (each pixel weighted by its brightest
channel, a soft mask of the digit on the black background), scaled to unit maximum, named by the
nearest tint of `compositions.TINTS`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vgrpo_lib.integrations.rewards.geneval import Detection
from vgrpo_lib.integrations.testbed.geneval_digits.compositions import TINTS
from vgrpo_lib.integrations.testbed.geneval_digits.prompts import COLORS

__all__ = ["STRIDE", "NUM_CLASSES", "DigitDetector", "decode", "DetectorPlugin", "crop_colors"]

STRIDE = 4
NUM_CLASSES = 10


class DigitDetector(nn.Module):
    """Dense digit detector: images (B, 3, S, S) in [0, 1] -> head (B, 15, S/4, S/4).

    Head channels: 11 class logits (0 = background, 1 + d = digit d), centre offset (2, sigmoid ->
    fraction of a cell), log box width and height in cells (2). The stem folds each 4 x 4 pixel patch
    into channels (pixel unshuffle) and mixes them (1x1 conv to `channels[0]`, 3x3 conv to
    `channels[1]`): no layer runs at full resolution, which keeps CPU training to minutes.
    `dilations` are those of the 3x3 residual convolutions at stride 4.
    """

    def __init__(self, channels: tuple[int, int] = (64, 48), dilations: tuple[int, ...] = (1, 2, 4, 1)):
        super().__init__()
        self.config = dict(channels=list(channels), dilations=list(dilations))
        c1, c2 = channels

        def conv(cin, cout, stride=1, dilation=1):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=dilation, dilation=dilation, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU())

        self.stem = nn.Sequential(nn.PixelUnshuffle(STRIDE), nn.Conv2d(3 * STRIDE**2, c1, 1, bias=False),
                                  nn.BatchNorm2d(c1), nn.ReLU(), conv(c1, c2))
        self.blocks = nn.ModuleList(conv(c2, c2, dilation=d) for d in dilations)
        self.head = nn.Sequential(conv(c2, c2), nn.Conv2d(c2, 1 + NUM_CLASSES + 4, 1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != 3 or images.shape[-1] % STRIDE or images.shape[-2] % STRIDE:
            raise ValueError(f"DigitDetector expects images (B, 3, H, W) with H, W multiples of {STRIDE}, "
                             f"got {tuple(images.shape)}")
        h = self.stem(images * 2 - 1)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def decode(head: torch.Tensor, min_score: float = 0.05) -> tuple[torch.Tensor, ...]:
    """Peaks of a detector head (B, 15, h, w) -> (batch index, label, score, box) of every detection.

    Shapes: (M,), (M,), (M,), (M, 4) with boxes x0, y0, x1, y1 in input pixels.
    """
    probs = head[:, : 1 + NUM_CLASSES].softmax(dim=1)
    objectness = 1 - probs[:, 0]
    peaks = (objectness == F.max_pool2d(objectness[:, None], 3, 1, 1)[:, 0]) & (objectness > min_score)
    b, y, x = peaks.nonzero(as_tuple=True)
    score, label = probs[b, 1:, y, x].max(dim=1)
    offset = head[b, 11:13, y, x].sigmoid()
    size = head[b, 13:15, y, x].exp() * STRIDE
    centre = (torch.stack([x, y], dim=1) + offset) * STRIDE
    return b, label, score, torch.cat([centre - size / 2, centre + size / 2], dim=1)


class DetectorPlugin(nn.Module):
    """The `Detector` protocol of `vgrpo_lib.integrations.rewards.geneval` for a DigitDetector: images -> lists of Detection.

    Labels are digit names ("0".."9"); colour is left to `crop_colors` (the reward's colour classifier).
    A module, so that a reward holding it moves the detector with `.to(device)`.
    """

    def __init__(self, model: DigitDetector, min_score: float = 0.05):
        super().__init__()
        self.model = model
        self.min_score = min_score

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> list[list[Detection]]:
        param = next(self.model.parameters())
        b, label, score, box = decode(self.model(images.to(param.device, param.dtype)), self.min_score)
        out: list[list[Detection]] = [[] for _ in range(images.shape[0])]
        for i, d, s, bx in zip(b.tolist(), label.tolist(), score.tolist(), box.tolist()):
            out[i].append(Detection(str(d), s, tuple(bx)))
        return out


def crop_colors(image: torch.Tensor, boxes: torch.Tensor) -> list[str]:
    """Colour names of the objects in boxes (K, 4) of one image (3, H, W) in [0, 1], from their crops.

    Each crop (pixels whose centres lie in the box) is averaged with weights = the pixel's brightest
    channel; the mean colour, scaled to a maximum of 1, gets the name of the nearest tint (scaled
    alike).
    """
    if image.ndim != 3 or image.shape[0] != 3 or boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"crop_colors expects image (3, H, W) and boxes (K, 4), got {tuple(image.shape)}, "
                         f"{tuple(boxes.shape)}")
    _, h, w = image.shape
    boxes = boxes.to(image.device, image.dtype)
    ys = torch.arange(h, device=image.device, dtype=image.dtype) + 0.5
    xs = torch.arange(w, device=image.device, dtype=image.dtype) + 0.5
    inside = (((xs >= boxes[:, :1]) & (xs <= boxes[:, 2:3]))[:, None, :]
              & ((ys >= boxes[:, 1:2]) & (ys <= boxes[:, 3:4]))[:, :, None])  # (K, H, W)
    weight = inside * image.amax(dim=0)
    mean = torch.einsum("khw,chw->kc", weight, image) / weight.sum(dim=(1, 2)).clamp_min(1e-6)[:, None]
    mean = mean / mean.amax(dim=1, keepdim=True).clamp_min(1e-6)
    tints = TINTS.to(image.device, image.dtype)
    tints = tints / tints.amax(dim=1, keepdim=True)
    nearest = torch.cdist(mean, tints).argmin(dim=1)
    return [COLORS[i] for i in nearest.tolist()]
