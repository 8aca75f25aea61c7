#!/usr/bin/env bash
# Runs an MPI job that must end by itself within a hard bound, optionally stopping one of its rank
# processes with SIGSTOP first, and checks its exit code and stderr. Every process the job started
# is continued and killed afterwards, whatever happened.
#
#   bounded_job.sh BOUND_S (whole seconds) EXPECT_RC STDERR_REGEX STOP_AFTER_S PROGRAM_NAME -- COMMAND...
#
# STOP_AFTER_S: "none"; whole seconds after which one rank process (a descendant named PROGRAM_NAME,
# the newest) gets SIGSTOP; or "line:REGEX": stop it as soon as a line of the job's stderr matches the
# extended regex REGEX (a progress line: the stop then lands mid-run on a fast machine as on a slow
# one). STDERR_REGEX is an extended regex one line of stderr must match.
set -u
bound=$1 expect_rc=$2 regex=$3 stop_after=$4 program=$5
shift 6
tmp=$(mktemp -d)
declare -A seen=()  # pid -> start time, for every process of the job ever seen
"$@" >"$tmp/out" 2>"$tmp/err" &
job=$!

record() {
  local queue=("$job") p c
  while ((${#queue[@]})); do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    [[ -n ${seen[$p]:-} ]] || seen[$p]=$(ps -o lstart= -p "$p" 2>/dev/null)
    for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do queue+=("$c"); done
  done
}
cleanup() {
  local p
  for p in "${!seen[@]}"; do
    # only the same process (a pid can be reused once it is gone)
    [[ "$(ps -o lstart= -p "$p" 2>/dev/null)" == "${seen[$p]}" && -n ${seen[$p]} ]] || continue
    kill -CONT "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

now_ms() { date +%s%3N; }
start=$(now_ms)
bound_ms=$((bound * 1000))
stop_line=""
case $stop_after in
  none) stop_ms=-1 ;;
  line:*) stop_ms=-1 stop_line=${stop_after#line:} ;;
  *) stop_ms=$((stop_after * 1000)) ;;
esac
stopped=""
while kill -0 "$job" 2>/dev/null; do
  record
  t=$(($(now_ms) - start))
  due=""
  if ((stop_ms >= 0 && t >= stop_ms)); then due=1; fi
  if [[ -n $stop_line ]] && grep -Eq -- "$stop_line" "$tmp/err"; then due=1; fi
  if [[ -n $due && -z $stopped ]]; then
    victim=""
    for p in "${!seen[@]}"; do
      [[ "$(ps -o comm= -p "$p" 2>/dev/null)" == "$program" ]] && ((p > ${victim:-0})) && victim=$p
    done
    if [[ -z $victim ]]; then
      echo "bounded_job: FAIL: no process named $program under the job at ${t} ms" >&2
      exit 1
    fi
    kill -STOP "$victim"
    stopped=$victim
    echo "bounded_job: stopped $program process $victim at ${t} ms" >&2
  fi
  if ((t > bound_ms)); then
    echo "bounded_job: FAIL: the job did not end within ${bound} s; its stderr so far:" >&2
    cat "$tmp/err" >&2
    exit 1
  fi
  sleep 0.05
done
wait "$job"
rc=$?
t=$(($(now_ms) - start))
cat "$tmp/err" >&2
echo "bounded_job: the job ended after ${t} ms with exit code $rc" >&2
if [[ $stop_after != none && -z $stopped ]]; then
  echo "bounded_job: FAIL: the job ended before a rank could be stopped" >&2
  exit 1
fi
if [[ $rc != "$expect_rc" ]]; then
  echo "bounded_job: FAIL: exit code $rc, expected $expect_rc" >&2
  exit 1
fi
if ! grep -Eq -- "$regex" "$tmp/err"; then
  echo "bounded_job: FAIL: no line of stderr matches: $regex" >&2
  exit 1
fi
echo "bounded_job: PASS" >&2
