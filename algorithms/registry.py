"""Algorithm names -> classes. A new algorithm is a short file and one line here."""

from __future__ import annotations

from algorithms.awm import AWM
from algorithms.base import Algorithm
from algorithms.diffusion_nft import DiffusionNFT
from algorithms.flow_grpo import FlowGRPO
from algorithms.flow_grpo_fast import FlowGRPOFast
from algorithms.fpo import FPO
from algorithms.grpo_guard import GRPOGuard
from algorithms.vgrpo import VGRPO

ALGORITHM_CLASSES: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (VGRPO, FlowGRPO, DiffusionNFT, FPO, AWM, GRPOGuard, FlowGRPOFast)
}
