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
from tests.algorithms.conftest import evaluation_table

__all__ = [
    "KL_ON", "PROMPTS", "TINY_RUN", "assert_eval_repeats_the_run", "assert_pipeline_lora_is_the_trained_policy",
    "model_overrides", "one_torch_thread", "train_interrupt_resume_export", "train_straight_and_resumed",
    "write_prompt_files",
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


def train_straight_and_resumed(config, tmp_path: Path) -> tuple[Trainer, list[dict]]:
    """``config`` (two iterations) trained straight in tmp_path/"straight" and again in tmp_path/"cut", stopped
    after one iteration and resumed with :meth:`Trainer.resume`. Asserts LoRA-only checkpoints at iteration 2 and
    the same weights (up to float summation order). Returns the straight trainer and its evaluations."""
    straight = Trainer(config, tmp_path / "straight", progress=False)
    evaluations = straight.train()
    state = RunDir(tmp_path / "straight").load_latest_checkpoint()
    assert state["iteration"] == 2 and state["policy"] and all("lora_" in k for k in state["policy"])

    Trainer(config, tmp_path / "cut", progress=False).train(until=1)
    resumed = Trainer.resume(tmp_path / "cut", progress=False)
    resumed.train()
    final = resumed.policy.state_dict()
    for key, value in straight.policy.state_dict().items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6)
    return straight, evaluations


def assert_eval_repeats_the_run(run: Path, evaluations: list[dict], capsys) -> dict:
    """``vgrpo eval --run RUN`` prints, for each metric, the base policy's and the trained one's values: the run's own
    first and last ``evaluations``. Returns the printed table (metric -> (base, trained))."""
    capsys.readouterr()
    assert cli_main(["eval", "--run", str(run)]) == 0
    table = evaluation_table(capsys.readouterr().out)
    for metric, (base, trained) in table.items():
        assert base == pytest.approx(evaluations[0][metric], abs=6e-4, nan_ok=True), metric
        assert trained == pytest.approx(evaluations[-1][metric], abs=6e-4, nan_ok=True), metric
    return table


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
