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

Every value a schedule reaches is checked, before the run writes anything, by the rule of the value it drives:
the one its loss declares in ``_schedulable_rules`` (:mod:`vgrpo_lib.losses`), or ``>= 0`` for the learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from vgrpo_lib.control import AdaptiveKLController, Constant, Cosine, Linear, Piecewise, Warmup, set_learning_rate
from vgrpo_lib.rules import NON_NEGATIVE, Rule
from vgrpo_lib.errors import UsageError

__all__ = ["SCHEDULED_LR", "SCHEDULES", "StepControl", "parse_schedule"]

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
    params = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        param, _, text = item.partition("=")
        if param not in allowed_keys:
            raise UsageError(f"{key}: the {name} schedule takes {', '.join(allowed_keys) or 'no parameters'}, got {param!r}.")
        try:
            params[param] = allowed_keys[param](text)
        except ValueError:
            raise UsageError(f"{key}: {name} schedule parameter {param}={text!r} does not parse.") from None
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


class StepControl:
    """Applies the configured schedules before each iteration and updates the adaptive KL controllers after it.

    ``targets``: value name -> ``(start value, spec)``; ``lr`` sets the optimizer's learning rate, any other name
    a scalar buffer that ``loss_module`` declares in its ``_schedulable_rules`` (``clip_range``, ``ref_kl_coef``,
    ``behaviour_kl_coef``), checked over the whole schedule by the rule declared there.
    """

    def __init__(self, targets: dict[str, tuple[float, str]], loss_module, optimizer: torch.optim.Optimizer):
        self.loss_module, self.optimizer = loss_module, optimizer
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
        """Set every controlled value for ``iteration``; returns them (for the metrics row)."""
        values = self.values(iteration)
        for name, value in values.items():
            if name == "lr":
                set_learning_rate(self.optimizer, value)
            else:
                setattr(self.loss_module, name, value)
        return values

    def observe(self, metrics: dict[str, float]) -> None:
        """After an iteration: each adaptive coefficient ``*_kl_coef`` moves towards its target using the KL the
        iteration measured (metric ``*_kl``)."""
        for name, schedule in self.schedules.items():
            if isinstance(schedule, AdaptiveKLController):
                schedule.update(metrics[name.removesuffix("_coef")])

    def state_dict(self) -> dict:
        """The adaptive coefficients' values (schedules are functions of the iteration: nothing to save)."""
        return {name: s.state_dict() for name, s in self.schedules.items() if isinstance(s, AdaptiveKLController)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        for name, value in state.items():
            self.schedules[name].load_state_dict(value)
