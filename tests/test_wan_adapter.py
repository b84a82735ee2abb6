"""Wan text-to-video through the hub path, on tiny WanPipelines built locally from their real component classes
(UMT5, the causal video VAE, UniPC with flow sigmas; Wan 2.1's one transformer and Wan 2.2's two experts):
the adapter against WanPipeline itself (time scale, sign, latent normalisation, expert switching), the scheduler's
grid, video rewards, and V-GRPO, DiffusionNFT and Flow-GRPO each trained from the CLI with ``model.path=``,
resumed exactly, exported, and the export loaded by ``WanPipeline.load_lora_weights``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.export import load_run_policy  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters.wan import (  # noqa: E402
    WAN_LORA_TARGET_MODULES, WanExperts, WanVelocity, decode_videos, encode_videos, load_wan, wan_latent_shape,
    wan_sigma_grid, wan_sigma_grid_from_scheduler_config,
)
from vgrpo_lib.integrations.tasks.hub import hub_task  # noqa: E402
from vgrpo_lib.integrations.tasks.wan import (  # noqa: E402
    EXPERT_LORA_FILES, FrameMeanMultiReward, FrameMeanReward, WanTask, frame_mean_reward, frame_strips,
)
from vgrpo_lib.samplers import sample_euler  # noqa: E402
from tests.integrations.hub_cli import (  # noqa: E402
    KL_ON, PROMPTS, model_overrides,
    train_interrupt_resume_export, write_prompt_files,
)
from tests.integrations.hub_cli import one_torch_thread  # noqa: E402, F401 (autouse: every test here on one thread)
from tests.integrations.tiny_pipelines import IMAGE_SIZE, T5_LENGTH, WAN_FRAMES, save_tiny_wan  # noqa: E402

LATENT = (4, 2, 4, 4)  # (C, F, H, W) of a 5-frame 16x16 video of the tiny pipelines
BOUNDARY = 875.0  # the tiny Wan 2.2's boundary_ratio 0.875 x 1000 timesteps


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    return {"wan2.1": save_tiny_wan(root / "wan21"), "wan2.2": save_tiny_wan(root / "wan22", seed=1, two_experts=True),
            **write_prompt_files(root)}


def load(path) -> object:
    return load_wan(str(path), frames=WAN_FRAMES, dtype=torch.float32, autocast=False, local_files_only=True)


def probe(cond_source, seed: int = 0):
    """Latents (4, *LATENT), times on both sides of the Wan 2.2 boundary, and the prompts' embeddings."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((4, *LATENT), generator=g)
    return x, torch.tensor([0.95, 0.9, 0.5, 0.1]), cond_source(PROMPTS)


# -- the adapter against the pipeline ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["wan2.1", "wan2.2"])
def test_euler_rollout_and_decode_are_the_pipelines_own(version, pipelines):
    """With a FlowMatchEuler scheduler (exact float timesteps), WanPipeline's latents and videos equal an Euler
    rollout of the adapter on the scheduler's grid, decoded: same time scale (1000 t), same sign of the flow
    prediction, same latent normalisation, and (Wan 2.2) the same expert at every step."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    policy = load(pipelines[version])
    assert isinstance(policy.model.transformer, WanExperts) == (version == "wan2.2")
    pipe = policy.pipe
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    cond = policy.encode_prompts(PROMPTS[:2], T5_LENGTH)
    noise = torch.randn((2, *LATENT), generator=torch.Generator().manual_seed(0))
    grid = policy.sigma_grid(4)
    assert grid[1] < BOUNDARY / 1000 < grid[0], "the 4-step grid crosses the Wan 2.2 boundary after its first step"
    common = dict(prompt_embeds=cond["prompt_embeds"], num_frames=WAN_FRAMES, height=IMAGE_SIZE, width=IMAGE_SIZE,
                  num_inference_steps=4, guidance_scale=1.0)
    with torch.no_grad():
        latents = pipe(latents=noise.clone(), output_type="latent", **common).frames
        videos = pipe(latents=noise.clone(), output_type="pt", **common).frames  # (B, F, 3, H, W)
        ours = sample_euler(policy.model, noise, grid, cond)
        decoded = policy.decode(ours)
    torch.testing.assert_close(ours, latents, rtol=1e-4, atol=1e-5)
    assert decoded.shape == (2, 3, WAN_FRAMES, IMAGE_SIZE, IMAGE_SIZE)
    torch.testing.assert_close(decoded, videos.permute(0, 2, 1, 3, 4), rtol=1e-4, atol=1e-4)


def test_two_experts_each_take_their_side_of_the_boundary(pipelines):
    policy = load(pipelines["wan2.2"])
    experts = policy.model.transformer
    x, t, cond = probe(lambda p: policy.encode_prompts(p, T5_LENGTH))
    with torch.no_grad():
        mixed = policy.model(x, t, cond)
        high = WanVelocity(experts.high_noise)(x, t, cond)
        low = WanVelocity(experts.low_noise)(x, t, cond)
    above = t * 1000 >= BOUNDARY
    assert above.tolist() == [True, True, False, False]
    torch.testing.assert_close(mixed[above], high[above], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(mixed[~above], low[~above], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(high, low), "the two random experts differ"


def test_one_timestep_per_token_gives_the_same_velocity(pipelines):
    """Wan 2.2 TI2V's ``expand_timesteps``: text-to-video has the same time on every token."""
    policy = load(pipelines["wan2.1"])
    x, t, cond = probe(lambda p: policy.encode_prompts(p, T5_LENGTH))
    with torch.no_grad():
        per_token = WanVelocity(policy.model.transformer, expand_timesteps=True)(x, t, cond)
        torch.testing.assert_close(per_token, policy.model(x, t, cond), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"\(B, C, F, H, W\)"):
        policy.model(x[:, :, 0], t, cond)


def test_encode_inverts_the_latent_normalisation_of_decode(pipelines):
    vae = load(pipelines["wan2.1"]).pipe.vae
    videos = torch.rand(2, 3, WAN_FRAMES, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        latents = encode_videos(vae, videos)
        raw = vae.decode(vae.encode(videos * 2 - 1).latent_dist.mode(), return_dict=False)[0]
        assert latents.shape == (2, *LATENT)
        torch.testing.assert_close(decode_videos(vae, latents), (raw / 2 + 0.5).clamp(0, 1), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(latents, vae.encode(videos * 2 - 1).latent_dist.mode()), "the latents are normalised"


@pytest.mark.parametrize("num_steps", [1, 4, 10])
@pytest.mark.parametrize("flow_shift", [1.0, 3.0, 5.0])
def test_grid_is_the_unipc_schedulers_flow_sigmas(num_steps, flow_shift):
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=flow_shift)
    scheduler.set_timesteps(num_steps)
    grid = wan_sigma_grid_from_scheduler_config(scheduler.config, num_steps)
    assert grid == wan_sigma_grid(num_steps, flow_shift) and len(grid) == num_steps + 1
    assert grid[0] == 1.0 and grid[-1] == 0.0
    torch.testing.assert_close(torch.tensor(grid, dtype=torch.float64), scheduler.sigmas.double(), rtol=0, atol=2e-6)  # UniPC: 1 - 1e-6


def test_scheduler_options_the_grid_does_not_reproduce_are_named():
    from diffusers import UniPCMultistepScheduler

    karras = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, use_karras_sigmas=True)
    with pytest.raises(ValueError, match="use_karras_sigmas"):
        wan_sigma_grid_from_scheduler_config(karras.config, 4)
    with pytest.raises(ValueError, match="prediction_type='epsilon'"):
        wan_sigma_grid_from_scheduler_config(UniPCMultistepScheduler(use_flow_sigmas=True).config, 4)


def test_video_sizes_are_checked_with_the_key_to_change():
    assert wan_latent_shape(81, 480, 832) == (16, 21, 60, 104)
    assert wan_latent_shape(1, 480, 832) == (16, 1, 60, 104)
    with pytest.raises(ValueError, match=r"model.frames=4: Wan videos have 4k \+ 1 frames"):
        wan_latent_shape(4, 480, 832)
    with pytest.raises(ValueError, match="multiple of 16x16"):
        wan_latent_shape(5, 488, 832)


def test_hub_task_builds_a_wan_task_and_refuses_what_does_not_apply(pipelines):
    common = dict(path=str(pipelines["wan2.1"]), prompts=PROMPTS, reward="jpeg_compressibility", device="cpu",
                  dtype="float32")
    task = hub_task("wan2.1-t2v", image_size=IMAGE_SIZE, frames=WAN_FRAMES, max_sequence_length=T5_LENGTH,
                    lora_rank=4, lora_alpha=8, **common)
    assert isinstance(task, WanTask) and task.sample_shape == LATENT
    assert task.condition(PROMPTS[:2])["prompt_embeds"].shape == (2, T5_LENGTH, 16)
    policy = task.load_policy()
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    adapted = {n.split(".lora_")[0].split(".blocks.0.")[1] for n in trainable}
    assert adapted == set(WAN_LORA_TARGET_MODULES), "LoRA on attn1, attn2 and the feed-forward layer"
    with pytest.raises(ValueError, match="model.without_t5 applies to SD3"):
        hub_task("wan2.1-t2v", without_t5=True, **common)
    with pytest.raises(ValueError, match="model.frames=5 sets a video's length; task 'sd3.5-medium' makes images"):
        hub_task("sd3.5-medium", frames=5, **common)


# -- rewards and sample grids of videos ------------------------------------------------------------------------------


class _Brightness:
    """An image reward: mean pixel of each image (N, 3, H, W) -> (N,), recording the prompts it saw."""

    def __call__(self, images, prompts):
        self.prompts = list(prompts)
        return images.mean(dim=(1, 2, 3))


class _TwoColumns(_Brightness):
    names, weights = ["bright", "red"], [1.0, 0.5]

    def stack(self, images, prompts):
        return torch.stack([images.mean(dim=(1, 2, 3)), images[:, 0].mean(dim=(1, 2))], dim=1)


def test_an_image_reward_scores_every_frame_and_a_video_gets_their_mean():
    videos = torch.rand(2, 3, 4, 6, 5, generator=torch.Generator().manual_seed(0))
    image_reward = _Brightness()
    reward = frame_mean_reward(image_reward)
    assert type(reward) is FrameMeanReward
    expected = torch.stack([torch.stack([videos[b, :, f].mean() for f in range(4)]).mean() for b in range(2)])
    torch.testing.assert_close(reward(videos, ["a", "b"]), expected)
    assert image_reward.prompts == ["a"] * 4 + ["b"] * 4, "each frame is scored with its own video's prompt"

    multi = frame_mean_reward(_TwoColumns())
    assert isinstance(multi, FrameMeanMultiReward) and multi.names == ["bright", "red"]
    stacked = multi.stack(videos, ["a", "b"])
    assert stacked.shape == (2, 2)
    torch.testing.assert_close(stacked[:, 0], expected)
    torch.testing.assert_close(stacked[:, 1], videos[:, 0].mean(dim=(1, 2, 3)))
    with pytest.raises(ValueError, match=r"\(B, 3, F, H, W\)"):
        reward(videos[:, :, 0], ["a", "b"])


def test_frame_strips_put_evenly_spaced_frames_side_by_side():
    videos = torch.arange(2 * 3 * 5 * 2 * 2, dtype=torch.float32).view(2, 3, 5, 2, 2)
    strips = frame_strips(videos, max_frames=3)  # frames 0, 2, 4
    assert strips.shape == (2, 3, 2, 6)
    for k, frame in enumerate([0, 2, 4]):
        assert torch.equal(strips[..., 2 * k: 2 * k + 2], videos[:, :, frame])
    assert frame_strips(videos, max_frames=8).shape == (2, 3, 2, 10)


# -- training from the CLI, resuming, exporting ------------------------------------------------------------------


# V-GRPO on the two-expert pipeline (its K pairs at mixed times route to both experts in one batch), the others on
# Wan 2.1; each with its KL to the reference switched on, so the adapters-off view is exercised.
ALGORITHMS = {
    "vgrpo": ("wan2.2", KL_ON["vgrpo"]),
    # The preset's EMA (exported, 0.9 every 8 gradient steps) updated at every step of the short run.
    "flow_grpo": ("wan2.1", [*KL_ON["flow_grpo"], "flow_grpo.timestep_fraction=1.0", "optim.ema_every=1"]),
    "diffusion_nft": ("wan2.1", KL_ON["diffusion_nft"]),
}


def overrides(pipelines, version: str, algo: str) -> list[str]:
    """The wan2.1-t2v preset scaled down to the tiny pipeline: 2 iterations of 2 prompts x 2 videos, 3 steps."""
    return [
        *model_overrides(pipelines[version], pipelines, IMAGE_SIZE, T5_LENGTH), f"model.frames={WAN_FRAMES}",
        "iterations=2", "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=3", "eval.per_prompt=2",
        "eval.num_steps=2", "eval.every=0", "checkpoint_every=1", "optim.lr=0.01", *ALGORITHMS[algo][1],
    ]


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_each_algorithm_trains_from_the_cli_resumes_exactly_and_exports_for_wan_pipeline(algo, pipelines, tmp_path):
    from diffusers import WanPipeline

    version = ALGORITHMS[algo][0]
    argv = ["train", "--algo", algo, "--preset", "wan2.1-t2v", *overrides(pipelines, version, algo)]
    straight, state, exported = train_interrupt_resume_export(argv, tmp_path)
    assert (straight / "samples_iter_000002.png").stat().st_size > 0

    two_experts = version == "wan2.2"
    files = EXPERT_LORA_FILES if two_experts else EXPERT_LORA_FILES[:1]
    assert sorted(p.name for p in exported.iterdir()) == sorted(["README.md", *files])
    assert "load_into_transformer_2=True" in (exported / "README.md").read_text() or not two_experts

    pipe = WanPipeline.from_pretrained(str(pipelines[version]), torch_dtype=torch.float32)
    pipe.load_lora_weights(str(exported))
    transformer = pipe.transformer
    if two_experts:
        pipe.load_lora_weights(str(exported), weight_name=files[1], load_into_transformer_2=True)
        transformer = WanExperts(pipe.transformer, pipe.transformer_2, BOUNDARY)
    _, task, policy, _, base = load_run_policy(straight)
    x, t, cond = probe(task.condition)
    with torch.no_grad():
        trained, loaded, before = policy(x, t, cond), WanVelocity(transformer)(x, t, cond), base(x, t, cond)
    torch.testing.assert_close(loaded, trained, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(trained, before), "the exported adapter changes the pipeline's transformer"
