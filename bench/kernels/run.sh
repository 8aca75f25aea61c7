# Sourced by bench/run.sh with BIN and MPIEXEC set: the kernel benchmarks on one rank. Each row
# reports relayout and its baseline measured alternately in the same run, and their ratio.
if [ -x "$BIN/bench_kernels" ]; then
  "$MPIEXEC" -n 1 "$BIN/bench_kernels" --benchmark_min_time=0.3
else
  echo "bench_kernels not built (OpenBLAS missing?): skipped"
fi
