"""The reward interface, the registry by name, and weighted multi-reward combination.

Every reward is an `nn.Module` called as

    reward(images, prompts) -> (B,) float32 tensor
    images: (B, 3, H, W) float in [0, 1] (any device), prompts: list of B strings.

Model-based rewards move the images to their own device (`reward.to("cuda")` moves the model)
and return the scores on the images' device, so a trainer never has to shuffle tensors. No reward
differentiates through the images: all three algorithms treat the reward as a black box.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import nn

__all__ = ["Reward", "register_reward", "available_rewards", "get_reward", "MultiRewardOutput", "MultiReward"]


class Reward(nn.Module):
    """Base class: validates the inputs, runs `score` on the reward's device, returns (B,) float32.

    Subclasses implement `score(images, prompts) -> (B,)` with `images` already on `self.device`.
    """

    @property
    def device(self) -> torch.device | None:
        """Device of the reward's weights, or None for weight-free rewards (they follow the input)."""
        for tensor in list(self.parameters()) + list(self.buffers()):
            return tensor.device
        return None

    def forward(self, images: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"images must be (B, 3, H, W) in [0, 1]; got shape {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        device = self.device or images.device
        with torch.no_grad():
            scores = self.score(images.to(device), list(prompts))
        return scores.float().to(images.device)

    def score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        raise NotImplementedError


_REGISTRY: dict[str, Callable[..., Reward]] = {}


def register_reward(name: str) -> Callable:
    """Decorator: register a reward factory (a class or a function returning a Reward) under `name`."""
    def decorate(factory: Callable[..., Reward]) -> Callable[..., Reward]:
        if name in _REGISTRY:
            raise ValueError(f"a reward named {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory
    return decorate


def available_rewards() -> list[str]:
    """The registered reward names, sorted."""
    return sorted(_REGISTRY)


def get_reward(name: str, **kwargs) -> Reward:
    """Build the reward registered as `name`; kwargs go to its factory (paths, device, options).

    Model-based rewards are registered with their `from_pretrained` loader, so
    `get_reward("pickscore")` loads the PickScore weights (or raises `MissingWeightsError`).
    """
    if name not in _REGISTRY:
        raise KeyError(f"unknown reward {name!r}; available rewards: {', '.join(available_rewards())}")
    return _REGISTRY[name](**kwargs)


class MultiRewardOutput(NamedTuple):
    per_reward: torch.Tensor
    """(B, R) raw scores, columns in the order of `MultiReward.names`."""
    total: torch.Tensor
    """(B,) the weighted sum of the raw scores."""


class MultiReward(nn.Module):
    """Several rewards with weights, e.g. `MultiReward({"pickscore": 1.0, "ocr": 0.5})`.

    Args:
        weights: reward name -> weight. Names are looked up in the registry unless `rewards`
            supplies the instance.
        rewards: optional name -> already-built reward (for custom rewards or loader options).
        reward_kwargs: optional name -> kwargs for `get_reward` when building from the registry.

    Call: `multi(images, prompts) -> MultiRewardOutput(per_reward (B, R), total (B,))`.
    The raw (B, R) matrix is what group advantages need for per-reward normalisation before the
    weighted sum (GDPO-style); `total` is the sum-then-normalise alternative's input. `weights`
    (R,) is exposed for the former.
    """

    def __init__(self, weights: Mapping[str, float], rewards: Mapping[str, Reward] | None = None,
                 reward_kwargs: Mapping[str, Mapping] | None = None):
        super().__init__()
        if not weights:
            raise ValueError("MultiReward needs at least one reward")
        rewards, reward_kwargs = dict(rewards or {}), dict(reward_kwargs or {})
        self.names = list(weights)
        self.rewards = nn.ModuleDict({
            name: rewards[name] if name in rewards else get_reward(name, **reward_kwargs.get(name, {}))
            for name in self.names
        })
        self.register_buffer("weights", torch.tensor([float(weights[n]) for n in self.names]), persistent=False)

    def forward(self, images: torch.Tensor, prompts: Sequence[str]) -> MultiRewardOutput:
        # Served rewards (they have `submit`) start first, in the background: the local ones score meanwhile.
        pending = {name: reward.submit(images, prompts) for name, reward in self.rewards.items()
                   if hasattr(reward, "submit")}
        scores = {name: reward(images, prompts) for name, reward in self.rewards.items() if name not in pending}
        scores.update({name: future.result() for name, future in pending.items()})
        per_reward = torch.stack([scores[name] for name in self.names], dim=1)
        total = per_reward @ self.weights.to(per_reward.device)
        return MultiRewardOutput(per_reward, total)
