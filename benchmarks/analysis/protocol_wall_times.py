"""Wall-clock of each protocol comparison whose runs' tables are kept: from its first run's config.json to its
summary.json (either, or its compressed copy, which keeps its time; file times: a git checkout resets them, so run
this on the machine that made the runs).

    python -m vgrpo_lib.benchmarks.analysis.protocol_wall_times > results/protocol_wall_times.txt
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import RunDir, stored_path
from vgrpo_lib.benchmarks.analysis import results_parser

__all__ = ["main", "protocol_wall_times"]


def protocol_wall_times(results: Path) -> str:
    """One line per ``results/protocol-*/`` folder with runs and a summary: minutes from the first run's start to
    the summary, and the UTC clock times of both."""
    lines = []
    for folder in sorted(results.glob("protocol-*/")):
        summary = stored_path(folder / "summary.json")
        if not (folder / "runs").is_dir() or not summary.exists():
            continue
        start = min(os.path.getmtime(RunDir(run).stored_config_path) for run in (folder / "runs").iterdir())
        end = os.path.getmtime(summary)
        clock = [datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%S") for t in (start, end)]
        lines.append(f"{folder.name}: {(end - start) / 60:.0f} min ({clock[0]} to {clock[1]} UTC)")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(protocol_wall_times(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
