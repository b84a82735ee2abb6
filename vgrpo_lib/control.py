"""Step control: schedules as ``step -> value`` callables (optax-style), an adaptive KL controller, the
old-policy soft update of DiffusionNFT, the MixGRPO SDE window and the number of ELBO pairs chosen from the
measured noise (:class:`PairCountController`).

A schedule is any callable ``schedule(step: int) -> float``; assign its value to a loss buffer
(``loss.clip_range = schedule(step)``) or an optimizer's learning rate (:func:`set_learning_rate`). The schedules
here also give their ``extremes()``: every value they take lies between those, so a range check of the extremes
covers every step (what a run checks before it starts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "AdaptiveKLController", "Constant", "Cosine", "EMAWarmupDecay", "Linear", "OldPolicyDecay", "PairCountController",
    "Piecewise", "SDEWindow", "Schedule", "Warmup", "ema_update_", "exceeds_kl", "set_learning_rate",
]

Schedule = Callable[[int], float]


def _check_steps(name: str, steps: int) -> None:
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"{name} must be a positive integer, got {steps!r}.")


@dataclass(frozen=True)
class Constant:
    """``value`` at every step."""

    value: float

    def __call__(self, step: int) -> float:
        return self.value

    def extremes(self) -> tuple[float, ...]:
        """The values between which every step's value lies."""
        return (self.value,)


@dataclass(frozen=True)
class _Interpolation:
    """A schedule from ``start`` to ``end`` over ``steps`` steps, then ``end``; subclasses give the shape."""

    start: float
    end: float
    steps: int

    def __post_init__(self):
        _check_steps("steps", self.steps)

    def fraction(self, step: int) -> float:
        return min(max(step, 0), self.steps) / self.steps

    def extremes(self) -> tuple[float, ...]:
        """The values between which every step's value lies (the shape is monotone from start to end)."""
        return (self.start, self.end)


class Linear(_Interpolation):
    """From ``start`` to ``end`` linearly over ``steps`` steps, then ``end``."""

    def __call__(self, step: int) -> float:
        return self.start + (self.end - self.start) * self.fraction(step)


class Cosine(_Interpolation):
    """Cosine decay from ``start`` to ``end`` over ``steps`` steps, then ``end``."""

    def __call__(self, step: int) -> float:
        return self.end + 0.5 * (self.start - self.end) * (1.0 + math.cos(math.pi * self.fraction(step)))


@dataclass(frozen=True)
class Piecewise:
    """``values[i]`` from ``boundaries[i - 1]`` (inclusive) on; ``values[0]`` before ``boundaries[0]``.

    A curriculum: ``Piecewise([150, 350], [0.0, 0.3, 0.3])`` switches a KL on at step 150.
    """

    boundaries: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self):
        if len(self.values) != len(self.boundaries) + 1:
            raise ValueError("Piecewise needs one more value than boundaries.")
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError("Piecewise boundaries must be increasing.")

    def __call__(self, step: int) -> float:
        return self.values[sum(step >= b for b in self.boundaries)]

    def extremes(self) -> tuple[float, ...]:
        """The values between which every step's value lies."""
        return tuple(self.values)


@dataclass(frozen=True)
class Warmup:
    """Linear warm-up into ``schedule`` (whose step count starts after the warm-up): at step ``s < steps`` the
    value is ``schedule(0) * (s + 1) / (steps + 1)``, so the first step already moves (never a zero rate)."""

    schedule: Schedule
    steps: int

    def __call__(self, step: int) -> float:
        if step < self.steps:
            return self.schedule(0) * (step + 1) / (self.steps + 1)
        return self.schedule(step - self.steps)

    def extremes(self) -> tuple[float, ...]:
        """The values between which every step's value lies: the warm-up's first value and the schedule's."""
        return (self(0), *self.schedule.extremes())


def set_learning_rate(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set the learning rate of every parameter group of ``optimizer`` to ``value`` (a schedule's value)."""
    for group in optimizer.param_groups:
        group["lr"] = value


class AdaptiveKLController:
    """Ziegler et al. (2019): move the KL coefficient so the measured KL tracks ``target``.

    ``coef <- coef * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon)``.
    """

    def __init__(self, init_coef: float, target: float, horizon: int = 10_000):
        if not (0 <= init_coef < math.inf and 0 < target < math.inf):  # also refuses NaN
            raise ValueError(f"AdaptiveKLController: need finite init_coef >= 0 and target > 0, got {init_coef}, {target}.")
        _check_steps("horizon", horizon)
        self.value, self.target, self.horizon = float(init_coef), float(target), horizon

    def update(self, measured_kl: float, num_steps: int = 1) -> float:
        """Move the coefficient after ``num_steps`` steps whose KL was ``measured_kl``; returns the new value."""
        error = min(max(measured_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * num_steps / self.horizon
        return self.value

    def state_dict(self) -> dict:
        """The current coefficient (what a resume needs)."""
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.value = float(state["value"])


class PairCountController:
    """K, the timestep-noise pairs of each sample's ELBO surrogate, chosen from the Monte-Carlo noise measured on the
    training batch (beyond the paper, which fixes K = 4): the smallest K whose predicted noise share of the
    within-group surrogate variance is at most ``share``.

    A measurement at K (:func:`vgrpo_lib.diagnostics.pair_noise`) gives the noise variance ``N_K`` and the signal
    variance ``S``; the noise of a mean over K' independent pairs is ``N_K K / K'``, so the share at K' is at most
    ``share`` when ``K' >= N_K K (1 - share) / (share S)``. K' is that bound rounded up (to an even number with
    ``even``, for antithetic couples), within ``[min_pairs, max_pairs]``; ``max_pairs`` where no signal was
    measured (``S <= 0``), ``min_pairs`` where no noise was. The controller measures on every ``every``-th iteration
    (:meth:`due`, from the first) and keeps K in between.

    One batch's measurement is itself noisy (on the testbed digit task the share ranged 0.13-1.0 from one
    measurement to the next, and K with it); ``smoothing`` = b > 0 chooses from exponential moving averages of the
    per-pair noise ``N_K K`` and of ``S`` instead, each new measurement weighted ``1 - b`` (the first taken whole),
    so K follows the noise level rather than one batch's draw. b = 0 (the default) uses each measurement alone.

    Example:
        >>> control = PairCountController(start=4, share=0.5, max_pairs=16)
        >>> if control.due():
        ...     control.observe(**{k: v for k, v in pair_noise(per_pair, group).items() if k != "noise_share"})
        >>> estimator.num_pairs = control.num_pairs
    """

    def __init__(self, start: int, share: float, max_pairs: int, every: int = 1, min_pairs: int = 2, even: bool = False,
                 smoothing: float = 0.0):
        if not 0 < share < 1:  # also refuses NaN
            raise ValueError(f"PairCountController: share must be in (0, 1), got {share!r}.")
        if not 0 <= smoothing < 1:
            raise ValueError(f"PairCountController: smoothing must be in [0, 1), got {smoothing!r}.")
        _check_steps("every", every)
        if not 2 <= min_pairs <= start <= max_pairs:
            raise ValueError(f"PairCountController: need 2 <= min_pairs <= start <= max_pairs, got {min_pairs}, {start}, "
                             f"{max_pairs} (a noise measurement needs 2 pairs).")
        if even and (min_pairs % 2 or start % 2 or max_pairs % 2):
            raise ValueError(f"PairCountController(even=True): min_pairs, start and max_pairs must be even, got "
                             f"{min_pairs}, {start}, {max_pairs}.")
        self.share, self.min_pairs, self.max_pairs, self.every, self.even = float(share), min_pairs, max_pairs, every, even
        self.smoothing = float(smoothing)
        self.num_pairs, self.iterations = start, 0
        self.averages: tuple[float, float] | None = None  # smoothed (per-pair noise, signal); None before a measurement

    def due(self) -> bool:
        """Called once per iteration, before its pairs are drawn: whether this iteration measures the noise."""
        due = self.iterations % self.every == 0
        self.iterations += 1
        return due

    def choose(self, noise_variance: float, signal_variance: float) -> int:
        """The K for a measurement ``noise_variance`` (at the current K) and ``signal_variance`` (see the class),
        with no smoothing; :meth:`observe` smooths first where ``smoothing`` > 0."""
        return self._pairs_for(*self._per_pair(noise_variance, signal_variance))

    def _per_pair(self, noise_variance: float, signal_variance: float) -> tuple[float, float]:
        """A measurement at the current K as (noise of one pair, signal); a non-finite one is refused."""
        if not (math.isfinite(noise_variance) and math.isfinite(signal_variance)):
            raise ValueError(f"PairCountController: a non-finite measurement (noise {noise_variance}, signal "
                             f"{signal_variance}).")
        return noise_variance * self.num_pairs, signal_variance

    def _pairs_for(self, pair_noise: float, signal_variance: float) -> int:
        """The smallest allowed K whose noise ``pair_noise / K`` is at most ``share`` of the total (see the class)."""
        if pair_noise <= 0:
            return self.min_pairs
        if signal_variance <= 0:
            return self.max_pairs
        bound = pair_noise * (1 - self.share) / (self.share * signal_variance)
        needed = math.ceil(bound * (1 - 1e-12))  # a bound that is an integer up to rounding is met by that integer
        if self.even:
            needed += needed % 2
        return min(max(needed, self.min_pairs), self.max_pairs)

    def observe(self, noise_variance: float, signal_variance: float) -> int:
        """Set and return the K for the next iterations from a measurement at the current K (see :meth:`choose`),
        averaged with the earlier ones where ``smoothing`` > 0."""
        measured, b = self._per_pair(noise_variance, signal_variance), self.smoothing
        if b > 0:
            self.averages = measured = measured if self.averages is None else tuple(
                b * old + (1 - b) * new for old, new in zip(self.averages, measured))
        self.num_pairs = self._pairs_for(*measured)
        return self.num_pairs

    def state_dict(self) -> dict:
        """The current K, the iterations counted and the smoothed measurements (what a resume needs)."""
        state = {"num_pairs": self.num_pairs, "iterations": self.iterations}
        return state if self.averages is None else {**state, "averages": list(self.averages)}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.num_pairs, self.iterations = int(state["num_pairs"]), int(state["iterations"])
        self.averages = tuple(map(float, state["averages"])) if "averages" in state else None


def exceeds_kl(approx_kl: float, max_kl: float | None) -> bool:
    """Early stop of the inner epochs: True when the measured approx KL exceeds ``max_kl`` (None: never)."""
    return max_kl is not None and approx_kl > max_kl


@dataclass(frozen=True)
class OldPolicyDecay:
    """DiffusionNFT's soft-update decay of the old policy, a function of the gradient steps taken so far:

        d(step) = 0                                   for step < flat
                  min(rate * (step - flat), max_decay) otherwise

    The official ``return_decay`` (NVlabs/DiffusionNFT, ``scripts/train_nft_sd3.py``) is applied after each
    iteration with ``step`` = the gradient steps done (its ``global_step``), so the first update already
    uses ``rate * steps_per_iteration``. Type 1 (default): ``rate=0.001, max_decay=0.5, flat=0``; type 2 (the
    OCR preset): ``rate=0.0075, max_decay=0.999, flat=75``; type 0: ``rate=0`` (a hard copy every iteration).
    """

    rate: float = 0.001
    max_decay: float = 0.5
    flat: int = 0

    def __post_init__(self):
        if not 0.0 <= self.rate < math.inf:
            raise ValueError(f"OldPolicyDecay rate must be finite and >= 0, got {self.rate}.")
        if not 0.0 <= self.max_decay <= 1.0:
            raise ValueError(f"OldPolicyDecay max_decay must be in [0, 1], got {self.max_decay}.")
        if not isinstance(self.flat, int) or self.flat < 0:
            raise ValueError(f"OldPolicyDecay flat must be an integer >= 0, got {self.flat!r}.")

    def __call__(self, step: int) -> float:
        return 0.0 if step < self.flat else min(self.rate * (step - self.flat), self.max_decay)


@dataclass(frozen=True)
class EMAWarmupDecay:
    """Decay of an EMA of the trained weights with a warm-up: ``d(step) = min((1 + step) / (10 + step), max_decay)``
    (the official Flow-GRPO / DiffusionNFT ``EMAModuleWrapper.get_current_decay``, ``max_decay`` 0.9 there), so
    early averages follow the weights closely."""

    max_decay: float = 0.9

    def __post_init__(self):
        if not 0.0 <= self.max_decay <= 1.0:
            raise ValueError(f"EMA max_decay must be in [0, 1], got {self.max_decay}.")

    def __call__(self, step: int) -> float:
        return min((1.0 + step) / (10.0 + step), self.max_decay)


@torch.no_grad()
def ema_update_(target: Iterable[torch.Tensor], source: Iterable[torch.Tensor], decay: float) -> None:
    """``target <- decay * target + (1 - decay) * source``, in place, for matching parameter lists.

    ``decay = 0`` copies ``source`` (a hard update: the V-GRPO / Flow-GRPO behaviour policy).
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay}.")
    target, source = list(target), list(source)
    if len(target) != len(source):
        raise ValueError(f"EMA update needs matching parameter lists, got {len(target)} and {len(source)}.")
    torch._foreach_lerp_(target, source, 1.0 - decay)


@dataclass(frozen=True)
class SDEWindow:
    """MixGRPO's sliding window: SDE (stochastic, trained) steps only inside ``[start, start + size)``.

    The window start advances by ``stride`` every ``shift_interval`` iterations and wraps past
    ``num_steps - size`` (MixGRPO's progressive schedule). ``size = num_steps`` is plain Flow-GRPO.
    """

    num_steps: int
    size: int
    shift_interval: int = 25
    stride: int = 1

    def __post_init__(self):
        for name in ("num_steps", "size", "shift_interval", "stride"):
            _check_steps(name, getattr(self, name))
        if self.size > self.num_steps:
            raise ValueError(f"window size {self.size} exceeds the number of steps {self.num_steps}.")

    def __call__(self, iteration: int) -> Sequence[int]:
        positions = self.num_steps - self.size + 1
        start = (iteration // self.shift_interval * self.stride) % positions
        return range(start, start + self.size)
