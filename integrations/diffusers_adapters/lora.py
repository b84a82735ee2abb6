"""LoRA training policies on one diffusers transformer: trained, behaviour (old) and reference.

All three algorithms need up to three versions of the policy network, and with LoRA they can
share the frozen base weights:

- the trained policy theta: the base plus the trainable LoRA adapter ("default");
- the behaviour policy theta_old (V-GRPO's old surrogates, DiffusionNFT's soft-updated v_old): a
  second, frozen adapter ("old") that receives copies / EMA updates of the trained one
  (`copy_adapter`, `ema_adapter`);
- the reference policy (the pretrained model, for KL-to-reference terms): the same network with
  all adapters disabled; with GARDO's reference reset, after the first reset, a third frozen adapter
  ("reference") holding the trained one's weights at the last reset (`AdapterReference`).

The adapters live inside the transformer (peft via diffusers' `add_adapter`), so switching between
the policies switches which adapter is active. `AdapterView` does that switch around each call,
which lets a loss hold the trained model and a frozen one and call both in the same forward.

Note on peft's switching: activating an adapter sets `requires_grad=True` on it and False on the
others, and disabling adapters sets it False on all of them. The views restore the trained adapter
after every call, so the trainable parameter set is the same before and after.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from vgrpo_lib.extras import needs_extra

__all__ = [
    "TRAINED_ADAPTER", "BEHAVIOUR_ADAPTER", "REFERENCE_ADAPTER", "ATTENTION_TARGET_MODULES", "add_lora",
    "add_adapter_copy", "add_behaviour_adapter", "lora_parameters", "ema_adapter", "copy_adapter",
    "upcast_trainable_parameters", "adapters_disabled", "adapter_active", "reference_policy", "behaviour_policy",
    "AdapterView", "AdapterBehaviour", "AdapterReference", "adapter_state", "load_adapter_state",
]

TRAINED_ADAPTER = "default"
BEHAVIOUR_ADAPTER = "old"
REFERENCE_ADAPTER = "reference"

# The attention projections of the joint (image + text) blocks of SD3 and FLUX, as in Flow-GRPO's
# SD3 LoRA; FLUX's single-stream blocks match to_q/to_k/to_v too.
ATTENTION_TARGET_MODULES = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
)


def add_lora(transformer: nn.Module, r: int = 32, alpha: int = 64,
             target_modules: str | Sequence[str] = ATTENTION_TARGET_MODULES,
             adapter_name: str = TRAINED_ADAPTER, dropout: float = 0.0) -> None:
    """Add a trainable LoRA adapter to a diffusers transformer and freeze everything else.

    Args:
        transformer: an `SD3Transformer2DModel` / `FluxTransformer2DModel` (any diffusers model with
            `add_adapter`).
        r, alpha: LoRA rank and scale numerator (update = (alpha / r) B A). The paper's SD3.5-M
            setting is r=32, alpha=64.
        target_modules: module-name suffixes to adapt (default: the attention projections), or one regular
            expression matched against each module's full name (FLUX.2's `FLUX2_LORA_TARGET_MODULES`).
        adapter_name: the adapter's name; keep the default for the trained policy.
        dropout: LoRA dropout (0 keeps the surrogate deterministic, which the ratio of V-GRPO needs).

    The B matrices start at zero (peft's "gaussian" init), so the trained policy equals the base
    model until the first optimizer step. Only the new adapter's parameters require grad afterwards.
    """
    with needs_extra("diffusers", "A LoRA adapter"):
        from peft import LoraConfig

    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, init_lora_weights="gaussian",
                        target_modules=target_modules if isinstance(target_modules, str) else list(target_modules))
    transformer.add_adapter(config, adapter_name=adapter_name)
    for name, param in transformer.named_parameters():
        param.requires_grad_(f".{adapter_name}." in name and "lora_" in name)


def add_adapter_copy(transformer: nn.Module, name: str, source: str = TRAINED_ADAPTER) -> None:
    """Add a frozen adapter ``name`` with the same config as ``source``, initialised as a copy of it.

    diffusers activates a newly added adapter; ``source`` is re-activated here, so the trained policy stays the
    active one.
    """
    config = transformer.peft_config[source]
    with warnings.catch_warnings():  # peft warns that the model now has several adapters: that is the point
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        transformer.add_adapter(config.__class__(**config.to_dict()), adapter_name=name)
    transformer.set_adapter(source)
    copy_adapter(transformer, source, name)


def add_behaviour_adapter(transformer: nn.Module, source: str = TRAINED_ADAPTER, name: str = BEHAVIOUR_ADAPTER) -> None:
    """The behaviour (old) policy's adapter: :func:`add_adapter_copy` of ``source`` named ``name``."""
    add_adapter_copy(transformer, name, source)


def lora_parameters(transformer: nn.Module, adapter_name: str = TRAINED_ADAPTER) -> dict[str, nn.Parameter]:
    """The LoRA parameters of one adapter, keyed by name with the adapter name replaced by '{}'."""
    tag = f".{adapter_name}."
    return {name.replace(tag, ".{}."): p for name, p in transformer.named_parameters() if "lora_" in name and tag in name}


@torch.no_grad()
def ema_adapter(transformer: nn.Module, decay: float, source: str = TRAINED_ADAPTER, target: str = BEHAVIOUR_ADAPTER) -> None:
    """target <- decay * target + (1 - decay) * source, over the LoRA weights of two adapters.

    DiffusionNFT's soft old-policy update (`d = min(0.001 * step, 0.5)` in its schedule); decay=0
    is a hard copy (V-GRPO and Flow-GRPO: theta_old = theta at the start of each iteration).
    """
    src, dst = lora_parameters(transformer, source), lora_parameters(transformer, target)
    if src.keys() != dst.keys():
        raise ValueError(f"adapters {source!r} and {target!r} do not cover the same modules")
    for key, p_dst in dst.items():
        p_dst.lerp_(src[key].to(p_dst.dtype), 1.0 - decay)


def copy_adapter(transformer: nn.Module, source: str = TRAINED_ADAPTER, target: str = BEHAVIOUR_ADAPTER) -> None:
    """target <- source over the LoRA weights (the hard old-policy update)."""
    ema_adapter(transformer, 0.0, source, target)


def upcast_trainable_parameters(module: nn.Module, dtype: torch.dtype = torch.float32) -> None:
    """Store the trainable parameters in `dtype` (float32) while the frozen base stays in bf16.

    Optimizer updates of size lr * grad (lr = 3e-4) vanish when added to bf16 weights; keeping the
    LoRA weights in fp32 avoids that at a negligible memory cost. peft's LoRA layers cast their input
    to the adapter dtype and the result back, so forward passes work with mixed storage.
    """
    for param in module.parameters():
        if param.requires_grad:
            param.data = param.data.to(dtype)


@contextmanager
def adapters_disabled(transformer: nn.Module) -> Iterator[None]:
    """Run the base model (all LoRA adapters off) inside the block, then re-enable the trained adapter."""
    active = transformer.active_adapters()
    transformer.disable_adapters()
    try:
        yield
    finally:
        transformer.enable_adapters()
        transformer.set_adapter(active)


@contextmanager
def adapter_active(transformer: nn.Module, adapter_name: str) -> Iterator[None]:
    """Make `adapter_name` the active adapter inside the block, then restore the previous one."""
    active = transformer.active_adapters()
    transformer.set_adapter(adapter_name)
    try:
        yield
    finally:
        transformer.set_adapter(active)


@contextmanager
def reference_policy(model: nn.Module) -> Iterator[nn.Module]:
    """`with reference_policy(model) as ref: v = ref(x_t, t, cond)`: the pretrained model.

    `model` is a protocol adapter (`SD3Velocity` / `FluxVelocity`) whose transformer carries LoRA
    adapters; inside the block it computes the base model's velocity.
    """
    with adapters_disabled(model.transformer):
        yield model


@contextmanager
def behaviour_policy(model: nn.Module, adapter_name: str = BEHAVIOUR_ADAPTER) -> Iterator[nn.Module]:
    """`with behaviour_policy(model) as old: v = old(x_t, t, cond)`: the old-policy adapter active."""
    with adapter_active(model.transformer, adapter_name):
        yield model


class AdapterView:
    """A frozen policy as a plain protocol callable: `view(x_t, t, cond) -> v`.

    Each call switches the shared transformer to `adapter_name` (None: adapters disabled, i.e. the
    reference policy), runs the model without gradients, and switches back. Use it where a loss
    needs the trained and a frozen policy in one forward (DiffusionNFT's v_old, V-GRPO's x-space
    KL to the behaviour policy, a KL to the reference).

    Not an nn.Module on purpose: it shares, and must not re-register, the trained model's
    parameters.
    """

    def __init__(self, model: nn.Module, adapter_name: str | None = BEHAVIOUR_ADAPTER):
        self.model = model
        self.adapter_name = adapter_name

    @torch.no_grad()
    def __call__(self, x_t: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        if self.adapter_name is None:
            with adapters_disabled(self.model.transformer):
                return self.model(x_t, t, cond)
        with adapter_active(self.model.transformer, self.adapter_name):
            return self.model(x_t, t, cond)


class AdapterBehaviour(AdapterView):
    """The behaviour policy as the second, frozen LoRA adapter ``"old"`` of the trained policy's transformer
    (:class:`vgrpo_lib.algorithms.policies.BehaviourPolicy`): DiffusionNFT's old policy without a second transformer.

    Made as a copy of the trained adapter; ``update_(decay)`` is the soft update :func:`ema_adapter`; its state
    dict holds the old adapter's LoRA weights only. Under FSDP2 the adapter is sharded with the transformer, so
    ``shard`` has nothing to do.

    Args:
        model: the trained policy (a velocity adapter whose ``transformer`` carries the trained adapter).
    """

    def __init__(self, model: nn.Module):
        add_behaviour_adapter(model.transformer)
        super().__init__(model, BEHAVIOUR_ADAPTER)

    def update_(self, decay: float) -> None:
        ema_adapter(self.model.transformer, decay)

    def shard(self, strategy: str) -> None:
        """Nothing to do: the adapter lives (and is sharded) inside the trained model."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return adapter_state(self.model.transformer, BEHAVIOUR_ADAPTER)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load_adapter_state(self.model.transformer, BEHAVIOUR_ADAPTER, state, "behaviour adapter")


class AdapterReference(AdapterView):
    """The reference policy of a LoRA-trained transformer, resettable as GARDO resets it: the pretrained model
    (adapters off) until the first :meth:`reset_`, then a frozen third adapter ``"reference"`` holding the trained
    adapter's weights at the last reset (as the official code keeps its reference in an adapter: tinnerhrhe/GARDO,
    scripts/train_sd3_grpo_gardo.py, ``main``). No second transformer either way.

    :meth:`hold_resets` adds that adapter; call it before the model is wrapped or sharded (the trainer does, when
    ``schedule.reference_reset`` is set), so that the adapter is sharded with the transformer as the behaviour
    adapter is. Until then the view is the plain adapters-off reference.

    Args:
        model: the trained policy (a velocity adapter whose ``transformer`` carries the trained adapter).
    """

    def __init__(self, model: nn.Module):
        super().__init__(model, None)

    @property
    def holds_resets(self) -> bool:
        """Whether the adapter that resets copy into exists (:meth:`hold_resets` was called)."""
        return REFERENCE_ADAPTER in self.model.transformer.peft_config

    def hold_resets(self) -> None:
        """Add the frozen ``"reference"`` adapter (a copy of the trained one, unused until the first reset)."""
        if not self.holds_resets:
            add_adapter_copy(self.model.transformer, REFERENCE_ADAPTER)

    def reset_(self) -> None:
        """The reference becomes the trained policy as it is now."""
        self._require_held("reset_")
        copy_adapter(self.model.transformer, TRAINED_ADAPTER, REFERENCE_ADAPTER)
        self.adapter_name = REFERENCE_ADAPTER

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The reference adapter's LoRA weights once reset; empty while the reference is the pretrained model."""
        return {} if self.adapter_name is None else adapter_state(self.model.transformer, REFERENCE_ADAPTER)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`: a non-empty state makes the reference that adapter again."""
        if state:
            self._require_held("load_state_dict")
            load_adapter_state(self.model.transformer, REFERENCE_ADAPTER, state, "reference adapter")
            self.adapter_name = REFERENCE_ADAPTER

    def _require_held(self, method: str) -> None:
        """A RuntimeError unless :meth:`hold_resets` added the adapter (the one place it is added: before sharding)."""
        if not self.holds_resets:
            raise RuntimeError(f"AdapterReference.{method} before hold_resets: the reference adapter does not exist")


def adapter_state(transformer: nn.Module, adapter_name: str) -> dict[str, torch.Tensor]:
    """A copy of one adapter's LoRA weights, keyed as :func:`lora_parameters` keys them."""
    return {name: p.detach().clone() for name, p in lora_parameters(transformer, adapter_name).items()}


@torch.no_grad()
def load_adapter_state(transformer: nn.Module, adapter_name: str, state: dict[str, torch.Tensor], what: str) -> None:
    """Copy :func:`adapter_state`'s ``state`` into the adapter ``adapter_name``; a KeyError naming ``what`` when
    the keys differ."""
    params = lora_parameters(transformer, adapter_name)
    if state.keys() != params.keys():
        missing, unexpected = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
        raise KeyError(f"{what} state does not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    for name, param in params.items():
        param.copy_(state[name])
