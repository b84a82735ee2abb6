"""Bytes of the kept runs' tables as stored (gzip, `vgrpo compress`) and as read back, per comparison.

    python results/table_sizes.py > results/table_sizes.txt
"""
import gzip
from pathlib import Path

for comparison in sorted(p.parent for p in Path(__file__).parent.glob("*/runs")):
    packed = list(comparison.glob("runs/*/*.gz"))
    stored, plain = sum(p.stat().st_size for p in packed), sum(len(gzip.decompress(p.read_bytes())) for p in packed)
    if packed:
        print(f"{comparison.name:<34} {len(packed):>4} tables  {plain / 1e6:6.2f} MB -> {stored / 1e6:5.2f} MB  ({stored / plain:.2f})")
