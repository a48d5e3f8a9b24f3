#!/usr/bin/env bash
# `make bench`: pgworker against procrastinate, pgqueuer and chancy, and against the floor (raw
# asyncpg). Builds bench/.venv on first use (this repository's pgworker, editable, plus the peers
# pinned in bench/requirements.txt), then runs bench/bench.py with the arguments given, e.g.
#   bash bench/run.sh --n 2000 --runs 1
# Settings also come from BENCH_DSN, BENCH_N, BENCH_RUNS, BENCH_SYSTEMS, BENCH_WORKLOADS.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VENV="$HERE/.venv"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.installed"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# Reinstall when the pins or pgworker's own dependencies change.
if [ ! -f "$STAMP" ] || [ "$HERE/requirements.txt" -nt "$STAMP" ] || [ "$REPO/pyproject.toml" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$REPO[metrics]" -r "$HERE/requirements.txt"
    touch "$STAMP"
fi

cd "$REPO"
exec "$VENV/bin/python" "$HERE/bench.py" "$@"
