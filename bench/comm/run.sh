# Sourced by bench/run.sh with BIN and MPIEXEC set: every relayout collective next to the raw MPI
# call at np = 2 and 4, then the table of median time ratios.
for np in 2 4; do
  echo "-- comm collectives, np=$np"
  "$MPIEXEC" -n "$np" "$BIN/bench_comm" --benchmark_min_time=0.05 \
    --benchmark_out="$BIN/bench_comm_np$np.json" --benchmark_out_format=json
done
python3 bench/comm/ratio_table.py "$BIN/bench_comm_np2.json" "$BIN/bench_comm_np4.json"
