"""Task assembly: the one place that may import both the embedded testbed and the diffusers adapters.

- :mod:`~vgrpo_lib.integrations.tasks.protocol`: :class:`TaskProtocol`, what the trainer calls on a task, and
  :func:`check_task`.
- :mod:`~vgrpo_lib.integrations.tasks.registry`: tasks by name (:func:`register_task`, :func:`task_names`) and the one
  resolver of names and import paths ``"package.module:factory"`` (:func:`build_task`).
- :mod:`~vgrpo_lib.integrations.tasks.hub`: SD3 / FLUX text-to-image training as a task (:class:`DiffusersTask`,
  :func:`hub_task`), rewards from the zoo or an import path (:func:`make_reward`).
- :mod:`~vgrpo_lib.integrations.tasks.mnist_sd3`: the tasks of the shipped MNIST-SD3 pipelines.
- :mod:`~vgrpo_lib.integrations.tasks.imports`: import paths (:func:`load_import_path`).

The diffusers adapters (:mod:`vgrpo_lib.integrations.diffusers_adapters`) never import the testbed; both import
shared metrics from :mod:`vgrpo_lib.integrations.metrics`.
"""

from vgrpo_lib.integrations.tasks.imports import ImportPathError, is_import_path, load_import_path
from vgrpo_lib.integrations.tasks.protocol import (
    OPTIONAL_MEMBERS, REQUIRED_MEMBERS, TaskProtocol, TaskProtocolError, check_task,
)
from vgrpo_lib.integrations.tasks.registry import (
    TASK_ENTRIES, TASK_KINDS, TaskEntry, build_task, register_task, resolve_task_name, task_description, task_names,
)

__all__ = [
    "ImportPathError", "OPTIONAL_MEMBERS", "REQUIRED_MEMBERS", "TASK_ENTRIES", "TASK_KINDS", "TaskEntry", "TaskProtocol",
    "TaskProtocolError", "build_task", "check_task", "is_import_path", "load_import_path", "register_task",
    "resolve_task_name", "task_description", "task_names",
]
