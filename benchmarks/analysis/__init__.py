"""The analyses behind the numbers in ``results/``: each module reads raw files that a benchmark or a run wrote there
and prints the table or text that ``results/`` keeps beside them, runnable as ``python -m
vgrpo_lib.benchmarks.analysis.NAME [ARGS] > results/...`` from the repository root (``results/README.md`` and each
study's README name the command of every kept output). The modules that read only committed raw data have a
function returning their text, which the test suite runs on the committed raw files and compares with the committed
output.

Reports on committed raw data (tested): :mod:`.first_iteration_rewards`, :mod:`.heldout_selection`,
:mod:`.kept_selection`, :mod:`.table_sizes`, :mod:`.repeat_check`, :mod:`.gpu_geneval_summary`, :mod:`.cpu_vs_gpu`,
:mod:`.main_job_phases`, :mod:`.geneval_table`, :mod:`.training_speed`, :mod:`.iteration_budget`, :mod:`.sampler_gap`,
:mod:`.heldout_curves`, :mod:`.phrasing_gap`. Reports on the file times of the machine that made the runs (a git
checkout resets them, so they reproduce only there): :mod:`.protocol_wall_times`, :mod:`.comparison_gaps`. Runs and probes that train or
sample (minutes to hours on CPU; their logs are the record): :mod:`.ema_check`, :mod:`.gpu_geneval_train_one`,
:mod:`.reading_control`, and the pilots and probes that made the shipped MNIST-SD3 pipelines (``mnist_sd3_*``,
``geneval_pipeline_*``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import read_stored_text
from vgrpo_lib.benchmarks.compare.stats import first_heldout_evaluation

__all__ = ["RESULTS", "first_heldout_iteration", "heldout_comparisons", "results_parser", "study_parser"]

RESULTS = Path("results")  # the repository's results/ folder, from the repository root


def results_parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser with ``--results DIR`` (default ``results``, the folder the analysis reads)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results/ folder (default: ./results)")
    return parser


def study_parser(doc: str | None, folder_help: str) -> argparse.ArgumentParser:
    """An argument parser for a study read against a comparison: the study's ``folder`` (``folder_help`` says what
    its ``runs/`` hold) and ``--comparison DIR``, whose targets the report reads."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help=folder_help)
    parser.add_argument("--comparison", type=Path, required=True, help="the comparison whose targets are read")
    return parser


def first_heldout_iteration(evaluations: list[dict], target: float) -> str:
    """The iteration at which the protocol's held-out clock stops on ``evaluations``
    (:func:`~vgrpo_lib.benchmarks.compare.stats.first_heldout_evaluation`), or ``never``: as the reports print it."""
    first = first_heldout_evaluation(evaluations, target)
    return "never" if first is None else str(first["iteration"])


def heldout_comparisons(results: Path) -> Iterator[tuple[Path, dict]]:
    """``(path, summary)`` of every comparison in ``results`` (``*/summary.json`` or its compressed copy), in name
    order, whose summary holds the held-out target and the tuning rows; the others were kept without their runs'
    evaluations or made before the protocol had them."""
    for summary_path in sorted({path.parent / "summary.json" for path in results.glob("*/summary.json*")}):
        summary = json.loads(read_stored_text(summary_path))
        if "heldout" in summary.get("protocol", {}) and "tuning" in summary:
            yield summary_path, summary
