"""The ``vgrpo`` console command: the training commands of :mod:`vgrpo_lib.algorithms.cli` plus the benchmarks.

    vgrpo compare [--preset mnist-sd3] [--quick] [--seeds N] [--task digit] [--variants A B ...] --out DIR
                                                                      the controlled comparison
    vgrpo estimators [--preset mnist-sd3] [--quick] [--task digit] --out DIR   the estimator lab (+ ground truth)
    vgrpo estimators --recommend [--task digit] --out DIR [key=value ...]
                                                                      a pilot that picks sharing and K before training
    vgrpo ablations [--preset mnist-sd3] [--set paper|regime] [--seeds N] [--quick] --out DIR
                                                                      training-level ablations / regime map
    vgrpo levers --comparison DIR [--variant vgrpo] [--levers L ...] [--combine L1+L2 ...] --out OUT
                                                                      levers on a comparison's chosen setting
    vgrpo reward-server --reward NAME [--host H] [--port P] [--max-batch N] [--device D]
                                                                      a reward served over HTTP (model.reward=URL)

``--preset`` (default ``testbed``) picks the model the benchmark runs on: the MLP testbed, or a pipeline preset
(``mnist-sd3``: the shipped MNIST-SD3 pipeline through the hub path), whose tasks ``--task`` names by their short
names (``--preset mnist-sd3 --task ocr``).

The benchmarks sit on top of the algorithms layer, so the command is assembled here.
"""

from __future__ import annotations

import argparse
import sys

from vgrpo_lib.algorithms import cli as training_cli
from vgrpo_lib.algorithms.cli import Command
from vgrpo_lib.algorithms.presets import PIPELINES
from vgrpo_lib.benchmarks.compare import SELECTIONS
from vgrpo_lib.integrations.rewards.server import add_server_arguments, run_server

__all__ = ["BENCHMARK_COMMANDS", "main", "make_parser"]


def _compare(args) -> int:
    from vgrpo_lib.benchmarks.compare import run_compare

    kwargs = {} if args.variants is None else {"variants": tuple(args.variants)}
    if args.learning_rates is not None:
        kwargs["learning_rates"] = tuple(args.learning_rates)
    summary = run_compare(args.out, task=args.task, seeds=args.seeds, quick=args.quick, overrides=args.overrides,
                          iterations=args.iterations, pipeline=_pipeline(args.preset), select=args.select,
                          tuning_seeds=args.tuning_seeds, nfe_budget=args.nfe_budget, lr_decay=args.lr_decay,
                          **kwargs)
    print(open(f"{args.out}/summary.md").read())
    return 0 if summary else 1


def _estimators(args) -> int:
    if args.recommend:
        from vgrpo_lib.benchmarks.estimator_rule import run_pilot

        report = run_pilot(args.out, task=args.task, preset=args.preset, overrides=args.overrides)
        for name in ("vgrpo", "vgrpo_without_sharing"):
            print(f"{name:<22} gradient cosine {report['mean'][name]['gradient_cosine']:.3f}")
        print("recommended:", " ".join(f"{key}={value}" for key, value in report["recommendation"].items()))
        return 0
    from vgrpo_lib.benchmarks.estimator_lab import run_lab

    run_lab(args.out, quick=args.quick, task=args.task, preset=args.preset, overrides=args.overrides)
    return 0


def _ablations(args) -> int:
    from vgrpo_lib.benchmarks.ablations import markdown, run_ablations

    report = run_ablations(args.out, which=args.set, seeds=args.seeds, quick=args.quick, task=args.task, cells=args.cells,
                           preset=args.preset, overrides=args.overrides)
    print(markdown(report))
    return 0


def _pipeline(preset: str) -> str | None:
    """The comparison's pipeline: None on the testbed (its variants' own presets), else the pipeline preset."""
    return None if preset == "testbed" else preset


BENCHMARK_PRESETS = ("testbed", *PIPELINES)


def _compare_arguments(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("--preset", choices=BENCHMARK_PRESETS, default="testbed", help="the model to compare on")
    compare.add_argument("--task", default="digit", help=training_cli.task_help())
    compare.add_argument("--seeds", type=int, default=5, help="reported seeds (at least 5 unless --quick)")
    compare.add_argument("--variants", nargs="+", default=None, help="algorithms to compare (vgrpo_lib.benchmarks.compare.VARIANTS)")
    compare.add_argument("--iterations", type=int, default=None, help="iterations per run (default 80, 30 with --quick)")
    compare.add_argument("--quick", action="store_true", help="a smoke test: 30 iterations, fewer seeds allowed")
    compare.add_argument("--nfe-budget", type=int, default=None, metavar="N",
                         help="instead of --iterations: the same compute for every setting, N model evaluations per "
                              "sample (each setting's iterations: N over its NFE per iteration, in protocol.json)")
    compare.add_argument("--lr-decay", type=float, default=None, metavar="F",
                         help="every setting's learning rate falls by a cosine to F times it over its own "
                              "iterations, tuning included (default: a constant rate)")
    compare.add_argument("--learning-rates", type=float, nargs="+", default=None, metavar="LR",
                         help="the tuning grid, the same for every algorithm (default: "
                              "vgrpo_lib.benchmarks.compare.LEARNING_RATES, 1e-4 3e-4 1e-3)")
    compare.add_argument("--select", choices=tuple(SELECTIONS), default="training",
                         help="the target whose time selects each algorithm's setting on the tuning seed(s)")
    compare.add_argument("--tuning-seeds", type=int, default=1, metavar="N",
                         help="tune every setting on N seeds (100, 101, ...) and select by all of them: fewest "
                              "misses of the target, then the median time (default 1, the protocol's first form)")
    compare.add_argument("--out", required=True)
    compare.add_argument("overrides", nargs="*", help="config overrides applied to every algorithm")


def _estimators_arguments(estimators: argparse.ArgumentParser) -> None:
    estimators.add_argument("--preset", choices=BENCHMARK_PRESETS, default="testbed", help="the model of the rollout")
    estimators.add_argument("--task", default="digit", help=training_cli.task_help())
    estimators.add_argument("--quick", action="store_true")
    estimators.add_argument("--recommend", action="store_true",
                            help="instead of the lab: a pilot on the base policy at the training batch shape that "
                                 "recommends vgrpo.sharing and vgrpo.num_pairs (vgrpo_lib.benchmarks.estimator_rule)")
    estimators.add_argument("--out", required=True)
    estimators.add_argument("overrides", nargs="*", help="config overrides of the rollout's task and model")


def _ablations_arguments(ablations: argparse.ArgumentParser) -> None:
    ablations.add_argument("--set", choices=("paper", "regime"), default="paper")
    ablations.add_argument("--preset", choices=BENCHMARK_PRESETS, default="testbed", help="the model of the paper set")
    ablations.add_argument("--task", default="digit", help=f"the paper set's task: {training_cli.task_help()}")
    ablations.add_argument("--seeds", type=int, default=2)
    ablations.add_argument("--quick", action="store_true")
    ablations.add_argument("--cells", nargs="+", default=None, help="run only these cells of the set (names as listed)")
    ablations.add_argument("--out", required=True)
    ablations.add_argument("overrides", nargs="*", help="config overrides applied to every run")


def _levers(args) -> int:
    from vgrpo_lib.benchmarks.levers import run_levers
    run_levers(args.comparison, args.out, variant=args.variant, cells=[*args.levers, *args.combine])
    print(f"wrote {args.out}/levers.json and levers.md")
    return 0


def _levers_arguments(levers: argparse.ArgumentParser) -> None:
    from vgrpo_lib.benchmarks.levers import BASELINE, BUDGET_LEVERS, DECAY_LEVERS, LEVERS
    levers.add_argument("--comparison", required=True, help="a finished `vgrpo compare` folder (its protocol, "
                                                            "summary and targets)")
    levers.add_argument("--variant", default="vgrpo", help="the comparison's algorithm whose chosen setting is changed")
    levers.add_argument("--levers", nargs="*", default=[],
                        help=f"levers, each alone: {', '.join(LEVERS)}; or a multiple of the comparison's iteration "
                             f"budget: {', '.join(BUDGET_LEVERS)}; or a decay of the chosen learning rate over the "
                             f"run: {', '.join(DECAY_LEVERS)}; or {BASELINE!r}, the unchanged setting trained "
                             f"again beside them (time ratios over it are read on one machine)")
    levers.add_argument("--combine", nargs="*", default=[], metavar="L1+L2",
                        help="levers together, joined by '+' (e.g. dpmpp_2m_6+ema_eval)")
    levers.add_argument("--out", required=True)


BENCHMARK_COMMANDS = (
    Command("compare", "V-GRPO against its baselines and peers, tuned alike, on one task", _compare_arguments, _compare),
    Command("estimators", "the estimator lab: noise of each surrogate design", _estimators_arguments, _estimators),
    Command("ablations", "training-level ablations (paper) or the regime map (regime)", _ablations_arguments,
            _ablations),
    Command("levers", "levers added to a finished comparison's chosen setting, alone and combined", _levers_arguments,
            _levers),
    Command("reward-server", "serve a reward over HTTP with dynamic batching (vgrpo_lib.integrations.rewards.server)",
            add_server_arguments, run_server),
)


def make_parser() -> argparse.ArgumentParser:
    """The ``vgrpo`` parser: the training commands and :data:`BENCHMARK_COMMANDS`."""
    return training_cli.make_parser(extra_commands=BENCHMARK_COMMANDS)


def main(argv: list[str] | None = None) -> int:
    return training_cli.run(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
