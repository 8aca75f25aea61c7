# Sourced by bench/run.sh: the decoder layer forward per bridge path, and attention CP vs TP on
# the same ranks, at np = 2 and 4.
for np in 2 4; do
  echo "-- layer forward, np=$np"
  "$MPIEXEC" -n "$np" "$BIN/bench_layer" --benchmark_min_time=0.5 --benchmark_counters_tabular=true
done
echo "-- EP dispatch + combine, workspace per call vs kept, np=2"
"$MPIEXEC" -n 2 "$BIN/bench_ep" --benchmark_min_time=0.5
