"""Qwen-Image through the hub path: a tiny random ``QwenImagePipeline`` folder built from the real component classes
(tests.integrations.tiny_pipelines), checked against the pipeline's own code (CFG-free and with true CFG against a
negative prompt), trained from the CLI by each algorithm with ``model.path=``, resumed, exported and loaded back
with ``load_lora_weights``."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.config import TrainConfig, apply_overrides  # noqa: E402
from vgrpo_lib.algorithms.tasks import load_task  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters import (  # noqa: E402
    QwenImageVelocity, encode_images_qwen_image, encode_prompts_qwen_image, load_policy, true_cfg_qwen_image,
)
from vgrpo_lib.integrations.tasks.hub import DiffusersTask  # noqa: E402
from vgrpo_lib.samplers import sample_ode  # noqa: E402
from tests.integrations.hub_cli import (  # noqa: E402
    KL_ON, PROMPTS, TINY_RUN, assert_pipeline_lora_is_the_trained_policy, model_overrides,
    train_interrupt_resume_export, write_prompt_files,
)
from tests.integrations.hub_cli import one_torch_thread  # noqa: E402, F401 (autouse: every test here on one thread)
from tests.integrations.tiny_pipelines import QWEN_IMAGE_LENGTH, QWEN_IMAGE_SIZE, save_tiny_qwen_image  # noqa: E402

NEGATIVE = " "


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_image")
    return {"path": save_tiny_qwen_image(root / "qwen"), **write_prompt_files(root)}


def hub_overrides(pipeline) -> list[str]:
    return model_overrides(pipeline["path"], pipeline, QWEN_IMAGE_SIZE, QWEN_IMAGE_LENGTH)


def frozen_pipeline(pipeline):
    from diffusers import QwenImagePipeline

    return QwenImagePipeline.from_pretrained(pipeline["path"], dtype=torch.float32)


def test_grid_is_the_schedulers_with_qwen_images_shift_and_terminal():
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    from vgrpo_lib.integrations.diffusers_adapters import sigma_grid_from_scheduler_config

    scheduler = FlowMatchEulerDiscreteScheduler(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192,
                                                max_shift=0.9, shift=1.0, shift_terminal=0.02, use_dynamic_shifting=True,
                                                time_shift_type="exponential")
    for steps, tokens in ((2, 16), (10, 1024), (30, 4096)):
        mu = calculate_shift(tokens, 256, 8192, 0.5, 0.9)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        grid = sigma_grid_from_scheduler_config(scheduler.config, steps, image_seq_len=tokens)
        assert len(grid) == steps + 1 and grid[-1] == 0.0
        assert grid[-2] == pytest.approx(0.02), "the last nonzero time is the config's shift_terminal"
        torch.testing.assert_close(torch.tensor(grid, dtype=torch.float32), scheduler.sigmas, rtol=0, atol=1e-6)
    # One step has no time to stretch (diffusers divides by zero there): [1, 0].
    assert sigma_grid_from_scheduler_config(scheduler.config, 1, image_seq_len=16) == [1.0, 0.0]


@pytest.mark.parametrize("true_cfg", [False, True])
def test_euler_rollout_and_decode_reproduce_the_pipeline(pipeline, true_cfg):
    """The adapter on (B, 4, h, w) latents (prompts of different lengths, padded and masked), vgrpo_lib's Euler sampler
    on the task's grid and ``decode_qwen_image`` give the pipeline's own latents and images; with a negative prompt
    and ``true_cfg_scale`` 4, ``true_cfg_qwen_image`` is the pipeline's norm-rescaled true CFG."""
    pipe = frozen_pipeline(pipeline)
    policy = load_policy(str(pipeline["path"]), "qwen-image", dtype=torch.float32, lora_rank=None, autocast=False,
                         local_files_only=True)
    assert isinstance(policy.model, QwenImageVelocity)
    shape = policy.latent_shape(QWEN_IMAGE_SIZE, QWEN_IMAGE_SIZE)
    assert shape == (4, 8, 8)
    noise = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    prompts = ["a red cat", "x"]
    kwargs = dict(prompt=prompts, height=QWEN_IMAGE_SIZE, width=QWEN_IMAGE_SIZE, num_inference_steps=3,
                  max_sequence_length=QWEN_IMAGE_LENGTH, true_cfg_scale=4.0)
    if true_cfg:
        kwargs["negative_prompt"] = NEGATIVE
    packed = pipe._pack_latents(noise, 2, 4, 8, 8)  # the pipeline's own token layout
    steps = []  # the pipeline's token latents after each step
    images = pipe(latents=packed, output_type="pt", callback_on_step_end=lambda p, i, t, kw: steps.append(kw) or {},
                  **kwargs).images

    cond = encode_prompts_qwen_image(policy.pipe, prompts, max_sequence_length=QWEN_IMAGE_LENGTH)
    assert cond["prompt_embeds"].shape == (2, QWEN_IMAGE_LENGTH, 16)
    lengths = cond["prompt_embeds_mask"].sum(dim=1)
    assert lengths[0] > lengths[1] and not cond["prompt_embeds"][1, lengths[1]:].any(), "padded with masked zeros"
    model = policy.model
    if true_cfg:
        model = true_cfg_qwen_image(model, encode_prompts_qwen_image(policy.pipe, [NEGATIVE], QWEN_IMAGE_LENGTH), 4.0)
    grid = policy.sigma_grid(3, QWEN_IMAGE_SIZE, QWEN_IMAGE_SIZE)
    with torch.no_grad():
        sample = sample_ode(model, noise, grid, cond, method="euler")
        torch.testing.assert_close(pipe._pack_latents(sample, 2, 4, 8, 8), steps[-1]["latents"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(policy.decode(sample), images, rtol=1e-4, atol=1e-5)


def test_image_encoding_is_the_pipelines_normalisation(pipeline):
    pipe = frozen_pipeline(pipeline)
    images = torch.rand(2, 3, QWEN_IMAGE_SIZE, QWEN_IMAGE_SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        latents = encode_images_qwen_image(pipe.vae, images)
        raw = pipe.vae.encode((images * 2 - 1)[:, :, None]).latent_dist.mode()[:, :, 0]
        mean, std = torch.tensor(pipe.vae.config.latents_mean), torch.tensor(pipe.vae.config.latents_std)
        assert latents.shape == (2, 4, 8, 8)
        torch.testing.assert_close(latents, (raw - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1))


def test_true_cfg_at_evaluation_is_the_negative_prompts_and_training_stays_cfg_free(pipeline):
    plain = load_task("qwen-image", apply_overrides(TrainConfig(), hub_overrides(pipeline)).model)
    guided = load_task("qwen-image", apply_overrides(TrainConfig(), [
        *hub_overrides(pipeline), f"model.negative_prompt={NEGATIVE}", "model.true_cfg_scale=4.0"]).model)
    assert isinstance(guided, DiffusersTask) and guided.base.family == "qwen-image"
    policy = guided.load_policy()
    assert plain.evaluation_policy(policy) is policy
    g = torch.Generator().manual_seed(3)
    x, t = torch.randn((2, *guided.sample_shape), generator=g), torch.rand(2, generator=g)
    cond = guided.condition(PROMPTS[:2])
    negative = encode_prompts_qwen_image(guided.base.pipe, [NEGATIVE], QWEN_IMAGE_LENGTH)
    with torch.no_grad():
        expected = true_cfg_qwen_image(policy, negative, 4.0)(x, t, cond)
        torch.testing.assert_close(guided.evaluation_policy(policy)(x, t, cond), expected)
        assert not torch.allclose(expected, policy(x, t, cond))
    first = guided.sample(policy, PROMPTS[:2], num_steps=2, generator=torch.Generator().manual_seed(0))
    assert first.shape == (2, 3, QWEN_IMAGE_SIZE, QWEN_IMAGE_SIZE)
    with pytest.raises(RuntimeError, match="already made its policy"):
        guided.load_policy()


def test_evaluation_guidance_is_named_in_the_plots_and_titles():
    from vgrpo_lib.algorithms.evaluation import guidance_label
    from vgrpo_lib.algorithms.plots import run_figure

    plain = apply_overrides(TrainConfig(), ["model.negative_prompt=", "model.true_cfg_scale=1.0"]).model
    guided = apply_overrides(TrainConfig(), [f"model.negative_prompt={NEGATIVE}", "model.true_cfg_scale=4.0"]).model
    assert guidance_label(TrainConfig().model) == guidance_label(plain) == "CFG-free"
    assert guidance_label(guided) == "CFG 4 against ' '"
    evaluations = [{"iteration": 0, "reward_mean": 0.1}, {"iteration": 2, "reward_mean": 0.3}]
    figure = run_figure([{"iteration": 0, "reward_mean": 0.2}], evaluations, {"reward_mean": "mean reward"},
                        guidance_label(guided))
    assert figure.axes[-1].get_ylabel() == "held-out seeds, CFG 4 against ' '"


def test_presets_use_the_recipes_scale_and_evaluate_under_true_cfg():
    from vgrpo_lib.algorithms.presets import build_config

    for algo in ALGORITHMS:
        config = build_config(algo, None, "qwen-image", [])
        assert (config.task, config.model.image_size, config.rollout.num_steps) == ("qwen-image", "512", 10)
        assert (config.model.negative_prompt, config.model.true_cfg_scale) == ("", 4.0)
    nft = build_config("diffusion_nft", None, "qwen-image", [])
    assert (nft.prompts_per_iteration, nft.diffusion_nft.strength, nft.diffusion_nft.ref_kl_coef) == (24, 0.1, 1e-4)


# V-GRPO evaluates under true CFG against the empty prompt, Flow-GRPO trains with CFG.
ALGORITHMS = {
    "vgrpo": [*KL_ON["vgrpo"], "model.negative_prompt=", "model.true_cfg_scale=2.0"],
    "flow_grpo": [*KL_ON["flow_grpo"], "flow_grpo.cfg_scale=2.0"],
    "diffusion_nft": KL_ON["diffusion_nft"],
}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_cli_trains_resumes_exactly_and_exports_a_lora_the_pipeline_loads(pipeline, algo, tmp_path):
    argv = ["train", "--algo", algo, "--task", "qwen-image", *TINY_RUN, *ALGORITHMS[algo], *hub_overrides(pipeline)]
    straight, state, out = train_interrupt_resume_export(argv, tmp_path)
    assert any("img_mlp.net.2.lora_A" in k for k in state["policy"])
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "pytorch_lora_weights.safetensors"]
    card = (out / "README.md").read_text()
    assert f"pipe = QwenImagePipeline.from_pretrained({str(pipeline['path'])!r})" in card
    assert ("held-out seeds, CFG 2 against ''," if algo == "vgrpo" else "held-out seeds, CFG-free,") in card
    pipe = frozen_pipeline(pipeline)
    pipe.load_lora_weights(out)
    assert_pipeline_lora_is_the_trained_policy(straight, QwenImageVelocity(pipe.transformer))
