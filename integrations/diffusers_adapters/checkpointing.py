"""Gradient checkpointing of every N-th transformer block (``model.gradient_checkpointing_every``).

    checkpointed = enable_block_checkpointing(transformer, every=2)   # the 2nd, 4th, 6th ... block recomputed

diffusers' ``enable_gradient_checkpointing()`` recomputes every block of the transformer in the backward pass: the
least memory, about one more forward of compute. Checkpointing every N-th block instead keeps the other blocks'
activations: memory between none and all checkpointed, recomputation ``1 / N`` of it. The blocks are counted as
torchtitan's per-layer selective activation checkpointing counts its layers (``selective_ac_option = N``
checkpoints the layers whose 1-based count is a multiple of N; foundation-model-stack/fms-fsdp's
``every_xth_item`` alike): over the transformer's block lists in the order its forward runs them (FLUX.1 / FLUX.2:
the double-stream blocks, then the single-stream ones), so ``every=1`` is diffusers' own behaviour.

It works through diffusers' hook for this, ``enable_gradient_checkpointing(gradient_checkpointing_func=...)``: the
transformer hands each block to that function, which recomputes the chosen ones (non-reentrant
``torch.utils.checkpoint``, as diffusers' default) and calls the others directly.
"""

from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["enable_block_checkpointing", "transformer_blocks"]


def transformer_blocks(transformer: nn.Module) -> list[nn.Module]:
    """The blocks of a diffusers transformer in the order its forward runs them: the entries of its ``ModuleList``
    children whose name ends in ``blocks`` (``transformer_blocks``, FLUX's ``single_transformer_blocks``, Wan's
    ``blocks``), in the order they were registered. A ValueError naming the class when it has none."""
    blocks = [block for name, child in transformer.named_children()
              if name.endswith("blocks") and isinstance(child, nn.ModuleList) for block in child]
    if not blocks:
        raise ValueError(f"{type(transformer).__name__} has no ModuleList of blocks (a child named '*blocks') to "
                         f"checkpoint.")
    return blocks


def enable_block_checkpointing(transformer: nn.Module, every: int = 1) -> list[nn.Module]:
    """Turn on ``transformer``'s gradient checkpointing for every ``every``-th block (the ``every``-th,
    2 ``every``-th, ... of :func:`transformer_blocks`; 1: all, as ``enable_gradient_checkpointing()``). A model
    with ``experts`` (:class:`~vgrpo_lib.integrations.diffusers_adapters.wan.WanExperts`) is done per expert.
    Returns the checkpointed blocks."""
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"enable_block_checkpointing: every must be an int >= 1, got {every!r}.")
    models = getattr(transformer, "experts", (transformer,))
    chosen = [block for model in models for block in transformer_blocks(model)[every - 1 :: every]]
    recomputed = {id(block) for block in chosen}

    def checkpoint_chosen(block: nn.Module, *args):
        if id(block) in recomputed:
            return checkpoint(block.__call__, *args, use_reentrant=False)
        return block(*args)

    for model in models:
        model.enable_gradient_checkpointing(gradient_checkpointing_func=checkpoint_chosen)
    return chosen

