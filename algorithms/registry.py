"""Algorithm names -> classes. A new algorithm is a short file and one line here."""

from __future__ import annotations

from algorithms.base import Algorithm
from algorithms.diffusion_nft import DiffusionNFT
from algorithms.flow_grpo import FlowGRPO
from algorithms.vgrpo import VGRPO

ALGORITHM_CLASSES: dict[str, type[Algorithm]] = {cls.name: cls for cls in (VGRPO, FlowGRPO, DiffusionNFT)}
