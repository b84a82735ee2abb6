"""``--preset mnist-sd3``: the MNIST-SD3 pipeline trained through the hub path (the code of sd3.5-medium), its two
tasks (digit, ocr), their judges, and ``vgrpo sample`` on it.

The plumbing tests run on the pipeline's final configs with untrained weights (``build_pipeline``, saved with
``save_pretrained`` and loaded through ``model.path`` exactly as the shipped folder is), so they do not depend on
the shipped weights; the preset's default path is the shipped folder (``PIPELINE_DIR``)."""

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from vgrpo_lib.algorithms.cli import main as cli_main  # noqa: E402
from vgrpo_lib.algorithms.presets import build_config  # noqa: E402
from vgrpo_lib.algorithms.tasks import load_task, rollout_grid  # noqa: E402
from vgrpo_lib.algorithms.trainer import Trainer  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters import load_policy  # noqa: E402
from vgrpo_lib.integrations.diffusers_adapters.lora import AdapterBehaviour, AdapterView  # noqa: E402
from vgrpo_lib.integrations.tasks.hub import HUB_MODELS, DiffusersTask, LoRAPolicy  # noqa: E402
from vgrpo_lib.integrations.testbed.data import load_mnist  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_sd3 import prompts as grammar  # noqa: E402
from vgrpo_lib.integrations.packed_weights import unpacked_folder  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_sd3 import render  # noqa: E402
from vgrpo_lib.integrations.testbed.mnist_sd3.build import CLIP_LENGTH, PIPELINE_DIR, build_pipeline  # noqa: E402
from vgrpo_lib.integrations.tasks.mnist_sd3 import digit_metrics, number_judge, number_slots  # noqa: E402
from tests.integrations.hub_cli import assert_eval_repeats_the_run, train_straight_and_resumed  # noqa: E402

# A short run: 4 prompts x 4 images, 4 rollout steps, 2 pairs; a small evaluation.
SHORT = ["iterations=2", "prompts_per_iteration=4", "group_size=4", "rollout.num_steps=4", "vgrpo.num_pairs=2",
         "eval.per_prompt=1", "eval.num_steps=4", "eval.every=0", "checkpoint_every=1"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """``model.path=...``: the untrained MNIST-SD3 pipeline (final configs) in the save_pretrained layout."""
    path = tmp_path_factory.mktemp("mnist_sd3")
    build_pipeline(seed=0).save_pretrained(path)
    return [f"model.path={path}"]


@pytest.fixture(scope="module")
def digit_task(pipeline):
    config = build_config("vgrpo", "digit", "mnist-sd3", pipeline)
    return load_task(config.task, config.model), config, pipeline[0].split("=", 1)[1]


def test_preset_names_its_tasks_without_colliding_with_the_testbed():
    assert build_config("vgrpo", None, "mnist-sd3", []).task == "mnist-sd3/digit"
    assert build_config("vgrpo", "ocr", "mnist-sd3", []).task == "mnist-sd3/ocr"
    assert build_config("vgrpo", "digit", "testbed", []).task == "digit"
    with pytest.raises(ValueError, match="Unknown task 'ocr' under preset 'testbed'"):
        build_config("vgrpo", "ocr", "testbed", [])
    assert HUB_MODELS["mnist-sd3"].hub_id == str(PIPELINE_DIR) and HUB_MODELS["mnist-sd3"].family == "sd3"


def test_the_preset_builds_the_digit_task_through_the_hub_path(digit_task):
    task, config, path = digit_task
    assert isinstance(task, DiffusersTask) and task.base.family == "sd3"
    assert (task.height, task.width) == render.DIGIT_SIZE and task.sample_shape == render.latent_shape(render.DIGIT_SIZE)
    assert task.prompts == [p for p, _ in grammar.digit_prompts("train")]
    assert task.eval_prompt_list == [p for p, _ in grammar.digit_prompts("eval")]

    policy = task.load_policy()
    assert isinstance(policy, LoRAPolicy)
    trainable = [name for name, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name and ".default." in name for name in trainable)
    assert all(next(policy.parameters()).dtype == p.dtype == torch.float32 for p in policy.parameters())

    # The reference is the same transformer with its adapters off: the pipeline as loaded, however LoRA moved.
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    reference = task.reference_policy(policy)
    assert isinstance(reference, AdapterView) and reference.adapter_name is None
    assert isinstance(task.behaviour_policy(policy), AdapterBehaviour)
    fresh = load_policy(path, "sd3", dtype=torch.float32, lora_rank=None, autocast=False,
                        local_files_only=True).model
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn((3, *task.sample_shape), generator=g), torch.rand(3, generator=g)
    cond = task.condition(task.prompts[:3])
    assert task.base.pipe.text_encoder_3 is None and cond["prompt_embeds"].shape[1] == CLIP_LENGTH  # no T5 tokens
    with torch.no_grad():
        torch.testing.assert_close(reference(x, t, cond), fresh(x, t, cond), rtol=0, atol=0)
        assert not torch.allclose(policy(x, t, cond), fresh(x, t, cond))

    # The rollout grid is the pipeline scheduler's own sigmas (rollout.shift unset).
    scheduler = task.base.pipe.scheduler
    scheduler.set_timesteps(config.rollout.num_steps)
    np.testing.assert_allclose(rollout_grid(task, config.rollout), scheduler.sigmas.tolist(), atol=1e-6)


def test_the_ocr_task_has_its_canvas_number_prompts_and_labels(pipeline):
    config = build_config("vgrpo", "ocr", "mnist-sd3", pipeline)
    task = load_task(config.task, config.model)
    assert (task.height, task.width) == render.NUMBER_SIZE and task.sample_shape == render.latent_shape(render.NUMBER_SIZE)
    assert set(task.prompts).isdisjoint(task.eval_prompt_list) and len(task.eval_prompt_list) == 108
    assert task.labels(["the number 407", "the number 12"]) == ["407", "12"]


def test_judges_read_real_rendered_digits_and_numbers():
    """The metrics' geometry matches the renderings: real MNIST eval digits drawn as the pipeline was trained to
    draw them are read by the classifier and the MLP judge (per digit slot for numbers)."""
    digits, labels = load_mnist("eval")
    g = torch.Generator().manual_seed(0)
    pick = torch.randperm(len(labels), generator=g)[:100]
    images = render.render_digits(digits[pick], torch.randint(0, len(render.TINTS), (100,), generator=g))
    prompts = [f"the digit {int(d)}" for d in labels[pick]]
    result = digit_metrics(images, prompts, torch.zeros(100))
    assert result["accuracy"] >= 0.95 and result["judge_accuracy"] >= 0.9 and abs(result["judge_gap"]) <= 0.06

    numbers = [str(n) for n in torch.randint(10, 1000, (100,), generator=g).tolist()]
    canvas = render.render_numbers(digits, labels, numbers, generator=g)
    judged = number_judge(canvas, numbers)
    assert judged.float().mean() >= 0.75  # per-digit judge accuracy ~0.95, up to three digits
    shifted = torch.roll(canvas, render.NUMBER_STRIDE // 2, dims=-1)
    assert number_judge(shifted, numbers).float().mean() < 0.5 * judged.float().mean()  # slots matter
    for length in (2, 3):  # render_numbers' documented layout: NUMBER_STRIDE apart, centred
        slots = number_slots(length)
        assert [b - a for a, b in zip(slots, slots[1:])] == [render.NUMBER_STRIDE] * (length - 1)
        assert abs(slots[0] - (render.NUMBER_SIZE[1] - slots[-1] - render.MNIST_SIDE)) <= 1


def test_vgrpo_on_mnist_sd3_checkpoints_lora_only_and_resumes_exactly(pipeline, tmp_path, capsys):
    config = build_config("vgrpo", "digit", "mnist-sd3", [*SHORT, *pipeline])
    _, evaluations = train_straight_and_resumed(config, tmp_path)
    assert {"accuracy", "judge_accuracy", "judge_gap", "diversity", "reward_mean"} <= set(evaluations[-1])
    # vgrpo eval on a hub task: the base (LoRA off) and the trained policy, as the run's own evaluations
    table = assert_eval_repeats_the_run(tmp_path / "straight", evaluations, capsys)
    assert set(table) == {"reward_mean", "accuracy", "judge_accuracy", "judge_gap", "diversity"}

    out = tmp_path / "trained.npz"
    assert cli_main(["sample", "--run", str(tmp_path / "straight"), "--per-prompt", "1", "--seed", "0", "--out", str(out)]) == 0
    data = np.load(out)
    assert data["images"].shape == (30, 3, 32, 32) and data["labels"].dtype == np.int64
    assert data["labels"].tolist() == [grammar.parse_digit(p) for p in data["prompts"]]


def test_sample_writes_the_documented_arrays_for_the_base_pipeline(pipeline, tmp_path):
    out = tmp_path / "ocr.npz"
    argv = ["sample", "--preset", "mnist-sd3", "--task", "ocr", "--per-prompt", "1", "--seed", "3", "--steps", "2"]
    assert cli_main([*argv, "--out", str(out), *pipeline]) == 0
    data = np.load(out)
    assert data["images"].dtype == np.float32 and data["images"].shape == (108, 3, 32, 96)
    assert 0 <= data["images"].min() and data["images"].max() <= 1
    assert data["prompts"].tolist() == [p for p, _ in grammar.number_prompts("eval")]
    assert data["labels"].tolist() == [n for _, n in grammar.number_prompts("eval")]
    again = tmp_path / "again.npz"
    assert cli_main([*argv, "--out", str(again), *pipeline]) == 0
    np.testing.assert_array_equal(np.load(again)["images"], data["images"])  # the seed fixes the samples


@pytest.mark.slow
def test_a_short_vgrpo_run_on_the_shipped_pipeline_raises_the_held_out_reward(tmp_path):
    """The hub path learns: 16 V-GRPO iterations (8 prompts x 8 images, the preset's lr 3e-4) on the SHIPPED
    MNIST-SD3 weights raise the held-out digit reward (60 samples, 6 Euler steps). The evaluation draws the same
    noise before and after (fixed evaluation seed), so the difference is paired. Measured on this machine with the
    weights of the flow recipe's step 4500: reward 0.583 -> 0.606 (+0.023; 0.591, 0.594, 0.601 at iterations 4, 8,
    12), accuracy 0.617 -> 0.683; asserted: at least half the measured gain (+0.011) and no drop in accuracy."""
    short = ["iterations=16", "prompts_per_iteration=8", "group_size=8", "rollout.num_steps=6", "optim.lr=3e-4",
             "eval.per_prompt=2", "eval.num_steps=6", "eval.every=0", "checkpoint_every=16", "seed=0"]
    evaluations = Trainer(build_config("vgrpo", "digit", "mnist-sd3", short), tmp_path / "run", progress=False).train()
    base, trained = evaluations[0], evaluations[-1]
    assert base["iteration"] == 0 and trained["iteration"] == 16
    assert trained["reward_mean"] >= base["reward_mean"] + 0.011
    assert trained["accuracy"] >= base["accuracy"]


@pytest.mark.parametrize("packed", [False, True])
def test_export_writes_a_lora_that_diffusers_loads_into_the_trained_transformer(pipeline, tmp_path, packed):
    """``vgrpo export`` of a one-iteration run: a fresh ``StableDiffusion3Pipeline`` with ``load_lora_weights(out)``
    computes the trained policy's velocity (peft's LoRA scale alpha / r = 2 included), not the base model's. A
    packed base folder (as the shipped ones are) is named as itself, loaded through ``unpacked_folder``."""
    import shutil

    from vgrpo_lib.integrations.packed_weights import pack_folder

    if packed:
        folder = tmp_path / "packed_base"
        shutil.copytree(pipeline[0].split("=", 1)[1], folder)
        pack_folder(folder)
        pipeline = [f"model.path={folder}"]
    from diffusers import StableDiffusion3Pipeline

    from vgrpo_lib.integrations.diffusers_adapters.presets import absent_components
    from vgrpo_lib.integrations.diffusers_adapters.sd3 import SD3Velocity

    tiny = ["iterations=1", "prompts_per_iteration=2", "group_size=2", "rollout.num_steps=2", "vgrpo.num_pairs=1",
            "eval.per_prompt=1", "eval.num_steps=1", "eval.every=0", "optim.lr=1e-2"]
    trainer = Trainer(build_config("vgrpo", "digit", "mnist-sd3", [*tiny, *pipeline]), tmp_path / "run", progress=False)
    trainer.train()
    out = tmp_path / "lora"
    assert cli_main(["export", "--run", str(tmp_path / "run"), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "pytorch_lora_weights.safetensors"]

    path = pipeline[0].split("=", 1)[1]
    pipe = StableDiffusion3Pipeline.from_pretrained(unpacked_folder(path), torch_dtype=torch.float32,
                                                    **absent_components(path))
    pipe.load_lora_weights(out)
    loaded = SD3Velocity(pipe.transformer)
    g = torch.Generator().manual_seed(1)
    task = trainer.task
    x, t = torch.randn((3, *task.sample_shape), generator=g), torch.rand(3, generator=g)
    cond = task.condition(task.eval_prompt_list[:3])
    with torch.no_grad():
        trained = trainer.policy(x, t, cond)
        torch.testing.assert_close(loaded(x, t, cond), trained, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(task.reference_policy(trainer.policy)(x, t, cond), trained, rtol=1e-5, atol=1e-6)

    card = (out / "README.md").read_text()
    assert f"base_model: {path}" in card and "| task | mnist-sd3/digit:" in card and "| judge_accuracy |" in card
    source = f"unpacked_folder({path!r})" if packed else repr(path)
    assert f"pipe = StableDiffusion3Pipeline.from_pretrained({source}" in card
    assert ("from vgrpo_lib.integrations.packed_weights import unpacked_folder" in card) == packed
    assert f"pipe.load_lora_weights({str(out)!r})" in card
