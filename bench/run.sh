#!/usr/bin/env bash
# `make bench`: runs every benchmark suite. Each bench/<area>/run.sh is sourced with BIN and MPIEXEC
# set; it runs its benchmarks at the rank counts it cares about.
set -euo pipefail
BIN=${BIN:-build/bin}
MPIEXEC=${MPIEXEC:-mpiexec}
cd "$(dirname "$0")/.."
echo "== layout engine (np=1)"
"$MPIEXEC" -n 1 "$BIN/bench_layout" --benchmark_min_time=0.2
for suite in bench/*/run.sh; do
  [ -f "$suite" ] || continue
  echo "== $(basename "$(dirname "$suite")")"
  # shellcheck source=/dev/null
  BIN=$BIN MPIEXEC=$MPIEXEC source "$suite"
done
