"""The layers' import rules, read from the source (ast, nothing imported): benchmarks -> algorithms -> integrations ->
vgrpo_lib core, the hub adapters apart from the testbed, no import cycles, one installed name.

- the diffusers adapters never import the embedded testbed (task assembly, which may import both, lives in
  ``integrations/tasks``);
- the core (``vgrpo_lib/*.py``) imports none of the three upper layers, nor diffusers / transformers;
- no two modules import each other, directly or through others, at module level (imports inside functions and under
  ``if TYPE_CHECKING:`` do not run at import time and are left out);
- no source file imports the bare folder names ``algorithms`` / ``integrations`` / ``benchmarks``: they install as
  ``vgrpo_lib.algorithms`` / ``vgrpo_lib.integrations`` / ``vgrpo_lib.benchmarks``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = {"vgrpo_lib": "vgrpo_lib", "algorithms": "vgrpo_lib.algorithms", "integrations": "vgrpo_lib.integrations",
          "benchmarks": "vgrpo_lib.benchmarks"}
"""Repository folder -> installed package name (pyproject's package-dir)."""
UPPER = ("vgrpo_lib.algorithms", "vgrpo_lib.integrations", "vgrpo_lib.benchmarks")
BARE = ("algorithms", "integrations", "benchmarks")
SKIPPED_DIRS = {".git", "build", "dist", "site", "node_modules", "__pycache__"}


def _library_modules() -> dict[str, Path]:
    """Installed module name -> source file, for every module of the four layers."""
    modules = {}
    for folder, package in LAYERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


MODULES = _library_modules()


def _source_files() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.py")
                  if not SKIPPED_DIRS.intersection(p.relative_to(REPO).parts[:-1])
                  and not any(part.endswith(".egg-info") or part.startswith(".") for part in p.relative_to(REPO).parts))


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> list[str]:
    """The modules ``node`` imports (``from a import b``: ``a.b`` when that is a module of the layers, else ``a``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = _package_of(module, path).split(".")
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: top level, inside top-level if/try/with blocks (not under
    ``if TYPE_CHECKING:``), never inside functions or classes."""
    found, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            pending += ([] if _is_type_checking(node) else node.body) + node.orelse
        elif isinstance(node, (ast.Try, ast.With)):
            pending += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
    return found


def _all_imports(module: str, path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _imported(node, module, path)]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_layers_are_found():
    assert {"vgrpo_lib.elbo", "vgrpo_lib.algorithms.trainer", "vgrpo_lib.integrations.tasks.registry",
            "vgrpo_lib.integrations.diffusers_adapters.lora", "vgrpo_lib.benchmarks.cli"} <= set(MODULES)


def test_the_diffusers_adapters_never_import_the_testbed():
    adapters = [m for m in MODULES if _within(m, "vgrpo_lib.integrations.diffusers_adapters")]
    assert adapters
    found = [f"{m} imports {name}" for m in adapters for name in _all_imports(m, MODULES[m])
             if _within(name, "vgrpo_lib.integrations.testbed")]
    assert found == []


def test_the_core_imports_no_upper_layer_and_no_diffusers():
    core = [m for m, path in MODULES.items() if path.parent == REPO / "vgrpo_lib"]
    assert "vgrpo_lib.elbo" in core
    found = [f"{m} imports {name}" for m in core for name in _all_imports(m, MODULES[m])
             if any(_within(name, upper) for upper in (*UPPER, *BARE, "diffusers", "transformers"))]
    assert found == []


def _import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = {name for node in _module_level_imports(tree) for name in _imported(node, module, path)}
        graph[module] = {name for name in targets if name in MODULES and name != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules():
    assert _cycles(_import_graph()) == []


@pytest.mark.parametrize("path", _source_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_source_file_imports_the_bare_folder_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    bare = [ast.unparse(node) for node in ast.walk(tree)
            if (isinstance(node, ast.Import) and any(a.name.split(".")[0] in BARE for a in node.names))
            or (isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in BARE)]
    assert bare == [], f"import them as vgrpo_lib.<layer>: {bare}"
