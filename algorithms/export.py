"""What a user takes away from a run: its trained policy, as other tools read it, with a model card.

    vgrpo export --run RUN_DIR --out DIR

``export_run(run_dir, out_dir)`` writes the policy of the run's newest valid checkpoint through its task's
``export_policy`` (a diffusers task: the trained LoRA in the diffusers format, which
``Pipeline.load_lora_weights(DIR)`` reads; a testbed task: a float32 safetensors file and its JSON config, which
``load_pretrained(name, directory=DIR)`` reads) and ``README.md``, the model card: base model, algorithm, task and
reward, iterations, and the run's last evaluation beside its first (the base policy's). Every exported file gets the
mode a plain ``open`` would give it (0644 under the usual umask 022), readable by whoever shares the model.

The exported weights are the ones the run evaluates (:func:`load_run_policy`): the EMA of the trained weights when
``optim.ema_decay`` is set, else the trained weights.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from vgrpo_lib.algorithms.config import TrainConfig
from vgrpo_lib.algorithms.errors import RunDirError
from vgrpo_lib.algorithms.evaluation import guidance_label
from vgrpo_lib.algorithms.run_dir import RunDir, atomic_write_text
from vgrpo_lib.algorithms.tasks import load_task
from vgrpo_lib.integrations.atomic import os_error_naming, plain_file_mode
from vgrpo_lib.integrations.tasks import task_description
from vgrpo_lib import __version__

__all__ = ["ExportDirExists", "load_run_policy", "export_run", "model_card"]


class ExportDirExists(RunDirError, FileExistsError):
    """``--out`` already holds files (an export never overwrites; exit code 3)."""


def load_run_policy(run_dir: str | Path):
    """The config, task, evaluated policy (in eval mode), checkpoint state and base policy of a run's newest valid
    checkpoint.

    The policy holds the weights the run evaluates: the EMA average when the run keeps one (``optim.ema_decay``),
    else the trained weights. The base policy is the one the run started from, the task's ``reference_policy``
    taken before the trained weights are loaded (a diffusers task: the trained
    transformer with its adapters switched off; a testbed task: a frozen copy), for side-by-side evaluation.
    :class:`RunDirError` when the run has no checkpoint yet.
    """
    run = RunDir(run_dir)
    config = run.train_config()
    state = run.load_latest_checkpoint()
    if state is None:
        raise RunDirError(f"{run.root} has no checkpoint yet.")
    task = load_task(config.task, config.model)
    policy = task.load_policy().eval()
    base = task.reference_policy(policy)
    policy.load_state_dict(state["policy"])
    if "ema" in state:  # the average of the trainable parameters, in their order (vgrpo_lib.algorithms.policies.WeightEMA)
        trainable = [p for p in policy.parameters() if p.requires_grad]
        with torch.no_grad():
            for param, average in zip(trainable, state["ema"]["average"], strict=True):
                param.copy_(average)
    return config, task, policy, state, base


def export_run(run_dir: str | Path, out_dir: str | Path) -> list[Path]:
    """Export the policy of the run in ``run_dir`` into ``out_dir`` (created; refused when it holds files) with a
    model card; returns the files written. An export that fails (a full disk: an ``OSError`` naming ``out_dir``)
    removes what it wrote, so the same command can run again."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportDirExists(f"{out} already exists and is not an empty folder; choose a new --out.")
    config, task, policy, state, _ = load_run_policy(run_dir)
    evaluations = [e for e in RunDir(run_dir).read_jsonl("eval.jsonl") if e["iteration"] <= state["iteration"]]
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        facts = task.export_policy(policy, out)
        atomic_write_text(out / "README.md", model_card(config, state, evaluations, facts))
    except BaseException as error:  # out was new or empty: what is in it now is this export's, removed
        for path in out.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        if created:
            out.rmdir()
        named = os_error_naming(error, out)  # a disk that filled up under safetensors: one line naming the folder
        if named is not None:
            raise named from error
        raise
    written = sorted(out.iterdir())
    for path in written:  # safetensors (and so diffusers' save_lora_weights) makes its files 0600
        if path.is_file():
            path.chmod(plain_file_mode())
    return written


def model_card(config: TrainConfig, state: dict, evaluations: list[dict], facts: dict[str, str]) -> str:
    """The model card (Markdown with a YAML header) of an exported policy: ``state`` is the checkpoint's,
    ``evaluations`` the run's (``eval.jsonl``), ``facts`` what the task's ``export_policy`` returned."""
    reward = config.model.reward or f"the task's own ({task_description(config.task)})"
    weights = (f"EMA of the trained weights (optim.ema_decay={config.optim.ema_decay}, every {config.optim.ema_every} "
               f"gradient steps)" if config.optim.ema_decay is not None else "the trained weights")
    lines = [
        "---",
        f"base_model: {facts['base_model']}",
        f"tags: [vgrpo-lib, {config.algo}, reinforcement-learning]",
        "---",
        "",
        f"# {config.algo} on {config.task}",
        "",
        f"Trained with vgrpo-lib {__version__} (`vgrpo train`), exported with `vgrpo export`.",
        "",
        "| | |",
        "|---|---|",
        f"| base model | {facts['base_model']} |",
        f"| algorithm | {config.algo} |",
        f"| task | {config.task}: {task_description(config.task)} |",
        f"| reward | {reward} |",
        f"| iterations | {state['iteration']} of {config.iterations} ({config.prompts_per_iteration} prompts x "
        f"{config.group_size} samples each) |",
        f"| gradient steps | {state['counters']['grad_steps']} |",
        f"| weights | {weights} |",
        "",
    ]
    if evaluations:
        base, last = evaluations[0], evaluations[-1]
        e = config.eval
        lines += [f"## Evaluation (iteration {last['iteration']}; held-out seeds, {guidance_label(config.model)}, "
                  f"{e.num_steps} ODE steps, {e.per_prompt} per prompt)", "",
                  f"| metric | iteration {base['iteration']} | iteration {last['iteration']} |", "|---|---|---|"]
        for key, value in last.items():
            if key != "iteration" and isinstance(value, (int, float)):
                before = base.get(key)
                lines.append(f"| {key} | {'' if before is None else f'{before:.4g}'} | {value:.4g} |")
        lines.append("")
    else:
        lines += ["## Evaluation", "", "The run recorded no evaluation.", ""]
    lines += ["## Usage", "", "```python", facts["usage"], "```", ""]
    return "\n".join(lines)
