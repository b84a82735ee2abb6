"""The core on video latents ``(B, C, F, H, W)``: every estimator, weighting, sampler, step density and loss reduces
over the data dimensions ``(B, *D)``, so a video is a sample like any other. Each test compares the video batch with
the same numbers laid out flat ``(B, C*F*H*W)`` (the per-sample means over the data dimensions, hence every value,
must agree) and checks the shapes that keep the frame axis; property tests draw the video shapes
(:func:`vgrpo_lib.testing.strategies.video_shapes`)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vgrpo_lib import DiffusionNFTLoss, ELBOSurrogate, FlowGRPOLoss, VGRPOLoss
from vgrpo_lib.objectives import gaussian_kl_same_std, x_space_kl
from vgrpo_lib.paths import RectifiedFlow
from vgrpo_lib.samplers import ODE_SOLVERS, sample_ode, sample_sde, time_grid
from vgrpo_lib.sde import SDE_TYPES, gaussian_log_prob, step_mean_std
from vgrpo_lib.testing import MLPVelocity, make_loss_batches, perturb
from vgrpo_lib.testing.strategies import estimators, sample_batches, video_shapes
from vgrpo_lib.weighting import WEIGHTINGS

PROPERTIES = settings(max_examples=25, deadline=None, derandomize=True, database=None)
VIDEO = (2, 3, 2, 4)  # (C, F, H, W): two channels, three frames of 2x4 latent pixels


def flat(x: torch.Tensor, leading: int = 1) -> torch.Tensor:
    """The same numbers with the data dimensions after ``leading`` flattened into one."""
    return x.flatten(leading) if x.ndim > leading + 1 else x


def models(shape, cond_dim: int = 0, dtype=torch.float64):
    """The same MLP on the video layout and on the flat one (equal weights: both see C*F*H*W inputs)."""
    return (MLPVelocity(shape, cond_dim=cond_dim, dtype=dtype),
            MLPVelocity((math.prod(shape),), cond_dim=cond_dim, dtype=dtype))


@PROPERTIES
@given(estimator=estimators(num_pairs=(1, 2, 4)), batch=sample_batches(data_shapes=video_shapes(), dtype=torch.float64),
       seed=st.integers(0, 2**31 - 1))
def test_pairs_and_surrogates_of_videos_equal_the_flat_layouts(estimator, batch, seed):
    sample, group = batch["sample"], batch["group"]
    shape = tuple(sample.shape[1:])
    assert len(shape) == 4 and shape[1] >= 2, "video_shapes draws (C, F, H, W) with several frames"
    pairs = estimator.sample_pairs(sample, group=group, generator=torch.Generator().manual_seed(seed))
    flat_pairs = estimator.sample_pairs(flat(sample), group=group, generator=torch.Generator().manual_seed(seed))
    assert pairs["noise"].shape == (sample.shape[0], estimator.num_pairs, *shape)
    torch.testing.assert_close(pairs["t"], flat_pairs["t"], rtol=0, atol=0)
    torch.testing.assert_close(flat(pairs["noise"], 2), flat_pairs["noise"], rtol=0, atol=0)
    if estimator.sharing == "group":  # every member of a group sees the same pairs, frames included
        for label in torch.unique(group):
            members = (group == label).nonzero().flatten()
            assert all(torch.equal(pairs["noise"][members[0]], pairs["noise"][m]) for m in members)

    video_model, flat_model = models(shape)
    evaluated = estimator.evaluate(video_model, sample, None, pairs)
    flat_evaluated = estimator.evaluate(flat_model, flat(sample), None, flat_pairs)
    assert evaluated["x_pred"].shape == pairs["noise"].shape
    torch.testing.assert_close(evaluated["log_prob"], flat_evaluated["log_prob"], rtol=1e-9, atol=1e-12)
    surrogate = estimator(video_model, sample, None, pairs)
    assert surrogate.shape == (sample.shape[0],) and torch.isfinite(surrogate).all()


@pytest.mark.parametrize("weighting", sorted(WEIGHTINGS))
def test_each_weighting_reduces_over_frames_channels_and_pixels(weighting):
    g = torch.Generator().manual_seed(0)
    path = RectifiedFlow()
    x, noise = (torch.randn(3, 2, *VIDEO, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(3, 2, *VIDEO, generator=g, dtype=torch.float64)
    t = torch.rand(3, 2, generator=g, dtype=torch.float64) * 0.9 + 0.05
    z = path.add_noise(x, noise, t)
    loss = WEIGHTINGS[weighting](v, x, noise, z, t, path, path.x_from_v(z, v, t))
    flat_loss = WEIGHTINGS[weighting](*(flat(a, 2) for a in (v, x, noise, z)), t, path,
                                      flat(path.x_from_v(z, v, t), 2))
    assert loss.shape == (3, 2)
    torch.testing.assert_close(loss, flat_loss, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", sorted(ODE_SOLVERS))
def test_ode_solvers_integrate_a_video_like_its_flat_layout(method):
    video_model, flat_model = models(VIDEO, cond_dim=2)
    g = torch.Generator().manual_seed(1)
    noise, cond = torch.randn(3, *VIDEO, generator=g, dtype=torch.float64), torch.randn(3, 2, generator=g, dtype=torch.float64)
    with torch.no_grad():
        video = sample_ode(video_model, noise, time_grid(4, shift=3.0), cond, method=method)
        flat_video = sample_ode(flat_model, flat(noise), time_grid(4, shift=3.0), cond, method=method)
    assert video.shape == noise.shape
    torch.testing.assert_close(flat(video), flat_video, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sde_type", sorted(SDE_TYPES))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sde_rollouts_record_video_transitions_with_the_flat_log_densities(sde_type, reduction):
    video_model, flat_model = models(VIDEO)
    noise = torch.randn(3, *VIDEO, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    level = 0.7 if sde_type == "flow_sde" else 0.8
    runs = []
    for model, start in ((video_model, noise), (flat_model, flat(noise))):
        with torch.no_grad():
            runs.append(sample_sde(model, start, time_grid(4), None, noise_level=level, record_mean=True,
                                   generator=torch.Generator().manual_seed(3), log_prob_reduction=reduction,
                                   sde_type=sde_type))
    (final, records), (flat_final, flat_records) = runs
    assert records["z"].shape == (3, records.shape[1], *VIDEO) and records["mean"].shape == records["z"].shape
    torch.testing.assert_close(flat(final), flat_final, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(records["log_prob"], flat_records["log_prob"], rtol=1e-9, atol=1e-9)

    step = step_mean_std(sde_type)
    t, t_next = records["t"][:, 0], records["t_next"][:, 0]
    mean, std = step(records["z"][:, 0], torch.ones_like(records["z"][:, 0]), t, t_next, level)
    density = gaussian_log_prob(records["z_next"][:, 0], mean, std, reduction)
    flat_mean, flat_std = step(flat(records["z"][:, 0]), torch.ones_like(flat(records["z"][:, 0])), t, t_next, level)
    torch.testing.assert_close(density, gaussian_log_prob(flat(records["z_next"][:, 0]), flat_mean, flat_std, reduction))
    kl = gaussian_kl_same_std(mean, mean + 0.1, std, reduction)
    torch.testing.assert_close(kl, gaussian_kl_same_std(flat_mean, flat_mean + 0.1, flat_std, reduction))


def test_x_space_kl_of_video_predictions_is_the_flat_one():
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(3, 2, *VIDEO, generator=g), torch.randn(3, 2, *VIDEO, generator=g)
    torch.testing.assert_close(x_space_kl(a, b), x_space_kl(flat(a, 2), flat(b, 2)))
    assert x_space_kl(a, b).shape == (3,)


def test_a_single_frame_video_is_the_image():
    """``(B, C, 1, H, W)`` and ``(B, C, H, W)`` hold the same numbers: every estimator value agrees."""
    estimator = ELBOSurrogate(num_pairs=3, sharing="none")
    image = torch.randn(4, 2, 3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    video = image.unsqueeze(2)
    model_image, model_video = MLPVelocity((2, 3, 3), dtype=torch.float64), MLPVelocity((2, 1, 3, 3), dtype=torch.float64)
    pairs = estimator.sample_pairs(video, generator=torch.Generator().manual_seed(6))
    image_pairs = pairs.clone()
    image_pairs["noise"] = pairs["noise"].squeeze(3)
    torch.testing.assert_close(estimator(model_video, video, None, pairs), estimator(model_image, image, None, image_pairs))


@PROPERTIES
@given(shape=video_shapes(max_side=3), seed=st.integers(0, 2**31 - 1))
def test_the_three_losses_on_videos_equal_the_flat_layouts_and_train(shape, seed):
    video = make_loss_batches(torch.Generator().manual_seed(seed), data_shape=shape)
    flat_ = make_loss_batches(torch.Generator().manual_seed(seed), data_shape=(math.prod(shape),))
    assert video.vgrpo["sample"].shape == (4, *shape) and video.flow_grpo["z"].shape == (4, 3, *shape)
    old, flat_old = perturb(video.model), perturb(flat_.model)
    losses = {
        "vgrpo": lambda b: VGRPOLoss(b.model, b.estimator, behaviour_kl_coef=0.1)(b.vgrpo),
        "flow_grpo": lambda b: FlowGRPOLoss(b.model)(b.flow_grpo),
        "diffusion_nft": lambda b: DiffusionNFTLoss(b.model, old if b is video else flat_old, b.estimator)(b.nft),
    }
    for name, loss in losses.items():
        out, flat_out = loss(video), loss(flat_)
        torch.testing.assert_close(out["loss_objective"], flat_out["loss_objective"], rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{name}: {m}")
        video.model.zero_grad()
        out["loss_objective"].backward()
        grads = [p.grad for p in video.model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads), name
        assert any(g.abs().sum() > 0 for g in grads), f"{name}: the loss on videos reaches the model"
