"""The velocity-model protocol of VelocityMLP and the classifiers' input checks."""

import pytest
import torch

from vgrpo_lib.integrations.testbed.models import DigitClassifier, JudgeClassifier, VelocityMLP, build_model


@pytest.fixture
def pair_model():
    torch.manual_seed(0)
    model = VelocityMLP((1, 8, 16), num_slots=2, width=32, depth=1, emb_dim=16, time_features=8)
    with torch.no_grad():  # output and modulation layers start at zero; randomise them so conditioning shows
        model.out.weight.normal_()
        for block in model.blocks:
            block.modulation.weight.normal_()
    return model


def test_output_shape_and_finite_at_both_ends(pair_model):
    x_t, t = torch.randn(4, 1, 8, 16), torch.tensor([0.0, 0.02, 0.5, 1.0])
    v = pair_model(x_t, t, torch.tensor([[3, 7], [7, 3], [10, 10], [0, 10]]))
    assert v.shape == x_t.shape and torch.isfinite(v).all()  # t = 0 is clamped to t_min


def test_fresh_model_predicts_x_hat_zero():
    """x-prediction: the zero-initialised body predicts x_hat = 0, so v = x_t / max(t, t_min)."""
    model = VelocityMLP((1, 8, 8), width=16, depth=1, emb_dim=8, time_features=8)
    x_t, t = torch.randn(3, 1, 8, 8), torch.tensor([0.01, 0.5, 1.0])
    v = model(x_t, t, torch.tensor([1, 2, 10]))
    assert torch.allclose(v, x_t / t.clamp_min(0.05).view(-1, 1, 1, 1))
    assert torch.allclose((x_t - t.view(-1, 1, 1, 1) * v)[1:], torch.zeros(2, 1, 8, 8), atol=1e-6)


def test_slot_order_matters(pair_model):
    x_t, t = torch.randn(1, 1, 8, 16).expand(2, -1, -1, -1), torch.full((2,), 0.5)
    v = pair_model(x_t, t, torch.tensor([[3, 7], [7, 3]]))
    assert not torch.allclose(v[0], v[1])


def test_single_slot_accepts_flat_ids_and_scalar_time():
    model = VelocityMLP((1, 8, 8), width=16, depth=1, emb_dim=8, time_features=8)
    v = model(torch.randn(3, 1, 8, 8), torch.tensor(0.3), torch.tensor([1, 2, 10]))
    assert v.shape == (3, 1, 8, 8)


@pytest.mark.parametrize(
    "cond, match",
    [(torch.tensor([[3, 7]] * 4), "int64 prompt ids"), (torch.zeros(4, 2), "int64"),
     (torch.tensor([1, 2, 3, 11]), "0..10")],
)
def test_bad_conditions_are_rejected(cond, match):
    model = VelocityMLP((1, 8, 8), width=16, depth=1, emb_dim=8, time_features=8)
    with pytest.raises(ValueError, match=match):
        model(torch.randn(4, 1, 8, 8), torch.rand(4), cond)


def test_wrong_image_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"\(B, 1, 8, 8\)"):
        VelocityMLP((1, 8, 8), width=16, depth=1)(torch.randn(2, 1, 28, 28), torch.rand(2), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="DigitClassifier"):
        DigitClassifier(image_size=28)(torch.rand(2, 1, 28, 56))
    with pytest.raises(ValueError, match="JudgeClassifier"):
        JudgeClassifier(image_size=8)(torch.rand(2, 8, 8))


def test_build_model_round_trips_configs():
    for model in (VelocityMLP((1, 8, 8), width=16, depth=1), DigitClassifier(8, (4, 8), 16), JudgeClassifier(8)):
        rebuilt = build_model(type(model).__name__, model.config)
        assert rebuilt.config == model.config
        assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in model.parameters()]
    with pytest.raises(ValueError, match="valid kinds"):
        build_model("UNet", {})
