"""The documentation: the site builds with --strict, every tutorial script runs, the README stays short and its
test command is CI's."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLES = sorted((ROOT / "docs" / "examples").glob("*.py"))
# Scripts that take tens of seconds on a loaded two-core machine (a trainer run, a diffusers pipeline, torchrun);
# the rest take seconds. `-m "not slow"` leaves these out; CI runs everything.
SLOW_EXAMPLES = {"custom_task.py", "hub_lora_export.py", "torchrun_scale_out.py", "property_tests_own_estimator.py"}
SCRIPT_TIMEOUT_S = 600  # generous: a loaded two-core machine; the scripts take seconds to a minute alone
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
PLACEHOLDER = re.compile(r"\.\.\.|(?<![A-Za-z])(TASK|DIR|OUT|NAME|FOLDER|SEED|ALGO|PRESET)(?![A-Za-z])")  # patterns
MISSING_DOCS_MODULES = [name for name in DOCS_MODULES if importlib.util.find_spec(name.split(".")[0]) is None
                        or importlib.util.find_spec(name) is None]


def _indented_commands(text: str) -> list[str]:
    """The README's indented (4-space) command lines, in order."""
    return [line.strip() for line in text.splitlines() if line.startswith("    ") and line.strip()]


def _ci_test_command() -> str:
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#") and "pytest" in line]
    assert len(commands) == 1, f".ci/run should hold exactly one pytest command line, found {commands}"
    return commands[0]


@pytest.mark.slow
@pytest.mark.skipif(bool(MISSING_DOCS_MODULES),
                    reason=f"the docs extra is not installed (missing {MISSING_DOCS_MODULES}): "
                           "pip install -e '.[docs]'; CI installs it")
def test_the_site_builds_with_strict_and_generates_its_reference_pages(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                            cwd=ROOT, capture_output=True, text=True, timeout=900,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in ("train", "sample", "eval", "export", "compress", "compare", "estimators", "ablations"):
        assert f'id="vgrpo-{command}"' in cli, f"the CLI reference has no section for `vgrpo {command}`"
    api = (site / "reference" / "api" / "algorithms" / "index.html").read_text()
    assert 'id="vgrpo_lib.algorithms.trainer.Trainer"' in api, "the API reference does not document Trainer"
    tutorials = (site / "tutorials" / "index.html").read_text()
    for script in EXAMPLES:
        assert script.name in tutorials, f"docs/examples/{script.name} has no tutorial page embedding it"


@pytest.mark.parametrize("script", [pytest.param(path, marks=[pytest.mark.slow] if path.name in SLOW_EXAMPLES else [])
                                    for path in EXAMPLES], ids=[path.name for path in EXAMPLES])
def test_every_tutorial_script_runs(script):
    pythonpath = os.pathsep.join(filter(None, [str(ROOT / "docs" / "examples"), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                            timeout=SCRIPT_TIMEOUT_S, env={**os.environ, "PYTHONPATH": pythonpath})
    assert result.returncode == 0, f"{script.name} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"


def test_there_are_tutorial_scripts():
    assert EXAMPLES, "docs/examples/ holds no tutorial script"


def test_readme_is_short_and_opens_with_the_two_commands():
    size = README.stat().st_size
    assert size < 20_000, f"README.md is {size} bytes; keep it under 20 KB and move the rest into docs/"
    first, second = _indented_commands(README.read_text())[:2]
    assert first.startswith("pip install") and "vgrpo train" in first, first
    assert second.startswith("pip install") and "pytest" in second, second
    before = README.read_text().split(first)[0]
    assert "##" not in before, "the README's first section should be the two commands"


def test_readme_test_command_is_the_one_ci_runs():
    second = [line for line in _indented_commands(README.read_text()) if "pytest" in line][0]
    assert second == _ci_test_command(), "README.md's test command and .ci/run differ: keep them in sync"


def test_every_path_the_docs_cite_exists():
    """Pages cite raw files and code as code paths (`results/...`, `algorithms/...`); a renamed, moved or pruned
    file or folder must not leave them dangling."""
    cited = re.compile(r"`((?:results|algorithms|integrations|benchmarks|vgrpo_lib|tests|docs)/[^`\s*{}<>:]+?)`")
    missing = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for path in cited.findall(page.read_text()):
            if PLACEHOLDER.search(path):  # results/protocol-TASK/, results/...: a pattern, not a path
                continue
            if not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "cited paths that do not exist:\n" + "\n".join(missing)


def test_every_module_the_docs_run_exists():
    """`python -m vgrpo_lib...` in the pages names a module that is installed (moved scripts must be re-pointed)."""
    missing = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for module in sorted(set(re.findall(r"python -m (vgrpo_lib(?:\.[a-z_0-9]+)+)", page.read_text()))):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{page.relative_to(ROOT)}: {module}")
    assert not missing, "modules the docs run that do not exist:\n" + "\n".join(missing)
