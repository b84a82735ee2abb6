"""Task registry, prompt sampling, evaluation keys and values, the sample grid PNG."""

import math

import matplotlib.image
import pytest
import torch

from vgrpo_lib.integrations.testbed.data import load_mnist, make_pairs
from vgrpo_lib.integrations.testbed.evaluation import diversity, evaluate, sample_grid_png
from vgrpo_lib.integrations.testbed.rewards import WeightedReward
from vgrpo_lib.integrations.testbed.tasks import TASKS, get_task

EXPECTED_KEYS = {"num_samples", "reward_mean", "accuracy", "slot_accuracy", "accuracy_per_prompt",
                 "judge_accuracy", "judge_gap", "diversity"}


def test_registry_has_the_graded_tasks():
    assert {"digit", "pair", "style", "digit_style", "digits8"} <= set(TASKS)
    with pytest.raises(ValueError, match="valid tasks: digit, pair, style, digit_style, digits8"):
        get_task("digits")


@pytest.mark.parametrize("name, shape", [("digit", (7,)), ("pair", (7, 2)), ("digits8", (7,))])
def test_sample_prompts_shape_range_and_determinism(name, shape):
    task = get_task(name)
    prompts = task.sample_prompts(7, torch.Generator().manual_seed(3))
    assert prompts.shape == shape and prompts.dtype == torch.int64
    assert 0 <= prompts.min() and prompts.max() <= 9
    assert torch.equal(prompts, task.sample_prompts(7, torch.Generator().manual_seed(3)))
    assert task.null_cond(prompts).eq(10).all() and task.null_cond(prompts).shape == shape


def test_eval_prompts_cover_every_prompt():
    assert get_task("digit").eval_prompts(2).tolist() == [d for d in range(10) for _ in range(2)]
    pairs = get_task("pair").eval_prompts(1)
    assert pairs.shape == (100, 2) and len({tuple(p) for p in pairs.tolist()}) == 100


def test_evaluate_real_digits_reports_high_accuracy_and_a_small_gap():
    images, labels = load_mnist("eval")
    result = evaluate(images, labels, get_task("digit"))
    assert EXPECTED_KEYS <= set(result)
    assert result["accuracy"] >= 0.98 and result["judge_accuracy"] >= 0.93
    assert result["judge_gap"] == pytest.approx(result["accuracy"] - result["judge_accuracy"])
    assert set(result["accuracy_per_prompt"]) == {str(d) for d in range(10)}
    assert 0.2 < result["diversity"] < 0.5
    assert 0.8 < result["reward_mean"] <= 1.0


def test_evaluate_detects_wrong_prompts_and_collapse():
    images, labels = load_mnist("eval")
    wrong = evaluate(images, (labels + 1) % 10, get_task("digit"))
    assert wrong["accuracy"] < 0.05 and wrong["reward_mean"] < 0.1
    collapsed = images[:1].expand(20, -1, -1, -1)
    assert diversity(collapsed, torch.zeros(20, dtype=torch.long)) == pytest.approx(0.0, abs=1e-3)
    assert math.isnan(diversity(images[:3], torch.arange(3)))  # no prompt repeats


def test_evaluate_pairs_and_multi_reward():
    images, labels = load_mnist("eval")
    pairs, pair_labels = make_pairs(images, labels, 200, torch.Generator().manual_seed(0))
    result = get_task("pair").evaluate(pairs, pair_labels)
    assert result["accuracy"] >= 0.9 and result["slot_accuracy"] >= result["accuracy"]
    assert all("," in key for key in result["accuracy_per_prompt"])
    half_wrong = pair_labels.clone()
    half_wrong[:, 1] = (half_wrong[:, 1] + 1) % 10
    broken = get_task("pair").evaluate(pairs, half_wrong)
    assert broken["accuracy"] < 0.05 and 0.4 < broken["slot_accuracy"] < 0.6
    task = get_task("digit_style")
    assert isinstance(task.reward(), WeightedReward)
    multi = task.evaluate(images, labels)
    assert multi["reward_mean"] == pytest.approx(multi["reward/digit"] + 0.5 * multi["reward/thickness"], rel=1e-5)


def test_evaluate_rejects_shapes_of_another_task():
    images, labels = load_mnist("eval")
    with pytest.raises(ValueError, match="expects images"):
        evaluate(images, labels, get_task("digits8"))
    with pytest.raises(ValueError, match="prompt slot"):
        evaluate(images[:, :, :, :14].repeat(1, 1, 1, 4), labels, get_task("pair"))


def test_sample_grid_png_is_written_atomically(tmp_path):
    images, _ = load_mnist("eval")
    path = sample_grid_png(images[:23], tmp_path / "sub" / "grid.png", nrow=10)
    picture = matplotlib.image.imread(path)
    assert picture.shape[:2] == (3 * 30 + 2, 10 * 30 + 2)
    assert [p.name for p in path.parent.iterdir()] == ["grid.png"]
    with pytest.raises(ValueError, match="non-empty"):
        sample_grid_png(images[:0], tmp_path / "empty.png")
