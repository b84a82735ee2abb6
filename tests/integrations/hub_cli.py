"""What the hub-model tests (tests/test_flux2_adapter.py, test_qwen_image_adapter.py, test_wan_adapter.py) share: one
torch thread, the prompt files, the ``model.*`` overrides for a tiny pipeline folder, a tiny run's settings, and the
CLI round trip (train, interrupt and resume, export) with the checks every hub model's run must pass.

A test module takes the thread fixture by importing it (``from tests.integrations.hub_cli import one_torch_thread``):
it is autouse, so every test of that module runs on one thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from vgrpo_lib.algorithms.cli import main as cli_main
from vgrpo_lib.algorithms.run_dir import RunDir
from vgrpo_lib.algorithms.trainer import Trainer

__all__ = [
    "KL_ON", "PROMPTS", "TINY_RUN", "assert_pipeline_lora_is_the_trained_policy", "model_overrides",
    "one_torch_thread", "train_interrupt_resume_export", "write_prompt_files",
]

PROMPTS = ["a red cat", "two dogs", "a house", "the sea"]
# Each algorithm with its KL to the reference switched on, so the adapters-off reference view is exercised.
KL_ON = {
    "vgrpo": ["vgrpo.num_pairs=2", "vgrpo.ref_kl_coef=1.0"],
    "flow_grpo": ["flow_grpo.ref_kl_coef=0.04"],
    "diffusion_nft": ["diffusion_nft.ref_kl_coef=1e-4"],
}
# Two iterations of one prompt x 2 samples, 2-step rollouts, a checkpoint after each iteration.
TINY_RUN = ["iterations=2", "prompts_per_iteration=1", "group_size=2", "rollout.num_steps=2", "eval.per_prompt=1",
            "eval.num_steps=2", "eval.every=0", "checkpoint_every=1", "optim.lr=0.01"]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One torch thread: the tiny models' ops are too small to share, and two threads contend on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_prompt_files(root: Path) -> dict[str, Path]:
    """``root``/prompts.txt (``PROMPTS``) and eval_prompts.txt (the first prompt alone, so evaluations stay short),
    as {"prompts": path, "eval_prompts": path}."""
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (root / "eval_prompts.txt").write_text(PROMPTS[0] + "\n")
    return {"prompts": root / "prompts.txt", "eval_prompts": root / "eval_prompts.txt"}


def model_overrides(path: Path, prompt_files: dict[str, Path], image_size: int, max_sequence_length: int) -> list[str]:
    """The ``model.*`` overrides of a hub task on the tiny pipeline folder ``path``: its prompt files, the JPEG
    reward, LoRA rank 4, float32 on the CPU."""
    return [
        f"model.path={path}", f"model.prompts={prompt_files['prompts']}", "model.reward=jpeg_compressibility",
        f"model.eval_prompts={prompt_files['eval_prompts']}",
        f"model.image_size={image_size}", "model.lora_rank=4", "model.lora_alpha=8", "model.dtype=float32",
        f"model.max_sequence_length={max_sequence_length}", "model.device=cpu",
    ]


def train_interrupt_resume_export(train_argv: list[str], tmp_path: Path) -> tuple[Path, dict, Path]:
    """``vgrpo train *train_argv`` into tmp_path/"straight"; the same run stopped after one iteration in
    tmp_path/"cut" and resumed by ``vgrpo train --resume``; ``vgrpo export`` of the straight run to tmp_path/"export".

    Asserts that every command exits 0, that both runs end at iteration 2 with LoRA-only checkpoints of the same keys
    and the same weights (up to float summation order). Returns the straight run's folder, its last checkpoint and
    the export folder.
    """
    straight, cut, exported = tmp_path / "straight", tmp_path / "cut", tmp_path / "export"
    assert cli_main([*train_argv, "--out", str(straight)]) == 0
    state = RunDir(straight).load_latest_checkpoint()
    assert state["iteration"] == 2 and state["policy"] and all("lora_" in k for k in state["policy"]), \
        "LoRA-only checkpoints"

    # Interrupted after one iteration, resumed from the CLI (the pipeline reloaded from its folder, configured by
    # the saved config alone): the same LoRA weights.
    Trainer(RunDir(straight).train_config(), cut, progress=False).train(until=1)
    assert cli_main(["train", "--out", str(cut), "--resume"]) == 0
    resumed = RunDir(cut).load_latest_checkpoint()
    assert resumed["iteration"] == 2 and resumed["policy"].keys() == state["policy"].keys()
    for key, value in state["policy"].items():
        torch.testing.assert_close(resumed["policy"][key], value, rtol=1e-5, atol=1e-6)

    assert cli_main(["export", "--run", str(straight), "--out", str(exported)]) == 0
    return straight, state, exported


def assert_pipeline_lora_is_the_trained_policy(run: Path, loaded: nn.Module, prompts: list[str] = PROMPTS[:3]) -> None:
    """``loaded`` (the velocity adapter on a pipeline's transformer after ``load_lora_weights`` of the run's export)
    gives the trained policy's velocity on random latents and times, and the trained policy differs from the
    reference (adapters off)."""
    trainer = Trainer.resume(run, progress=False)
    task = trainer.task
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn((len(prompts), *task.sample_shape), generator=g), torch.rand(len(prompts), generator=g)
    cond = task.condition(prompts)
    with torch.no_grad():
        trained = trainer.policy(x, t, cond)
        torch.testing.assert_close(loaded(x, t, cond), trained, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(task.reference_policy(trainer.policy)(x, t, cond), trained, rtol=1e-5, atol=1e-6)
