"""Optional packages and the extras that install them: a missing one is reported as one line naming the extra.

The library's required dependencies cover the core, the algorithms and the testbed; the hub path (diffusers), the
pretrained rewards, TensorBoard and Weights & Biases come from extras (``pip install 'vgrpo-lib[diffusers]'``). Every
place that imports such a package for an optional feature goes through this module, so a user without the extra
reads which extra to install instead of a traceback::

    require_extra("diffusers", "Task 'mnist-sd3/digit'")    # before the feature: its packages are all installed
    with needs_extra("rewards", "The ocr reward"):          # around a lazy import
        from rapidocr_onnxruntime import RapidOCR

Both raise :class:`MissingExtraError` (a ``ModuleNotFoundError``), whose message is one line::

    Task 'mnist-sd3/digit' needs the 'diffusers' extra: pip install 'vgrpo-lib[diffusers]' (diffusers is not installed).

The command line prints that line and exits with the usage status. This module imports nothing but the standard
library (the core may use it).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["EXTRAS", "MissingExtraError", "missing_extra_message", "missing_packages", "needs_extra", "require_extra"]

EXTRAS: dict[str, tuple[str, ...]] = {
    # extra -> the top-level import names of its packages that the library imports (pyproject's optional
    # dependencies; accelerate, which diffusers only uses when present, is not checked)
    "diffusers": ("diffusers", "transformers", "peft"),
    "rewards": ("transformers", "rapidocr_onnxruntime", "PIL"),
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "server": ("fastapi", "uvicorn"),
    "test": ("pytest", "hypothesis"),
}


def _known_extra(extra: str) -> tuple[str, ...]:
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra {extra!r}; the extras are: {', '.join(EXTRAS)}.")
    return EXTRAS[extra]


def missing_extra_message(feature: str, extra: str, module: str) -> str:
    """The one line that says ``feature`` needs ``extra`` (``module`` being the package found missing)."""
    return f"{feature} needs the {extra!r} extra: pip install 'vgrpo-lib[{extra}]' ({module} is not installed)."


class MissingExtraError(ModuleNotFoundError):
    """An optional feature needs a package of an extra that is not installed; the message is one line naming the
    feature, the extra and the ``pip install`` command (``feature``, ``extra`` and ``name`` hold them)."""

    def __init__(self, feature: str, extra: str, module: str):
        super().__init__(missing_extra_message(feature, extra, module), name=module)
        self.feature, self.extra = feature, extra


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None  # None also when sys.modules[module] is None
    except ValueError:  # in sys.modules without a __spec__ (e.g. __main__): present
        return module in sys.modules


def missing_packages(extra: str) -> list[str]:
    """The packages of ``extra`` (:data:`EXTRAS`) that cannot be imported here, in :data:`EXTRAS`' order."""
    return [module for module in _known_extra(extra) if not _installed(module)]


def require_extra(extra: str, feature: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtraError` for the first package of ``extra`` (or of ``modules``, a part of it) that
    is not installed; ``feature`` names what needs it ("Task 'mnist-sd3/digit'", "log.backend=wandb"). Checking
    before use also catches what a later import would not: diffusers imports without transformers and fails only
    when a pipeline is loaded."""
    known = _known_extra(extra)
    for module in modules if modules is not None else known:
        if module not in known:
            raise ValueError(f"{module!r} is not a package of the {extra!r} extra ({', '.join(known)}).")
        if not _installed(module):
            raise MissingExtraError(feature, extra, module)


@contextmanager
def needs_extra(extra: str, feature: str) -> Iterator[None]:
    """Run the block (lazy imports) and turn a ``ModuleNotFoundError`` for a package of ``extra`` into
    :class:`MissingExtraError`; any other error, or a missing module of another package, passes unchanged."""
    known = _known_extra(extra)
    try:
        yield
    except MissingExtraError:
        raise
    except ModuleNotFoundError as error:
        top = (error.name or "").split(".")[0]
        if top not in known:
            raise
        raise MissingExtraError(feature, extra, top) from None
