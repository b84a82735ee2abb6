"""Small networks of the embedded testbed, each rebuildable from a plain config dict.

* ``VelocityMLP``: the base policy, a conditional rectified-flow velocity network following the
  library protocol ``model(x_t, t, cond) -> v`` (``x_t`` ``(B, C, H, W)`` in model space, ``t``
  ``(B,)`` in ``[0, 1]`` with 1 = noise, ``cond`` int64 prompt ids ``(B,)`` or ``(B, S)``).
* ``DigitClassifier``: a small CNN that scores image-space digits; the reward model.
* ``JudgeClassifier``: an MLP on pixels (a different model family, trained on a disjoint split);
  only ever used to *evaluate*, never as a reward, so that reward hacking of the CNN shows up as
  a gap between the two.

Every model stores its constructor arguments in ``.config`` (JSON-serialisable) and
``build_model(kind, config)`` rebuilds it; this is how checkpoints are loaded.
"""

from __future__ import annotations

import importlib
import math

import torch
from torch import nn

__all__ = ["NULL_ID", "NUM_IDS", "VelocityMLP", "DigitClassifier", "JudgeClassifier", "MODEL_KINDS", "build_model"]

NULL_ID = 10
"""Prompt id meaning "no prompt" (the unconditional branch of classifier-free guidance)."""
NUM_IDS = 11  # ten digits plus the null id


def _check_image(x: torch.Tensor, image_shape: tuple[int, ...], who: str) -> None:
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(image_shape):
        raise ValueError(f"{who} expects images (B, {', '.join(map(str, image_shape))}), got {tuple(x.shape)}")


class _ResidualBlock(nn.Module):
    """Pre-norm MLP block whose LayerNorm is modulated (scale, shift, gate) by the embedding."""

    def __init__(self, width: int, emb_dim: int, expansion: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.modulation = nn.Linear(emb_dim, 3 * width)
        self.mlp = nn.Sequential(
            nn.Linear(width, expansion * width), nn.SiLU(), nn.Linear(expansion * width, width)
        )
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def forward(self, h: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        scale, shift, gate = self.modulation(emb).chunk(3, dim=-1)
        return h + (1.0 + gate) * self.mlp(self.norm(h) * (1.0 + scale) + shift)


class VelocityMLP(nn.Module):
    """Conditional residual-MLP velocity network for rectified flow.

    ``forward(x_t, t, cond) -> v``: ``x_t`` ``(B, *image_shape)`` in model space, ``t`` ``(B,)``
    (or a scalar) in ``[0, 1]``, ``cond`` int64 ``(B,)`` when ``num_slots == 1`` or
    ``(B, num_slots)`` (e.g. left digit, right digit), ids in ``0..9`` or ``NULL_ID`` (10).
    Returns the velocity ``v`` (the target is ``eps - x``) with the shape of ``x_t``.

    Parameterisation (x-prediction, as in "Back to Basics: Let Denoising Generative Models
    Denoise", Li & He 2025): the MLP body predicts the clean image ``x_hat`` and the velocity is
    ``v = (x_t - x_hat) / max(t, t_min)``. Clean digits lie near a low-dimensional manifold that fits
    through the ``width`` bottleneck, whereas a directly predicted velocity must carry the full
    per-pixel noise near ``t = 0``, which a narrow MLP cannot (its samples stay speckled). For
    ``t >= t_min`` the conversion ``x_hat = x_t - t v`` used by the losses recovers the body's output
    exactly; ``t_min`` (0.05, one step of a 20-step grid) only bounds the velocity.

    Conditioning: every slot has its own learned id table, the slot embeddings are summed, so
    "3 then 7" and "7 then 3" get different embeddings; a sinusoidal time embedding (``t`` scaled
    to ``[0, 1000]``) is added. The embedding modulates every residual block (adaptive LayerNorm).
    The output layer starts at zero, so the untrained network predicts ``x_hat = 0`` (mid-gray).
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int] = (1, 28, 28),
        num_slots: int = 1,
        width: int = 512,
        depth: int = 4,
        expansion: int = 2,
        emb_dim: int = 256,
        time_features: int = 64,
        t_min: float = 0.05,
    ):
        super().__init__()
        self.config = dict(
            image_shape=list(image_shape), num_slots=num_slots, width=width, depth=depth,
            expansion=expansion, emb_dim=emb_dim, time_features=time_features, t_min=t_min,
        )
        self.t_min = t_min
        self.image_shape = tuple(image_shape)
        self.num_slots = num_slots
        self.time_features = time_features
        dim = math.prod(self.image_shape)
        self.prompt_table = nn.Embedding(num_slots * NUM_IDS, emb_dim)
        self.register_buffer("slot_offset", torch.arange(num_slots) * NUM_IDS, persistent=False)
        self.time_mlp = nn.Sequential(nn.Linear(time_features, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim))
        self.emb_act = nn.SiLU()
        self.inp = nn.Linear(dim, width)
        self.blocks = nn.ModuleList(_ResidualBlock(width, emb_dim, expansion) for _ in range(depth))
        self.out_norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def _time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.time_features // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=t.dtype) / half)
        angles = 1000.0 * t[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        _check_image(x_t, self.image_shape, "VelocityMLP")
        batch = x_t.shape[0]
        t = torch.as_tensor(t, dtype=x_t.dtype, device=x_t.device)
        t = t.expand(batch) if t.ndim == 0 else t
        if t.shape != (batch,):
            raise ValueError(f"t must have shape ({batch},), got {tuple(t.shape)}")
        cond = cond.reshape(batch, -1) if cond.ndim == 1 else cond
        if cond.dtype != torch.long or cond.shape != (batch, self.num_slots):
            raise ValueError(
                f"cond must be int64 prompt ids of shape ({batch},) or ({batch}, {self.num_slots}), "
                f"got {cond.dtype} {tuple(cond.shape)}"
            )
        if ((cond < 0) | (cond > NULL_ID)).any():
            raise ValueError(f"prompt ids must lie in 0..{NULL_ID} ({NULL_ID} = null prompt)")
        emb = self.prompt_table(cond + self.slot_offset).sum(dim=1)
        emb = self.emb_act(emb + self.time_mlp(self._time_embedding(t)))
        h = self.inp(x_t.reshape(batch, -1))
        for block in self.blocks:
            h = block(h, emb)
        x_hat = self.out(self.out_norm(h)).reshape(x_t.shape)
        return (x_t - x_hat) / t.clamp_min(self.t_min).view(-1, *[1] * (x_t.ndim - 1))


class DigitClassifier(nn.Module):
    """Small CNN digit classifier: image-space ``(B, 1, S, S)`` in ``[0, 1]`` -> logits ``(B, 10)``.

    Two conv stages (two 3x3 convs each, batch norm, ReLU, 2x2 max-pool), then a two-layer head.
    ``image_size`` is 28 for MNIST and 8 for the scikit-learn digits. This is the reward model.
    """

    def __init__(self, image_size: int = 28, channels: tuple[int, int] = (32, 64), hidden: int = 128,
                 dropout: float = 0.3):
        super().__init__()
        self.config = dict(image_size=image_size, channels=list(channels), hidden=hidden, dropout=dropout)
        self.image_size = image_size
        c1, c2 = channels

        def stage(cin: int, cout: int) -> list[nn.Module]:
            return [
                nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2),
            ]

        self.features = nn.Sequential(*stage(1, c1), *stage(c1, c2))
        side = image_size // 4
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(c2 * side * side, hidden), nn.ReLU(),
            nn.Dropout(dropout), nn.Linear(hidden, 10),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_image(images, (1, self.image_size, self.image_size), "DigitClassifier")
        return self.head(self.features((images - 0.5) / 0.5))


class JudgeClassifier(nn.Module):
    """Independent judge: an MLP on raw pixels, ``(B, 1, S, S)`` in ``[0, 1]`` -> logits ``(B, 10)``.

    Deliberately a different family from ``DigitClassifier`` (no convolutions, no weight sharing)
    and trained on a disjoint split, so that images which exploit the CNN's idiosyncrasies are not
    automatically accepted by the judge. Never use it as a reward.
    """

    def __init__(self, image_size: int = 28, hidden: tuple[int, ...] = (512, 256), dropout: float = 0.3):
        super().__init__()
        self.config = dict(image_size=image_size, hidden=list(hidden), dropout=dropout)
        self.image_size = image_size
        layers: list[nn.Module] = [nn.Flatten()]
        fan_in = image_size * image_size
        for width in hidden:
            layers += [nn.Linear(fan_in, width), nn.ReLU(), nn.Dropout(dropout)]
            fan_in = width
        layers.append(nn.Linear(fan_in, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        _check_image(images, (1, self.image_size, self.image_size), "JudgeClassifier")
        return self.net(images)


MODEL_KINDS: dict[str, type[nn.Module]] = {
    "VelocityMLP": VelocityMLP,
    "DigitClassifier": DigitClassifier,
    "JudgeClassifier": JudgeClassifier,
}


_MODULE_OF_KIND = {"DigitDetector": "vgrpo_lib.integrations.testbed.geneval_digits.detector"}
"""Kinds defined outside this module, imported on first use (they import the testbed themselves)."""


def build_model(kind: str, config: dict) -> nn.Module:
    """Rebuild a testbed model from its class name and ``.config`` dict (as stored in checkpoints)."""
    if kind in _MODULE_OF_KIND:
        cls = getattr(importlib.import_module(_MODULE_OF_KIND[kind]), kind)
    elif kind in MODEL_KINDS:
        cls = MODEL_KINDS[kind]
    else:
        raise ValueError(f"unknown model kind {kind!r}; valid kinds: {', '.join([*MODEL_KINDS, *_MODULE_OF_KIND])}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    return cls(**kwargs)
