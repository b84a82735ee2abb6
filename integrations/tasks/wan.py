"""Wan text-to-video training as a trainer task: :class:`WanTask`, a :class:`~vgrpo_lib.integrations.tasks.hub.DiffusersTask`
on videos.

    vgrpo train --algo vgrpo --preset wan2.1-t2v model.path=DIR model.prompts=prompts.txt

The hub task ``wan2.1-t2v`` (:func:`~vgrpo_lib.integrations.tasks.hub.hub_task`) loads a local ``WanPipeline`` folder
(Wan 2.1, or Wan 2.2 with ``transformer_2``) through :func:`~vgrpo_lib.integrations.diffusers_adapters.wan.load_wan`
and builds this task; ``model.frames`` sets the video length (4k + 1 frames), ``model.image_size`` the frame size.

What differs from the image tasks:

- samples are video latents ``(C, F, H, W)``; the core takes them as any ``(B, *D)``.
- rewards see videos through an image reward: :class:`FrameMeanReward` scores every frame as an image (the frames
  are flattened into the batch, each with its video's prompt) and gives each video the mean over its frames. A
  multi-reward (``"pickscore:1,ocr:0.5"``) keeps its columns (:class:`FrameMeanMultiReward`), each averaged over the
  frames. A reward that reads whole videos is any callable ``(videos (B, 3, F, H, W), prompts) -> (B,)`` passed to
  :class:`WanTask` as ``reward`` with ``frame_mean=False``, or one that says so itself with the attribute
  ``reads_videos = True`` (as :class:`~vgrpo_lib.integrations.testbed.mnist_wan.rewards.MotionReward`).
- sample grids show each video as a strip of up to ``strip_frames`` frames side by side (:func:`frame_strips`).
- the LoRA adapter sits on Wan's block projections (``WAN_LORA_TARGET_MODULES``), on both experts of a Wan 2.2
  pipeline; ``vgrpo export`` writes one diffusers LoRA file per expert (:meth:`WanTask.export_policy`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
from torch import nn

from vgrpo_lib.extras import needs_extra
from vgrpo_lib.integrations.diffusers_adapters.lora import TRAINED_ADAPTER
from vgrpo_lib.integrations.diffusers_adapters.wan import WanExperts, WanPolicy
from vgrpo_lib.integrations.tasks.hub import DiffusersTask, LoRAPolicy, base_pipeline_code, make_reward

__all__ = ["EXPERT_LORA_FILES", "FrameMeanMultiReward", "FrameMeanReward", "WanTask", "frame_mean_reward",
           "frame_strips", "frames_as_images"]

EXPERT_LORA_FILES = ("pytorch_lora_weights.safetensors", "transformer_2_lora_weights.safetensors")
"""The exported LoRA file of each expert: ``transformer`` (diffusers' default name, what ``load_lora_weights(DIR)``
reads) and Wan 2.2's ``transformer_2``."""


def frames_as_images(videos: torch.Tensor, prompts: Sequence[str]) -> tuple[torch.Tensor, list[str]]:
    """``(B, 3, F, H, W)`` videos as ``(B * F, 3, H, W)`` images (video-major: the F frames of video 0 first) and
    each video's prompt repeated F times."""
    if videos.ndim != 5:
        raise ValueError(f"videos must be (B, 3, F, H, W); got shape {tuple(videos.shape)}")
    b, c, f, h, w = videos.shape
    return videos.transpose(1, 2).reshape(b * f, c, h, w), [p for p in prompts for _ in range(f)]


class FrameMeanReward(nn.Module):
    """An image reward ``(images, prompts) -> (N,)`` applied to videos ``(B, 3, F, H, W)``: every frame is scored
    as an image with its video's prompt, and a video's reward ``(B,)`` is the mean over its F frames."""

    def __init__(self, image_reward: Callable):
        super().__init__()
        self.image_reward = image_reward

    def forward(self, videos: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        frames, repeated = frames_as_images(videos, prompts)
        return self.image_reward(frames, repeated).view(videos.shape[0], videos.shape[2]).mean(1)


class FrameMeanMultiReward(FrameMeanReward):
    """:class:`FrameMeanReward` of a multi-reward (one with ``stack``, ``names`` and ``weights``): ``stack`` gives
    each column's mean over the frames ``(B, R)``, a call the weighted sum ``(B,)``."""

    @property
    def names(self) -> list[str]:
        return list(self.image_reward.names)

    @property
    def weights(self) -> torch.Tensor:
        return torch.as_tensor(self.image_reward.weights)

    def stack(self, videos: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        frames, repeated = frames_as_images(videos, prompts)
        scores = self.image_reward.stack(frames, repeated)
        return scores.view(videos.shape[0], videos.shape[2], -1).mean(1)


def frame_mean_reward(image_reward: Callable) -> FrameMeanReward:
    """The video reward of an image reward (a :class:`FrameMeanMultiReward` when it has columns)."""
    multi = all(hasattr(image_reward, name) for name in ("stack", "names", "weights"))
    return FrameMeanMultiReward(image_reward) if multi else FrameMeanReward(image_reward)


def frame_strips(videos: torch.Tensor, max_frames: int = 8) -> torch.Tensor:
    """``(B, 3, F, H, W)`` videos as ``(B, 3, H, k W)`` images: ``k = min(F, max_frames)`` frames evenly spaced over
    the video (first and last included) side by side, left to right in time."""
    frames = videos.shape[2]
    chosen = torch.linspace(0, frames - 1, min(frames, max_frames)).round().long()
    picked = videos[:, :, chosen]  # (B, 3, k, H, W)
    return picked.permute(0, 1, 3, 2, 4).flatten(3)


class WanTask(DiffusersTask):
    """A Wan text-to-video pipeline, prompts and a reward, as the trainer's task (see the module doc).

    Args:
        base: a :class:`~vgrpo_lib.integrations.diffusers_adapters.wan.WanPolicy` loaded WITHOUT an adapter
            (``load_wan(..., lora_rank=None)``); its ``frames`` is the video length.
        prompts, eval_prompts, image_size and the keyword arguments: as :class:`DiffusersTask` (``image_size`` is
            the frame size, multiples of 16; ``max_sequence_length``: UMT5 tokens, None: 512).
        reward: as :class:`DiffusersTask`; an image reward, scored per frame (:class:`FrameMeanReward`).
        frame_mean: wrap the reward in :func:`frame_mean_reward` (False: it reads videos ``(B, 3, F, H, W)`` itself;
            a reward with ``reads_videos = True`` is never wrapped).
        strip_frames: frames per video in the sample grids (:func:`frame_strips`).
    """

    def __init__(self, base: WanPolicy, prompts, reward, image_size: int | tuple[int, int] = (480, 832), *,
                 frame_mean: bool = True, strip_frames: int = 8, **kwargs):
        super().__init__(base, prompts, reward, image_size, **kwargs)
        self.frame_mean, self.strip_frames = frame_mean, strip_frames

    def reward(self) -> Callable:
        """The video reward ``reward(videos, prompts) -> (B,)``: the task's reward spec scored per frame and averaged
        (:func:`frame_mean_reward`; unchanged with ``frame_mean=False`` or for a reward with ``reads_videos``), built
        once on the pipeline's device."""
        if self._reward is None:
            reward = make_reward(self.reward_spec)
            reads_videos = not self.frame_mean or getattr(reward, "reads_videos", False)
            reward = reward if reads_videos else frame_mean_reward(reward)
            self._reward = reward.to(self.device) if isinstance(reward, nn.Module) else reward
        return self._reward

    def write_samples(self, images: torch.Tensor, prompts: Sequence[str], path: str | os.PathLike, title: str = "",
                      max_rows: int = 30, max_per_row: int = 8, thumbnail: int = 128):
        """:meth:`DiffusersTask.write_samples` of the videos ``(N, 3, F, H, W)`` as frame strips (each frame up to
        ``thumbnail`` px): one row per prompt, each of its videos a strip of frames, left to right in time."""
        strips = frame_strips(images, self.strip_frames)
        shown = min(images.shape[2], self.strip_frames)
        return super().write_samples(strips, prompts, path, title, max_rows, max_per_row, thumbnail * shown)

    def export_policy(self, policy: LoRAPolicy, directory: str | os.PathLike) -> dict[str, str]:
        """Write the trained LoRA adapter in the diffusers format, one file per expert (:data:`EXPERT_LORA_FILES`):
        ``WanPipeline.from_pretrained(base).load_lora_weights(directory)`` loads ``transformer``'s, and for Wan 2.2
        ``load_lora_weights(directory, weight_name="transformer_2_lora_weights.safetensors",
        load_into_transformer_2=True)`` the second expert's. Returns the model card's ``base_model`` and ``usage``."""
        with needs_extra("diffusers", "Exporting a LoRA policy"):
            from diffusers import WanPipeline
            from peft.utils import get_peft_model_state_dict

        transformer = policy.transformer
        experts = transformer.experts if isinstance(transformer, WanExperts) else (transformer,)
        base_model = self.base.pipe.config._name_or_path
        lines = base_pipeline_code("WanPipeline", base_model)
        for index, (expert, weight_name) in enumerate(zip(experts, EXPERT_LORA_FILES)):
            WanPipeline.save_lora_weights(
                directory,
                transformer_lora_layers=get_peft_model_state_dict(expert, adapter_name=TRAINED_ADAPTER),
                transformer_lora_adapter_metadata=expert.peft_config[TRAINED_ADAPTER].to_dict(),
                weight_name=weight_name,
            )
            second = f", weight_name={weight_name!r}, load_into_transformer_2=True" if index else ""
            lines.append(f"pipe.load_lora_weights({str(directory)!r}{second})")
        return {"base_model": base_model, "usage": "\n".join(lines)}
