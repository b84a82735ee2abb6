"""The repository stays small: the tracked files (code, shipped checkpoints, results/) at most 45 MB.

The project keeps its tree at about 40 MB or less (a copy to a GPU machine may carry 64 MiB, and every clone
downloads it); this test fails past 45 MB and names the largest folders, so the commit that grows the tree is the
one that has to prune or compress (results/README.md: ``vgrpo compress DIR`` for run tables; superseded result
folders stay in the git history). Outside a git checkout (an sdist, an installed copy) it is skipped.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 45_000_000
FOLDER_DEPTH = 2  # "results/protocol-style", "integrations/testbed"
LARGEST_SHOWN = 12


def tracked_files() -> list[str]:
    """Paths of the files git tracks in this checkout (relative to its root), or a skip when there is none."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if listing.returncode != 0 or not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: the tracked files cannot be listed")
    return [path for path in listing.stdout.decode().split("\0") if path]


def tracked_bytes(paths: list[str]) -> Counter:
    """Bytes of each tracked path as it lies in the working tree (a link counts as the link, not its target;
    a path deleted but not yet committed counts 0)."""
    sizes = Counter()
    for path in paths:
        full = REPO / path
        if full.is_symlink() or full.exists():
            sizes[path] = full.lstat().st_size
    return sizes


def folder_bytes(sizes: Counter, depth: int = FOLDER_DEPTH) -> Counter:
    """The bytes of ``sizes`` summed by folder, ``depth`` levels deep (files above that depth count under their
    own folder, top-level files under ``"."``)."""
    folders = Counter()
    for path, size in sizes.items():
        parts = path.split("/")[:-1][:depth]
        folders["/".join(parts) or "."] += size
    return folders


def test_folder_bytes_sums_by_folder():
    sizes = Counter({"README.md": 5, "results/a/runs/x/m.csv.gz": 7, "results/a/summary.json": 3, "results/t.txt": 2})
    assert folder_bytes(sizes) == Counter({".": 5, "results/a": 10, "results": 2})


def test_tracked_files_fit_in_45_mb():
    sizes = tracked_bytes(tracked_files())
    total = sum(sizes.values())
    largest = "\n".join(f"  {size / 1e6:7.2f} MB  {folder}" for folder, size in folder_bytes(sizes).most_common(LARGEST_SHOWN))
    assert total <= LIMIT_BYTES, (
        f"the tracked files take {total / 1e6:.2f} MB, over the {LIMIT_BYTES / 1e6:.0f} MB limit; prune superseded "
        f"result folders or compress tables (`vgrpo compress DIR`). Largest folders:\n{largest}")
