"""mkdocs hook: reference pages generated from the code at build time, so they cannot drift from it.

- ``<!-- vgrpo-cli -->`` becomes one section per ``vgrpo`` command with its ``--help`` (every flag, its choices and
  default), read from the same parser the console command uses (:func:`vgrpo_lib.benchmarks.cli.make_parser`).
- ``<!-- api-modules: FOLDER [except=SUBFOLDER,...] -->`` becomes a mkdocstrings block (``::: vgrpo_lib.x.y``) for every
  public module in the repository folder FOLDER and its sub-packages (a module whose name starts with ``_`` is
  private), leaving out the sub-folders named after ``except=``.
- ``<!-- module-list: FOLDER -->`` becomes a table of the public modules of FOLDER with the first line of each
  docstring (read from the source, nothing imported): for folders of scripts run with ``python -m``.
- ``<!-- tutorials-table -->`` becomes one row per tutorial page that embeds a script of ``docs/examples/`` (its
  title, the script, the first line of the script's docstring), so a new tutorial is listed once it has a page.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The repository folder of each installed package (pyproject.toml's package-dir mapping).
IMPORT_PREFIX = {"vgrpo_lib": "vgrpo_lib", "algorithms": "vgrpo_lib.algorithms",
                 "integrations": "vgrpo_lib.integrations", "benchmarks": "vgrpo_lib.benchmarks"}
API_MARKER = re.compile(r"<!-- api-modules: (\S+)(?: except=(\S+))? -->")
LIST_MARKER = re.compile(r"<!-- module-list: (\S+) -->")
CLI_MARKER = "<!-- vgrpo-cli -->"
TUTORIALS_MARKER = "<!-- tutorials-table -->"
EMBED = re.compile(r'--8<-- "([\w.-]+\.py)"')


def import_name(folder: str) -> str:
    """The import name of a repository folder (``integrations/rewards`` -> ``vgrpo_lib.integrations.rewards``)."""
    top, _, rest = folder.partition("/")
    return ".".join([IMPORT_PREFIX[top], *filter(None, rest.split("/"))])


def public_modules(folder: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """Import names of the public modules under the repository folder ``folder`` (e.g. ``integrations/rewards``),
    without those under the folders ``exclude``."""
    left_out = tuple(import_name(sub) for sub in exclude)
    return [name for name in _all_public_modules(folder)
            if not any(name == out or name.startswith(out + ".") for out in left_out)]


def _all_public_modules(folder: str) -> list[str]:
    prefix = import_name(folder)
    base = ROOT / folder
    names = [prefix] if (base / "__init__.py").exists() else []
    for path in sorted(base.rglob("*.py")):
        relative = path.relative_to(base)
        if any(part.startswith(("_", ".")) for part in relative.parts if part != "__init__.py"):
            continue
        if not all((base / Path(*relative.parts[:i]) / "__init__.py").exists() for i in range(len(relative.parts))):
            continue  # a folder of data or scripts, not a package
        parts = relative.with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join([prefix, *parts])
        if name not in names:
            names.append(name)
    return names


def cli_commands(parser) -> list[str]:
    """The sub-command names of ``parser``, in the order its usage line lists them (``{train,sample,...}``)."""
    match = re.search(r"\{([\w,-]+)\}", parser.format_usage())
    if match is None:
        raise ValueError("the vgrpo parser's usage line lists no sub-commands")
    return match.group(1).split(",")


def command_help(parser, command: str) -> str:
    """The ``--help`` text of one sub-command (as ``vgrpo COMMAND --help`` prints it)."""
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        parser.parse_args([command, "--help"])
    return buffer.getvalue()


def cli_markdown() -> str:
    """Every ``vgrpo`` command and flag, as markdown (the help texts in fenced blocks)."""
    from vgrpo_lib.benchmarks.cli import make_parser

    os.environ["COLUMNS"] = "110"  # a stable wrap width whatever the terminal that builds the site
    parser = make_parser()
    sections = ["## `vgrpo`", "", "```text", parser.format_help().rstrip(), "```", ""]
    for command in cli_commands(parser):
        sections += [f"## `vgrpo {command}`", "", "```text", command_help(parser, command).rstrip(), "```", ""]
    return "\n".join(sections)


def tutorials_table(tutorials: Path, examples: Path) -> str:
    """Markdown table rows: ``| [title](page.md) | `script.py` | summary |`` for every page embedding a script."""
    import ast

    rows = []
    for page in sorted(tutorials.glob("*.md")):
        text = page.read_text()
        for script in EMBED.findall(text):
            title = next(line[2:].strip() for line in text.splitlines() if line.startswith("# "))
            docstring = ast.get_docstring(ast.parse((examples / script).read_text())) or ""
            rows.append(f"| [{title}]({page.name}) | `{script}` | {docstring.splitlines()[0] if docstring else ''} |")
    return "\n".join(rows)


def module_table(folder: str) -> str:
    """``| module | what it does |`` for the public modules of ``folder``, from their docstrings' first lines."""
    import ast

    rows = ["| module | what it does |", "|---|---|"]
    prefix = import_name(folder)
    for name in _all_public_modules(folder):
        if name == prefix:
            continue
        path = ROOT / folder / Path(*name[len(prefix) + 1:].split(".")).with_suffix(".py")
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        summary = docstring.split("\n\n")[0].replace("\n", " ")
        summary = summary.replace("|", "\\|").replace("[", "\\[")  # table cells; no link syntax
        rows.append(f"| `{name}` | {summary} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_markdown())
    if TUTORIALS_MARKER in markdown:
        docs = Path(config.docs_dir)
        markdown = markdown.replace(TUTORIALS_MARKER, tutorials_table(docs / "tutorials", docs / "examples"))
    markdown = LIST_MARKER.sub(lambda m: module_table(m.group(1)), markdown)
    return API_MARKER.sub(lambda m: "\n\n".join(
        f"::: {name}" for name in public_modules(m.group(1), tuple(filter(None, (m.group(2) or "").split(","))))),
        markdown)
