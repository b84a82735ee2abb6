"""The wheel installs beside other packages and is complete (issue 28.6).

The repository keeps its layer folders (``vgrpo_lib/``, ``algorithms/``, ``integrations/``, ``benchmarks/``), but
they install under one name, ``vgrpo_lib`` (pyproject's package-dir mapping): torchrl, a required dependency,
already installs a top-level ``benchmarks`` package. Once per session (module-scoped fixtures) the wheel is built
offline from a copy of the package sources (``pip wheel --no-deps --no-build-isolation``) and installed into a
target folder (``pip install --no-deps --target``) that is then used beside the current environment's
dependencies, from a working directory outside the checkout and with ``python -S`` (so the editable install's
import finder, set up by a ``.pth`` file, cannot answer for ``vgrpo_lib``). From there ``vgrpo sample`` runs for every
shipped preset and task. The hub presets (SD3.5-M, FLUX.1-dev) download their weights and are left out.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

REPO = Path(__file__).resolve().parent.parent
NAME = "vgrpo_lib"
LAYER_FOLDERS = {"vgrpo_lib": "vgrpo_lib", "algorithms": "vgrpo_lib.algorithms",
                 "integrations": "vgrpo_lib.integrations", "benchmarks": "vgrpo_lib.benchmarks"}
CHECKPOINTS = REPO / "integrations" / "testbed" / "checkpoints"
SOURCE_FILES = ("pyproject.toml", "README.md")
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
PIPELINE_TASKS = ("digit", "ocr", "geneval", "geneval_ocr")  # --preset mnist-sd3's tasks, at the least
TESTBED_TASKS = ("digit", "pair", "style", "digit_style", "digits8")


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def setuptools_version() -> tuple[int, ...]:
    return tuple(int(part) for part in importlib.metadata.version("setuptools").split(".")[:2] if part.isdigit())


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Every package folder of the repository (a folder with ``__init__.py`` under the four layer folders), by
    the import name it installs as."""
    found = {}
    for folder, name in LAYER_FOLDERS.items():
        for init in sorted((REPO / folder).rglob("__init__.py")):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(REPO / folder).parts
            found[".".join((name, *relative))] = init.parent
    return found


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject lists its packages (find() cannot map folders to other names): a new sub-package must be added
    there, or the wheel leaves it out while the editable install still finds it."""
    settings = pyproject()["tool"]["setuptools"]
    assert settings["package-dir"] == {name: folder for folder, name in LAYER_FOLDERS.items() if folder != NAME}
    listed = set(settings["packages"])
    missing = sorted(set(package_folders()) - listed)
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml"
    assert not listed - set(package_folders()), f"listed but no such package folder: {sorted(listed - set(package_folders()))}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built offline from a copy of the package sources (the checkout gets no build/ folder)."""
    if setuptools_version() < (69,):
        pytest.fail(f"building the wheel needs setuptools >= 69 (package-dir mapping, ** globs; the test extra "
                    f"brings it): found {importlib.metadata.version('setuptools')}")
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for folder in LAYER_FOLDERS:
        shutil.copytree(REPO / folder, source / folder, ignore=SKIPPED)
    for name in SOURCE_FILES:
        shutil.copy2(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out),
         str(source)])
    (built,) = out.glob(f"{NAME}-*.whl")
    return built


@pytest.fixture(scope="module")
def target(wheel, tmp_path_factory) -> Path:
    """The wheel installed into a folder of its own (nothing else of the environment is touched)."""
    folder = tmp_path_factory.mktemp("target")
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q", "--target",
         str(folder), str(wheel)])
    return folder


def installed_python(target: Path) -> tuple[list[str], dict]:
    """``python -S`` with ``target`` first on the path, then the current environment's site-packages (no .pth file
    is processed, so the editable install's finder is not there), and its environment."""
    site_folders = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env.update(PYTHONPATH=os.pathsep.join([str(target), *site_folders]), HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1")
    return [sys.executable, "-S"], env


@pytest.mark.slow
def test_the_wheel_installs_only_vgrpo_lib(wheel):
    """RECORD lists only ``vgrpo_lib/`` and its dist-info: no top-level ``benchmarks``, ``algorithms`` or
    ``integrations``, and no top-level name that torchrl installs (so torchrl's files stay untouched)."""
    with zipfile.ZipFile(wheel) as archive:
        dist_info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        record = archive.read(f"{dist_info}/RECORD").decode().splitlines()
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    paths = [line.rsplit(",", 2)[0] for line in record if line]
    top_level = {path.split("/")[0] for path in paths}
    assert top_level == {NAME, dist_info}, sorted(top_level)
    torchrl_top = {str(f).split("/")[0] for f in importlib.metadata.files("torchrl") or ()}
    assert "benchmarks" in torchrl_top or not torchrl_top  # the collision the layout avoids (torchrl 0.14)
    assert not top_level & torchrl_top
    assert "vgrpo = vgrpo_lib.benchmarks.cli:main" in entry_points


@pytest.mark.slow
def test_the_wheel_holds_every_shipped_checkpoint_and_package(wheel):
    with zipfile.ZipFile(wheel) as archive:
        stored = {info.filename: info for info in archive.infolist()}
    prefix = "vgrpo_lib/integrations/testbed/checkpoints/"
    shipped = [p for p in CHECKPOINTS.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(shipped) > 20
    for path in shipped:
        name = prefix + path.relative_to(CHECKPOINTS).as_posix()
        assert name in stored, f"{name} is not in the wheel"
        assert stored[name].CRC == zlib.crc32(path.read_bytes()), f"{name} differs from {path}"
    for name, folder in package_folders().items():
        assert name.replace(".", "/") + "/__init__.py" in stored, f"package {name} ({folder}) is not in the wheel"
    assert "vgrpo_lib/py.typed" in stored


SAMPLE_EVERYTHING = textwrap.dedent('''
    """Import every package and sample every shipped preset and task from the installed copy; a JSON report."""
    import importlib, json, sys
    from pathlib import Path

    import numpy as np

    packages, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    files = {name: importlib.import_module(name).__file__ for name in packages}
    from vgrpo_lib import ELBOSurrogate, GroupAdvantage  # the public core names
    from vgrpo_lib.algorithms.presets import PRESETS, build_config
    from vgrpo_lib.benchmarks.cli import main
    from vgrpo_lib.integrations.tasks.registry import TASK_ENTRIES

    local = {name: entry.kind for name, entry in TASK_ENTRIES.items() if entry.kind in ("testbed", "pipeline")}
    commands = []  # (preset, task, the task's registered name)
    for name, kind in local.items():  # every task under its own preset
        preset, _, task = name.rpartition("/") if kind == "pipeline" else ("testbed", "", name)
        commands.append((preset, task, name))
    for preset in PRESETS:  # every preset whose default task is shipped, with that task (once)
        default = build_config("vgrpo", None, preset, []).task
        if default in local and (preset, default) not in {(p, n) for p, _, n in commands}:
            commands.append((preset, None, default))
    report = {"files": {**files, "vgrpo_lib.benchmarks.cli": sys.modules["vgrpo_lib.benchmarks.cli"].__file__},
              "hub": sorted(set(TASK_ENTRIES) - set(local)), "runs": []}
    for number, (preset, task, name) in enumerate(commands):
        npz = out / f"{number}.npz"
        argv = ["sample", "--preset", preset, *(["--task", task] if task else []), "--per-prompt", "1", "--steps", "2",
                "--seed", "0", "--out", str(npz)]
        code = main(argv)
        shape = list(np.load(npz)["images"].shape) if npz.exists() else None
        report["runs"].append({"preset": preset, "task": task, "name": name, "exit": code, "shape": shape})
    (out / "report.json").write_text(json.dumps(report))
''')


@pytest.mark.slow
def test_the_installed_wheel_samples_every_shipped_preset_and_task(target, tmp_path):
    """From a working directory outside the checkout, with only the installed copy importable: every package
    resolves under the target folder, ``python -m vgrpo_lib.benchmarks.cli sample`` runs, and so does ``vgrpo
    sample`` for every testbed task, every MNIST-SD3 task (both shipped pipelines) and every shipped preset."""
    python, env = installed_python(target)
    work = tmp_path / "elsewhere"
    work.mkdir()
    first = run([*python, "-m", "vgrpo_lib.benchmarks.cli", "sample", "--task", "digit", "--per-prompt", "1",
                 "--steps", "2", "--seed", "0", "--out", "digit.npz"], cwd=work, env=env)
    assert "wrote images" in first.stdout and (work / "digit.npz").exists()

    script = work / "sample_everything.py"
    script.write_text(SAMPLE_EVERYTHING)
    packages = sorted(pyproject()["tool"]["setuptools"]["packages"])
    run([*python, str(script), json.dumps(packages), str(work)], cwd=work, env=env)
    report = json.loads((work / "report.json").read_text())

    for module, file in report["files"].items():
        assert Path(file).resolve().is_relative_to(target.resolve()), f"{module} was imported from {file}"
    # the only tasks not sampled here (their weights are not shipped)
    assert set(report["hub"]) <= {"sd3.5-medium", "flux.1-dev", "flux.2-dev", "flux.2-klein", "qwen-image",
                                  "wan2.1-t2v"}, report["hub"]
    failed = [r for r in report["runs"] if r["exit"] != 0 or not r["shape"] or r["shape"][0] < 1]
    assert not failed, failed
    sampled = {(r["preset"], r["task"]) for r in report["runs"]}
    assert {("testbed", task) for task in TESTBED_TASKS} <= sampled
    assert {("mnist-sd3", task) for task in PIPELINE_TASKS} <= sampled
    assert {r["preset"] for r in report["runs"]} >= {"testbed", "official", "mnist-sd3", "official-mnist-sd3"}
