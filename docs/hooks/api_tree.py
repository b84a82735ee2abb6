"""mkdocs hook: show the API under its installed import names (``vgrpo_lib.algorithms``, ...).

The repository keeps ``algorithms/``, ``integrations/`` and ``benchmarks/`` at its top level and setuptools maps them
to ``vgrpo_lib.algorithms`` etc. (``package-dir`` in pyproject.toml). griffe, which reads the source for
mkdocstrings, finds packages by folder, so before the build this hook lays out the installed tree under
``build/api_tree/vgrpo_lib`` as links to the real files (mkdocs.yml points mkdocstrings' ``paths`` there).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

MAPPED_LAYERS = ("algorithms", "integrations", "benchmarks")


def build_api_tree(root: Path, tree: Path) -> Path:
    """Link ``root/vgrpo_lib/*`` and the mapped layers into ``tree/vgrpo_lib``; returns ``tree``."""
    package = tree / "vgrpo_lib"
    if tree.exists():
        shutil.rmtree(tree)
    package.mkdir(parents=True)
    for entry in (root / "vgrpo_lib").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry.resolve())
    for layer in MAPPED_LAYERS:
        (package / layer).symlink_to((root / layer).resolve(), target_is_directory=True)
    return tree


@event_priority(100)
def on_config(config):
    root = Path(config.config_file_path).resolve().parent
    build_api_tree(root, root / "build" / "api_tree")
    return config
