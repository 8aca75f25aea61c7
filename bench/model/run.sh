# Sourced by bench/run.sh: the decoder layer forward per bridge path and attention CP vs TP on the
# same ranks (np = 2 and 4), the EP dispatch + combine, and two-batch overlap against one batch.
for np in 2 4; do
  echo "-- layer forward, np=$np"
  "$MPIEXEC" -n "$np" "$BIN/bench_layer" --benchmark_min_time=0.5 --benchmark_counters_tabular=true
done
echo "-- EP dispatch + combine, workspace per call vs kept; decode-sized dispatch, normal vs low_latency, np=2"
"$MPIEXEC" -n 2 "$BIN/bench_ep" --benchmark_min_time=0.5 --benchmark_filter='BM_EpDispatchCombine|BM_EpDecodeDispatch' --benchmark_counters_tabular=true
echo "-- two-batch overlap against one batch on path direct (tbo_vs_one below 1: the overlap gains), np=2"
"$MPIEXEC" -n 2 "$BIN/bench_ep" --benchmark_min_time=0.2 --benchmark_filter=BM_TwoBatchOverlap --benchmark_counters_tabular=true
for np in 1 2; do
  echo "-- EP dispatch + combine against its floor (raw MPI_Alltoallv of the same rows + one copy in and out), np=$np"
  "$MPIEXEC" -n "$np" "$BIN/bench_ep" --benchmark_min_time=0.5 --benchmark_filter=BM_EpVsFloor --benchmark_counters_tabular=true
done
