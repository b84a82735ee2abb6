"""FLUX.2 (dev and klein) through the hub path: tiny random ``Flux2Pipeline`` / ``Flux2KleinPipeline`` folders built
from the real component classes (tests.integrations.tiny_pipelines), checked against the pipelines' own code, trained
from the CLI by each algorithm with ``model.path=``, resumed, exported and loaded back with ``load_lora_weights``."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.integrations.diffusers_adapters import (  # noqa: E402
    ATTENTION_TARGET_MODULES, FLUX2_LORA_TARGET_MODULES, Flux2Velocity, add_lora, decode_flux2, encode_images_flux2,
    encode_prompts_flux2, flux2_empirical_mu, flux2_sigma_grid, load_policy,
)
from vgrpo_lib.integrations.tasks.hub import DiffusersTask  # noqa: E402
from vgrpo_lib.samplers import sample_ode  # noqa: E402
from tests.integrations.hub_cli import (  # noqa: E402
    KL_ON, PROMPTS, TINY_RUN, assert_pipeline_lora_is_the_trained_policy, model_overrides,
    train_interrupt_resume_export, write_prompt_files,
)
from tests.integrations.hub_cli import one_torch_thread  # noqa: E402, F401 (autouse: every test here on one thread)
from tests.integrations.tiny_pipelines import CHAT_LENGTH, FLUX2_IMAGE_SIZE, save_tiny_flux2  # noqa: E402

TASKS = {"dev": "flux.2-dev", "klein": "flux.2-klein"}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux2")
    return {"dev": save_tiny_flux2(root / "dev"), "klein": save_tiny_flux2(root / "klein", klein=True),
            **write_prompt_files(root)}


def hub_overrides(pipelines, variant: str) -> list[str]:
    return model_overrides(pipelines[variant], pipelines, FLUX2_IMAGE_SIZE, CHAT_LENGTH)


def frozen_pipeline(pipelines, variant: str):
    from diffusers import Flux2KleinPipeline, Flux2Pipeline

    pipeline_class = Flux2KleinPipeline if variant == "klein" else Flux2Pipeline
    return pipeline_class.from_pretrained(pipelines[variant], dtype=torch.float32)


@pytest.mark.parametrize("steps, image_seq_len", [(1, 4), (8, 1024), (28, 4096), (50, 6000)])
def test_grid_is_the_pipeline_schedulers_with_the_empirical_mu(steps, image_seq_len):
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    assert flux2_empirical_mu(image_seq_len, steps) == pytest.approx(compute_empirical_mu(image_seq_len, steps), abs=1e-12)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(image_seq_len, steps))
    grid = flux2_sigma_grid(scheduler.config, steps, image_seq_len)
    assert len(grid) == steps + 1 and grid[0] == pytest.approx(1.0) and grid[-1] == 0.0
    torch.testing.assert_close(torch.tensor(grid, dtype=torch.float32), scheduler.sigmas, rtol=0, atol=1e-6)


@pytest.mark.parametrize("variant", ["dev", "klein"])
def test_euler_rollout_and_decode_reproduce_the_pipeline(pipelines, variant):
    """The adapter on the (B, 128, h, w) latent, vgrpo_lib's Euler sampler on the task's grid and ``decode_flux2`` give
    the pipeline's own latents and images (dev: distilled guidance 4.0; klein: guidance 1, i.e. no CFG)."""
    pipe = frozen_pipeline(pipelines, variant)
    policy = load_policy(str(pipelines[variant]), "flux2-klein" if variant == "klein" else "flux2", dtype=torch.float32,
                         lora_rank=None, autocast=False, local_files_only=True)
    assert isinstance(policy.model, Flux2Velocity)
    shape = policy.latent_shape(FLUX2_IMAGE_SIZE, FLUX2_IMAGE_SIZE)
    assert shape == (16, 4, 4)
    noise = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    prompts = PROMPTS[:2]
    kwargs = dict(prompt=prompts, height=FLUX2_IMAGE_SIZE, width=FLUX2_IMAGE_SIZE, num_inference_steps=3,
                  max_sequence_length=CHAT_LENGTH, guidance_scale=4.0 if variant == "dev" else 1.0)
    steps = []  # the pipeline's token latents after each step
    images = pipe(latents=noise, output_type="pt", callback_on_step_end=lambda p, i, t, kw: steps.append(kw) or {},
                  **kwargs).images

    cond = encode_prompts_flux2(policy.pipe, prompts, max_sequence_length=CHAT_LENGTH)
    assert cond["prompt_embeds"].shape == (2, CHAT_LENGTH, 24)
    grid = policy.sigma_grid(3, FLUX2_IMAGE_SIZE, FLUX2_IMAGE_SIZE)
    with torch.no_grad():
        sample = sample_ode(policy.model, noise, grid, cond, method="euler")
        torch.testing.assert_close(sample.flatten(2).transpose(1, 2), steps[-1]["latents"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(policy.decode(sample), images, rtol=1e-4, atol=1e-5)


def test_image_encoding_is_the_pipelines_and_decoding_inverts_the_normalisation(pipelines):
    pipe = frozen_pipeline(pipelines, "dev")
    images = torch.rand(2, 3, FLUX2_IMAGE_SIZE, FLUX2_IMAGE_SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        latents = encode_images_flux2(pipe.vae, images)
        torch.testing.assert_close(latents, pipe._encode_vae_image(images * 2 - 1, generator=None))
        assert latents.shape == (2, 16, 4, 4)
        mean = pipe.vae.bn.running_mean.view(1, -1, 1, 1)
        assert not torch.allclose(decode_flux2(pipe.vae, latents), decode_flux2(pipe.vae, latents + mean))


def test_lora_targets_reach_the_single_stream_blocks_fused_projections(pipelines):
    adapted = {}
    for name, targets in (("flux2", FLUX2_LORA_TARGET_MODULES), ("sd3-list", ATTENTION_TARGET_MODULES)):
        transformer = frozen_pipeline(pipelines, "dev").transformer
        add_lora(transformer, r=2, alpha=4, target_modules=targets)
        adapted[name] = {n.removesuffix(".lora_A") for n, _ in transformer.named_modules() if n.endswith(".lora_A")}
    single = {"single_transformer_blocks.0.attn.to_qkv_mlp_proj", "single_transformer_blocks.0.attn.to_out"}
    double = {f"transformer_blocks.0.{m}" for m in (
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
        "attn.add_v_proj", "attn.to_add_out", "ff.linear_in", "ff.linear_out", "ff_context.linear_in",
        "ff_context.linear_out")}
    assert adapted["flux2"] == single | double
    assert not adapted["sd3-list"] & single, "the SD3 list misses the fused single-stream projections"


def test_hub_task_builds_the_flux2_task_and_its_policy(pipelines):
    from vgrpo_lib.algorithms.config import TrainConfig, apply_overrides
    from vgrpo_lib.algorithms.tasks import load_task

    for variant, family in (("dev", "flux2"), ("klein", "flux2-klein")):
        task = load_task(TASKS[variant], apply_overrides(TrainConfig(), hub_overrides(pipelines, variant)).model)
        assert isinstance(task, DiffusersTask) and task.base.family == family and task.sample_shape == (16, 4, 4)
        assert task.time_grid(4) == task.base.sigma_grid(4, FLUX2_IMAGE_SIZE, FLUX2_IMAGE_SIZE)
        policy = task.load_policy()
        trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
        assert any("to_qkv_mlp_proj.lora_A.default" in n for n in trainable)
        assert set(policy.state_dict()) == trainable


def test_klein_evaluates_under_cfg_against_the_negative_prompt(pipelines):
    """``model.negative_prompt`` with ``model.true_cfg_scale`` > 1: evaluation samples ``v_neg + s (v_c - v_neg)``, the
    CFG ``Flux2KleinPipeline`` runs for the base checkpoints; the policy itself (training) stays CFG-free."""
    from vgrpo_lib.algorithms.config import TrainConfig, apply_overrides
    from vgrpo_lib.algorithms.tasks import load_task

    overrides = [*hub_overrides(pipelines, "klein"), "model.negative_prompt=", "model.true_cfg_scale=4.0"]
    task = load_task(TASKS["klein"], apply_overrides(TrainConfig(), overrides).model)
    policy = task.load_policy()
    g = torch.Generator().manual_seed(4)
    x, t = torch.randn((2, *task.sample_shape), generator=g), torch.rand(2, generator=g)
    cond, negative = task.condition(PROMPTS[:2]), task.condition([""]).expand(2)
    with torch.no_grad():
        v_cond, v_negative = policy(x, t, cond), policy(x, t, negative)
        torch.testing.assert_close(task.evaluation_policy(policy)(x, t, cond), v_negative + 4.0 * (v_cond - v_negative),
                                   rtol=1e-5, atol=1e-6)


def test_presets_and_errors_name_what_is_missing(pipelines, tmp_path):
    from vgrpo_lib.algorithms.config import TrainConfig, apply_overrides
    from vgrpo_lib.algorithms.presets import build_config
    from vgrpo_lib.algorithms.tasks import load_task

    for preset, size in (("flux.2-dev", "512"), ("flux.2-klein", "384")):
        for algo in KL_ON:
            config = build_config(algo, None, preset, [])
            assert (config.task, config.model.image_size, config.rollout.num_steps) == (preset, size, 8)
            assert (config.model.lora_rank, config.model.lora_alpha) == (64, 128)
    klein, dev = build_config("flow_grpo", None, "flux.2-klein", []), build_config("flow_grpo", None, "flux.2-dev", [])
    assert klein.flow_grpo.cfg_scale == 4.0 and (klein.model.negative_prompt, klein.model.true_cfg_scale) == ("", 4.0)
    assert dev.flow_grpo.cfg_scale == 1.0 and dev.model.negative_prompt is None  # dev: distilled guidance only
    with pytest.raises(RuntimeError, match="weights are not available.*model.path"):
        load_task("flux.2-dev", apply_overrides(TrainConfig(), [*hub_overrides(pipelines, "dev"),
                                                                f"model.path={tmp_path / 'nowhere'}"]).model)
    with pytest.raises(ValueError, match="family must be one of .*'flux2-klein'"):
        load_policy(str(pipelines["dev"]), "flux3")


@pytest.mark.parametrize("variant, algo", [("dev", "vgrpo"), ("dev", "flow_grpo"), ("dev", "diffusion_nft"),
                                           ("klein", "vgrpo")])
def test_cli_trains_resumes_exactly_and_exports_a_lora_the_pipeline_loads(pipelines, variant, algo, tmp_path):
    argv = ["train", "--algo", algo, "--task", TASKS[variant], *TINY_RUN, *KL_ON[algo], *hub_overrides(pipelines, variant)]
    straight, state, out = train_interrupt_resume_export(argv, tmp_path)
    assert any("single_transformer_blocks.0.attn.to_qkv_mlp_proj" in k for k in state["policy"])
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "pytorch_lora_weights.safetensors"]
    pipeline_name = "Flux2KleinPipeline" if variant == "klein" else "Flux2Pipeline"
    assert f"pipe = {pipeline_name}.from_pretrained({str(pipelines[variant])!r})" in (out / "README.md").read_text()
    pipe = frozen_pipeline(pipelines, variant)
    pipe.load_lora_weights(out)
    assert_pipeline_lora_is_the_trained_policy(straight, Flux2Velocity(pipe.transformer))
