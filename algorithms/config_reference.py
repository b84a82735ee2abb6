"""The config reference: every key with its value, type, allowed values, help and the algorithms that read it.

What ``vgrpo config`` prints, read from the dataclasses of :mod:`vgrpo_lib.algorithms.config` (each field's
``setting(..., help=...)``); ``docs/reference/config.md`` is :func:`config_reference_markdown`, regenerated with
``vgrpo config --format markdown > docs/reference/config.md``::

    vgrpo config                                   every key of every algorithm, at its default
    vgrpo config --algo flow_grpo --preset official   the keys that run would use, with its values
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, fields
from typing import Any

from vgrpo_lib.algorithms.config import (
    ALGORITHMS, TrainConfig, _expected, _field_types, _walk, key_users,
)
from vgrpo_lib.algorithms.step_control import SCHEDULES

__all__ = ["FORMATS", "KeyInfo", "config_reference", "config_reference_markdown", "describe_config", "format_reference"]

FORMATS = ("text", "markdown", "json")


@dataclass(frozen=True)
class KeyInfo:
    """One config key: its dotted ``key``, the ``value`` the run would use, its ``default``, ``type`` and
    ``allowed`` values (as text), its ``help`` and the ``algorithms`` that read it."""

    key: str
    value: Any
    default: Any
    type: str
    allowed: str
    help: str
    algorithms: tuple[str, ...]


def _allowed(key: str, f: dataclasses.Field, tp) -> str:
    """The allowed values of a field as text: its choices, its rule, a bool's or a schedule's forms (``algo``: the
    algorithms, read from the sections after the dataclass is built)."""
    if key == "algo":
        return " | ".join(ALGORITHMS)
    if f.metadata.get("choices"):
        return " | ".join(f.metadata["choices"])
    if f.metadata.get("rule") is not None:
        return f.metadata["rule"].text
    if key == "schedule.reference_reset":
        return "kl=K (> 0) and/or every=N (>= 1)"
    if key == "vgrpo.adaptive_pairs":
        return "share=S (0 < S < 1),max=K (>= vgrpo.num_pairs >= 2) and optionally every=N (>= 1), smoothing=B (0 <= B < 1)"
    if key.startswith("schedule."):
        forms = [s for s in SCHEDULES if s != "adaptive" or key.endswith("kl_coef")]
        return " | ".join(forms) + " (with their parameters, see above)"
    return "true | false" if tp in (bool, bool | None) else ""


def _text(value) -> str:
    """A value as written on the command line (``none``, ``true``, ``0.01,0.02``)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def config_reference(config: TrainConfig | None = None) -> list[KeyInfo]:
    """Every key that the run of ``config`` would use (those of :meth:`TrainConfig.to_dict` that its algorithm
    reads) with its value; with ``None``, every key of every algorithm at its default (the full reference)."""
    shown = TrainConfig() if config is None else config
    used = None if config is None else _flatten(config.to_dict())
    infos = []
    for key, value, f in _walk(shown):
        if used is not None and (key not in used or config.algo not in key_users(key)):
            continue
        owner = TrainConfig if "." not in key else type(getattr(shown, key.split(".")[0]))
        tp = _field_types(owner)[f.name]
        infos.append(KeyInfo(key, value, f.default, _expected(tp), _allowed(key, f, tp), f.metadata.get("help", ""),
                             key_users(key)))
    return infos


def _flatten(data: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in data.items():
        keys |= _flatten(value, f"{prefix}{name}.") if isinstance(value, dict) else {prefix + name}
    return keys


def _users_text(algorithms: tuple[str, ...]) -> str:
    return "all" if set(algorithms) == set(ALGORITHMS) else ", ".join(algorithms)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def _section_docs() -> dict[str, str]:
    """Each section's name -> the first paragraph of its class docstring (top-level keys: TrainConfig's)."""
    docs = {"": TrainConfig.__doc__}
    for f in fields(TrainConfig):
        tp = _field_types(TrainConfig)[f.name]
        if dataclasses.is_dataclass(tp):
            docs[f.name] = tp.__doc__
    return {name: _markdown(" ".join((doc or "").split("\n\n")[0].split())) for name, doc in docs.items()}


def _markdown(text: str) -> str:
    """A docstring's reStructuredText roles and literals as markdown code: ``:class:`X``` and ````x```` -> ```x```."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def format_reference(infos: list[KeyInfo], fmt: str = "text", title: str = "Config reference", intro: str = "",
                     value_column: str = "default") -> str:
    """``infos`` as ``text`` (one block per key), ``markdown`` (a ``title`` and ``intro``, then one table per
    section) or ``json`` (a list of objects with the fields of :class:`KeyInfo`)."""
    if fmt == "json":
        rows = [{**dataclasses.asdict(info), "value": _jsonable(info.value), "default": _jsonable(info.default),
                 "algorithms": list(info.algorithms)} for info in infos]
        return json.dumps(rows, indent=2)
    if fmt == "text":
        blocks = [f"{info.key} = {_text(info.value)}    ({info.type}; {info.allowed or 'any'}; "
                  f"algorithms: {_users_text(info.algorithms)})\n    {info.help}" for info in infos]
        return "\n".join([title, ""] + blocks)
    if fmt != "markdown":
        raise ValueError(f"Unknown format {fmt!r}; expected one of {', '.join(FORMATS)}.")
    docs, lines = _section_docs(), [f"# {title}", ""] + ([intro, ""] if intro else [])
    by_section: dict[str, list[KeyInfo]] = {}
    for info in infos:
        by_section.setdefault(info.key.rpartition(".")[0], []).append(info)
    for section, rows in by_section.items():
        lines += [f"## `{section}`" if section else "## Top level", "", docs.get(section, ""), ""]
        lines += [f"| key | {value_column} | type | allowed | algorithms | help |", "|---|---|---|---|---|---|"]
        lines += [f"| `{info.key}` | `{_text(info.value)}` | {_cell(info.type)} | {_cell(info.allowed)} | "
                  f"{_users_text(info.algorithms)} | {_cell(info.help)} |" for info in rows]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


REFERENCE_HEADER = (
    "Every key of `vgrpo train` (`key=value` overrides, `config.json`), generated from the code by "
    "`vgrpo config --format markdown > docs/reference/config.md` (a test keeps it in sync). `vgrpo config --algo A "
    "--preset P` lists the keys one run would use with its values. Defaults are the dataclasses' (a preset changes "
    "some: `vgrpo config --algo diffusion_nft --preset official`). A key of another algorithm's section, or one the "
    "chosen algorithm ignores, is refused."
)


def describe_config(config: TrainConfig | None = None, fmt: str = "text") -> str:
    """What ``vgrpo config`` prints: the keys of ``config``'s run (None: every key of every algorithm, at its
    default) in the format ``fmt``."""
    if config is None:
        return format_reference(config_reference(), fmt, intro=REFERENCE_HEADER)
    return format_reference(config_reference(config), fmt, title=f"Config of a {config.algo} run on {config.task}",
                            value_column="value")


def config_reference_markdown() -> str:
    """``docs/reference/config.md``: every key of every algorithm, one markdown table per section (what
    ``vgrpo config --format markdown`` prints)."""
    return describe_config(None, "markdown")
