"""Rewards on hand-made cases: real digits, swapped prompts, pairs with one wrong half, bad input."""

import pytest
import torch

from vgrpo_lib.integrations.testbed.checkpoints import load_pretrained
from vgrpo_lib.integrations.testbed.data import load_mnist
from vgrpo_lib.integrations.testbed.rewards import (
    DigitCorrect,
    DigitProbability,
    StrokeThickness,
    WeightedReward,
    split_slots,
    stroke_thickness,
)


@pytest.fixture(scope="module")
def classifier():
    return load_pretrained("classifier")


@pytest.fixture(scope="module")
def digits():
    """The first eval-split image of every class, ordered 0..9: (10, 1, 28, 28)."""
    images, labels = load_mnist("eval")
    first = torch.stack([torch.nonzero(labels == d)[0, 0] for d in range(10)])
    return images[first]


def test_probability_is_high_for_the_true_digit_and_low_for_another(classifier, digits):
    reward = DigitProbability(classifier)
    right = reward(digits, torch.arange(10))
    wrong = reward(digits, (torch.arange(10) + 5) % 10)
    assert right.shape == (10,)
    assert (right > 0.8).all(), right
    assert (wrong < 0.1).all(), wrong
    three = digits[3:4]
    assert reward(three, torch.tensor([3])) > 0.8 > 0.1 > reward(three, torch.tensor([5]))


def test_correct_is_zero_one(classifier, digits):
    reward = DigitCorrect(classifier)
    assert reward(digits, torch.arange(10)).tolist() == [1.0] * 10
    assert reward(digits, (torch.arange(10) + 1) % 10).tolist() == [0.0] * 10


def test_pair_reward_needs_both_halves(classifier, digits):
    pair = torch.cat([digits[3:4], digits[7:8]], dim=-1)  # "3 then 7"
    prompts = torch.tensor([[3, 7], [3, 5], [5, 7], [7, 3]])
    images = pair.expand(4, -1, -1, -1)
    product = DigitProbability(classifier)(images, prompts)
    assert product[0] > 0.7
    assert (product[1:] < 0.1).all(), product
    mean = DigitProbability(classifier, combine="mean")(images, prompts)
    assert 0.3 < mean[1] < 0.7 and 0.3 < mean[2] < 0.7 and mean[3] < 0.1
    assert DigitCorrect(classifier)(images, prompts).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_split_slots_is_left_to_right():
    images = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 2, 6)
    slots = split_slots(images, 3)
    assert slots.shape == (6, 1, 2, 2)
    assert torch.equal(slots[4], images[1, :, :, 2:4])


def test_stroke_thickness_measures_width():
    images = torch.zeros(3, 1, 28, 28)
    images[0, 0, 4:24, 13:15] = 1.0  # a 2 px wide bar
    images[1, 0, 4:24, 12:17] = 1.0  # a 5 px wide bar; its short ends count as edge too, so ~4 px
    width = stroke_thickness(images)
    assert 1.5 < width[0] < 2.5 and 4.0 < width[1] < 5.5 and width[2] == 0.0
    reward = StrokeThickness(target=4.0, tolerance=1.0)(images, torch.zeros(3, dtype=torch.long))
    assert reward[1] > 0.8 > reward[0] and reward[2] < 1e-3


def test_stroke_thickness_gives_small_differences_between_real_digits():
    images, labels = load_mnist("eval")
    values = StrokeThickness()(images, labels)
    assert ((values > 0) & (values <= 1)).all()
    assert 0.02 < values.std() < 0.35


def test_weighted_reward_sums_components(classifier, digits):
    prob, thick = DigitProbability(classifier), StrokeThickness()
    reward = WeightedReward({"digit": (prob, 1.0), "thickness": (thick, 0.5)})
    prompts = torch.arange(10)
    expected = prob(digits, prompts) + 0.5 * thick(digits, prompts)
    assert torch.allclose(reward(digits, prompts), expected)
    assert reward.stack(digits, prompts).shape == (10, 2) and reward.names == ["digit", "thickness"]
    assert set(reward.components(digits, prompts)) == {"digit", "thickness"}


@pytest.mark.parametrize(
    "images, prompts, match",
    [
        (torch.zeros(4, 28, 28), torch.zeros(4, dtype=torch.long), r"\(B, 1, H, W\)"),
        (torch.zeros(4, 1, 28, 28), torch.zeros(3, dtype=torch.long), "prompts are for 3 images but 4"),
        (torch.zeros(4, 1, 28, 28), torch.zeros(4), "int64"),
        (torch.zeros(4, 1, 28, 28), torch.full((4,), 10), "digits 0..9"),
        (torch.zeros(4, 1, 28, 28), torch.zeros(4, 2, dtype=torch.long), r"\(B, 1, 28, 56\)"),
        (torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long), r"\(B, 1, 28, 28\)"),
        (torch.zeros(4, 1, 28, 28, dtype=torch.uint8), torch.zeros(4, dtype=torch.long), "floating point"),
    ],
)
def test_bad_input_raises_clear_errors(classifier, images, prompts, match):
    with pytest.raises(ValueError, match=match):
        DigitProbability(classifier)(images, prompts)


def test_bad_configuration_is_rejected(classifier):
    with pytest.raises(ValueError, match="combine"):
        DigitProbability(classifier, combine="max")
    with pytest.raises(ValueError, match="tolerance"):
        StrokeThickness(tolerance=0.0)
    with pytest.raises(ValueError, match="at least one"):
        WeightedReward({})
    with pytest.raises(ValueError, match="tuple"):
        WeightedReward({"digit": DigitProbability(classifier)})
