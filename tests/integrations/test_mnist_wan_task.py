"""``--preset mnist-wan``: the shipped MNIST-Wan video pipeline trained through the hub path (the code of
``wan2.1-t2v``), its task ``motion`` (prompts, a reward reading whole clips, metrics and the judge), ``vgrpo sample``
and ``vgrpo export`` on it.

The shipped folder is small (3 MB, 9 frames of 32x32), so these tests run on it directly; the adapter's own tests
(``tests/test_wan_adapter.py``) cover Wan on tiny random pipelines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.cli import main as cli_main  # noqa: E402
from vgrpo_lib.algorithms.presets import build_config  # noqa: E402
from vgrpo_lib.algorithms.tasks import load_task  # noqa: E402
from vgrpo_lib.algorithms.trainer import Trainer  # noqa: E402
from vgrpo_lib.integrations.tasks.hub import HUB_MODELS  # noqa: E402
from vgrpo_lib.integrations.tasks.mnist_wan import (  # noqa: E402
    mnist_wan_task, motion_label, motion_metrics,
)
from vgrpo_lib.integrations.tasks.wan import FrameMeanReward, WanTask  # noqa: E402
from vgrpo_lib.integrations.packed_weights import unpacked_folder  # noqa: E402
from vgrpo_lib.integrations.testbed.data import load_mnist  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_wan.build import PIPELINE_DIR  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_wan.prompts import motion_prompts  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_wan.render import DIRECTIONS, render_clips  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_wan.rewards import MotionReward  # noqa: E402
from tests.integrations.hub_cli import assert_eval_repeats_the_run, train_straight_and_resumed  # noqa: E402

# A short run: 4 prompts x 4 clips, 4 rollout steps, 2 pairs; a small evaluation (120 held-out prompts, 1 clip each).
SHORT = ["iterations=2", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "vgrpo.num_pairs=2",
         "eval.per_prompt=1", "eval.num_steps=4", "eval.every=0", "checkpoint_every=1"]


@pytest.fixture(scope="module")
def task():
    config = build_config("vgrpo", None, "mnist-wan", [])
    return load_task(config.task, config.model)


@pytest.fixture(scope="module")
def labelled_clips():
    """120 real MNIST ``eval`` digits rendered moving (directions cycling), with their digits and directions."""
    images, labels = load_mnist("eval")
    directions = torch.arange(120) % len(DIRECTIONS)
    return render_clips(images[:120], directions, torch.Generator().manual_seed(3)), labels[:120], directions


def _prompts(labels, directions, direction_offset=0):
    return [f"a {int(d)} moving {DIRECTIONS[(int(k) + direction_offset) % 4]}" for d, k in zip(labels, directions)]


def test_the_preset_names_the_motion_task_on_the_shipped_pipeline():
    assert build_config("vgrpo", None, "mnist-wan", []).task == "mnist-wan/motion"
    assert build_config("diffusion_nft", "motion", "mnist-wan", []).task == "mnist-wan/motion"
    with pytest.raises(ValueError, match="Unknown task 'motion' under preset 'testbed'"):
        build_config("vgrpo", "motion", "testbed", [])
    assert HUB_MODELS["mnist-wan"].hub_id == str(PIPELINE_DIR) and HUB_MODELS["mnist-wan"].family == "wan"
    assert (PIPELINE_DIR / "model_index.json").is_file()


def test_the_task_samples_clips_and_scores_them_whole(task):
    """A WanTask of 9-frame 32x32 clips on the train / held-out prompt splits; its reward reads whole clips
    (``reads_videos``: not averaged per frame) and is the motion reward itself."""
    assert isinstance(task, WanTask) and task.base.frames == 9 and (task.height, task.width) == (32, 32)
    assert task.prompts == [p for p, _, _ in motion_prompts("train")]
    assert task.eval_prompt_list == [p for p, _, _ in motion_prompts("eval")]
    reward = task.reward()
    assert isinstance(reward, MotionReward) and not isinstance(reward, FrameMeanReward)
    prompts = ["a 3 moving left", "a seven that moves up"]
    clips = task.sample(task.load_policy(), prompts, num_steps=2, generator=torch.Generator().manual_seed(0))
    assert clips.shape == (2, 3, 9, 32, 32) and 0 <= clips.min() and clips.max() <= 1
    scores = reward(clips, prompts)
    assert scores.shape == (2,) and torch.all((0 <= scores) & (scores <= 1))


def test_metrics_count_a_clip_right_only_with_the_prompted_digit_and_direction(labelled_clips):
    clips, labels, directions = labelled_clips
    right = motion_metrics(clips, _prompts(labels, directions), torch.zeros(120))
    assert right["direction_accuracy"] == 1.0 and right["judge_direction_accuracy"] == 1.0
    assert right["accuracy"] > 0.9 and right["judge_accuracy"] > 0.9  # the digit readers on real MNIST digits
    assert right["judge_gap"] == pytest.approx(right["accuracy"] - right["judge_accuracy"])
    assert set(right["accuracy_per_prompt"]) == {f"{int(d)} {DIRECTIONS[int(k)]}" for d, k in zip(labels, directions)}
    wrong_way = motion_metrics(clips, _prompts(labels, directions, direction_offset=1), torch.zeros(120))
    assert wrong_way["accuracy"] == 0.0 and wrong_way["judge_accuracy"] == 0.0
    assert wrong_way["digit_accuracy"] == right["digit_accuracy"]  # the digit part does not read the direction
    assert motion_label("the digit three moving up") == "3 up"


def test_a_reward_that_reads_videos_is_not_averaged_over_frames():
    """``WanTask.reward`` wraps an image reward per frame, but leaves one marked ``reads_videos`` as it is."""

    class Whole:
        reads_videos = True

        def __call__(self, videos, prompts):
            return videos[:, 0, -1].mean((-1, -2)) - videos[:, 0, 0].mean((-1, -2))  # last frame minus first

    whole = Whole()
    assert mnist_wan_task(reward=whole).reward() is whole
    per_image = mnist_wan_task(reward=lambda images, prompts: images.mean((1, 2, 3)))
    assert isinstance(per_image.reward(), FrameMeanReward)


def test_vgrpo_on_mnist_wan_checkpoints_lora_only_resumes_exactly_and_samples(tmp_path, capsys):
    config = build_config("vgrpo", None, "mnist-wan", SHORT)
    _, evaluations = train_straight_and_resumed(config, tmp_path)
    assert {"accuracy", "judge_accuracy", "digit_accuracy", "direction_accuracy"} <= set(evaluations[-1])
    assert (tmp_path / "straight" / "samples_iter_000002.png").is_file()  # labelled frame strips
    table = assert_eval_repeats_the_run(tmp_path / "straight", evaluations, capsys)
    assert {"reward_mean", "accuracy", "judge_accuracy"} <= set(table)

    out = tmp_path / "clips.npz"
    argv = ["sample", "--run", str(tmp_path / "straight"), "--per-prompt", "1", "--seed", "0", "--steps", "2"]
    assert cli_main([*argv, "--out", str(out)]) == 0
    data = np.load(out)
    assert data["images"].shape == (120, 3, 9, 32, 32)
    assert data["labels"].tolist() == [motion_label(p) for p in data["prompts"]]


@pytest.mark.slow
def test_a_short_vgrpo_run_on_the_shipped_pipeline_raises_the_held_out_reward(tmp_path):
    """Video RL learns: 10 V-GRPO iterations at the preset's settings (8 prompts x 8 clips, lr 1e-3) on the SHIPPED
    MNIST-Wan weights raise the held-out motion reward (120 clips, 10 Euler steps, the same noise before and after:
    paired). Measured on this machine: reward 0.386 -> 0.507 (+0.121), judge accuracy 0.483 -> 0.558 (the main job
    goes on to 0.829 in 40 iterations, results/mnist-wan/main-job/); asserted: at least half the measured reward gain
    (+0.06) and no drop in the judge's accuracy."""
    short = ["iterations=10", "eval.per_prompt=1", "eval.num_steps=10", "eval.every=0", "checkpoint_every=10", "seed=0"]
    evaluations = Trainer(build_config("vgrpo", None, "mnist-wan", short), tmp_path / "run", progress=False).train()
    base, trained = evaluations[0], evaluations[-1]
    assert base["iteration"] == 0 and trained["iteration"] == 10
    assert trained["reward_mean"] >= base["reward_mean"] + 0.06
    assert trained["judge_accuracy"] >= base["judge_accuracy"]


def test_export_writes_a_lora_that_wan_pipeline_loads(tmp_path):
    """``vgrpo export`` of a one-iteration run at a large learning rate: ``WanPipeline.from_pretrained(shipped)``
    with ``load_lora_weights(out)`` makes other clips than the base pipeline from the same noise."""
    from diffusers import WanPipeline

    tiny = ["iterations=1", "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=2", "vgrpo.num_pairs=1",
            "eval.per_prompt=1", "eval.num_steps=1", "eval.every=0", "optim.lr=3e-2"]
    Trainer(build_config("vgrpo", None, "mnist-wan", tiny), tmp_path / "run", progress=False).train()
    out = tmp_path / "lora"
    assert cli_main(["export", "--run", str(tmp_path / "run"), "--out", str(out)]) == 0
    card = (out / "README.md").read_text()  # the base model is the shipped (packed) folder, not its unpacked copy
    assert f"base_model: {PIPELINE_DIR}" in card
    assert f"pipe = WanPipeline.from_pretrained(unpacked_folder({str(PIPELINE_DIR)!r})" in card

    def clip(pipe):
        return pipe("a 3 moving left", height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=1.0,
                    max_sequence_length=8, output_type="pt", generator=torch.Generator().manual_seed(0)).frames

    pipe = WanPipeline.from_pretrained(unpacked_folder(PIPELINE_DIR), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    base = clip(pipe)
    pipe.load_lora_weights(str(out))
    assert pipe.get_list_adapters()["transformer"]
    assert not torch.allclose(clip(pipe), base, atol=1e-3)
