"""Every task the trainer knows by name: what it is and how it is built.

    from vgrpo_lib.integrations.task_registry import build_task, task_names

    task_names()                                      # ['digit', ..., 'mnist-sd3/digit', 'mnist-sd3/ocr', 'sd3.5-medium', ...]
    build_task("digit")                               # an embedded-testbed task (the MLP policy)
    build_task("mnist-sd3/ocr", {"lora_rank": 8})     # a diffusers task, configured by model settings

Three kinds of entries:

- the embedded testbed's tasks (:data:`vgrpo_lib.integrations.testbed.tasks.TASKS`), which ignore the model settings;
- the hub models ``sd3.5-medium`` and ``flux.1-dev`` (:func:`vgrpo_lib.integrations.diffusers_adapters.task.hub_task`);
- ``<pipeline>/<task>``: a task of a hub-path pipeline that brings its own prompts, reward and judge
  (``mnist-sd3/digit``, ``mnist-sd3/ocr``: :mod:`vgrpo_lib.integrations.testbed.mnist_sd3_tasks`). The part after the
  slash is what ``--task`` names under ``--preset <pipeline>``, so ``--preset mnist-sd3 --task digit`` is
  ``mnist-sd3/digit`` and never the MLP testbed's ``digit``.

The model settings are the keyword arguments of ``hub_task`` (the run config's ``model`` section as a dict).
diffusers is imported only when a diffusers task is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vgrpo_lib.integrations.rewards.loading import MissingWeightsError  # what the CLI reports as one line: a missing install

__all__ = ["TaskEntry", "TASK_ENTRIES", "build_task", "resolve_task_name", "task_names"]


@dataclass(frozen=True)
class TaskEntry:
    """One named task: a one-line description and ``build(settings) -> task`` (``settings``: model settings)."""

    name: str
    description: str
    build: Callable[[dict], object]


def _testbed(name: str) -> Callable[[dict], object]:
    def build(settings: dict):
        from vgrpo_lib.integrations.testbed.tasks import get_task

        return get_task(name)

    return build


def _hub(name: str) -> Callable[[dict], object]:
    def build(settings: dict):
        try:
            from vgrpo_lib.integrations.diffusers_adapters.task import hub_task
        except ImportError as error:
            raise MissingWeightsError(
                f"Task {name!r} needs the diffusers integration, which cannot be imported ({error}). Install "
                f"diffusers, transformers and peft, or use a testbed task."
            ) from error
        return hub_task(name, **settings)

    return build


def _mnist_sd3(kind: str) -> Callable[[dict], object]:
    def build(settings: dict):
        try:
            from vgrpo_lib.integrations.testbed.mnist_sd3_tasks import mnist_sd3_task
        except ImportError as error:
            raise MissingWeightsError(f"Task 'mnist-sd3/{kind}' needs diffusers, transformers and peft ({error}).") from error
        return mnist_sd3_task(kind, **settings)

    return build


def _entries() -> dict[str, TaskEntry]:
    from vgrpo_lib.integrations.testbed.tasks import TASKS

    entries = [TaskEntry(name, task.description, _testbed(name)) for name, task in TASKS.items()]
    entries += [
        TaskEntry("mnist-sd3/digit", "the shipped MNIST-SD3 pipeline: a prompted digit, 32x32, classifier reward",
                  _mnist_sd3("digit")),
        TaskEntry("mnist-sd3/ocr", "the shipped MNIST-SD3 pipeline: a prompted 2-3 digit number, 32x96, OCR reward",
                  _mnist_sd3("ocr")),
        TaskEntry("mnist-sd3/geneval", "the shipped MNIST-SD3-GenEval pipeline: GenEval's compositional prompts with "
                  "digits, 64x64, GenEval reward (digit detector)", _mnist_sd3("geneval")),
        TaskEntry("mnist-sd3/geneval_ocr", "mnist-sd3/geneval's prompts and pipeline under two rewards: GenEval and "
                  "OCR (rapidocr reads the digits), normalised per reward", _mnist_sd3("geneval_ocr")),
        TaskEntry("sd3.5-medium", "Stable Diffusion 3.5 Medium (weights needed locally), prompts and reward by the "
                  "model section", _hub("sd3.5-medium")),
        TaskEntry("flux.1-dev", "FLUX.1-dev (weights needed locally), prompts and reward by the model section",
                  _hub("flux.1-dev")),
    ]
    return {entry.name: entry for entry in entries}


TASK_ENTRIES: dict[str, TaskEntry] = _entries()


def task_names() -> list[str]:
    """Every registered task name, sorted."""
    return sorted(TASK_ENTRIES)


def resolve_task_name(task: str, preset: str | None = None) -> str:
    """The registered name ``task`` means under ``preset``: ``"<preset>/<task>"`` when that is registered (a
    pipeline preset's own task), else ``task`` itself. ``ValueError`` listing the valid names when neither is."""
    if preset is not None and f"{preset}/{task}" in TASK_ENTRIES:
        return f"{preset}/{task}"
    if task in TASK_ENTRIES:
        return task
    under = f" under preset {preset!r}" if preset else ""
    raise ValueError(f"Unknown task {task!r}{under}; valid tasks: {', '.join(task_names())}.")


def build_task(name: str, settings: Mapping | None = None):
    """Build the task registered as ``name`` with model ``settings`` (ignored by testbed tasks); ``ValueError``
    listing the valid names for an unknown one."""
    if name not in TASK_ENTRIES:
        raise ValueError(f"Unknown task {name!r}; valid tasks: {', '.join(task_names())}.")
    return TASK_ENTRIES[name].build(dict(settings or {}))
