"""The precision of the training forwards (``precision``): float32, or bf16 autocast.

``precision=bfloat16`` runs the model forwards of rollouts, old surrogates and losses under bf16 autocast on the
policy's device; parameters, optimizer state and the losses' arithmetic on the float32 samples stay float32, and
evaluation always runs in float32.
"""

from __future__ import annotations

import torch

__all__ = ["autocast"]


def autocast(device_type: str, precision: str):
    """bf16 autocast on ``device_type`` for ``precision="bfloat16"``; a disabled (no-op) context for float32."""
    return torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bfloat16")
