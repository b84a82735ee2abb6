#!/bin/bash
# The README's first fresh-machine command, timed step by step in a new virtual environment with pip's cache off.
set -e
rm -rf /tmp/timing/venv1 /tmp/timing/fresh && mkdir -p /tmp/timing/fresh
cd "${REPO:-$PWD}" && git archive HEAD | tar -x -C /tmp/timing/fresh
cd /tmp/timing/fresh
python -m venv /tmp/timing/venv1
source /tmp/timing/venv1/bin/activate
echo "$(date -u +%T) load: $(cat /proc/loadavg)"
start=$(date +%s)
pip install --no-cache-dir -q torch==2.13.0 2>/dev/null
echo "$(date -u +%T) pip install torch==2.13.0: $(( $(date +%s) - start )) s; load: $(cat /proc/loadavg)"
t1=$(date +%s)
pip install --no-cache-dir -q -e . 2>/dev/null
echo "$(date -u +%T) pip install -e .: $(( $(date +%s) - t1 )) s; load: $(cat /proc/loadavg)"
t2=$(date +%s)
vgrpo train --algo vgrpo --out runs/vgrpo-digit 2>/tmp/timing/fresh_train.err | tail -12
echo "$(date -u +%T) vgrpo train --algo vgrpo --out runs/vgrpo-digit: $(( $(date +%s) - t2 )) s; load: $(cat /proc/loadavg)"
echo "total: $(( $(date +%s) - start )) s"
