# Sourced by bench/run.sh with BIN and MPIEXEC set: every relayout collective next to the raw MPI
# call at np = 2 and 4, then the table of median ratios. Only rank 0 writes the JSON file; the
# other ranks (launched MPMD) write theirs to /dev/null instead of truncating the same file.
for np in 2 4; do
  echo "-- comm collectives, np=$np"
  "$MPIEXEC" -n 1 "$BIN/bench_comm" --benchmark_out="$BIN/bench_comm_np$np.json" --benchmark_out_format=json \
    : -n $((np - 1)) "$BIN/bench_comm" --benchmark_out=/dev/null --benchmark_out_format=json
done
python3 bench/comm/ratio_table.py "$BIN/bench_comm_np2.json" "$BIN/bench_comm_np4.json"
echo "-- large messages on 4 KiB and on huge pages (page_pinning_probe), np=2"
"$MPIEXEC" -n 2 "$BIN/page_pinning_probe"
"$MPIEXEC" -n 2 "$BIN/page_pinning_probe" --huge
