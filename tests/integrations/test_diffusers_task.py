"""The diffusers task end to end: a tiny random SD3 (and FLUX) pipeline saved to disk, loaded by name through
``algorithms.tasks.load_task`` and trained by the real trainer with each algorithm on the CPU."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from algorithms.config import TrainConfig, apply_overrides  # noqa: E402
from algorithms.run_dir import RunDir  # noqa: E402
from algorithms.tasks import load_task  # noqa: E402
from algorithms.trainer import Trainer  # noqa: E402
from integrations.diffusers_adapters import SD3Velocity, load_policy  # noqa: E402
from integrations.diffusers_adapters.task import DiffusersTask, LoRAPolicy, TotalReward, make_reward  # noqa: E402
from tests.integrations.tiny_pipelines import CLIP_LENGTH, IMAGE_SIZE, T5_LENGTH, save_tiny_flux, save_tiny_sd3  # noqa: E402

PROMPTS = ["a red cat", "two dogs", "a house", "the sea"]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n\n")
    return {"sd3": save_tiny_sd3(root / "sd3"), "flux": save_tiny_flux(root / "flux"), "prompts": root / "prompts.txt"}


@pytest.fixture
def hub_env(pipelines, monkeypatch):
    """``hub_env("sd3")``: the environment that makes ``load_task`` build the task from the tiny pipeline."""

    def set_env(family: str = "sd3"):
        env = {
            "VGRPO_MODEL_PATH": str(pipelines[family]), "VGRPO_PROMPTS": str(pipelines["prompts"]),
            "VGRPO_REWARD": "jpeg_compressibility", "VGRPO_IMAGE_SIZE": str(IMAGE_SIZE), "VGRPO_LORA_RANK": "4",
            "VGRPO_LORA_ALPHA": "8", "VGRPO_DTYPE": "float32", "VGRPO_MAX_SEQUENCE_LENGTH": str(T5_LENGTH),
            "VGRPO_DEVICE": "cpu",
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    return set_env


def base_model(path) -> SD3Velocity:
    """The pretrained transformer, freshly loaded from disk, as a protocol model."""
    return load_policy(str(path), "sd3", dtype=torch.float32, lora_rank=None, autocast=False, local_files_only=True).model


def probe(task, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((3, *task.sample_shape), generator=g)
    return x, torch.rand(3, generator=g), task.condition(PROMPTS[:3])


def config(algo: str, *overrides: str) -> TrainConfig:
    return apply_overrides(TrainConfig(algo=algo), [
        "task=sd3.5-medium", "iterations=2", "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=3",
        "eval.per_prompt=2", "eval.num_steps=2", "eval.every=0", "checkpoint_every=1", "optim.lr=0.01", *overrides,
    ])


# Each algorithm with its KL to the reference policy switched on, so the adapters-off view is exercised.
ALGORITHMS = {
    "vgrpo": ["vgrpo.num_pairs=2", "vgrpo.ref_kl_coef=1.0"],
    "flow_grpo": ["flow_grpo.kl_coef=0.04"],
    "diffusion_nft": ["diffusion_nft.kl_coef=1e-4"],
}


def test_load_task_builds_the_task_from_the_environment(hub_env, pipelines):
    hub_env("sd3")
    task = load_task("sd3.5-medium")
    assert isinstance(task, DiffusersTask) and task.sample_shape == (4, IMAGE_SIZE // 2, IMAGE_SIZE // 2)
    assert task.prompts == PROMPTS and task.eval_prompts(2) == [p for p in PROMPTS for _ in range(2)]

    calls = []
    encode = task.base.pipe.encode_prompt
    task.base.pipe.encode_prompt = lambda **kwargs: calls.append(list(kwargs["prompt"])) or encode(**kwargs)
    cond = task.condition(["a house", "two dogs", "a house"])
    again = task.condition(["two dogs", "a house"])
    assert calls == [["a house", "two dogs"]], "each distinct prompt goes through the text encoders once"
    assert cond.batch_size == torch.Size([3]) and torch.equal(cond[1]["prompt_embeds"], again[0]["prompt_embeds"])
    assert cond["prompt_embeds"].shape[1] == CLIP_LENGTH + T5_LENGTH  # CLIP tokens, then T5 tokens

    policy = task.load_policy()
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".default." in n for n in trainable)
    assert set(policy.state_dict()) == set(trainable), "the state dict holds only the trained LoRA weights"
    x, t, c = probe(task)
    with torch.no_grad():
        torch.testing.assert_close(policy(x, t, c), base_model(pipelines["sd3"])(x, t, c), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="already made its policy"):
        task.load_policy()


def test_load_task_says_what_is_missing(hub_env, monkeypatch, tmp_path):
    hub_env("sd3")
    monkeypatch.setenv("VGRPO_MODEL_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeError, match="weights are not available.*VGRPO_MODEL_PATH"):
        load_task("sd3.5-medium")
    hub_env("sd3")
    monkeypatch.delenv("VGRPO_PROMPTS")
    with pytest.raises(RuntimeError, match="VGRPO_PROMPTS"):
        load_task("sd3.5-medium")


def test_lora_state_dict_round_trip_is_strict_about_lora_keys(hub_env):
    hub_env("sd3")
    policy = load_task("sd3.5-medium").load_policy()
    state = {k: torch.randn_like(v) for k, v in policy.state_dict().items()}
    policy.load_state_dict(state)
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in state.items())
    with pytest.raises(RuntimeError, match="Missing key"):
        policy.load_state_dict(dict(list(state.items())[1:]))


def test_weighted_reward_spec_trains_on_the_weighted_sum():
    images = torch.rand(3, 3, 16, 16)
    single = make_reward("jpeg_compressibility")(images, ["x"] * 3)
    weighted = make_reward("jpeg_compressibility:2")
    assert isinstance(weighted, TotalReward)
    torch.testing.assert_close(weighted(images, ["x"] * 3), 2 * single)
    assert set(weighted.components(images, ["x"] * 3)) == {"jpeg_compressibility"}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_each_algorithm_trains_lora_only_checkpoints_it_and_resumes_exactly(algo, hub_env, pipelines, tmp_path):
    hub_env("sd3")
    cfg = config(algo, *ALGORITHMS[algo])
    straight = Trainer(cfg, tmp_path / "straight", progress=False)
    straight.train()

    policy = straight.policy
    assert isinstance(policy, LoRAPolicy)
    base = base_model(pipelines["sd3"])
    base_params = dict(base.named_parameters())
    for name, param in policy.named_parameters():
        name = name.removeprefix("velocity.")
        if "lora_" in name:
            continue
        assert torch.equal(param, base_params[name.replace(".base_layer", "")]), f"{name} changed"
    lora_b = [p for n, p in policy.named_parameters() if "lora_B.default" in n]
    assert any(p.abs().sum() > 0 for p in lora_b), "the LoRA adapter trained (B starts at zero)"

    task = straight.task
    x, t, c = probe(task)
    with torch.no_grad():
        reference = task.reference_policy(policy)(x, t, c)
        torch.testing.assert_close(reference, base(x, t, c), rtol=0, atol=0)
        assert not torch.allclose(policy(x, t, c), reference)

    run = RunDir(tmp_path / "straight")
    state = run.load_latest_checkpoint()
    assert state["iteration"] == 2
    assert set(state["policy"]) == set(policy.state_dict()) and all("lora_" in k for k in state["policy"])
    if algo == "diffusion_nft":
        assert all("lora_" in k for k in state["algorithm"]["old_policy"]), "the old policy saves its LoRA only"
    assert (run.root / "samples_iter_000002.png").stat().st_size > 0 and (run.root / "reward.png").exists()

    # Stop after one iteration, resume in a fresh trainer (a fresh pipeline from disk), finish: the same weights up
    # to float summation order (Flow-GRPO differs in the last bit of a few weights).
    Trainer(cfg, tmp_path / "cut", progress=False).train(until=1)
    resumed = Trainer.resume(tmp_path / "cut", progress=False)
    assert resumed.iteration == 1
    resumed.train()
    final = resumed.policy.state_dict()
    for key, value in policy.state_dict().items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6)


def test_flux_task_runs_a_vgrpo_iteration(hub_env):
    hub_env("flux")
    trainer = Trainer(config("vgrpo", "task=flux.1-dev", "iterations=1", "vgrpo.num_pairs=2"), "unused", progress=False)
    assert isinstance(trainer.task, DiffusersTask) and trainer.task.base.family == "flux"
    row = trainer.step()
    assert torch.isfinite(torch.tensor(row["loss_objective"])) and row["grad_steps"] == 1
