"""Session-wide test settings: unpacked pipelines go to a temporary cache, not the user's ``~/.cache/vgrpo_lib``."""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE: list[str] = []


def pytest_configure(config):
    """Point ``VGRPO_CACHE`` (:func:`vgrpo_lib.integrations.packed_weights.cache_root`) at a folder of this session,
    inherited by the subprocesses tests start."""
    _CACHE.append(tempfile.mkdtemp(prefix="vgrpo-test-cache-"))
    os.environ["VGRPO_CACHE"] = _CACHE[0]


def pytest_unconfigure(config):
    for folder in _CACHE:
        shutil.rmtree(folder, ignore_errors=True)
