"""Training resolution separate from evaluation resolution (issue 32.2): ``model.eval_image_size`` makes
``DiffusersTask.sample`` (evaluation, ``vgrpo sample``) draw images of its own size on the scheduler's grid at that
size, while the training rollouts keep ``model.image_size``; unset, both are the training size. On the shipped
MNIST-SD3 pipeline (trained at 32x32, a transformer that takes any multiple of its patch size)."""

import pytest
import torch

pytest.importorskip("diffusers")

from vgrpo_lib.algorithms.config import ModelConfig  # noqa: E402
from vgrpo_lib.algorithms.presets import build_config  # noqa: E402
from vgrpo_lib.algorithms.tasks import load_task, rollout_grid  # noqa: E402

SMALL = ["model.dtype=float32", "model.image_size=32", "model.eval_image_size=48x64"]


@pytest.fixture(scope="module")
def tasks():
    """The digit task at 32x32 for training and 48x64 for evaluation, and the same task without the setting."""
    config = build_config("vgrpo", "digit", "mnist-sd3", SMALL)
    plain = build_config("vgrpo", "digit", "mnist-sd3", SMALL[:2])
    return load_task(config.task, config.model), load_task(plain.task, plain.model), config


def test_evaluation_samples_at_its_own_size_and_training_at_the_model_size(tasks):
    task, plain, config = tasks
    assert task.sample_shape == plain.sample_shape == plain.eval_sample_shape
    assert task.eval_sample_shape == task.base.latent_shape(48, 64) != task.sample_shape == task.base.latent_shape(32, 32)
    assert rollout_grid(task, config.rollout) == rollout_grid(plain, config.rollout)  # training is untouched
    policy = task.load_policy()
    images = task.sample(policy, task.eval_prompts(1)[:2], num_steps=2, generator=torch.Generator().manual_seed(0))
    assert images.shape == (2, 3, 48, 64) and torch.isfinite(images).all()
    assert task.decode(torch.zeros((1, *task.sample_shape))).shape == (1, 3, 32, 32)


def test_the_setting_is_checked_like_image_size():
    with pytest.raises(ValueError, match="model.eval_image_size"):
        build_config("vgrpo", "digit", "mnist-sd3", ["model.eval_image_size=50"])
    assert ModelConfig().eval_image_size is None
