"""The task of the shipped MNIST-Wan video pipeline: ``mnist-wan/motion``.

    from vgrpo_lib.integrations.tasks.mnist_wan import mnist_wan_task
    task = mnist_wan_task("motion", lora_rank=8)       # vgrpo train --preset mnist-wan --algo vgrpo

``mnist_wan_task`` is :func:`vgrpo_lib.integrations.tasks.hub.hub_task` on the hub model ``"mnist-wan"`` (the
``WanPipeline`` in ``integrations/testbed/checkpoints/mnist_wan``, :mod:`vgrpo_lib.integrations.testbed.mnist_wan`), a
:class:`~vgrpo_lib.integrations.tasks.wan.WanTask` of 9-frame 32x32 clips with the task's prompts, reward, metrics and
labels filled in:

- prompts: the 200 ``"train"`` motion prompts ("a 3 moving left", five phrasings x 10 digits x 4 directions);
  evaluation on the 120 ``"eval"`` prompts (three held-out phrasings);
- reward: :class:`~vgrpo_lib.integrations.testbed.mnist_wan.rewards.MotionReward` on whole clips (``reads_videos``:
  not averaged per frame; the testbed CNN's frame-mean probability of the prompted digit times the centre-of-mass motion along the prompted direction);
- metrics (:func:`motion_metrics`): ``accuracy`` (the reward's models: the CNN reads the prompted digit AND the
  centre of mass moves the prompted way), ``judge_accuracy`` (the independent
  :class:`~vgrpo_lib.integrations.testbed.mnist_wan.rewards.MotionJudge`: an MLP on a disjoint split and block
  matching), each part separately, and ``accuracy_per_prompt`` keyed by the label ``"3 left"``;
- sample grids: each clip a strip of its frames, one row per prompt, labelled with it.
"""

from __future__ import annotations

import torch

from vgrpo_lib.errors import UsageError
from vgrpo_lib.integrations.rewards.loading import MissingWeightsError
from vgrpo_lib.integrations.tasks.hub import hub_task
from vgrpo_lib.integrations.tasks.mnist_sd3 import accuracy_summary, testbed_classifiers
from vgrpo_lib.integrations.testbed.mnist_wan.build import PIPELINE_DIR, TEXT_LENGTH
from vgrpo_lib.integrations.testbed.mnist_wan.card import REBUILD_COMMAND
from vgrpo_lib.integrations.testbed.mnist_wan.prompts import motion_prompts, parse_motion
from vgrpo_lib.integrations.testbed.mnist_wan.render import DIRECTIONS, FRAMES, FRAME_SIZE, measured_direction
from vgrpo_lib.integrations.testbed.mnist_wan.rewards import MotionJudge, MotionReward, read_clips

__all__ = ["MNIST_WAN_TASKS", "motion_label", "motion_metrics", "mnist_wan_task"]

MNIST_WAN_TASKS = ("motion",)
EVALUATION_METRICS = {"accuracy": "digit and direction (reward models)",
                      "judge_accuracy": "digit and direction (independent judge)"}


def motion_label(prompt: str) -> str:
    """What a motion prompt asks for, ``"3 left"``."""
    digit, direction = parse_motion(prompt)
    return f"{digit} {DIRECTIONS[direction]}"


def motion_metrics(clips: torch.Tensor, prompts: list[str], rewards: torch.Tensor) -> dict:
    """Accuracies of decoded clips ``(B, 3, F, H, W)``: ``accuracy`` / ``judge_accuracy`` (digit and direction both
    right, the reward's models / the judge's), ``digit_accuracy``, ``direction_accuracy``, ``judge_digit_accuracy``,
    ``judge_direction_accuracy``, and ``accuracy_per_prompt`` keyed by :func:`motion_label`."""
    classifier, judge = testbed_classifiers()
    parsed = [parse_motion(p) for p in prompts]
    digits = torch.tensor([d for d, _ in parsed])
    directions = torch.tensor([k for _, k in parsed])
    digit_right = read_clips(classifier, clips) == digits
    direction_right = measured_direction(clips) == directions
    judged = MotionJudge(judge)(clips, prompts)
    out = accuracy_summary(digit_right & direction_right, judged["both"], [motion_label(p) for p in prompts])
    out.update({"digit_accuracy": digit_right.float().mean().item(),
                "direction_accuracy": direction_right.float().mean().item(),
                "judge_digit_accuracy": judged["digit"].float().mean().item(),
                "judge_direction_accuracy": judged["direction"].float().mean().item()})
    return out


def mnist_wan_task(kind: str = "motion", *, path=None, prompts=None, eval_prompts=None, reward=None,
                   image_size=None, frames=None, max_sequence_length=None, **settings):
    """The MNIST-Wan task ``kind`` (``"motion"``) as a ``WanTask`` through ``hub_task("mnist-wan")`` on the shipped
    pipeline unless ``path`` names another; ``settings`` are the other ``hub_task`` arguments (the run config's
    ``model`` section). The clip length and size and the text length default to the pipeline's (9 frames, 32x32,
    8 tokens)."""
    if kind not in MNIST_WAN_TASKS:
        raise UsageError(f"unknown MNIST-Wan task {kind!r}; valid: {', '.join(MNIST_WAN_TASKS)}")
    if path is None and not (PIPELINE_DIR / "model_index.json").is_file():
        raise MissingWeightsError(f"Task 'mnist-wan/{kind}' runs on the pipeline folder {PIPELINE_DIR}, which is not "
                                  f"there: run `{REBUILD_COMMAND}` and copy its pipeline/ folder there, or set "
                                  f"model.path=<pipeline directory>.")
    return hub_task(
        "mnist-wan",
        path=str(PIPELINE_DIR) if path is None else path,
        prompts=[p for p, _, _ in motion_prompts("train")] if prompts is None else prompts,
        eval_prompts=[p for p, _, _ in motion_prompts("eval")] if eval_prompts is None else eval_prompts,
        reward=MotionReward(testbed_classifiers()[0]) if reward is None else reward,
        image_size=FRAME_SIZE if image_size is None else image_size,
        frames=FRAMES if frames is None else frames,
        max_sequence_length=TEXT_LENGTH if max_sequence_length is None else max_sequence_length,
        metrics=motion_metrics,
        label=motion_label,
        evaluation_metrics=EVALUATION_METRICS,
        **settings,
    )
