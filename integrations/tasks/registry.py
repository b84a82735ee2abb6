"""Every task the trainer knows by name, and the one resolver of names and import paths: :func:`build_task`.

    from vgrpo_lib.integrations.tasks import build_task, register_task, task_names

    task_names()                                      # ['digit', ..., 'mnist-sd3/digit', 'mnist-sd3/ocr', 'sd3.5-medium', ...]
    build_task("digit")                               # an embedded-testbed task (the MLP policy)
    build_task("mnist-sd3/ocr", {"lora_rank": 8})     # a diffusers task, configured by model settings
    build_task("my_package.my_module:make_task")      # a user's task, from its factory's import path
    register_task("toy2d", make_toy2d, "a 2-D flow-matching toy")   # a user's task, by name from now on

Four kinds of tasks:

- the embedded testbed's tasks (:data:`vgrpo_lib.integrations.testbed.tasks.TASKS`), which ignore the model settings;
- the hub models ``sd3.5-medium``, ``flux.1-dev``, ``flux.2-dev``, ``flux.2-klein``, ``qwen-image`` and ``wan2.1-t2v``
  (:func:`vgrpo_lib.integrations.tasks.hub.hub_task`);
- ``<pipeline>/<task>``: a task of a hub-path pipeline that brings its own prompts, reward and judge
  (``mnist-sd3/digit``, ``mnist-sd3/ocr``: :mod:`vgrpo_lib.integrations.tasks.mnist_sd3`; the video task
  ``mnist-wan/motion``: :mod:`vgrpo_lib.integrations.tasks.mnist_wan`). The part after the
  slash is what ``--task`` names under ``--preset <pipeline>``, so ``--preset mnist-sd3 --task digit`` is
  ``mnist-sd3/digit`` and never the MLP testbed's ``digit``;
- a user's own: registered with :func:`register_task`, or named by the import path ``"package.module:factory"`` of
  a factory (``vgrpo train --task my_package.my_module:make_task``; the run's saved config keeps the path, so
  ``--resume`` rebuilds the task from it).

A factory (registered or imported) is called as :func:`call_factory` says: with no argument when it has no required
parameter, else with the model settings, the keyword arguments of ``hub_task`` (the run config's ``model``
section as a dict). diffusers is imported only when a diffusers task is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vgrpo_lib.extras import needs_extra, require_extra
from vgrpo_lib.integrations.tasks.hub import hub_task
from vgrpo_lib.integrations.tasks.imports import ImportPathError, is_import_path, load_import_path
from vgrpo_lib.integrations.tasks.mnist_sd3 import mnist_sd3_task
from vgrpo_lib.integrations.tasks.mnist_wan import mnist_wan_task
from vgrpo_lib.integrations.tasks.protocol import check_task
from vgrpo_lib.integrations.testbed.tasks import TASKS, get_task
from vgrpo_lib.errors import UsageError

__all__ = ["TASK_ENTRIES", "TASK_KINDS", "TaskEntry", "build_task", "call_factory", "register_task", "resolve_task_name",
           "task_description", "task_names"]

TASK_KINDS = ("testbed", "pipeline", "hub", "registered")
"""The kinds of registered tasks: the embedded testbed's, a pipeline preset's own (``<pipeline>/<task>``), a hub
model's, and the user's own (:func:`register_task`)."""


@dataclass(frozen=True)
class TaskEntry:
    """One named task: a one-line description, ``build(settings) -> task`` (``settings``: model settings) and its
    kind (one of :data:`TASK_KINDS`)."""

    name: str
    description: str
    build: Callable[[dict], object]
    kind: str = "registered"


def _testbed(name: str) -> Callable[[dict], object]:
    def build(settings: dict):
        return get_task(name)

    return build


def _needs_diffusers(name: str, build: Callable[[dict], object]) -> Callable[[dict], object]:
    """``build`` with a missing package of the ``diffusers`` extra reported as one line naming the extra
    (:class:`~vgrpo_lib.extras.MissingExtraError`), checked before building."""

    def checked(settings: dict):
        require_extra("diffusers", f"Task {name!r}")
        with needs_extra("diffusers", f"Task {name!r}"):
            return build(settings)

    return checked


def _entries() -> dict[str, TaskEntry]:
    entries = [TaskEntry(name, task.description, _testbed(name), "testbed") for name, task in TASKS.items()]
    pipeline_tasks = {
        "digit": "the shipped MNIST-SD3 pipeline: a prompted digit, 32x32, classifier reward",
        "ocr": "the shipped MNIST-SD3 pipeline: a prompted 2-3 digit number, 32x96, OCR reward",
        "geneval": "the shipped MNIST-SD3-GenEval pipeline: GenEval's compositional prompts with digits, 64x64, "
                   "GenEval reward (digit detector)",
        "geneval_ocr": "mnist-sd3/geneval's prompts and pipeline under two rewards: GenEval and OCR (rapidocr reads "
                       "the digits), normalised per reward",
    }
    entries += [TaskEntry(f"mnist-sd3/{kind}", description,
                          _needs_diffusers(f"mnist-sd3/{kind}", lambda settings, kind=kind: mnist_sd3_task(kind, **settings)), "pipeline")
                for kind, description in pipeline_tasks.items()]
    entries.append(TaskEntry("mnist-wan/motion", "the shipped MNIST-Wan video pipeline: a prompted digit moving a "
                             "prompted way, 9 frames of 32x32, classifier x motion reward",
                             _needs_diffusers("mnist-wan/motion", lambda settings: mnist_wan_task("motion", **settings)),
                             "pipeline"))
    hub_models = {
        "sd3.5-medium": "Stable Diffusion 3.5 Medium (weights needed locally), prompts and reward by the model section",
        "flux.1-dev": "FLUX.1-dev (weights needed locally), prompts and reward by the model section",
        "wan2.1-t2v": "Wan 2.1/2.2 text-to-video (a WanPipeline folder, model.path), videos of model.frames frames; "
                      "prompts and an image reward (averaged over the frames) by the model section",
        "flux.2-dev": "FLUX.2-dev (weights needed locally), prompts and reward by the model section",
        "flux.2-klein": "FLUX.2 klein base (weights needed locally), prompts and reward by the model section",
        "qwen-image": "Qwen-Image (weights needed locally), prompts and reward by the model section",
    }
    entries += [TaskEntry(name, description, _needs_diffusers(name, lambda settings, name=name: hub_task(name, **settings)), "hub")
                for name, description in hub_models.items()]
    return {entry.name: entry for entry in entries}


TASK_ENTRIES: dict[str, TaskEntry] = _entries()
"""The registered tasks by name (read-only by convention: add one with :func:`register_task`)."""


def register_task(name: str, factory: Callable, description: str, *, replace: bool = False) -> None:
    """Make ``factory`` buildable as the task ``name`` (``build_task(name)``, ``Trainer`` configs with ``task=name``,
    ``vgrpo`` commands run in the same process). ``factory`` is called as :func:`call_factory` says. A ``ValueError``
    when ``name`` is taken (unless ``replace``), is empty, contains ``":"`` (import paths' syntax) or ``factory`` is
    not callable."""
    if not isinstance(name, str) or not name.strip() or ":" in name:
        raise UsageError(f"A task name must be a non-empty string without ':' (the import paths' syntax), got {name!r}.")
    if not callable(factory):
        raise UsageError(f"register_task({name!r}): the factory must be callable, got {type(factory).__name__}.")
    if name in TASK_ENTRIES and not replace:
        raise UsageError(f"The task {name!r} is already registered ({TASK_ENTRIES[name].description}); pass "
                         f"replace=True to replace it.")
    TASK_ENTRIES[name] = TaskEntry(name, description, lambda settings: call_factory(factory, settings, name))


def call_factory(factory: Callable, settings: Mapping | None, source: str) -> object:
    """``factory()`` when it has no required parameter, else ``factory(settings)`` (the model settings as a dict).
    ``source`` names the factory in errors."""
    if not callable(factory):
        raise ImportPathError(f"{source} is a {type(factory).__name__}, not a task factory (a callable returning a task).")
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called without arguments
        parameters = []
    required = [p for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(required) > 1:
        raise ImportPathError(f"The task factory {source} takes {len(required)} required arguments "
                              f"({', '.join(p.name for p in required)}); it may take none, or one: the model settings.")
    return factory(dict(settings or {})) if required else factory()


def task_names(kind: str | None = None) -> list[str]:
    """Every registered task name (of ``kind``, one of :data:`TASK_KINDS`, when given), sorted."""
    if kind is not None and kind not in TASK_KINDS:
        raise UsageError(f"Unknown task kind {kind!r}; valid: {', '.join(TASK_KINDS)}.")
    return sorted(name for name, entry in TASK_ENTRIES.items() if kind in (None, entry.kind))


def _unknown(task: str, under: str = "") -> UsageError:
    return UsageError(f"Unknown task {task!r}{under}; valid tasks: {', '.join(task_names())}, or the import path "
                      f"'package.module:factory' of your own task's factory.")


def resolve_task_name(task: str, preset: str | None = None) -> str:
    """The task ``task`` means under ``preset``: ``"<preset>/<task>"`` when that is registered (a pipeline preset's own
    task), else ``task`` itself when it is registered or an import path (not imported here: :func:`build_task` does).
    ``ValueError`` listing the valid names otherwise."""
    if preset is not None and f"{preset}/{task}" in TASK_ENTRIES:
        return f"{preset}/{task}"
    if task in TASK_ENTRIES or is_import_path(task):
        return task
    raise _unknown(task, f" under preset {preset!r}" if preset else "")


def task_description(name: str) -> str:
    """The one-line description of the task ``name``: its registry entry's, or the import path of its factory."""
    return TASK_ENTRIES[name].description if name in TASK_ENTRIES else f"the task built by {name}"


def build_task(name: str, settings: Mapping | None = None):
    """The task ``name`` (a registered name or an import path ``"package.module:factory"``) built with model
    ``settings`` (ignored by testbed tasks). One-line errors: ``ValueError`` listing the valid names for an unknown
    name; :class:`ImportPathError` (a ``ValueError``) for an import path whose module or attribute is missing or
    that is no factory; :class:`TaskProtocolError` (a ``TypeError``) when the factory's result is not a task."""
    if name in TASK_ENTRIES:
        task = TASK_ENTRIES[name].build(dict(settings or {}))
    elif is_import_path(name):
        task = call_factory(load_import_path(name, "task factory"), settings, name)
    else:
        raise _unknown(name)
    return check_task(task, f"the task {name!r}")
