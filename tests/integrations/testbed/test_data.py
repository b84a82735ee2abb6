"""Data of the embedded testbed: shapes, ranges, split sizes and disjointness, pairs, model space."""

import pytest
import torch

from vgrpo_lib.integrations.testbed.data import (
    digits8_split_indices,
    load_digits8,
    load_mnist,
    make_pairs,
    mnist_split_indices,
    to_images,
    to_model_space,
)


@pytest.mark.parametrize(
    "loader, side, sizes",
    [(load_mnist, 28, {"train": 3000, "judge": 1500, "eval": 500, "all": 5000}),
     (load_digits8, 8, {"all": 1797})],
)
def test_shapes_ranges_and_sizes(loader, side, sizes):
    for split, n in sizes.items():
        images, labels = loader(split)
        assert images.shape == (n, 1, side, side) and images.dtype == torch.float32
        assert labels.shape == (n,) and labels.dtype == torch.int64
        assert images.min() == 0.0 and images.max() == 1.0
        assert set(labels.tolist()) == set(range(10))


def test_mnist_splits_are_class_balanced():
    for split, per_class in {"train": 300, "judge": 150, "eval": 50}.items():
        _, labels = load_mnist(split)
        assert torch.bincount(labels).tolist() == [per_class] * 10


@pytest.mark.parametrize("indices", [mnist_split_indices, digits8_split_indices])
def test_splits_are_disjoint_and_cover_everything(indices):
    parts = indices()
    train, judge, eval_ = (set(parts[k].tolist()) for k in ("train", "judge", "eval"))
    assert not train & judge and not train & eval_ and not judge & eval_
    assert train | judge | eval_ == set(parts["all"].tolist())


def test_splits_are_deterministic_and_images_match_indices():
    first, again = mnist_split_indices(), mnist_split_indices()
    assert all(torch.equal(first[k], again[k]) for k in first)
    everything, labels = load_mnist("all")
    judge_images, judge_labels = load_mnist("judge")
    assert torch.equal(everything[first["judge"]], judge_images)
    assert torch.equal(labels[first["judge"]], judge_labels)


def test_loaders_return_independent_copies():
    images, _ = load_mnist("eval")
    images.zero_()
    assert load_mnist("eval")[0].max() == 1.0


def test_unknown_split_is_rejected():
    with pytest.raises(ValueError, match="valid splits: train, judge, eval, all"):
        load_mnist("test")


def test_make_pairs_puts_left_and_right_digits_side_by_side():
    images, labels = load_mnist("eval")
    pairs, pair_labels = make_pairs(images, labels, 64, torch.Generator().manual_seed(0))
    assert pairs.shape == (64, 1, 28, 56) and pair_labels.shape == (64, 2)
    for pair, (left, right) in zip(pairs[:8], pair_labels[:8]):
        left_match = (images == pair[..., :28]).flatten(1).all(1)
        right_match = (images == pair[..., 28:]).flatten(1).all(1)
        assert left in labels[left_match] and right in labels[right_match]
    again, _ = make_pairs(images, labels, 64, torch.Generator().manual_seed(0))
    assert torch.equal(pairs, again)


def test_make_pairs_rejects_bad_input():
    images, labels = load_digits8("eval")
    with pytest.raises(ValueError, match="labels"):
        make_pairs(images, labels[:-1], 4)
    with pytest.raises(ValueError, match="positive"):
        make_pairs(images, labels, 0)


def test_model_space_round_trip_and_clamp():
    images, _ = load_digits8("eval")
    x = to_model_space(images)
    assert x.min() == -1.0 and x.max() == 1.0
    assert torch.allclose(to_images(x), images)
    assert to_images(torch.tensor([-3.0, 3.0])).tolist() == [0.0, 1.0]
