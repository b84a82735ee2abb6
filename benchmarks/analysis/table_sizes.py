"""Bytes of the kept runs' tables as stored (gzip, `vgrpo compress`) and as read back, per comparison (the tables
alone: not the runs' compressed ``config.json.gz``).

    python -m vgrpo_lib.benchmarks.analysis.table_sizes > results/table_sizes.txt
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

from vgrpo_lib.algorithms.run_dir import COMPRESSED_SUFFIX, TABLES
from vgrpo_lib.benchmarks.analysis import results_parser

__all__ = ["main", "table_sizes"]


def table_sizes(results: Path) -> str:
    """One line per comparison under ``results`` with compressed run tables: their count and bytes, read back and
    stored."""
    lines = []
    for comparison in sorted(p.parent for p in results.glob("*/runs")):
        packed = [path for name in TABLES for path in comparison.glob(f"runs/*/{name}{COMPRESSED_SUFFIX}")]
        stored, plain = sum(p.stat().st_size for p in packed), sum(len(gzip.decompress(p.read_bytes())) for p in packed)
        if packed:
            lines.append(f"{comparison.name:<34} {len(packed):>4} tables  {plain / 1e6:6.2f} MB -> {stored / 1e6:5.2f} MB  "
                         f"({stored / plain:.2f})")
    return "".join(line + "\n" for line in lines)


def main(argv: list[str] | None = None) -> int:
    args = results_parser(__doc__).parse_args(argv)
    sys.stdout.write(table_sizes(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
