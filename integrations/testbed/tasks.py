"""Testbed tasks of graded difficulty: ``get_task(name) -> Task``.

| task          | image    | prompt            | reward                                       | base policy     |
|---------------|----------|-------------------|----------------------------------------------|-----------------|
| ``digit``       | 28x28    | one digit ``(B,)``  | classifier probability of the digit          | ``digit_policy``  |
| ``pair``        | 28x56    | two digits ``(B,2)``| product of the two halves' probabilities     | ``pair_policy``   |
| ``style``       | 28x28    | one digit         | stroke width near a thin target (2 px)       | ``digit_policy``  |
| ``digit_style`` | 28x28    | one digit         | 1.0 * digit probability + 0.5 * thickness    | ``digit_policy``  |
| ``digits8``     | 8x8      | one digit         | 8x8 classifier probability                   | ``digits8_policy``|

``digit`` is easy (every estimator solves it); ``pair`` adds composition and dimension and starts
weak; ``style`` has small within-group reward differences; ``digit_style`` is a weighted
multi-reward; ``digits8`` trains in seconds for end-to-end unit tests. Every task is evaluated with
its training classifier AND an independent judge (see :mod:`vgrpo_lib.integrations.testbed.evaluation`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained, save_checkpoint
from vgrpo_lib.integrations.testbed.data import to_images
from vgrpo_lib.integrations.figures import prompt_rows, write_labelled_grid
from vgrpo_lib.integrations.testbed.evaluation import evaluate
from vgrpo_lib.integrations.testbed.rewards import (
    DigitProbability,
    Reward,
    StrokeThickness,
    WeightedReward,
    check_images,
)
from vgrpo_lib.integrations.testbed.sampling import null_prompts, sample_images
from vgrpo_lib.errors import UsageError

__all__ = ["Task", "TASKS", "get_task"]


@lru_cache(maxsize=None)
def _frozen(name: str) -> nn.Module:
    """One shared frozen instance per classifier/judge checkpoint (they are never trained)."""
    return load_pretrained(name)


@dataclass(frozen=True)
class Task:
    """A testbed task: what is generated, from which prompts, how it is rewarded and judged.

    Attributes:
        name: registry name.
        description: one line for humans.
        image_shape: ``(C, H, W)`` of the generated images (image space, ``[0, 1]``).
        num_slots: digits per prompt; prompts are ``(B,)`` when 1, ``(B, num_slots)`` otherwise.
        policy_name, classifier_name, judge_name: shipped checkpoints (see ``load_pretrained``).
        make_reward: builds the reward callable from the (frozen) classifier.
        eval_num_steps: ODE steps for evaluation (more than typical training rollouts, as in the paper).
    """

    name: str
    description: str
    image_shape: tuple[int, int, int]
    num_slots: int
    policy_name: str
    classifier_name: str
    judge_name: str
    make_reward: Callable[[nn.Module], Reward]
    eval_num_steps: int = 40

    def sample_prompts(self, num_prompts: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``num_prompts`` uniformly random prompts: int64 ``(num_prompts,)`` or ``(num_prompts, num_slots)``."""
        shape = (num_prompts,) if self.num_slots == 1 else (num_prompts, self.num_slots)
        return torch.randint(0, 10, shape, generator=generator)

    def all_prompts(self) -> torch.Tensor:
        """Every distinct prompt once (10 digits, or all 100 ordered pairs), in lexicographic order."""
        digits = torch.arange(10)
        if self.num_slots == 1:
            return digits
        return torch.cartesian_prod(*[digits] * self.num_slots)

    def eval_prompts(self, per_prompt: int) -> torch.Tensor:
        """``all_prompts()`` each repeated ``per_prompt`` times (consecutively): the evaluation prompt set."""
        return self.all_prompts().repeat_interleave(per_prompt, dim=0)

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """The null-prompt condition (every id ``NULL_ID`` = 10) with the shape of ``cond``, for CFG."""
        return null_prompts(cond)

    def load_policy(self) -> nn.Module:
        """A fresh, trainable float32 copy of the task's base policy."""
        return load_pretrained(self.policy_name).requires_grad_(True)

    def reference_policy(self, policy: nn.Module) -> nn.Module:
        """A frozen copy of ``policy`` (for a KL to the base policy)."""
        return copy.deepcopy(policy).requires_grad_(False)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        """Model-space shape of one sample: the testbed works in pixel space, so ``image_shape``."""
        return self.image_shape

    def condition(self, prompts: torch.Tensor) -> torch.Tensor:
        """The policy's conditioning: the prompt ids themselves (the policy embeds them)."""
        return prompts

    def decode(self, samples: torch.Tensor) -> torch.Tensor:
        """Model space ``[-1, 1]`` -> images in ``[0, 1]``."""
        return to_images(samples)

    def classifier(self) -> nn.Module:
        """The frozen training classifier (shared instance)."""
        return _frozen(self.classifier_name)

    def judge(self) -> nn.Module:
        """The frozen independent judge (shared instance); for evaluation only, never a reward."""
        return _frozen(self.judge_name)

    def reward(self) -> Reward:
        """The task's reward callable ``reward(images, prompts) -> (B,)``."""
        return self.make_reward(self.classifier())

    def check_batch(self, images: torch.Tensor, prompts: torch.Tensor) -> None:
        """``ValueError`` unless ``images`` is ``(B, *image_shape)`` and ``prompts`` this task's prompt shape."""
        check_images(images, prompts)
        if tuple(images.shape[1:]) != self.image_shape:
            raise ValueError(f"task {self.name!r} expects images (B, {self.image_shape}), got {tuple(images.shape)}")
        expected = 1 if prompts.ndim == 1 else prompts.shape[1]
        if expected != self.num_slots or (self.num_slots > 1 and prompts.ndim != 2):
            raise ValueError(f"task {self.name!r} expects {self.num_slots} prompt slot(s), got prompts {tuple(prompts.shape)}")

    def sample(self, policy: nn.Module, prompts: torch.Tensor, **kwargs) -> torch.Tensor:
        """Images ``(B, *image_shape)`` in ``[0, 1]`` from ``policy``; kwargs as in ``sample_images``."""
        return sample_images(policy, prompts, **kwargs)

    @property
    def evaluation_metrics(self) -> dict[str, str]:
        """The headline numbers of :meth:`evaluate` and their labels (checked, plotted and shown by the trainer)."""
        return {"accuracy": "classifier (reward model)", "judge_accuracy": "independent judge"}

    def prompt_label(self, prompt: torch.Tensor) -> str:
        """How a prompt reads: ``"7"``, or ``"3 then 7"`` for several slots."""
        return " then ".join(str(int(digit)) for digit in prompt.reshape(-1))

    def write_samples(self, images: torch.Tensor, prompts: torch.Tensor, path, title: str = "") -> Path:
        """A PNG grid of evaluation images (prompts repeated consecutively): one row per prompt labelled with it
        (at most 10 images per row and 20 rows), under ``title``, written atomically."""
        same = prompts == prompts[0]
        per_prompt = int((same.all(-1) if prompts.ndim > 1 else same).sum())
        index, starts = prompt_rows(images.shape[0], per_prompt, max_per_row=10, max_rows=20)
        return write_labelled_grid(images[index], [self.prompt_label(prompts[i]) for i in starts], title, path)

    def evaluate(self, images: torch.Tensor, prompts: torch.Tensor) -> dict:
        """``evaluation.evaluate(images, prompts, self)``."""
        return evaluate(images, prompts, self)

    def export_policy(self, policy: nn.Module, directory: str | os.PathLike) -> dict[str, str]:
        """Write ``policy`` to ``directory`` as a checkpoint named like the base policy (``<policy_name>.safetensors``
        in float32 and ``<policy_name>.json``: kind and config), which ``load_pretrained(policy_name, directory)``
        rebuilds. Returns the model card's facts: ``base_model`` and ``usage`` (Python code loading it)."""
        save_checkpoint(self.policy_name, policy, {"base_model": self.policy_name, "task": self.name},
                        Path(directory), dtype=torch.float32, compressed=False)
        usage = ("from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained, save_checkpoint\n\n"
                 f"policy = load_pretrained({self.policy_name!r}, directory={str(directory)!r})")
        return {"base_model": f"the testbed's {self.policy_name} (integrations/testbed/checkpoints)", "usage": usage}


def _digit_probability(classifier: nn.Module) -> Reward:
    return DigitProbability(classifier)


def _stroke_thickness(classifier: nn.Module) -> Reward:
    return StrokeThickness()


def _digit_style(classifier: nn.Module) -> Reward:
    return WeightedReward({"digit": (DigitProbability(classifier), 1.0), "thickness": (StrokeThickness(), 0.5)})


TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task("digit", "one prompted digit, 28x28, classifier-probability reward", (1, 28, 28), 1,
             "digit_policy", "classifier", "judge", _digit_probability),
        Task("pair", "two prompted digits side by side ('3 then 7'), 28x56, both halves must be right",
             (1, 28, 56), 2, "pair_policy", "classifier", "judge", _digit_probability),
        Task("style", "one prompted digit, 28x28, preference-like reward: thin crisp strokes (~2 px)",
             (1, 28, 28), 1, "digit_policy", "classifier", "judge", _stroke_thickness),
        Task("digit_style", "one prompted digit, 28x28, weighted multi-reward: digit probability + 0.5 thickness",
             (1, 28, 28), 1, "digit_policy", "classifier", "judge", _digit_style),
        Task("digits8", "one prompted digit, 8x8 scikit-learn digits, for fast tests",
             (1, 8, 8), 1, "digits8_policy", "digits8_classifier", "digits8_judge", _digit_probability,
             eval_num_steps=20),
    )
}


def get_task(name: str) -> Task:
    """The registered task ``name``; ``ValueError`` listing the valid names otherwise."""
    if name not in TASKS:
        raise UsageError(f"unknown task {name!r}; valid tasks: {', '.join(TASKS)}")
    return TASKS[name]
