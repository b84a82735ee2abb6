"""Rollout samplers for the velocity-model protocol ``model(z, t, cond) -> v`` (:class:`vgrpo_lib.protocols.VelocityModel`:
``t`` is ``(B,)``, one grid time repeated for the batch).

In the style of k-diffusion: every sampler is a short function of ``(model, noise, grid, cond=None, ...)``, in
that order, over an explicit time grid (a list of floats from 1 to 0, see :func:`time_grid`); nothing is
stateful, nothing advances behind the caller's back. A call with the arguments out of order (a tensor or None
where the grid goes) is refused with an error naming the argument. A ``callback(info)`` receives ``{"i", "t", "t_next", "z", "v"}`` at every step for
recording. The grid is kept as Python floats so that no step forces a device sync.

- :func:`sample_euler`, :func:`sample_heun` (2nd order), :func:`sample_dpmpp_2m` (DPM-Solver++(2M), data
  prediction, multistep 2nd order): deterministic ODE solvers. V-GRPO and DiffusionNFT can use any of them,
  since their objectives do not depend on the trajectory.
- :func:`sample_sde`: the Flow-GRPO SDE or the coefficients-preserving SDE (CPS), recording every stochastic
  transition with its log-density (optionally only inside a window of steps: MixGRPO, Flow-GRPO-Fast).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from numbers import Real

import torch
from tensordict import TensorDict
from torch import nn

from vgrpo_lib._checks import check_positive, check_positive_int, check_real, check_tensor, choose, renamed_keywords
from vgrpo_lib.paths import Path, make_path
from vgrpo_lib.protocols import Condition, VelocityModel
from vgrpo_lib.rules import TIME_SHIFT
from vgrpo_lib.sde import check_noise_level, gaussian_log_prob, step_mean_std

Callback = Callable[[dict], None] | None


def time_grid(num_steps: int, shift: float = 1.0, t_max: float = 1.0, t_min: float = 0.0) -> list[float]:
    """``num_steps + 1`` decreasing times: uniform from ``t_max`` to ``t_min``, then warped by the SD3 shift
    ``s t / (1 + (s - 1) t)`` (``shift = 3`` for SD3 at 1024px; 1 = uniform). The shift moves interior end
    points too (``t_max = 0.98`` with ``shift = 3`` starts at 0.993); 0 and 1 stay fixed."""
    check_positive_int("num_steps", num_steps)
    check_positive("shift", shift)  # NaN or inf: a NaN grid
    if not TIME_SHIFT.ok(shift):  # 1e-308: 1 + (s - 1) t is 0 at t = 1; 1e308: s t overflows
        raise ValueError(f"shift must be {TIME_SHIFT.text}, got {shift}.")
    if not 0.0 <= check_real("t_min", t_min) < check_real("t_max", t_max) <= 1.0:
        raise ValueError(f"time_grid needs 0 <= t_min < t_max <= 1, got t_min={t_min}, t_max={t_max}.")
    uniform = [t_max - (t_max - t_min) * i / num_steps for i in range(num_steps)] + [t_min]
    return [shift * t / (1.0 + (shift - 1.0) * t) for t in uniform]


def _check_grid(grid: Sequence[float]) -> list[float]:
    if isinstance(grid, torch.Tensor) or not isinstance(grid, Sequence) or isinstance(grid, str):
        raise TypeError(
            f"grid must be a sequence of Python floats (e.g. time_grid(10)), got {type(grid).__name__}; the samplers "
            "take (model, noise, grid, cond=None, ...) in that order."
        )
    if not all(isinstance(t, Real) and not isinstance(t, bool) for t in grid):
        raise TypeError(f"grid must hold real numbers (times in [0, 1]), got {[type(t).__name__ for t in grid][:4]}.")
    grid = [float(t) for t in grid]
    decreasing = all(a > b for a, b in zip(grid, grid[1:]))  # False for NaN, unlike `b >= a`
    if len(grid) < 2 or not decreasing or not all(0.0 <= t <= 1.0 for t in grid):
        raise ValueError("grid must be a strictly decreasing sequence of at least 2 times in [0, 1].")
    return grid


def _check_noise(noise) -> None:
    """Integer states would silently truncate the times and steps (``_times`` uses the state's dtype)."""
    check_tensor("noise", noise)
    if not noise.is_floating_point():
        raise ValueError(f"noise (the initial state at grid[0]) must be a floating-point tensor, got dtype {noise.dtype}.")


def _times(z: torch.Tensor, t: float) -> torch.Tensor:
    return torch.full((z.shape[0],), t, device=z.device, dtype=z.dtype)


def _velocity(model, z: torch.Tensor, t: float, cond) -> torch.Tensor:
    return model(z, _times(z, t), cond)


def _integrate(model, noise: torch.Tensor, grid: list[float], cond, callback: Callback, step) -> torch.Tensor:
    """The loop every ODE solver shares: from ``z = noise`` at ``grid[0]``, one model call per interval of the (checked)
    ``grid``, reported to ``callback``, then ``z <- step(i, t, t_next, z, v)``; returns the state at ``grid[-1]``."""
    _check_noise(noise)
    z = noise
    for i, (t, t_next) in enumerate(zip(grid, grid[1:])):
        v = _velocity(model, z, t, cond)
        if callback is not None:
            callback({"i": i, "t": t, "t_next": t_next, "z": z, "v": v})
        z = step(i, t, t_next, z, v)
    return z


@renamed_keywords(z="noise")
def sample_euler(
    model: VelocityModel, noise: torch.Tensor, grid: Sequence[float], cond: Condition = None, callback: Callback = None
) -> torch.Tensor:
    """First-order ODE solver ``z <- z + (t_next - t) v`` from ``z = noise`` ``[B, *D]`` at ``grid[0]``; returns
    the state at ``grid[-1]`` ``[B, *D]``."""
    return _integrate(model, noise, _check_grid(grid), cond, callback, lambda i, t, t_next, z, v: z + (t_next - t) * v)


@renamed_keywords(z="noise")
def sample_heun(
    model: VelocityModel, noise: torch.Tensor, grid: Sequence[float], cond: Condition = None, callback: Callback = None
) -> torch.Tensor:
    """Heun's second-order method (trapezoidal correction with a second model call per step), ``[B, *D]`` ->
    ``[B, *D]`` as :func:`sample_euler`."""

    def step(i, t, t_next, z, v):
        z_euler = z + (t_next - t) * v
        return z + (t_next - t) * 0.5 * (v + _velocity(model, z_euler, t_next, cond))

    return _integrate(model, noise, _check_grid(grid), cond, callback, step)


def _half_log_snr(a: float, b: float) -> float:
    if a == 0.0:
        return -math.inf
    if b == 0.0:
        return math.inf
    return math.log(a / b)


@renamed_keywords(z="noise")
def sample_dpmpp_2m(
    model: VelocityModel,
    noise: torch.Tensor,
    grid: Sequence[float],
    cond: Condition = None,
    callback: Callback = None,
    path: str | Path = "rectified_flow",
) -> torch.Tensor:
    """DPM-Solver++(2M) (Lu et al., 2022) in data prediction, for any :class:`~vgrpo_lib.paths.Path`.

    With ``lambda = log(a_t / b_t)`` and ``h = lambda_next - lambda``:
    ``z_next = (b_next / b) z - a_next (exp(-h) - 1) D``, where ``D`` is the data prediction (first order) or
    ``(1 + 1/(2r)) x_hat - 1/(2r) x_hat_prev`` with ``r = h_prev / h`` (second order). The first step, the last
    step (``b_next = 0``) and any step after an infinite ``h`` use first order. ``[B, *D]`` -> ``[B, *D]``.
    """
    grid, path = _check_grid(grid), make_path(path)
    times = torch.tensor(grid, dtype=torch.float64)
    a, b = path.a(times).tolist(), path.b(times).tolist()
    lam = [_half_log_snr(ai, bi) for ai, bi in zip(a, b)]
    x_prev, h_prev = None, math.inf  # the last step's data prediction and log-SNR step

    def step(i, t, t_next, z, v):
        nonlocal x_prev, h_prev
        x_hat = path.x_from_v(z, v, _times(z, t))
        h = lam[i + 1] - lam[i]
        if x_prev is None or math.isinf(h) or math.isinf(h_prev):
            direction = x_hat
        else:
            r = h_prev / h
            direction = (1.0 + 0.5 / r) * x_hat - (0.5 / r) * x_prev
        x_prev, h_prev = x_hat, h
        return (b[i + 1] / b[i]) * z - a[i + 1] * math.expm1(-h) * direction

    return _integrate(model, noise, grid, cond, callback, step)


ODE_SOLVERS = {"euler": sample_euler, "heun": sample_heun, "dpmpp_2m": sample_dpmpp_2m}


@renamed_keywords(z="noise")
def sample_ode(
    model: VelocityModel,
    noise: torch.Tensor,
    grid: Sequence[float],
    cond: Condition = None,
    method: str = "euler",
    callback: Callback = None,
) -> torch.Tensor:
    """Integrate the probability-flow ODE from ``noise`` ``[B, *D]`` at ``grid[0]`` to ``grid[-1]`` with a named
    solver (``"euler"``, ``"heun"``, ``"dpmpp_2m"``); returns ``[B, *D]``."""
    solver = ODE_SOLVERS[choose("ODE solver", method, ODE_SOLVERS)]
    return solver(model, noise, grid, cond, callback=callback)


def nfe_per_sample(method: str, num_steps: int) -> int:
    """Model evaluations one sample costs with a named solver (Heun: two per step)."""
    return 2 * num_steps if choose("ODE solver", method, ODE_SOLVERS) == "heun" else num_steps


@renamed_keywords(z="noise")
def sample_sde(
    model: VelocityModel,
    noise: torch.Tensor,
    grid: Sequence[float],
    cond: Condition = None,
    *,
    noise_level: float = 0.7,
    sde_steps: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    log_prob_reduction: str = "mean",
    sde_type: str = "flow_sde",
    record_mean: bool = False,
) -> tuple[torch.Tensor, TensorDict]:
    """Flow-GRPO rollout: SDE steps (recorded) where ``sde_steps`` says, Euler ODE steps elsewhere.

    Args:
        sde_steps: indices of the stochastic steps (default: all; with ``sde_type="cps"`` all but a final step
            to ``t = 0``, which has no noise). MixGRPO passes a sliding window, Flow-GRPO-Fast a random one.
        log_prob_reduction: see :func:`vgrpo_lib.sde.gaussian_log_prob`.
        sde_type: ``"flow_sde"`` (Flow-GRPO's SDE) or ``"cps"`` (coefficients-preserving), see :mod:`vgrpo_lib.sde`.
        record_mean: also record each step's mean under the behaviour policy, ``"mean"`` ``(B, S, *D)``
            (GRPO-Guard's ratio normalisation needs it).

    Returns:
        The final sample ``(B, *D)`` and a TensorDict of batch size ``(B, S)`` for the S recorded steps with
        ``"z"``, ``"z_next"`` ``(B, S, *D)``, ``"t"``, ``"t_next"`` ``(B, S)`` and ``"log_prob"`` ``(B, S)``
        (the behaviour policy's log-density of each transition: Flow-GRPO's old log-probs).
    """
    grid = _check_grid(grid)
    _check_noise(noise)
    z = noise
    step = step_mean_std(sde_type)
    check_noise_level(sde_type, noise_level)
    num_steps = len(grid) - 1
    noisy = [i for i in range(num_steps) if sde_type != "cps" or grid[i + 1] > 0.0]
    stochastic = set(noisy) if sde_steps is None else set(sde_steps)
    if not noisy:
        raise ValueError("A cps rollout needs a step that ends above t = 0 (a cps step to t = 0 has no noise).")
    if not stochastic or not stochastic <= set(noisy):
        why = " (a cps step to t = 0 has no noise)" if len(noisy) < num_steps else ""
        raise ValueError(f"sde_steps must be a non-empty subset of 0..{noisy[-1]}{why}, got {sorted(stochastic)}.")
    records = []
    for i, (t, t_next) in enumerate(zip(grid, grid[1:])):
        v = _velocity(model, z, t, cond)
        if i not in stochastic:
            z = z + (t_next - t) * v
            continue
        mean, std = step(z, v, _times(z, t), _times(z, t_next), noise_level)
        z_next = mean + std * torch.randn(z.shape, generator=generator, device=z.device, dtype=z.dtype)
        log_prob = gaussian_log_prob(z_next, mean, std, log_prob_reduction)
        records.append({"z": z, "z_next": z_next, "log_prob": log_prob} | ({"mean": mean} if record_mean else {}))
        z = z_next
    batch, steps = z.shape[0], sorted(stochastic)
    time = lambda values: torch.tensor(values, device=z.device, dtype=z.dtype).expand(batch, -1)  # noqa: E731
    trajectory = TensorDict(
        {key: torch.stack([record[key] for record in records], 1) for key in records[0]}
        | {"t": time([grid[i] for i in steps]), "t_next": time([grid[i + 1] for i in steps])},
        batch_size=[batch, len(records)],
    )
    return z, trajectory


class ClassifierFreeGuidance(nn.Module):
    """Wrap a conditional velocity model as ``v_u + scale (v_c - v_u)``, cond and uncond in one batched forward.

    ``null_cond`` is a callable ``cond -> unconditional cond`` with the same batch size (e.g. a tensor of
    null prompt ids). ``detach_uncond=True`` stops the gradient through the unconditional branch, as the
    official Flow-GRPO does when it trains with CFG (``compute_log_prob`` in ``scripts/train_sd3.py``).
    """

    def __init__(self, model: nn.Module, null_cond: Callable, scale: float, detach_uncond: bool = False):
        super().__init__()
        self.model, self.null_cond, self.scale, self.detach_uncond = model, null_cond, scale, detach_uncond

    def forward(self, z, t, cond):
        both = self.model(torch.cat([z, z]), torch.cat([t, t]), torch.cat([cond, self.null_cond(cond)]))
        v_cond, v_uncond = both.chunk(2)
        if self.detach_uncond:
            v_uncond = v_uncond.detach()
        return v_uncond + self.scale * (v_cond - v_uncond)


def classifier_free_guidance(model: nn.Module, null_cond: Callable, scale: float, detach_uncond: bool = False) -> nn.Module:
    """``scale = 1`` returns ``model`` itself (no extra forward); otherwise a :class:`ClassifierFreeGuidance`."""
    return model if scale == 1.0 else ClassifierFreeGuidance(model, null_cond, scale, detach_uncond)


__all__ = [
    "time_grid",
    "sample_euler",
    "sample_heun",
    "sample_dpmpp_2m",
    "sample_ode",
    "sample_sde",
    "nfe_per_sample",
    "classifier_free_guidance",
    "ClassifierFreeGuidance",
]
