"""Gradient checkpointing of every N-th transformer block (model.gradient_checkpointing_every) on the tiny SD3, FLUX
and Wan 2.2 pipelines: the gradients equal those without checkpointing, and exactly the chosen blocks run their
forward twice (once more in the backward pass)."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.tasks import load_task  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters import load_policy, load_wan  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters.checkpointing import (  # noqa: E402
    enable_block_checkpointing, transformer_blocks,
)
from tests.integrations.test_diffusers_task import PROMPTS, hub_model, model_config, pipelines  # noqa: E402, F401
from tests.integrations.tiny_pipelines import IMAGE_SIZE, T5_LENGTH, WAN_FRAMES, save_tiny_wan  # noqa: E402


@pytest.fixture(scope="module")
def wan22(tmp_path_factory):
    return save_tiny_wan(tmp_path_factory.mktemp("wan") / "wan22", seed=1, two_experts=True)


def load(family: str, pipelines, wan22):
    """The pretrained policy of ``family`` in float32 on the CPU, every weight trainable, and a probe batch:
    latents, times (both sides of Wan 2.2's expert boundary) and two prompts' embeddings."""
    if family == "wan2.2":
        policy = load_wan(str(wan22), frames=WAN_FRAMES, dtype=torch.float32, autocast=False, local_files_only=True)
    else:
        policy = load_policy(str(pipelines[family]), family, dtype=torch.float32, lora_rank=None, autocast=False,
                             local_files_only=True)
    policy.model.requires_grad_(True)
    shape = policy.latent_shape(IMAGE_SIZE, IMAGE_SIZE)
    x = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    return policy, x, torch.tensor([0.95, 0.3]), policy.encode_prompts(PROMPTS[:2], max_sequence_length=T5_LENGTH)


def every_block(transformer) -> list:
    return [block for model in getattr(transformer, "experts", (transformer,)) for block in transformer_blocks(model)]


def gradients_and_forwards(model, x, t, cond) -> tuple[dict[str, torch.Tensor], list[int]]:
    """Each parameter's gradient of a loss on ``model(x, t, cond)``, and how often each block ran its forward."""
    blocks = every_block(model.transformer)
    runs = [0] * len(blocks)
    hooks = [block.register_forward_pre_hook(lambda module, args, i=i: runs.__setitem__(i, runs[i] + 1))
             for i, block in enumerate(blocks)]
    model.zero_grad(set_to_none=True)
    model(x, t, cond).square().mean().backward()
    for hook in hooks:
        hook.remove()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, runs


@pytest.mark.parametrize("family", ["sd3", "flux", "wan2.2"])
def test_every_second_block_is_recomputed_and_the_gradients_are_unchanged(family, pipelines, wan22):
    policy, x, t, cond = load(family, pipelines, wan22)
    plain, runs = gradients_and_forwards(policy.model, x, t, cond)
    # Wan 2.2 runs one expert per time: each row's expert runs its blocks (the tiny experts: one block each).
    ran = [count > 0 for count in runs]
    assert all(count in (0, 1) for count in runs)

    chosen = enable_block_checkpointing(policy.model.transformer, every=2)
    checkpointed, runs = gradients_and_forwards(policy.model, x, t, cond)
    blocks = every_block(policy.model.transformer)
    if family == "wan2.2":  # per expert: every second block of each; one block each, so none
        assert chosen == []
    else:  # SD3: 2 joint blocks; FLUX: 1 double- then 1 single-stream block: the second is recomputed
        assert len(blocks) == 2 and chosen == [blocks[1]]
    assert runs == [(2 if block in chosen else 1) * int(r) for block, r in zip(blocks, ran)]
    assert checkpointed.keys() == plain.keys()
    for name, gradient in plain.items():
        torch.testing.assert_close(checkpointed[name], gradient, rtol=1e-5, atol=1e-7, msg=name)

    chosen = enable_block_checkpointing(policy.model.transformer, every=1)  # diffusers' own: every block
    everything, runs = gradients_and_forwards(policy.model, x, t, cond)
    assert chosen == blocks and runs == [2 * int(r) for r in ran]
    for name, gradient in plain.items():
        torch.testing.assert_close(everything[name], gradient, rtol=1e-5, atol=1e-7, msg=name)


def test_the_task_checkpoints_the_blocks_its_model_section_names(hub_model, pipelines):
    overrides = hub_model("sd3") + ["model.gradient_checkpointing=true", "model.gradient_checkpointing_every=2"]
    task = load_task("sd3.5-medium", model_config(overrides))
    policy = task.load_policy()
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn((2, *task.sample_shape), generator=g), torch.rand(2, generator=g)
    blocks = transformer_blocks(task.base.model.transformer)
    runs = [0] * len(blocks)
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(lambda module, args, i=i: runs.__setitem__(i, runs[i] + 1))
    policy(x, t, task.condition(PROMPTS[:2])).sum().backward()
    assert runs == [1, 2]


def test_bad_settings_are_refused_naming_them(hub_model, pipelines):
    policy = load_policy(str(pipelines["sd3"]), "sd3", dtype=torch.float32, lora_rank=None, autocast=False,
                         local_files_only=True)
    with pytest.raises(ValueError, match="every must be an int >= 1, got 0"):
        enable_block_checkpointing(policy.model.transformer, every=0)
    with pytest.raises(ValueError, match="AutoencoderKL has no ModuleList of blocks"):
        transformer_blocks(policy.pipe.vae)
    with pytest.raises(ValueError, match="model.gradient_checkpointing=false turns checkpointing off"):
        model_config(hub_model("sd3") + ["model.gradient_checkpointing=false", "model.gradient_checkpointing_every=2"])
