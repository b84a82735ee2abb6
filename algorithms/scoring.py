"""Calling the reward and checking what comes back (the trainer's reward step).

    reward = call_reward(reward_fn, images, prompts, retries=2, iteration=7)          # [N], retried, checked
    scores = call_reward(multi.stack, images, prompts, 2, 7, num_rewards=2)           # [N, R] of a multi-reward

A reward function that raises (a flaky remote or GPU reward model) is retried ``retries`` times with a warning,
then reported as a :class:`RewardError` naming the iteration and the cause; a result of the wrong shape or with
NaN/inf is a :class:`RewardError` naming the first offending prompt. :func:`check_finite_images` stops a run whose
samples are not finite (the policy diverged).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from vgrpo_lib.algorithms.errors import DivergenceError
from vgrpo_lib.advantages import group_statistics

__all__ = ["RewardError", "check_reward", "reward_parts", "call_reward", "reward_statistics", "check_finite_images"]


class RewardError(ValueError):
    """A reward function returned something unusable."""


def check_reward(reward, num_samples: int, prompts: torch.Tensor, num_rewards: int | None = None) -> torch.Tensor:
    """The reward as a float tensor ``[N]`` (``[N, R]`` for ``num_rewards`` rewards); a clear error naming the
    prompt on NaN/inf or a wrong shape."""
    expected = (num_samples,) if num_rewards is None else (num_samples, num_rewards)
    if not isinstance(reward, torch.Tensor) or reward.shape != expected:
        shape = tuple(reward.shape) if isinstance(reward, torch.Tensor) else type(reward).__name__
        raise RewardError(f"The reward function must return a tensor of shape {expected}, got {shape}.")
    bad = ~torch.isfinite(reward)
    if bool(bad.any()):
        index = int(bad.nonzero()[0, 0])
        prompt = prompts[index].tolist() if isinstance(prompts[index], torch.Tensor) else prompts[index]
        raise RewardError(
            f"The reward is NaN or inf for {int(bad.sum())} sample(s), first at index {index} (prompt {prompt!r})."
        )
    return reward.float()


def reward_parts(reward_fn) -> tuple[list[str] | None, torch.Tensor | None]:
    """The names and weights ``[R]`` of a multi-reward (``stack(images, prompts) -> [N, R]`` with ``names`` and
    ``weights``: scored per reward and combined as ``advantage.multi_reward`` says); ``(None, None)`` otherwise."""
    if not hasattr(reward_fn, "stack"):
        return None, None
    return list(reward_fn.names), torch.as_tensor(reward_fn.weights).float().cpu()


def call_reward(score: Callable, images: torch.Tensor, prompts, retries: int, iteration: int,
                num_rewards: int | None = None) -> torch.Tensor:
    """``score(images, prompts)`` retried ``retries`` times when it raises, then checked (:func:`check_reward`):
    ``[N]``, or ``[N, R]`` for ``num_rewards`` rewards."""
    for attempt in range(retries + 1):
        try:
            reward = score(images, prompts)
            break
        except Exception as error:  # any failure of user code: retried, then reported with its cause
            if attempt == retries:
                raise RewardError(
                    f"The reward function raised on {attempt + 1} attempt(s) at iteration {iteration}: "
                    f"{type(error).__name__}: {error}"
                ) from error
            warnings.warn(f"The reward function raised ({error}); retrying ({attempt + 1}/{retries}).")
    return check_reward(reward, images.shape[0], prompts, num_rewards)


def reward_statistics(reward: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, advantage: torch.Tensor,
                      names: list[str] | None = None) -> dict[str, float]:
    """What an iteration logs of its global batch: the (weighted) ``reward`` ``[B]``'s mean and std, the share of
    groups (``groups`` ``[B]``) whose rewards are all equal, the mean |advantage| ``[B]``, and each named reward's
    mean (``scores`` ``[B, R]`` of a multi-reward)."""
    return {
        "reward_mean": reward.mean().item(),
        "reward_std": reward.std().item(),
        "zero_std_fraction": group_statistics(reward, groups)["zero_std_fraction"].item(),
        "advantage_abs_mean": advantage.abs().mean().item(),
        **{f"reward_{name}_mean": scores[:, i].mean().item() for i, name in enumerate(names or [])},
    }


def check_finite_images(images: torch.Tensor, what: str) -> None:
    """Raise :class:`DivergenceError` when ``images`` ``[N, ...]`` hold NaN or inf (the policy diverged)."""
    bad = ~torch.isfinite(images.flatten(1)).all(1)
    if bool(bad.any()):
        raise DivergenceError(f"The policy diverged: {int(bad.sum())} of {images.shape[0]} of {what} are NaN or inf; "
                              f"lower optim.lr.")
