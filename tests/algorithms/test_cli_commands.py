"""The public seam through which another layer adds ``vgrpo`` subcommands (``make_parser(extra_commands=...)``)."""

import argparse
import inspect

import pytest

from vgrpo_lib.algorithms import cli as training_cli
from vgrpo_lib.algorithms.cli import Command, make_parser, run


def _greet_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True)


def test_an_extra_command_parses_and_runs(capsys):
    greet = Command("greet", "say hello", _greet_arguments, lambda args: print(f"hello {args.name}") or 7)
    parser = make_parser(extra_commands=[greet])
    assert run(parser, ["greet", "--name", "ada"]) == 7
    assert capsys.readouterr().out == "hello ada\n"
    assert "say hello" in parser.format_help()


def test_a_taken_command_name_is_refused():
    clash = Command("train", "a second train", _greet_arguments, lambda args: 0)
    with pytest.raises(ValueError, match="'train'"):
        make_parser(extra_commands=[clash])


def test_the_benchmarks_use_the_public_seam():
    from vgrpo_lib.benchmarks import cli as benchmark_cli

    names = {command.name for command in benchmark_cli.BENCHMARK_COMMANDS}
    assert names == {"compare", "estimators", "ablations", "levers", "reward-server"}
    assert "_actions" not in inspect.getsource(benchmark_cli)
    parser = benchmark_cli.make_parser()
    args = parser.parse_args(["compare", "--out", "x", "--quick"])
    assert args.handler is not None and args.quick
    assert training_cli.make_parser().parse_args(["compress", "x"]).command == "compress"
