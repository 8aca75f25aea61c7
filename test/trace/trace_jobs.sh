#!/bin/sh
# Real jobs for the trace tests: concurrent runs into nested directories, a diff of a trace still
# being written, a killed run's partial trace, and a large generated trace under `ulimit -v`.
#   trace_jobs.sh MODE MPIEXEC NPFLAG LAYER CLI WORK [dsv4_layer flags...]
# MODE: nested (a run into WORK/a/sub while one writes WORK/a), nested_parent (the reverse),
# live_diff, killed, watchdog (rank 0 of a traced run stopped with SIGSTOP, the others' watchdog
# aborts the job), memory ROWS LIMIT_KB (flags replaced by the two numbers).
# Exits with the exit code of the command under test; its output passes through.
set -u
mode=$1 mpiexec=$2 np=$3 layer=$4 cli=$5 work=$6
shift 6
rm -rf "$work" && mkdir -p "$work" || exit 99

# until COND...: polls for up to 60 s.
until_ok() {
  i=0
  until "$@"; do
    i=$((i + 1))
    [ "$i" -gt 1200 ] && { echo "trace_jobs: timed out waiting for: $*" >&2; exit 98; }
    sleep 0.05
  done
}
# The first job: traces into $1 and keeps the directory's lock (--repeat) until killed.
start_first() {
  d=$1
  shift
  "$mpiexec" "$np" 1 "$layer" --tp 1 --repeat 1000000 --trace "$d" "$@" >/dev/null 2>&1 &
  first=$!
  until_ok grep -qs pid "$d/.relayout-trace.lock"
}
# Kills the job whose rank 0 holds the lock of $1 (its pid is in the lock file), and waits for it.
kill_job() {
  kill -KILL "$(sed -n 's/.*pid \([0-9]*\).*/\1/p' "$1/.relayout-trace.lock")" 2>/dev/null
  wait "$first" 2>/dev/null
}
lines() { [ "$(cat "$1" 2>/dev/null | wc -l)" -ge "$2" ]; }

case "$mode" in
  nested | nested_parent)
    if [ "$mode" = nested ]; then first_dir=$work/a second_dir=$work/a/sub; else first_dir=$work/a/sub second_dir=$work/a; fi
    start_first "$first_dir" "$@"
    "$mpiexec" "$np" 1 "$layer" --tp 1 --trace "$second_dir" "$@" >/dev/null
    rc=$?
    kill_job "$first_dir"
    exit $rc ;;
  live_diff)
    start_first "$work/a" "$@"
    "$cli" trace diff "$work/a" "$work/a"
    rc=$?
    kill_job "$work/a"
    exit $rc ;;
  killed)
    "$mpiexec" "$np" 1 "$layer" --tp 1 --trace "$work/base" "$@" >/dev/null || exit 97
    "$mpiexec" "$np" 2 "$layer" --tp 2 --dp 2 --enable-dp-attention --decode-steps 400 --kv-capacity 512 \
      --trace "$work/cand" "$@" >/dev/null 2>&1 &
    first=$!
    until_ok lines "$work/cand/rank1.jsonl" 12
    kill_job "$work/cand"
    "$cli" trace diff "$work/base" "$work/cand"
    exit $? ;;
  watchdog)
    "$mpiexec" "$np" 1 "$layer" --tp 1 --trace "$work/base" "$@" >/dev/null || exit 97
    RELAYOUT_COLLECTIVE_TIMEOUT=2 "$mpiexec" "$np" 2 "$layer" --tp 2 --dp 2 --enable-dp-attention --decode-steps 400 \
      --kv-capacity 512 --trace "$work/cand" "$@" >/dev/null 2>"$work/job.err" &
    first=$!
    until_ok lines "$work/cand/rank1.jsonl" 12
    victim=$(sed -n 's/.*pid \([0-9]*\).*/\1/p' "$work/cand/.relayout-trace.lock")  # rank 0
    kill -STOP "$victim" || exit 94
    # The watchdog of rank 1 ends the job, 2 s and its inquiry window after it started waiting.
    i=0
    while kill -0 "$first" 2>/dev/null && [ "$i" -lt 600 ]; do i=$((i + 1)); sleep 0.05; done
    alive=0
    kill -0 "$first" 2>/dev/null && alive=1
    kill -CONT "$victim" 2>/dev/null
    kill -KILL "$victim" 2>/dev/null
    [ "$alive" = 1 ] && kill -KILL "$first" 2>/dev/null
    wait "$first"
    job_rc=$?
    until_ok sh -c "! kill -0 $victim 2>/dev/null"  # gone: its lock is released
    cat "$work/job.err" >&2
    if [ "$alive" = 1 ] || [ "$job_rc" != 3 ] || ! grep -q "^relayout watchdog: .*waited 2 s" "$work/job.err"; then
      echo "trace_jobs: the traced job was not ended by the watchdog (still running after 30 s: $alive, exit code $job_rc)" >&2
      exit 95
    fi
    echo "trace_jobs: the watchdog ended the traced job, exit code $job_rc" >&2
    "$cli" trace diff "$work/base" "$work/cand"
    exit $? ;;
  memory)
    rows=$1 limit=$2
    # A valid one-rank trace: 4 layers, two boundaries each, rows/8 rows per record.
    awk -v L=4 -v R=$((rows / 8)) 'BEGIN{
      print "{\"relayout_trace\":1,\"rank\":0,\"world_size\":1,\"program\":\"gen\"}"; n = 0;
      for (l = 0; l < L; l++) for (b = 0; b < 2; b++) {
        printf "{\"layer\":%d,\"boundary\":\"%s\",\"state\":\"%s\",\"sharing\":\"replicated\",\"copies\":1,", l,
          b ? "layer output" : "attention all_reduce", b ? "layer_out" : "attn_out";
        printf "\"global_rank\":0,\"attn_dp_rank\":0,\"attn_tp_rank\":0,\"moe_ep_rank\":0,\"group\":%s,\"handle\":%s,",
          b ? "null" : "\"attn_tp\"", b ? "null" : "1";
        printf "\"row_count\":%d,\"pad_rows\":0,\"hidden\":64,\"global_num_tokens\":[%d],\"rows\":[", R, R;
        for (i = 0; i < R; i++)
          printf "%s[%d,%d,0,%.17g,%.17g,%.17g]", i ? "," : "", int(i / 1000), i % 1000, 0.1 + i * 1e-7 + l, 0.05 + i * 1e-7, 1.5 + i * 1e-7;
        print "]}"; n++
      }
      print "{\"end\":true,\"records\":" n "}" }' > "$work/rank0.jsonl" || exit 96
    ulimit -v "$limit"
    "$cli" trace diff "$work" "$work"
    exit $? ;;
esac
echo "trace_jobs: unknown mode $mode" >&2
exit 99
