"""The diffusers task end to end: a tiny random SD3 (and FLUX) pipeline saved to disk, loaded by name through
``vgrpo_lib.algorithms.tasks.load_task`` (configured by the run config's ``model`` section) and trained by the real trainer
with each algorithm on the CPU."""

import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.config import ModelConfig, TrainConfig, apply_overrides  # noqa: E402
from vgrpo_lib.algorithms.run_dir import RunDir  # noqa: E402
from vgrpo_lib.algorithms.tasks import load_task  # noqa: E402
from vgrpo_lib.algorithms.trainer import Trainer  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters import SD3Velocity, load_policy  # noqa: E402
from vgrpo_lib.integrations.rewards.loading import MissingWeightsError  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters.lora import AdapterBehaviour, lora_parameters  # noqa: E402
from vgrpo_lib.integrations.tasks.hub import DiffusersTask, LoRAPolicy, TotalReward, make_reward  # noqa: E402
from vgrpo_lib.samplers import time_grid  # noqa: E402
from tests.integrations.tiny_pipelines import CLIP_LENGTH, IMAGE_SIZE, T5_LENGTH, save_tiny_flux, save_tiny_sd3  # noqa: E402
from tests.same_steps import assert_same_changes, train_with_sgd  # noqa: E402

PROMPTS = ["a red cat", "two dogs", "a house", "the sea"]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n\n")
    return {"sd3": save_tiny_sd3(root / "sd3"), "flux": save_tiny_flux(root / "flux"), "prompts": root / "prompts.txt"}


@pytest.fixture
def hub_model(pipelines):
    """``hub_model("sd3")``: the ``model.*`` overrides that make ``load_task`` build the task from the tiny pipeline."""

    def overrides(family: str = "sd3") -> list[str]:
        return [
            f"model.path={pipelines[family]}", f"model.prompts={pipelines['prompts']}", "model.reward=jpeg_compressibility",
            f"model.image_size={IMAGE_SIZE}", "model.lora_rank=4", "model.lora_alpha=8", "model.dtype=float32",
            f"model.max_sequence_length={T5_LENGTH}", "model.device=cpu",
        ]

    return overrides


def model_config(overrides: list[str]) -> ModelConfig:
    return apply_overrides(TrainConfig(), overrides).model


def base_model(path) -> SD3Velocity:
    """The pretrained transformer, freshly loaded from disk, as a protocol model."""
    return load_policy(str(path), "sd3", dtype=torch.float32, lora_rank=None, autocast=False, local_files_only=True).model


def probe(task, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((3, *task.sample_shape), generator=g)
    return x, torch.rand(3, generator=g), task.condition(PROMPTS[:3])


def config(algo: str, *overrides: str) -> TrainConfig:
    return apply_overrides(TrainConfig(), [
        f"algo={algo}", "task=sd3.5-medium", "iterations=2", "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=3",
        "eval.per_prompt=2", "eval.num_steps=2", "eval.every=0", "checkpoint_every=1", "optim.lr=0.01",
        *overrides,
    ])


# Each algorithm with its KL to the reference policy switched on, so the adapters-off view is exercised.
ALGORITHMS = {
    "vgrpo": ["vgrpo.num_pairs=2", "vgrpo.ref_kl_coef=1.0"],
    "flow_grpo": ["flow_grpo.ref_kl_coef=0.04"],
    "diffusion_nft": ["diffusion_nft.ref_kl_coef=1e-4"],
}


def test_load_task_builds_the_task_from_the_model_config(hub_model, pipelines):
    task = load_task("sd3.5-medium", model_config(hub_model("sd3")))
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


def test_load_task_says_what_is_missing(hub_model, tmp_path):
    with pytest.raises(RuntimeError, match="weights are not available.*model.path"):
        load_task("sd3.5-medium", model_config([*hub_model("sd3"), f"model.path={tmp_path / 'nowhere'}"]))
    with pytest.raises(RuntimeError, match="weights are not available"):
        load_task("sd3.5-medium")  # the hub id, not in this machine's cache
    with pytest.raises(ValueError, match="model.prompts"):
        load_task("sd3.5-medium", model_config([*hub_model("sd3"), "model.prompts=none"]))


def test_lora_state_dict_round_trip_is_strict_about_lora_keys(hub_model):
    policy = load_task("sd3.5-medium", model_config(hub_model("sd3"))).load_policy()
    state = {k: torch.randn_like(v) for k, v in policy.state_dict().items()}
    policy.load_state_dict(state)
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in state.items())
    with pytest.raises(RuntimeError, match="Missing key"):
        policy.load_state_dict(dict(list(state.items())[1:]))


def test_rollout_grid_is_the_pipeline_schedulers_unless_a_shift_is_set(hub_model):
    trainer = Trainer(config("vgrpo", *hub_model("sd3"), "rollout.num_steps=5"), "unused", progress=False)
    task = trainer.task
    assert trainer.algorithm.grid == task.base.sigma_grid(5, task.height, task.width) == task.time_grid(5)
    assert trainer.algorithm.grid != time_grid(5, shift=3.0), "SD3's scheduler grid is not the plain shifted grid"
    shifted = Trainer(config("vgrpo", *hub_model("sd3"), "rollout.num_steps=5", "rollout.shift=3.0"), "unused2",
                      progress=False)
    assert shifted.algorithm.grid == time_grid(5, shift=3.0)


def test_diffusion_nft_old_policy_is_a_second_adapter_soft_updated(hub_model):
    # The decay counts gradient steps (one per iteration here): d(s) = 0.25 (s - 1) after a flat first step.
    trainer = Trainer(config("diffusion_nft", *hub_model("sd3"), "diffusion_nft.decay_rate=0.25",
                             "diffusion_nft.decay_flat=1"), "unused", progress=False)
    old, transformer = trainer.algorithm.behaviour, trainer.policy.transformer
    assert isinstance(old, AdapterBehaviour) and set(transformer.peft_config) == {"default", "old"}
    assert all(not p.requires_grad for p in lora_parameters(transformer, "old").values())

    def adapter(name):
        return {k: p.detach().clone() for k, p in lora_parameters(transformer, name).items()}

    trainer.step()  # iteration 0, 1 gradient step: decay 0 (flat), a hard copy
    assert all(torch.equal(adapter("old")[k], v) for k, v in adapter("default").items())
    before = adapter("old")
    trainer.step()  # iteration 1, 2 gradient steps: decay min(0.25 * (2 - 1), 0.5) = 0.25
    trained, after = adapter("default"), adapter("old")
    assert any(not torch.equal(trained[k], before[k]) for k in trained), "the trained adapter moved"
    for key in trained:
        torch.testing.assert_close(after[key], 0.25 * before[key] + 0.75 * trained[key])
    assert all(p.requires_grad for p in lora_parameters(transformer, "default").values())
    state = old.state_dict()
    assert state.keys() == after.keys() and all(torch.equal(state[k], after[k]) for k in state)
    with pytest.raises(KeyError, match="behaviour adapter state does not match"):
        old.load_state_dict(dict(list(state.items())[1:]))


def test_weighted_reward_spec_trains_on_the_weighted_sum():
    images = torch.rand(3, 3, 16, 16)
    single = make_reward("jpeg_compressibility")(images, ["x"] * 3)
    weighted = make_reward("jpeg_compressibility:2")
    assert isinstance(weighted, TotalReward)
    torch.testing.assert_close(weighted(images, ["x"] * 3), 2 * single)
    assert set(weighted.components(images, ["x"] * 3)) == {"jpeg_compressibility"}


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_each_algorithm_trains_lora_only_checkpoints_it_and_resumes_exactly(algo, hub_model, pipelines, tmp_path):
    cfg = config(algo, *ALGORITHMS[algo], *hub_model("sd3"))
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

    # Stop after one iteration, resume in a fresh trainer (a fresh pipeline from disk, configured by the saved config
    # alone), finish: the same weights up to float summation order (Flow-GRPO differs in the last bit of a few).
    Trainer(cfg, tmp_path / "cut", progress=False).train(until=1)
    resumed = Trainer.resume(tmp_path / "cut", progress=False)
    assert resumed.iteration == 1
    resumed.train()
    final = resumed.policy.state_dict()
    for key, value in policy.state_dict().items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6)

    if algo == "vgrpo":  # `vgrpo sample` on a hub-model run: the trained LoRA policy, prompts saved as strings
        import numpy as np

        from vgrpo_lib.algorithms.cli import main as cli_main

        out = tmp_path / "samples.npz"
        argv = ["sample", "--run", str(tmp_path / "straight"), "--per-prompt", "2", "--seed", "0", "--steps", "2"]
        assert cli_main([*argv, "--out", str(out)]) == 0
        data = np.load(out)
        assert data["images"].shape == (8, 3, IMAGE_SIZE, IMAGE_SIZE)
        assert data["prompts"].tolist() == [p for p in PROMPTS for _ in range(2)]


def test_flux_task_runs_a_vgrpo_iteration(hub_model):
    overrides = [*hub_model("flux"), "task=flux.1-dev", "iterations=1", "vgrpo.num_pairs=2"]
    trainer = Trainer(config("vgrpo", *overrides), "unused", progress=False)
    assert isinstance(trainer.task, DiffusersTask) and trainer.task.base.family == "flux"
    row = trainer.step()
    assert torch.isfinite(torch.tensor(row["loss_objective"])) and row["grad_steps"] == 1


def _fsdp2_lora_worker(rank: int, world_size: int, port: int, overrides: list[str], out: str) -> None:
    from vgrpo_lib.integrations import distributed
    from tests.integrations.test_distributed import _full_weights, _join

    _join(rank, world_size, port)
    train_with_sgd()
    trainer = Trainer(config("diffusion_nft", *overrides, "distributed.strategy=fsdp2"), f"{out}/run", progress=False)
    trainer.train()
    assert distributed.is_sharded(trainer.policy)
    torch.save(_full_weights(trainer.policy), f"{out}/rank{rank}.pt")
    del trainer
    distributed.shutdown()


@pytest.mark.slow
def test_fsdp2_on_two_ranks_shards_the_lora_transformer_and_equals_one_process(hub_model, tmp_path, monkeypatch):
    """DiffusionNFT (trained adapter + the old-policy adapter + the adapters-off reference, all in one sharded
    transformer) on 2 gloo ranks with FSDP2 makes the 1-process run's weight changes on the same global batch
    (under SGD with momentum in AdamW's place: tests/same_steps.py says why)."""
    from tests.integrations.test_distributed import _spawn

    overrides = [*hub_model("sd3"), *ALGORITHMS["diffusion_nft"]]
    _spawn(_fsdp2_lora_worker, overrides, str(tmp_path))
    train_with_sgd(monkeypatch)
    single = Trainer(config("diffusion_nft", *overrides), tmp_path / "single", progress=False)
    base = {key: value.clone() for key, value in single.policy.state_dict().items()}
    single.train()
    expected = single.policy.state_dict()
    assert set(expected) and all("lora_" in key and ".default." in key for key in expected)
    assert any(value.abs().sum() > 0 for key, value in expected.items() if "lora_B" in key), "the adapter trained"
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert set(got) == set(expected), "the gathered state dict holds the trained LoRA weights only"
        assert_same_changes(got, expected, base)


def test_hub_task_finds_the_preset_by_name_in_the_hugging_face_cache(hub_model, pipelines, tmp_path, monkeypatch):
    """No model.path: the preset's hub id is resolved offline through a Hugging Face cache holding the pipeline
    (the layout `hf download` leaves: models--org--name/refs/main -> snapshots/<commit>/)."""
    import shutil

    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--stabilityai--stable-diffusion-3.5-medium"
    shutil.copytree(pipelines["sd3"], repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    without_path = [item for item in hub_model("sd3") if not item.startswith("model.path=")]
    task = load_task("sd3.5-medium", model_config(without_path))
    assert isinstance(task, DiffusersTask) and task.sample_shape == (4, IMAGE_SIZE // 2, IMAGE_SIZE // 2)
    shutil.rmtree(repo / "snapshots" / commit / "transformer")  # an incomplete snapshot fails loudly, not deep inside
    with pytest.raises(MissingWeightsError, match="local directory .*snapshots.* is incomplete"):
        load_task("sd3.5-medium", model_config(without_path))
