"""Algorithm names -> classes. A new algorithm is a short file and one line here."""

from __future__ import annotations

from vgrpo_lib.algorithms.awm import AWM
from vgrpo_lib.algorithms.base import Algorithm
from vgrpo_lib.algorithms.dgpo import DGPO
from vgrpo_lib.algorithms.diffusion_nft import DiffusionNFT
from vgrpo_lib.algorithms.flow_grpo import FlowGRPO
from vgrpo_lib.algorithms.flow_grpo_fast import FlowGRPOFast
from vgrpo_lib.algorithms.fpo import FPO
from vgrpo_lib.algorithms.grpo_guard import GRPOGuard
from vgrpo_lib.algorithms.vgrpo import VGRPO

__all__ = ["ALGORITHM_CLASSES"]

ALGORITHM_CLASSES: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (VGRPO, FlowGRPO, DiffusionNFT, FPO, AWM, GRPOGuard, FlowGRPOFast, DGPO)
}
