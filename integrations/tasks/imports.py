"""Import paths ``"package.module:name"``: how a user names their own task factory or reward without editing the project.

    load_import_path("my_package.my_module:make_task", "task factory")     # the object, or one clear ImportPathError

The module is imported with :func:`importlib.import_module`, so it must be importable from ``sys.path`` (an installed
package, the working directory under ``python -m``, or a folder on ``PYTHONPATH``); ``name`` may be dotted
(``module:Class.method``).
"""

from __future__ import annotations

import importlib

from vgrpo_lib.errors import UsageError

__all__ = ["ImportPathError", "is_import_path", "load_import_path"]


class ImportPathError(UsageError):
    """An import path that names no usable object: the module is not found, or it has no such attribute."""


def _dotted_identifier(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def is_import_path(spec: str) -> bool:
    """Whether ``spec`` has the form ``"package.module:name"`` (dotted identifiers on both sides of one colon).
    ``"pickscore:1"`` (a weighted reward) and ``"mnist-sd3/digit"`` (a registered name) are not import paths."""
    module, colon, name = spec.partition(":")
    return bool(colon) and _dotted_identifier(module) and _dotted_identifier(name)


def load_import_path(spec: str, what: str) -> object:
    """The object that ``spec`` (``"package.module:name"``) names; ``what`` says what it is for in the error
    (``"task factory"``, ``"reward"``). An :class:`ImportPathError` (a :class:`vgrpo_lib.errors.UsageError`, a ``ValueError``) of one line when ``spec`` is
    malformed, its module is not found, or the module has no such attribute; an import error raised *inside* a
    module that exists propagates unchanged (its traceback shows the user's bug)."""
    if not is_import_path(spec):
        raise ImportPathError(f"The {what} {spec!r} is not an import path of the form 'package.module:name'.")
    module_name, _, name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
            raise  # the module exists; something it imports is missing
        raise ImportPathError(f"The {what} {spec!r}: no module named {error.name!r} (is its folder on PYTHONPATH?).") from None
    found: object = module
    for depth, part in enumerate(name.split(".")):
        if not hasattr(found, part):
            where = ".".join([module_name, *name.split(".")[:depth]])
            public = sorted(n for n in dir(found) if not n.startswith("_"))[:12]
            raise ImportPathError(f"The {what} {spec!r}: {where!r} has no attribute {part!r} "
                                  f"(it defines: {', '.join(public) or 'nothing public'}).")
        found = getattr(found, part)
    return found
