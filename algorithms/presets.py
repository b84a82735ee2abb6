"""Named settings: the testbed defaults per algorithm, and the paper's SD3.5-M / FLUX.1-dev settings.

A preset is a list of ``key=value`` overrides applied before the user's own (see :mod:`algorithms.config`).
The SD3.5-M and FLUX.1-dev presets train hub models and therefore run only where those weights exist (and
need ``model.prompts=FILE``); elsewhere they fail with a clear message (see :func:`algorithms.tasks.load_task`).
"""

from __future__ import annotations

TESTBED = {
    # One gradient step per rollout with soft-clipped advantages (the paper's preference-stage setting) and
    # an x-space KL to the base policy. Swept on `digit` (60 iterations, seed 0): lr 3e-4 reaches 100% by
    # iteration 20 but collapses diversity (0.23 -> 0.01); lr 1e-4 without KL 0.03; ref_kl_coef 1 0.06;
    # ref_kl_coef 3 keeps 0.17 at 96.5% accuracy; ref_kl_coef 10 stalls at 72%.
    "vgrpo": ["optim.lr=1e-4", "advantage.soft_clip=3.0", "vgrpo.ref_kl_coef=3.0", "iterations=100"],
    # Flow-GRPO: SDE rollout, per-step clipped ratio, two optimizer steps per rollout as in the anchor.
    "flow_grpo": ["optim.lr=1e-4", "optim.minibatch_size=640", "flow_grpo.clip_epsilon=1e-4", "iterations=100"],
    # DiffusionNFT: old-policy rollout, every rollout timestep once per step.
    "diffusion_nft": ["optim.lr=1e-4", "iterations=100"],
}

PAPER = {
    # SD3.5-M preference stage: LoRA r=32 (integrations), lr 3e-4, G=24, 48 prompts, K=4, one step, eta=3,
    # 40-step ODE rollout without CFG on the pipeline scheduler's grid (rollout.shift unset: SD3's shift 3).
    "sd3.5-medium": [
        "task=sd3.5-medium", "optim.lr=3e-4", "group_size=24", "prompts_per_iteration=48", "vgrpo.num_pairs=4",
        "advantage.soft_clip=3.0", "rollout.num_steps=40", "rollout.solver=dpmpp_2m", "iterations=580",
    ],
    # FLUX.1-dev: 16-step rollout on the scheduler's resolution-dependent grid, K=4, ratio clipping over several
    # steps per rollout, 300 iterations.
    "flux.1-dev": [
        "task=flux.1-dev", "vgrpo.num_pairs=4", "rollout.num_steps=16", "rollout.solver=dpmpp_2m",
        "optim.epochs=2", "iterations=300",
    ],
}

PRESETS = ("testbed", *PAPER)


def preset_overrides(preset: str, algo: str) -> list[str]:
    """Overrides of ``preset`` for ``algo``; unknown presets raise a ValueError listing the valid ones."""
    if preset == "testbed":
        return list(TESTBED[algo])
    if preset in PAPER:
        return list(PAPER[preset])
    raise ValueError(f"Unknown preset {preset!r}; expected one of {', '.join(PRESETS)}.")
