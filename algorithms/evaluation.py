"""Evaluation during training: ODE samples on held-out seeds (``eval.*``), scored by the task; CFG-free unless the
task evaluates under true CFG against a negative prompt (``model.negative_prompt``, :func:`guidance_label`).

The samples come from their own RNG streams (``eval.seed``): the global streams are untouched by evaluation, and
every evaluation of a run draws the same noise, so evaluations are comparable and resumes exact. A run that keeps an
EMA of its weights is evaluated on the average. Non-finite samples, or a non-finite headline number (``reward_mean``
and the task's ``evaluation_metrics``), mean the policy diverged (a diagnostic such as the diversity of one sample
per prompt may be undefined, NaN, and is not checked).
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
from torch import nn

from vgrpo_lib.algorithms.config import EvalConfig, ModelConfig
from vgrpo_lib.algorithms.errors import DivergenceError
from vgrpo_lib.algorithms.policies import WeightEMA
from vgrpo_lib.algorithms.rng import isolated_rng
from vgrpo_lib.algorithms.scoring import check_finite_images

__all__ = ["evaluate_policy", "guidance_label"]


def guidance_label(model: ModelConfig) -> str:
    """How evaluation samples are guided, for titles and model cards: ``"CFG-free"``, or ``"CFG 4 against ''"`` when
    ``model.negative_prompt`` is set and ``model.true_cfg_scale`` exceeds 1 (what
    :meth:`vgrpo_lib.integrations.tasks.hub.DiffusersTask.evaluation_policy` then samples)."""
    if model.negative_prompt is None or model.true_cfg_scale <= 1.0:
        return "CFG-free"
    return f"CFG {model.true_cfg_scale:g} against {model.negative_prompt!r}"


@torch.no_grad()
def evaluate_policy(task, policy: nn.Module, config: EvalConfig, iteration: int, ema: WeightEMA | None = None,
                    score: bool = True):
    """``(result, images, prompts)``: ``config.per_prompt`` samples of every evaluation prompt from ``policy`` (its
    EMA average when ``ema`` is given), ``config.num_steps`` ODE steps, and ``task.evaluate`` of them (None when
    ``score`` is False: under FSDP2 the other ranks take part in the sampling only)."""
    with isolated_rng(config.seed):
        prompts = task.eval_prompts(config.per_prompt)
        generator = torch.Generator().manual_seed(config.seed)
        with nullcontext() if ema is None else ema.swapped_in():
            images = task.sample(policy, prompts, num_steps=config.num_steps, generator=generator)
        check_finite_images(images, f"the evaluation samples of iteration {iteration}")
        if not score:
            return None, images, prompts
        result = task.evaluate(images, prompts)
    bad = [k for k in ["reward_mean", *task.evaluation_metrics] if k in result and not math.isfinite(result[k])]
    if bad:
        raise DivergenceError(f"The evaluation at iteration {iteration} is not finite ({', '.join(bad)}).")
    return result, images, prompts
