"""CLIP-style image preprocessing in torch, on the images' device, for whole batches.

The Hugging Face image processors work on PIL images one at a time on the CPU. Rewards see
batches of float images in [0, 1] that usually live on the GPU right after VAE decoding, so the
same steps (resize the shortest side, center crop, normalise) are done here with tensor ops.
The sizes and statistics are read from the model's own processor config, so PickScore,
HPSv2.1, CLIPScore and the aesthetic predictor each preprocess as their processor says.

Resizing uses bicubic interpolation with antialiasing, close to (not bit-identical with) PIL's
bicubic resize; scores differ from the PIL path by small amounts, well below reward noise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ImagePreprocessor"]


class ImagePreprocessor(nn.Module):
    """(B, 3, H, W) in [0, 1] -> (B, 3, crop_h, crop_w) normalised pixel values.

    Args:
        shortest_edge: the shortest image side after resizing (aspect ratio kept).
        crop_size: (height, width) of the center crop.
        mean, std: per-channel normalisation (the CLIP values for all CLIP-based rewards).
    """

    def __init__(self, shortest_edge: int, crop_size: tuple[int, int], mean, std):
        super().__init__()
        self.shortest_edge = int(shortest_edge)
        self.crop_size = (int(crop_size[0]), int(crop_size[1]))
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def from_image_processor(cls, processor) -> "ImagePreprocessor":
        """Read size, crop size, mean and std from a transformers image processor (CLIP / BLIP style)."""
        config = processor.to_dict()
        size, crop = config["size"], config.get("crop_size") if config.get("do_center_crop", True) else None
        if isinstance(size, int):
            size = {"shortest_edge": size}
        shortest = size.get("shortest_edge") or min(size["height"], size["width"])
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        crop = crop or ({"height": size["height"], "width": size["width"]} if size.get("height") else
                        {"height": shortest, "width": shortest})
        return cls(shortest, (crop["height"], crop["width"]), config["image_mean"], config["image_std"])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _, _, h, w = images.shape
        scale = self.shortest_edge / min(h, w)
        new_h, new_w = max(self.crop_size[0], round(h * scale)), max(self.crop_size[1], round(w * scale))
        x = images.float()
        if (new_h, new_w) != (h, w):
            x = F.interpolate(x, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
        top, left = (new_h - self.crop_size[0]) // 2, (new_w - self.crop_size[1]) // 2
        x = x[:, :, top:top + self.crop_size[0], left:left + self.crop_size[1]].clamp(0, 1)
        return (x - self.mean) / self.std
