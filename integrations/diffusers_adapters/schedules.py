"""The rollout time grids of SD3 and FLUX as plain lists, without a stateful scheduler.

vgrpo_lib's samplers are pure functions over an explicit grid `[t_0 = 1, t_1, ..., t_N = 0]`. The
grids below reproduce `FlowMatchEulerDiscreteScheduler.set_timesteps(...).sigmas` for the
settings the SD3 and FLUX pipelines use, so a rollout through vgrpo_lib visits the same times as
the diffusers pipeline with the same number of steps.

- SD3 / SD3.5 (static shift, `shift=3.0`): the scheduler takes N points evenly spaced between its
  largest and smallest training sigma and applies `s -> shift s / (1 + (shift - 1) s)`. Its smallest
  training sigma is itself shifted (1/1000 shifted once at construction), a diffusers quirk that
  is reproduced here because the grid is compared with the scheduler's exactly.
- FLUX (dynamic shift): N points `linspace(1, 1/N, N)` and the resolution-dependent exponential
  shift `s -> e^mu / (e^mu + (1/s - 1))`, with mu interpolated linearly in the number of image
  tokens between (256 tokens, 0.5) and (4096 tokens, 1.15) (`calculate_shift` in the FLUX pipeline).
  Qwen-Image uses the same shift with its own config values; FLUX.2 passes its own mu (`mu=` below, from
  `flux2.flux2_empirical_mu`).
- `shift_terminal` (Qwen-Image: 0.02): the shifted grid is stretched so that its last nonzero time is
  `shift_terminal` (`FlowMatchEulerDiscreteScheduler.stretch_shift_to_terminal`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = [
    "shift_sigmas", "sd3_sigma_grid", "flux_mu", "flux_sigma_grid", "stretch_to_terminal", "sigma_grid_from_scheduler_config",
]


def shift_sigmas(sigmas: list[float], shift: float) -> list[float]:
    """The SD3 static time shift `s -> shift s / (1 + (shift - 1) s)`; shift > 1 spends more steps near noise."""
    return [shift * s / (1 + (shift - 1) * s) for s in sigmas]


def sd3_sigma_grid(num_steps: int, shift: float = 3.0, num_train_timesteps: int = 1000) -> list[float]:
    """The SD3 pipeline's time grid: num_steps + 1 values from 1.0 down to 0.0.

    Args:
        num_steps: number of sampler steps N (the paper's V-GRPO SD3.5-M rollouts use 40).
        shift: the scheduler config's `shift` (3.0 for SD3 and SD3.5).
        num_train_timesteps: the scheduler config's `num_train_timesteps` (1000).
    """
    sigma_max = shift_sigmas([1.0], shift)[0]
    sigma_min = shift_sigmas([1.0 / num_train_timesteps], shift)[0]
    base = _linspace(sigma_max, sigma_min, num_steps)
    return shift_sigmas(base, shift) + [0.0]


def flux_mu(image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
            base_shift: float = 0.5, max_shift: float = 1.15) -> float:
    """The FLUX resolution-dependent shift parameter mu (linear in the number of image tokens)."""
    slope = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * slope + base_shift - slope * base_seq_len


def flux_sigma_grid(num_steps: int, image_seq_len: int, base_seq_len: int = 256, max_seq_len: int = 4096,
                    base_shift: float = 0.5, max_shift: float = 1.15, mu: float | None = None) -> list[float]:
    """The FLUX pipeline's time grid: num_steps + 1 values from 1.0 down to 0.0.

    Args:
        num_steps: number of sampler steps N (the paper's FLUX rollouts use 16).
        image_seq_len: number of packed image tokens, (H/2) * (W/2) for an H x W latent
            (4096 for 1024x1024 images).
        base_seq_len, max_seq_len, base_shift, max_shift: the scheduler config's values
            (FLUX.1-dev: 256, 4096, 0.5, 1.15).
        mu: the shift parameter itself, when the pipeline computes it another way (FLUX.2); None: `flux_mu`.
    """
    if mu is None:
        mu = flux_mu(image_seq_len, base_seq_len, max_seq_len, base_shift, max_shift)
    base = _linspace(1.0, 1.0 / num_steps, num_steps)
    return [math.exp(mu) / (math.exp(mu) + (1.0 / s - 1.0)) for s in base] + [0.0]


def stretch_to_terminal(grid: list[float], shift_terminal: float) -> list[float]:
    """Stretch a grid `[1, ..., s_N-1, 0]` so that its last nonzero time is `shift_terminal` (the final 0 stays):
    `s -> 1 - (1 - s) (1 - shift_terminal) / (1 - s_N-1)`."""
    if not 0.0 <= shift_terminal < 1.0:
        raise ValueError(f"shift_terminal must lie in [0, 1); got {shift_terminal}")
    scale = (1.0 - grid[-2]) / (1.0 - shift_terminal)
    if scale == 0.0:  # a one-step grid [1, 0] has nothing to stretch
        return list(grid)
    return [1.0 - (1.0 - s) / scale for s in grid[:-1]] + [0.0]


def sigma_grid_from_scheduler_config(config: Mapping, num_steps: int, image_seq_len: int | None = None,
                                     mu: float | None = None) -> list[float]:
    """The grid for any `FlowMatchEulerDiscreteScheduler` config of the SD3, FLUX, FLUX.2 or Qwen-Image kind.

    Args:
        config: `scheduler.config` (a dict-like; only the shift-related entries are read).
        num_steps: number of sampler steps.
        image_seq_len: packed image tokens; required when the config uses dynamic shifting (FLUX) and `mu` is None.
        mu: the dynamic shift's parameter when the pipeline computes it itself (FLUX.2's empirical mu); None: from
            `image_seq_len` and the config (`flux_mu`). Ignored without dynamic shifting.
    """
    unsupported = [k for k in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas")
                   if config.get(k)]
    if unsupported or config.get("time_shift_type", "exponential") != "exponential":
        raise ValueError(f"scheduler options not reproduced by these grids: {unsupported or ['time_shift_type']}")
    if config.get("use_dynamic_shifting", False):
        if image_seq_len is None and mu is None:
            raise ValueError("this scheduler shifts by resolution: pass image_seq_len = (H/2) * (W/2) of the latent")
        grid = flux_sigma_grid(
            num_steps,
            image_seq_len,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
            mu=mu,
        )
    else:
        grid = sd3_sigma_grid(num_steps, config.get("shift", 1.0), config.get("num_train_timesteps", 1000))
    shift_terminal = config.get("shift_terminal")
    return stretch_to_terminal(grid, shift_terminal) if shift_terminal else grid


def _linspace(start: float, stop: float, num: int) -> list[float]:
    if num < 1:
        raise ValueError(f"num_steps must be >= 1; got {num}")
    if num == 1:
        return [start]
    step = (stop - start) / (num - 1)
    return [start + i * step for i in range(num)]
