"""Wall-clock of each protocol comparison whose runs' tables are kept: from its first run's config.json to its
summary.json (file times; a git checkout resets them, so run this on the machine that made the runs).

    python results/protocol_wall_times.py > results/protocol_wall_times.txt
"""
import datetime
import os
from pathlib import Path

for folder in sorted(Path(__file__).parent.glob("protocol-*/")):
    if not (folder / "runs").is_dir() or not (folder / "summary.json").exists():
        continue
    start = min(os.path.getmtime(run / "config.json") for run in (folder / "runs").iterdir())
    end = os.path.getmtime(folder / "summary.json")
    clock = [datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%H:%M:%S") for t in (start, end)]
    print(f"{folder.name}: {(end - start) / 60:.0f} min ({clock[0]} to {clock[1]} UTC)")
