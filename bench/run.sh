#!/usr/bin/env bash
# `make bench`: runs every benchmark suite. Each bench/<area>/run.sh is sourced with BIN and MPIEXEC
# set; it runs its benchmarks at the rank counts it cares about.
set -euo pipefail
BIN=${BIN:-build/bin}
MPIEXEC=${MPIEXEC:-mpiexec}
# Large buffers on transparent huge pages (where the kernel's THP mode is madvise): MPI's
# shared-memory transport pins every page of a large message it moves, and with 4 KiB pages that
# pinning makes the layer's collectives take 1.4-1.7 times as long (docs/benchmarks.md). A
# GLIBC_TUNABLES already set is kept; the benchmarks report what was in effect.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
cd "$(dirname "$0")/.."
echo "== layout engine (np=1)"
"$MPIEXEC" -n 1 "$BIN/bench_layout" --benchmark_min_time=0.2
for suite in bench/*/run.sh; do
  [ -f "$suite" ] || continue
  echo "== $(basename "$(dirname "$suite")")"
  # shellcheck source=/dev/null
  BIN=$BIN MPIEXEC=$MPIEXEC source "$suite"
done
