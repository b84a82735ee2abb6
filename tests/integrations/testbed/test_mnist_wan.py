"""MNIST-Wan: the clip rendering and motion measurement, the prompt grammar, the tokenizer, the pipeline's
save/load round trip offline, and the determinism and resumption of its pretraining."""

from __future__ import annotations

import pytest
import torch

from vgrpo_lib.integrations.packed_weights import unpacked_folder
from vgrpo_lib.integrations.testbed.data import load_mnist
from vgrpo_lib.integrations.testbed.mnist_wan import prompts as P
from vgrpo_lib.integrations.testbed.mnist_wan.render import (
    DIRECTION_VECTORS, DIRECTIONS, FRAME_SIZE, FRAMES, INK_MARGIN, MNIST_SIDE, SPEED, centre_of_mass, classifier_view,
    latent_shape, measured_direction, measured_displacement, render_clips,
)

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def digits():
    images, labels = load_mnist("train")
    return images[:160], labels[:160]


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- clips and motion
def test_clips_have_the_video_layout_and_keep_the_ink_on_canvas(digits):
    images, _ = digits
    directions = torch.arange(len(images)) % len(DIRECTIONS)
    clips = render_clips(images, directions, torch.Generator().manual_seed(0))
    assert clips.shape == (len(images), 3, FRAMES, *FRAME_SIZE)
    assert clips.min() >= 0 and clips.max() <= 1
    assert torch.equal(clips[:, 0], clips[:, 1]) and torch.equal(clips[:, 0], clips[:, 2])  # white
    ink_box = images[:, :, INK_MARGIN:MNIST_SIDE - INK_MARGIN, INK_MARGIN:MNIST_SIDE - INK_MARGIN].sum((1, 2, 3))
    assert (clips[:, 0].sum((-2, -1)) >= ink_box[:, None] - 1e-3).all()  # the 20x20 ink box never leaves the canvas


def test_every_rendered_clip_moves_in_its_labelled_direction_at_its_speed(digits):
    images, _ = digits
    directions = torch.randint(0, len(DIRECTIONS), (len(images),), generator=torch.Generator().manual_seed(1))
    clips = render_clips(images, directions, torch.Generator().manual_seed(2))
    assert torch.equal(measured_direction(clips), directions)
    velocity = measured_displacement(clips)
    assert torch.allclose(velocity, SPEED * DIRECTION_VECTORS[directions], atol=0.35)


def test_frames_are_integer_translations_of_the_digit(digits):
    images, _ = digits
    clips = render_clips(images[:4], torch.tensor([0, 1, 2, 3]), torch.Generator().manual_seed(3))
    com = centre_of_mass(clips)
    steps = com[:, 1:] - com[:, :-1]
    # consecutive centres move one pixel while the digit stays whole on the canvas
    assert ((steps - SPEED * DIRECTION_VECTORS[torch.tensor([0, 1, 2, 3])][:, None]).abs() < 0.5).float().mean() > 0.7


def test_classifier_view_recovers_a_digit_whose_box_is_on_the_canvas(digits):
    images, _ = digits
    clips = render_clips(images, torch.zeros(len(images), dtype=torch.long), torch.Generator().manual_seed(4))
    views = classifier_view(clips)
    assert views.shape == (len(images), FRAMES, 1, MNIST_SIDE, MNIST_SIDE)
    exact = (views[:, :, 0] == images).flatten(2).all(-1)
    assert exact.float().mean() > 0.3  # frames whose box is cut by the canvas differ, the others are exact


def test_render_and_latent_shape_refuse_bad_input(digits):
    images, _ = digits
    with pytest.raises(ValueError, match="directions"):
        render_clips(images[:2], torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="digits"):
        render_clips(images[:2, :, :20], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="clips"):
        measured_direction(torch.zeros(2, 3, 32, 32))
    with pytest.raises(ValueError, match="4k"):
        latent_shape(8)
    assert latent_shape() == (16, 3, 8, 8)


# ---------------------------------------------------------------- prompts and tokenizer
def test_prompt_splits_are_disjoint_and_cover_every_digit_and_direction():
    train, held_out = P.motion_prompts("train"), P.motion_prompts("eval")
    assert (len(train), len(held_out)) == (200, 120)
    assert {p for p, _, _ in train}.isdisjoint(p for p, _, _ in held_out)
    for split in (train, held_out):
        assert {(d, k) for _, d, k in split} == {(d, k) for d in range(10) for k in range(len(DIRECTIONS))}
        assert [P.parse_motion(p) for p, _, _ in split] == [(d, k) for _, d, k in split]
    assert P.parse_motion("a 3 moving left") == (3, 0)
    assert P.parse_motion("  The digit NINE moving down ") == (9, 3)
    with pytest.raises(ValueError, match="a 3 moving sideways"):
        P.parse_motion("a 3 moving sideways")


def test_tokenizer_keeps_every_word_whole_and_round_trips_every_prompt():
    from vgrpo_lib.integrations.testbed.mnist_wan.build import TEXT_LENGTH, tokenizer

    tok = tokenizer()
    for word in P.VOCABULARY:
        assert tok.tokenize(word) == ["▁" + word]
    for prompt, _, _ in P.motion_prompts("train") + P.motion_prompts("eval"):
        ids = tok(prompt).input_ids
        assert len(ids) <= TEXT_LENGTH and ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == prompt
    assert tok.unk_token_id not in tok("a 3 moving sideways").input_ids  # unknown words go by character


# ---------------------------------------------------------------- the pipeline
def test_untrained_pipeline_saves_in_float16_and_loads_offline_in_wan_pipeline(tmp_path, monkeypatch):
    from diffusers import UniPCMultistepScheduler, WanPipeline

    from vgrpo_lib.integrations.testbed.mnist_wan.build import FLOW_SHIFT, TEXT_LENGTH, build_pipeline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pipe = build_pipeline(seed=0)
    pipe.to(torch.float16).save_pretrained(tmp_path, safe_serialization=True)
    loaded = WanPipeline.from_pretrained(tmp_path, dtype=torch.float32)
    assert isinstance(loaded.scheduler, UniPCMultistepScheduler)
    assert loaded.scheduler.config.prediction_type == "flow_prediction" and loaded.scheduler.config.use_flow_sigmas
    assert loaded.scheduler.config.flow_shift == FLOW_SHIFT
    assert (loaded.vae_scale_factor_spatial, loaded.vae_scale_factor_temporal) == (4, 4)
    assert sum(f.stat().st_size for f in tmp_path.rglob("*") if f.is_file()) < 3.5e6
    loaded.set_progress_bar_config(disable=True)
    frames = loaded("a 3 moving left", height=32, width=32, num_frames=FRAMES, num_inference_steps=2,
                    max_sequence_length=TEXT_LENGTH, output_type="pt",
                    generator=torch.Generator().manual_seed(0)).frames
    assert frames.shape == (1, FRAMES, 3, *FRAME_SIZE)
    assert torch.isfinite(frames).all()


def _train_steps(digits: torch.Tensor) -> dict:
    """Two VAE steps, then two flow steps on a tiny latent pool: every weight afterwards."""
    from vgrpo_lib.integrations.testbed.mnist_sd3.train import optimizer_step
    from vgrpo_lib.integrations.testbed.mnist_wan import train as T
    from vgrpo_lib.integrations.testbed.mnist_wan.build import build_pipeline

    pipe = build_pipeline(seed=0)
    gen = torch.Generator().manual_seed(5)
    opt = torch.optim.AdamW(pipe.vae.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for _ in range(2):
        optimizer_step(opt, sched, T.vae_loss(pipe.vae, T.vae_batch(digits, 2, gen), 1e-6, gen))
    directions = torch.arange(4)
    means, stds = T.encode_moments(pipe.vae, render_clips(digits[:4], directions, gen))
    T.set_latent_statistics(pipe.vae, means, stds)
    pool = (means, stds, torch.arange(4), directions)
    params = [*pipe.transformer.parameters(), *pipe.text_encoder.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for _ in range(2):
        z, prompts = T.flow_batch(pipe.vae, pool, 4, gen)
        optimizer_step(opt, sched, T.flow_loss(pipe, z, prompts, 0.5, gen), clip_params=params)
    return {f"{name}.{k}": v.clone() for name in ("vae", "transformer", "text_encoder")
            for k, v in getattr(pipe, name).state_dict().items()}


def test_training_steps_are_bitwise_deterministic_at_one_thread(digits, one_thread):
    first, second = _train_steps(digits[0]), _train_steps(digits[0])
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    untouched = _untrained_weights()
    assert any(not torch.equal(first[k], untouched[k]) for k in first if k.startswith("transformer."))


def _untrained_weights() -> dict:
    from vgrpo_lib.integrations.testbed.mnist_wan.build import build_pipeline

    pipe = build_pipeline(seed=0)
    return {f"{name}.{k}": v for name in ("vae", "transformer", "text_encoder")
            for k, v in getattr(pipe, name).state_dict().items()}


def test_a_run_past_the_asked_flow_steps_is_refused_before_any_work(tmp_path):
    """A work folder whose state is past ``--flow-steps`` (a 16,250-step run asked for the shipped 14,000) would
    otherwise ship its later weights under the smaller recipe: refused by name, before the latent pool is built."""
    from vgrpo_lib.integrations.testbed.mnist_wan.train import FLOW_RECIPE, main, train

    torch.save({"stage": "flow", "step": 16250}, tmp_path / "state.pt")
    with pytest.raises(ValueError, match="holds flow step 16250, past the 14000 flow steps asked for: pass --flow-steps"):
        train(tmp_path, log=lambda line: None, flow_recipe={**FLOW_RECIPE, "steps": 14000})
    with pytest.raises(SystemExit, match="--flow-steps 16250 or more"):
        main(["--work", str(tmp_path), "--flow-steps", "14000"])


def test_an_interrupted_vae_stage_resumes_bitwise(tmp_path, one_thread, monkeypatch):
    from vgrpo_lib.integrations.testbed.mnist_wan import train as T

    class PoolReached(Exception):
        pass

    def stop(*args, **kwargs):
        raise PoolReached

    monkeypatch.setattr(T, "latent_pool", stop)
    monkeypatch.setattr(T, "vae_round_trip", lambda vae, classifier: {})  # the end-of-stage probe, not under test
    monkeypatch.setitem(T.PROGRESS, "vae", dict(checkpoint=2, probe=1000, log=1000))
    recipe = {**T.VAE_RECIPE, "steps": 4, "batch_size": 2}

    def run(work):
        with pytest.raises(PoolReached):
            T.train(work, lambda line: None, recipe)

    run(tmp_path / "whole")
    real, calls = T.vae_loss, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(T, "vae_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        T.train(tmp_path / "split", lambda line: None, recipe)
    assert torch.load(tmp_path / "split" / "state.pt", weights_only=False)["step"] == 2
    monkeypatch.setattr(T, "vae_loss", real)
    run(tmp_path / "split")
    whole, split = (torch.load(tmp_path / name / "state.pt", weights_only=False) for name in ("whole", "split"))
    assert whole["stage"] == split["stage"] == "flow"
    assert all(torch.equal(whole["vae"][k], split["vae"][k]) for k in whole["vae"])


# ---------------------------------------------------------------- reward and judge
@pytest.fixture(scope="module")
def labelled_clips():
    images, labels = load_mnist("eval")
    images, labels = images[:120], labels[:120]
    directions = torch.arange(len(labels)) % len(DIRECTIONS)
    clips = render_clips(images, directions, torch.Generator().manual_seed(6))
    return clips, labels, directions


def _prompts(labels, directions, digit_offset=0, direction_offset=0):
    return [f"a {(int(d) + digit_offset) % 10} moving {DIRECTIONS[(int(k) + direction_offset) % 4]}"
            for d, k in zip(labels, directions)]


def test_reward_is_high_only_for_the_prompted_digit_moving_the_prompted_way(labelled_clips):
    from vgrpo_lib.integrations.testbed.mnist_wan.rewards import motion_reward

    clips, labels, directions = labelled_clips
    reward = motion_reward()
    right = reward(clips, _prompts(labels, directions))
    assert right.shape == (len(labels),) and right.mean() > 0.85
    assert reward(clips, _prompts(labels, directions, direction_offset=1)).max() < 0.05  # perpendicular or opposite
    assert reward(clips, _prompts(labels, directions, digit_offset=1)).mean() < 0.1
    still = clips[:, :, :1].expand_as(clips)
    assert reward(still, _prompts(labels, directions)).max() == 0


def test_judge_reads_digits_with_another_family_and_motion_with_another_estimator(labelled_clips):
    from vgrpo_lib.integrations.testbed.mnist_wan.rewards import block_matching_direction, motion_judge

    clips, labels, directions = labelled_clips
    assert torch.equal(block_matching_direction(clips), directions)
    judged = motion_judge()(clips, _prompts(labels, directions))
    assert judged["direction"].all() and judged["digit"].float().mean() > 0.9
    assert torch.equal(judged["both"], judged["digit"] & judged["direction"])
    assert not motion_judge()(clips, _prompts(labels, directions, direction_offset=2))["direction"].any()
    with pytest.raises(ValueError, match="prompts"):
        motion_judge()(clips, _prompts(labels, directions)[:3])


# ---------------------------------------------------------------- the shipped pipeline
def test_the_shipped_pipeline_is_what_the_rebuild_command_makes_and_leaves_headroom():
    """The shipped folder (``checkpoints/mnist_wan``) is the rebuild command's output: its card's recipes are the
    module's ``VAE_RECIPE`` / ``FLOW_RECIPE`` (the constant learning rate makes its flow step count the first steps
    of any longer run), at most 6 MB, loadable in float32 as the real classes; its CFG-free judge accuracy leaves
    the motion task headroom (15-75%) and CFG 4 is clearly better (what RL can reach without guidance)."""
    import json

    from diffusers import WanPipeline

    from vgrpo_lib.integrations.testbed.mnist_wan.build import PIPELINE_DIR
    from vgrpo_lib.integrations.testbed.mnist_wan.card import REBUILD_COMMAND
    from vgrpo_lib.integrations.testbed.mnist_wan.train import FLOW_RECIPE, VAE_RECIPE

    card = json.loads((PIPELINE_DIR / "card.json").read_text())
    assert card["vae_recipe"] == VAE_RECIPE and card["flow_recipe"] == FLOW_RECIPE
    assert REBUILD_COMMAND in (PIPELINE_DIR / "README.md").read_text()
    assert sum(f.stat().st_size for f in PIPELINE_DIR.rglob("*") if f.is_file()) <= 6e6
    free, guided = card["metrics"]["cfg1"], card["metrics"]["cfg4"]
    assert 0.15 <= free["judge_both_accuracy"] <= 0.75
    assert guided["judge_both_accuracy"] >= free["judge_both_accuracy"] + 0.1
    pipe = WanPipeline.from_pretrained(unpacked_folder(PIPELINE_DIR), dtype=torch.float32)
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel" and type(pipe.vae).__name__ == "AutoencoderKLWan"
    assert all(p.dtype == torch.float32 for p in pipe.transformer.parameters())


def test_a_run_of_k_flow_steps_ends_on_the_weights_of_a_longer_runs_snapshot_k(tmp_path, one_thread, monkeypatch):
    """Why the rebuild command (`train`, 14,000 flow steps) makes the shipped weights, which are snapshot 14,000 of a
    16,250-step run: with a constant learning rate after warmup and one generator drawn step by step, the first k
    steps of a longer run are the run of k steps, bit for bit (here k = 2 of 4, on 8 digits)."""
    from vgrpo_lib.integrations.testbed.mnist_wan import train as T

    real_mnist = T.load_mnist
    monkeypatch.setattr(T, "load_mnist", lambda split: tuple(x[:8] for x in real_mnist(split)))
    monkeypatch.setattr(T, "vae_round_trip", lambda vae, classifier: {})  # the probes' measurements, not under test
    monkeypatch.setattr(T, "sample_metrics", lambda *args, **kwargs: {})
    monkeypatch.setitem(T.PROGRESS, "vae", dict(checkpoint=2, probe=1000, log=1000))
    monkeypatch.setitem(T.PROGRESS, "flow", dict(checkpoint=2, probe=2, log=1000))
    vae_recipe = {**T.VAE_RECIPE, "steps": 2, "batch_size": 2}
    for name, steps in (("short", 2), ("long", 4)):
        T.train(tmp_path / name, lambda line: None, vae_recipe, {**T.FLOW_RECIPE, "steps": steps, "batch_size": 2})

    def load(*parts):
        return torch.load(tmp_path.joinpath(*parts), weights_only=False)

    short, snapshot, long = load("short", "state.pt"), load("long", "snapshots", "flow_2.pt"), load("long", "state.pt")
    assert short["stage"] == long["stage"] == "done" and (short["step"], long["step"]) == (2, 4)
    for module in ("transformer", "text_encoder"):
        assert short[module].keys() == snapshot[module].keys()
        assert all(torch.equal(short[module][k], snapshot[module][k]) for k in short[module])
    # The two steps after the snapshot moved the weights on: the equality above is not that of untrained weights.
    assert any(not torch.equal(short["transformer"][k], long["transformer"][k]) for k in short["transformer"])
