"""Step control from the config: schedules of the learning rate, the clip range and the KL coefficients, and
the adaptive KL controller (the ``schedule`` section, see :class:`vgrpo_lib.algorithms.config.ScheduleConfig`).

A schedule is written ``NAME`` or ``NAME:key=value,...`` and starts from the configured value (``optim.lr``,
``<algo>.clip_range``, ``<algo>.ref_kl_coef``, ...); it steps once per iteration:

- ``constant``;
- ``linear:end=E,steps=N`` and ``cosine:end=E,steps=N`` (from the start value to ``E`` over ``N`` iterations);
- ``piecewise:at=B1/B2,values=V0/V1/V2`` (``V0`` before iteration ``B1``, ...: a KL switched on at ``B1``);
- ``adaptive:target=T,horizon=H`` (KL coefficients only: :class:`vgrpo_lib.control.AdaptiveKLController`, which
  moves the coefficient so that the KL measured in each iteration tracks ``T``; ``H`` in iterations);
- ``warmup=W`` with any of the first four: a linear warm-up over ``W`` iterations into it
  (:class:`vgrpo_lib.control.Warmup`).

``schedule.reference_reset`` (``kl=K,every=N``) is GARDO's reset of the reference of the KL to the base policy
(:class:`ReferenceReset`): not a value but an event, decided from the KL each iteration measured. It resets a
reference held as a separate copy of the parameters (the testbed's: :class:`CopiedReference`) or one that resets
itself (:class:`ResettableReference`: a LoRA model's, a frozen adapter).
``vgrpo.adaptive_pairs`` (``share=S,max=K,every=N,smoothing=B``) chooses V-GRPO's number of pairs from the noise each
measurement finds (:func:`parse_adaptive_pairs`, :class:`vgrpo_lib.control.PairCountController`).

Every value a schedule reaches is checked, before the run writes anything, by the rule of the value it drives:
the one its loss declares in ``_schedulable_rules`` (:mod:`vgrpo_lib.losses`), or ``>= 0`` for the learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from vgrpo_lib.control import (
    AdaptiveKLController, Constant, Cosine, Linear, PairCountController, Piecewise, Warmup, set_learning_rate,
)
from vgrpo_lib.rules import NON_NEGATIVE, Rule
from vgrpo_lib.errors import UsageError

__all__ = [
    "CopiedReference", "ReferenceReset", "ResettableReference", "SCHEDULED_LR", "SCHEDULES", "StepControl",
    "parse_adaptive_pairs", "parse_fields", "parse_reference_reset", "parse_schedule", "resettable_reference",
]

SCHEDULED_LR = NON_NEGATIVE
"""The rule of a scheduled learning rate: it may decay to 0 (``optim.lr`` itself must be > 0)."""

SCHEDULES = ("constant", "linear", "cosine", "piecewise", "adaptive")
# What each schedule reads (besides the optional warm-up): parameter -> parser.
_PARAMETERS: dict[str, dict[str, Callable[[str], object]]] = {
    "constant": {},
    "linear": {"end": float, "steps": int},
    "cosine": {"end": float, "steps": int},
    "piecewise": {"at": lambda s: tuple(int(v) for v in s.split("/")), "values": lambda s: tuple(float(v) for v in s.split("/"))},
    "adaptive": {"target": float, "horizon": int},
}


def parse_schedule(spec: str, start: float, key: str, rule: Rule, *, adaptive: bool = False):
    """The schedule ``spec`` of the value ``key`` starting at ``start``: a callable ``iteration -> value``, or an
    :class:`AdaptiveKLController` for ``adaptive:...`` (only where ``adaptive`` is allowed). Every value it reaches
    (its ``extremes()``; an adaptive coefficient keeps its start's sign) must obey ``rule``. Errors name ``key``."""
    name, _, rest = spec.partition(":")
    name = name.strip()
    if name not in SCHEDULES or (name == "adaptive" and not adaptive):
        allowed = [s for s in SCHEDULES if adaptive or s != "adaptive"]
        raise UsageError(f"Unknown {key} schedule {name!r}; expected one of {', '.join(allowed)}.")
    expected = _PARAMETERS[name]
    allowed_keys = {**expected, **({} if name == "adaptive" else {"warmup": int})}
    params = parse_fields(rest, f"{key} ({name} schedule)", allowed_keys, ", ".join(allowed_keys) or "no parameters")
    missing = [p for p in expected if p not in params]
    if missing:
        raise UsageError(f"{key}: the {name} schedule needs {', '.join(f'{p}=...' for p in missing)} (got {spec!r}).")
    warmup = params.pop("warmup", None)
    try:
        if name == "adaptive":
            return AdaptiveKLController(start, params["target"], params["horizon"])  # checks its start
        schedule = {
            "constant": lambda: Constant(start),
            "linear": lambda: Linear(start, params["end"], params["steps"]),
            "cosine": lambda: Cosine(start, params["end"], params["steps"]),
            "piecewise": lambda: Piecewise(params["at"], params["values"]),
        }[name]()
        if warmup is not None:
            if warmup < 1:
                raise UsageError(f"warmup must be >= 1, got {warmup}")
            schedule = Warmup(schedule, warmup)
    except ValueError as error:
        raise UsageError(f"{key}: {error}") from None
    for value in schedule.extremes():
        if not (math.isfinite(value) and rule.ok(value)):
            raise UsageError(f"{key}={spec} reaches {value!r}; every value of the schedule must be {rule.text}.")
    return schedule


@dataclass
class ReferenceReset:
    """GARDO's periodic reference reset (He et al., 2025, "GARDO: Reinforcing Diffusion Models without Reward
    Hacking", arXiv 2512.24138; tinnerhrhe/GARDO, scripts/train_sd3_grpo_gardo.py, ``main``): the reference of the KL
    to the base policy becomes a copy of the trained policy after an iteration whose KL to it exceeded ``kl``
    (official ``kl_thres``: 3e-4, checked per gradient step; here on the iteration's mean ``ref_kl``), or once more
    than ``every`` iterations have passed since the last reset (official ``reset_freq``: 15, ``epoch - prev_epoch >
    reset_freq``), so the KL keeps the policy near a recent version of itself instead of the base. GARDO's KL gate
    (the KL only on the samples whose rewards disagree) is not part of it.

    ``since``: iterations since the last reset (or the start); ``resets``: how many so far.
    """

    kl: float | None = None
    every: int | None = None
    since: int = 0
    resets: int = 0

    def due(self, ref_kl: float) -> bool:
        """After an iteration that measured ``ref_kl``: whether the reference is reset now (then counted)."""
        self.since += 1
        reset = (self.kl is not None and ref_kl > self.kl) or (self.every is not None and self.since > self.every)
        if reset:
            self.since, self.resets = 0, self.resets + 1
        return reset


@runtime_checkable
class ResettableReference(Protocol):
    """A reference policy that resets itself to the trained policy, where it is not a separate copy of the
    parameters: a LoRA model's (:class:`vgrpo_lib.integrations.diffusers_adapters.AdapterReference`, a frozen
    adapter). A task's ``reference_policy`` may return one; the trainer calls :meth:`hold_resets` before the policy is
    wrapped or sharded when ``schedule.reference_reset`` is set."""

    def hold_resets(self) -> None:
        """Prepare what resets copy into, before the policy is wrapped or sharded; a second call does nothing."""

    def reset_(self) -> None:
        """The reference becomes the trained policy as it is now."""

    def state_dict(self) -> dict:
        """What a resume needs of the reference (empty while it is the base)."""

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""


class CopiedReference:
    """A reference held as a separate copy of the trained policy's parameters (the testbed's): a reset copies them
    over. A UsageError (naming ``schedule.reference_reset``) unless ``reference`` is such a copy."""

    def __init__(self, reference: object, trained: nn.Module):
        pairs = list(zip(reference.parameters(), trained.parameters())) if isinstance(reference, nn.Module) else []
        shared = {p.data_ptr() for p in trained.parameters()}
        if (not pairs or len(pairs) != len(list(trained.parameters()))
                or any(r.shape != t.shape or r.data_ptr() in shared for r, t in pairs)):
            raise UsageError("schedule.reference_reset copies the trained policy into the reference of the KL, which "
                             "must be a separate copy of its parameters (the testbed's) or reset itself (a LoRA "
                             "model's frozen adapter: ResettableReference); this task's reference is neither.")
        self.pairs = pairs

    @torch.no_grad()
    def reset_(self) -> None:
        """The reference's parameters become the trained policy's."""
        for reference, trained in self.pairs:
            reference.copy_(trained)

    def state_dict(self) -> list[torch.Tensor]:
        """A copy of the reference's parameters, in the trained policy's order."""
        return [reference.detach().clone() for reference, _ in self.pairs]

    @torch.no_grad()
    def load_state_dict(self, state: list[torch.Tensor]) -> None:
        """Restore :meth:`state_dict`."""
        for (reference, _), saved in zip(self.pairs, state):
            reference.copy_(saved)


def resettable_reference(loss_module) -> ResettableReference | CopiedReference:
    """The reference of ``loss_module``'s KL as something :class:`StepControl` can reset (see the two classes)."""
    reference = getattr(loss_module, "ref_model", None)
    if isinstance(reference, ResettableReference):
        reference.hold_resets()  # done already where the trainer built it (before sharding); idempotent
        return reference
    return CopiedReference(reference, loss_module.model)


def parse_fields(spec: str, key: str, parsers: dict[str, Callable[[str], object]], form: str) -> dict[str, object]:
    """The ``name=value,...`` fields of ``spec`` (each name one of ``parsers``, parsed by it); errors name ``key``
    and say what it takes (``form``)."""
    params = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, text = item.partition("=")
        if name not in parsers:
            raise UsageError(f"{key} takes {form}, got {item!r}.")
        try:
            params[name] = parsers[name](text)
        except ValueError:
            raise UsageError(f"{key}: {name}={text!r} does not parse.") from None
    return params


def parse_reference_reset(spec: str, key: str) -> ReferenceReset:
    """``kl=K,every=N`` (either or both: ``K > 0``, ``N >= 1``) as a :class:`ReferenceReset`; errors name ``key``."""
    params = parse_fields(spec, key, {"kl": float, "every": int},
                          "kl=K and/or every=N (e.g. kl=3e-4,every=15)")
    if not params:
        raise UsageError(f"{key} needs kl=K and/or every=N (e.g. kl=3e-4,every=15), got {spec!r}.")
    if "kl" in params and not (math.isfinite(params["kl"]) and params["kl"] > 0):
        raise UsageError(f"{key}: kl must be finite and > 0, got {params['kl']!r}.")
    if "every" in params and params["every"] < 1:
        raise UsageError(f"{key}: every must be >= 1, got {params['every']}.")
    return ReferenceReset(**params)


def parse_adaptive_pairs(spec: str, key: str, start: int, even: bool) -> PairCountController:
    """``share=S,max=K[,every=N][,smoothing=B]`` as a :class:`~vgrpo_lib.control.PairCountController` starting at
    ``start`` pairs (``vgrpo.num_pairs``), with K even where ``even`` (antithetic noise); errors name ``key``."""
    params = parse_fields(spec, key, {"share": float, "max": int, "every": int, "smoothing": float},
                          "share=S,max=K and optionally every=N, smoothing=B (e.g. share=0.5,max=16,every=5)")
    missing = [name for name in ("share", "max") if name not in params]
    if missing:
        raise UsageError(f"{key} needs share=S and max=K (e.g. share=0.5,max=16,every=5); {spec!r} lacks "
                         f"{' and '.join(missing)}.")
    if not 0 < params["share"] < 1:
        raise UsageError(f"{key}: share (the noise share of the within-group surrogate variance to stay under) must "
                         f"be in (0, 1), got {params['share']!r}.")
    if not 2 <= start <= params["max"]:
        raise UsageError(f"{key}: need 2 <= vgrpo.num_pairs (the start, {start}) <= max ({params['max']}): a noise "
                         "measurement needs 2 pairs.")
    if even and params["max"] % 2:
        raise UsageError(f"{key}: max must be even with vgrpo.noise=antithetic, got {params['max']}.")
    if params.get("every", 1) < 1:
        raise UsageError(f"{key}: every must be >= 1, got {params['every']}.")
    if not 0 <= params.get("smoothing", 0.0) < 1:
        raise UsageError(f"{key}: smoothing (the weight of the earlier measurements' average) must be in [0, 1), "
                         f"got {params['smoothing']!r}.")
    return PairCountController(start, params["share"], params["max"], params.get("every", 1), even=even,
                               smoothing=params.get("smoothing", 0.0))


class StepControl:
    """Applies the configured schedules before each iteration and updates the adaptive KL controllers after it.

    ``targets``: value name -> ``(start value, spec)``; ``lr`` sets the optimizer's learning rate, any other name
    a scalar buffer that ``loss_module`` declares in its ``_schedulable_rules`` (``clip_range``, ``ref_kl_coef``,
    ``behaviour_kl_coef``), checked over the whole schedule by the rule declared there. ``reference_reset`` (its
    start unused) resets ``loss_module.ref_model`` to the trained ``loss_module.model`` (:class:`ReferenceReset`),
    which needs the reference held as a separate copy of the same parameters (the testbed's) or one that resets itself
    (a LoRA model's frozen adapter, prepared by :meth:`ResettableReference.hold_resets`).
    """

    def __init__(self, targets: dict[str, tuple[float, str]], loss_module, optimizer: torch.optim.Optimizer):
        self.loss_module, self.optimizer = loss_module, optimizer
        targets = dict(targets)
        reset = targets.pop("reference_reset", None)
        self.reference_reset = None if reset is None else parse_reference_reset(reset[1], "schedule.reference_reset")
        # Refused here, before the run, where the reference can be neither copied over nor reset.
        self.reference = None if self.reference_reset is None else resettable_reference(loss_module)
        rules = {"lr": SCHEDULED_LR, **getattr(type(loss_module), "_schedulable_rules", {})}
        for name in targets:
            if name not in rules or (name != "lr" and getattr(loss_module, name) is None):
                raise UsageError(f"schedule.{name}: the loss has no {name} to schedule (it declares "
                                 f"{', '.join(rules)}; is its term configured?).")
        self.schedules = {
            name: parse_schedule(spec, start, f"schedule.{name}", rules[name], adaptive=name.endswith("kl_coef"))
            for name, (start, spec) in targets.items()
        }

    def values(self, iteration: int) -> dict[str, float]:
        """The value of each controlled quantity at ``iteration``."""
        return {
            name: schedule.value if isinstance(schedule, AdaptiveKLController) else float(schedule(iteration))
            for name, schedule in self.schedules.items()
        }

    def apply(self, iteration: int) -> dict[str, float]:
        """Set every controlled value for ``iteration``; returns them (for the metrics row, with
        ``reference_resets`` so far when the reset is on)."""
        values = self.values(iteration)
        for name, value in values.items():
            if name == "lr":
                set_learning_rate(self.optimizer, value)
            else:
                setattr(self.loss_module, name, value)
        return values if self.reference_reset is None else {**values, "reference_resets": self.reference_reset.resets}

    def observe(self, metrics: dict[str, float]) -> None:
        """After an iteration: each adaptive coefficient ``*_kl_coef`` moves towards its target using the KL the
        iteration measured (metric ``*_kl``), and the reference is reset when :class:`ReferenceReset` says so."""
        for name, schedule in self.schedules.items():
            if isinstance(schedule, AdaptiveKLController):
                schedule.update(metrics[name.removesuffix("_coef")])
        if self.reference_reset is not None and self.reference_reset.due(metrics["ref_kl"]):
            self.reference.reset_()

    def state_dict(self) -> dict:
        """The adaptive coefficients' values (schedules are functions of the iteration: nothing else to save) and,
        with the reference reset on, its counters and, once reset, the reference's parameters."""
        state = {name: s.state_dict() for name, s in self.schedules.items() if isinstance(s, AdaptiveKLController)}
        reset = self.reference_reset
        if reset is not None:
            saved = self.reference.state_dict() if reset.resets else []  # the base needs nothing saved
            state["reference_reset"] = {"since": reset.since, "resets": reset.resets, "reference": saved}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        for name, value in state.items():
            if name == "reference_reset":
                self.reference_reset.since, self.reference_reset.resets = value["since"], value["resets"]
                if value["resets"]:
                    self.reference.load_state_dict(value["reference"])
            else:
                self.schedules[name].load_state_dict(value)
