"""The public API: what ``vgrpo_lib`` exports, its version, and a docstring on every public class and function."""

import ast
import importlib
import inspect
import pkgutil
import re
import tomllib
from pathlib import Path

import vgrpo_lib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vgrpo_lib", "vgrpo_lib.algorithms")


def public_modules():
    for package in PACKAGES:
        module = importlib.import_module(package)
        yield module
        for info in pkgutil.iter_modules(module.__path__):
            if not info.name.startswith("_"):
                yield importlib.import_module(f"{package}.{info.name}")


def undocumented(obj) -> bool:
    """A class needs its own docstring (not its base's); a method may inherit the one of the method it overrides."""
    doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
    # A dataclass without a docstring gets its signature as __doc__: "Name(field: type = ...)".
    return not doc or (inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("))


def test_every_public_class_and_function_has_a_docstring():
    missing = []
    for module in public_modules():
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                if undocumented(obj):
                    missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(obj):
                for method_name, method in vars(obj).items():
                    # inspect.getdoc falls back to the overridden base method's docstring
                    if not method_name.startswith("_") and inspect.isfunction(method) and undocumented(getattr(obj, method_name)):
                        missing.append(f"{module.__name__}.{name}.{method_name}")
    assert not missing, f"no docstring: {', '.join(missing)}"


def test_the_package_exports_the_timesteps_control_and_objectives_pieces():
    from vgrpo_lib import control, objectives, timesteps

    for module, names in (
        (timesteps, ["Uniform", "LogitNormal", "Shifted", "DiscreteGrid", "GridSubset", "PiecewiseDensity",
                     "make_timestep_sampler"]),
        (control, ["Constant", "Linear", "Cosine", "Piecewise", "Warmup", "AdaptiveKLController", "OldPolicyDecay",
                   "SDEWindow", "exceeds_kl", "set_learning_rate", "ema_update_"]),
        (objectives, ["clipped_ratio_objective", "clip_fraction", "clip_fraction_active", "soft_clip", "kl_estimate",
                      "x_space_kl", "gaussian_kl_same_std", "ratio_diagnostics", "nft_optimality"]),
    ):
        for name in names:
            assert getattr(vgrpo_lib, name) is getattr(module, name), name
            assert name in vgrpo_lib.__all__, name
    assert all(hasattr(vgrpo_lib, name) for name in vgrpo_lib.__all__)


def test_the_version_has_one_source():
    """pyproject.toml reads the version from vgrpo_lib.__version__ (setuptools' dynamic attr), nowhere else."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vgrpo_lib.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", vgrpo_lib.__version__)


def test_every_core_module_declares_its_public_names():
    """Every public module of the core has an ``__all__`` whose names exist, and it lists every public class and
    function the module defines (so a new one cannot slip out of the documented API)."""
    for info in pkgutil.iter_modules(vgrpo_lib.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"vgrpo_lib.{info.name}")
        assert hasattr(module, "__all__"), f"vgrpo_lib.{info.name} has no __all__"
        assert all(hasattr(module, name) for name in module.__all__), info.name
        defined = {name for name, obj in vars(module).items()
                   if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
                   and obj.__module__ == module.__name__}
        assert defined <= set(module.__all__), f"vgrpo_lib.{info.name}: not in __all__: {sorted(defined - set(module.__all__))}"


def test_the_samplers_type_the_model_contract():
    import typing

    from vgrpo_lib import protocols, samplers

    for sampler in (samplers.sample_euler, samplers.sample_heun, samplers.sample_dpmpp_2m, samplers.sample_ode,
                    samplers.sample_sde):
        hints = typing.get_type_hints(sampler)
        assert hints["model"] is protocols.VelocityModel, sampler.__name__
        assert "cond" in hints, sampler.__name__


def _top_level_bindings(tree: ast.Module) -> tuple[set[str], set[str], list[str] | None]:
    """(every name bound at the top level, the public classes and functions defined there, ``__all__`` or None)."""
    bound, defined, exported = set(), set(), None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            if not node.name.startswith("_"):
                defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    bound.add(target.id)
                    if target.id == "__all__":
                        exported = list(ast.literal_eval(node.value))
    return bound, defined, exported


def test_every_module_of_every_layer_declares_its_public_names():
    """Read from the source (no import): every public module of algorithms/, integrations/ and benchmarks/ that
    defines a public class or function has an ``__all__`` listing each of them, and every listed name is bound."""
    problems = []
    for layer in ("algorithms", "integrations", "benchmarks"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            if path.name.startswith("_") and path.name != "__init__.py":
                continue
            bound, defined, exported = _top_level_bindings(ast.parse(path.read_text()))
            where = path.relative_to(ROOT)
            if exported is None:
                if defined:
                    problems.append(f"{where}: no __all__")
                continue
            if defined - set(exported):
                problems.append(f"{where}: not in __all__: {sorted(defined - set(exported))}")
            if set(exported) - bound:
                problems.append(f"{where}: __all__ names what it does not define: {sorted(set(exported) - bound)}")
    assert not problems, "\n".join(problems)


def test_every_public_parameter_of_the_core_is_typed():
    """Every parameter of every public function, method-less class constructor and class of the core's ``__all__``
    carries a type hint (the samplers' ``model`` and ``cond``, a ``clip_range``, the loss terms' tensors)."""
    untyped = []
    for info in pkgutil.iter_modules(vgrpo_lib.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"vgrpo_lib.{info.name}")
        for name in module.__all__:
            obj = getattr(module, name)
            function = obj.__init__ if inspect.isclass(obj) else obj
            if not inspect.isfunction(function) or getattr(obj, "__module__", None) != module.__name__:
                continue
            for parameter in inspect.signature(inspect.unwrap(function)).parameters.values():
                if parameter.name not in ("self", "cls") and parameter.kind not in (parameter.VAR_POSITIONAL,
                                                                                    parameter.VAR_KEYWORD):
                    if parameter.annotation is inspect.Parameter.empty:
                        untyped.append(f"vgrpo_lib.{info.name}.{name}({parameter.name})")
    assert not untyped, f"untyped public parameters: {', '.join(untyped)}"
