#!/usr/bin/env bash
# `make test-multihost` (root): the layer on MPI ranks spread over two test hosts (network, UTS,
# IPC, mount and PID namespaces joined by a veth link, see hosts.sh), launched by MPICH's hydra.
#   1. the hosts are separate: hostnames, namespaces, /dev/shm, rank placement;
#   2. paths A, B and direct with ranks split 2+2, path B 4+4: --check passes, `relayout trace
#      diff` against a one-rank baseline agrees, and the bytes that entered the hosts through the
#      link are at least what the layer's own report says must cross (wire_bound.py);
#   3. faults with RELAYOUT_COLLECTIVE_TIMEOUT: the link cut mid-forward, and the ranks of one host
#      stopped (SIGSTOP) mid-forward: the job ends within the deadline plus a margin, exit
#      non-zero, with a watchdog message naming members on the far side, and no rank keeps
#      running (across the cut, the far side may wait in MPI_Abort: hydra cannot reach it);
#   4. cleanup on every exit path; no namespace, link or process is left on the machine.
# Every step runs under `timeout -k`, so a hang fails the step instead of the run.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hosts.sh
source "$HERE/hosts.sh"
# --preflight: only whether this machine can run the test (root, namespaces, veth), before building.
if reason=$(mh_unsupported "${1:-}") && [ -n "$reason" ]; then
  echo "test-multihost: cannot run here: $reason" >&2
  exit 1
fi
[ "${1:-}" = --preflight ] && exit 0
BIN=${BIN:-build/bin}
BIN=$(cd "$BIN" 2>/dev/null && pwd) || { echo "test-multihost: no $BIN (build dsv4_layer and relayout first)" >&2; exit 1; }
for b in dsv4_layer relayout; do
  [ -x "$BIN/$b" ] || { echo "test-multihost: $BIN/$b is missing (build it first)" >&2; exit 1; }
done

T0=$(date +%s.%N)
FAILED=0
FINALIZE_HANGS=0
fail() {
  echo "FAIL: $*"
  FAILED=1
}
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(date +%s.%N)"; }

finish() {
  local rc=$?
  trap - EXIT INT TERM
  mh_cleanup
  if mh_assert_clean; then
    echo "cleanup: no namespace, link or process of the test left on this machine"
  else
    rc=1
  fi
  [ "$FAILED" -eq 0 ] || rc=1
  [ "$FINALIZE_HANGS" -eq 0 ] || echo "note: $FINALIZE_HANGS run(s) hung in MPI_Finalize after a complete report (run again, up to 3 times)"
  echo "test-multihost: $([ $rc -eq 0 ] && echo passed || echo FAILED) in $(elapsed "$T0") s"
  exit $rc
}
trap finish EXIT
trap 'echo "test-multihost: interrupted"; FAILED=1; exit 1' INT TERM

mh_create 2
W=$MH_DIR/work
mkdir -p "$W"
# Small tensors: this runs on 2 cores, 4 or 8 ranks at a time.
MODEL=(--hidden 128 --requests 12,9,7,5,8,3,6,4)

echo "== hosts"
timeout -k 5 60 "$MH_MPIEXEC" h1,h2 2 -n 4 sh -c \
  'echo "$PMI_RANK $(hostname) $(readlink /proc/self/ns/net /proc/self/ns/mnt /proc/self/ns/ipc /proc/self/ns/pid | tr "\n" " ")"' \
  | sort -n >"$W/placement" || fail "mpiexec across the hosts failed"
cat "$W/placement"
python3 - "$W/placement" <<'EOF' || fail "rank placement or host separation"
import sys
rows = [l.split() for l in open(sys.argv[1])]
assert [int(r[0]) for r in rows] == [0, 1, 2, 3], rows
assert [r[1] for r in rows] == ["h1", "h1", "h2", "h2"], "ranks 0,1 on h1 and 2,3 on h2"
ns = [tuple(r[2:]) for r in rows]
assert ns[0] == ns[1] and ns[2] == ns[3], "ranks of one host share its namespaces"
assert all(a != b for a, b in zip(ns[0], ns[2])), "the hosts share no net, mount, IPC or PID namespace"
print("placement: ranks 0,1 on h1, 2,3 on h2; net, mount, IPC and PID namespaces differ between hosts")
EOF
mh_on h1 sh -c 'echo x > /dev/shm/relayout-multihost-probe'
if mh_on h2 test -e /dev/shm/relayout-multihost-probe || test -e /dev/shm/relayout-multihost-probe; then
  fail "a file in h1's /dev/shm is visible outside h1"
else
  echo "/dev/shm: a file made on h1 is not visible on h2 (nor on this machine)"
fi

echo "== the layer across the hosts (checked, traced, bytes on the link)"
timeout -k 5 60 "$MH_MPIEXEC" h1 1 -n 1 "$BIN/dsv4_layer" --tp 1 "${MODEL[@]}" --trace "$W/base" >"$W/base.out" 2>&1 ||
  { cat "$W/base.out"; fail "the one-rank baseline failed"; }
# control: MPI start-up and teardown across the hosts with no layer (what PMI and wire-up cost)
b1=$(mh_rx_bytes h1) b2=$(mh_rx_bytes h2)
timeout -k 5 60 "$MH_MPIEXEC" h1,h2 2 -n 4 "$BIN/dsv4_layer" --tp 4 --help >/dev/null 2>&1
CONTROL=$(($(mh_rx_bytes h1) - b1 + $(mh_rx_bytes h2) - b2))
echo "control (mpiexec + MPI_Init/Finalize, no layer): $CONTROL bytes entered the hosts"

printf '%-8s %-10s %-5s %12s %12s %14s %12s  %s\n' run path ranks "h1 in" "h2 in" "must cross" "reported" "check / trace diff"
layer_run() {  # NAME HOSTS PPN NP LAYOUT...
  local name=$1 hosts=$2 ppn=$3 np=$4
  shift 4
  local d="$W/$name"
  mkdir -p "$d"
  local a1 a2 in1 in2 rc attempt
  for attempt in 1 2 3; do
    rm -rf "$d/trace"
    a1=$(mh_rx_bytes h1) a2=$(mh_rx_bytes h2)
    mh_job 60 "$d/report.json" "$d/stderr" "$MH_MPIEXEC" "$hosts" "$ppn" -n "$np" "$BIN/dsv4_layer" "$@" \
      "${MODEL[@]}" --check --trace "$d/trace" --format json
    rc=$MH_RC
    in1=$(($(mh_rx_bytes h1) - a1)) in2=$(($(mh_rx_bytes h2) - a2))
    # A job stuck in MPI_Finalize after its complete report (see mh_job) runs again, for one
    # clean exit if it comes. Any other failure counts at once.
    [ "$rc" = finalize ] || break
    echo "$name: the job did not end after the layer's complete report (MPI_Finalize stuck in UCX's TCP transport); attempt $attempt of 3"
    FINALIZE_HANGS=$((FINALIZE_HANGS + 1))
  done
  [ "$rc" = finalize ] && rc=0  # three times: judge the layer by its complete report and trace
  if [ "$rc" != 0 ]; then
    cat "$d/stderr" "$d/report.json" | head -20
    fail "$name: dsv4_layer $* exit $rc"
    return
  fi
  "$BIN/relayout" explain "$@" --format json >"$d/explain.json" || { fail "$name: explain"; return; }
  python3 "$HERE/wire_bound.py" --report "$d/report.json" --explain "$d/explain.json" --trace "$d/trace" \
    --ppn "$ppn" >"$d/bound.json" || { fail "$name: wire_bound"; return; }
  local diff diff_rc bound reported path passed
  diff=$(timeout -k 5 60 "$BIN/relayout" trace diff "$W/base" "$d/trace" 2>&1)
  diff_rc=$?
  read -r path passed bound reported < <(python3 -c 'import json,sys
r = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
print(r["path"], "OK" if r["passed"] else "MISMATCH", b["cross_host_bound_bytes"], b["reported_cross_host_collectives_all_ranks"])' \
    "$d/report.json" "$d/bound.json")
  printf '%-8s %-10s %-5s %12d %12d %14d %12d  %s / %s\n' "$name" "$path" "$ppn+$ppn" "$in1" "$in2" "$bound" \
    "$reported" "$passed" "$([ $diff_rc -eq 0 ] && echo agree || echo "exit $diff_rc")"
  echo "         must cross, by collective: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["by_collective"])' "$d/bound.json")"
  [ "$passed" = OK ] || fail "$name: --check"
  [ $diff_rc -eq 0 ] || { echo "$diff" | head -8; fail "$name: trace diff against the one-rank baseline (exit $diff_rc)"; }
  [ "$bound" -gt 0 ] || fail "$name: no collective of this layout crosses the hosts"
  # The link carried the layer's data, not only start-up: what entered the hosts, less the
  # start-up control, is at least what must cross.
  [ $((in1 + in2 - CONTROL)) -ge "$bound" ] ||
    fail "$name: $((in1 + in2)) bytes entered the hosts ($CONTROL of them start-up), but $bound must cross"
}
layer_run A-2+2 h1,h2 2 4 --tp 4 --dp 2 --enable-dp-attention
layer_run B-2+2 h1,h2 2 4 --tp 4 --dp 2 --enable-dp-attention --moe-a2a-backend deepep
layer_run D-2+2 h1,h2 2 4 --tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep
layer_run B-4+4 h1,h2 4 8 --tp 8 --dp 2 --enable-dp-attention --moe-a2a-backend deepep

DEADLINE=4
echo "== faults (RELAYOUT_COLLECTIVE_TIMEOUT=$DEADLINE s)"
# A run long enough to be cut in the middle: 400 layers, run 25 more times (--repeat), tens of
# seconds undisturbed across the hosts. One pass of the 400 layers took 1.6 s on a 2-core AMD EPYC
# once the attention ran at its speed with 4 heads: shorter than the 2 s the drill waits before
# its fault, so the job could end first.
LONG=(--tp 4 --dp 2 --enable-dp-attention --moe-a2a-backend deepep --hidden 128 --requests 300,300 --layers 400 --repeat 25)
MARGIN=10
host_ranks() { for p in $(ip netns pids "$(mh_ns "$1")"); do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dsv4_layer ] && echo "$p"; done; }
fault_drill() {  # NAME FAULT REPAIR FAR_SIDE_ENDS(yes|no)
  local name=$1 fault=$2 repair=$3 far_ends=$4 d="$W/$1"
  mkdir -p "$d"
  RELAYOUT_COLLECTIVE_TIMEOUT=$DEADLINE timeout -k 5 $((DEADLINE + MARGIN + 30)) \
    "$MH_MPIEXEC" h1,h2 2 -n 4 "$BIN/dsv4_layer" "${LONG[@]}" >"$d/stdout" 2>"$d/stderr" &
  local job=$! tries=0
  # Mid-forward: all four ranks up, then two more seconds into the layers.
  until [ "$(host_ranks h1 | wc -l)$(host_ranks h2 | wc -l)" = 22 ]; do
    tries=$((tries + 1))
    [ $tries -le 200 ] || break
    sleep 0.05
  done
  sleep 2
  if ! kill -0 "$job" 2>/dev/null; then
    fail "$name: the job ended before the fault"; sed "s/^/    /" "$d/stderr" | tail -5
    return
  fi
  local t_fault
  t_fault=$(date +%s.%N)
  eval "$fault"
  wait "$job"
  local rc=$? took
  took=$(elapsed "$t_fault")
  # The ranks end too (their own watchdog, or hydra's kill): none left on either host.
  tries=0
  while [ -n "$(host_ranks h1)$(host_ranks h2)" ] && [ $tries -lt 60 ]; do
    tries=$((tries + 1))
    sleep 0.1
  done
  local left_h1 left_h2 p in_abort=yes
  left_h1=$(host_ranks h1 | tr '\n' ' ') left_h2=$(host_ranks h2 | tr '\n' ' ')
  # A rank in MPI_Abort sleeps reading its PMI socket (waiting for hydra's proxy to end it).
  for p in $left_h2; do [ "$(cat "/proc/$p/wchan" 2>/dev/null)" = unix_stream_read_generic ] || in_abort=no; done
  eval "$repair"
  echo "-- $name: exit $rc, $took s after the fault (deadline $DEADLINE s); stderr (less the progress lines):"
  grep -v -E '^dsv4_layer: (a long run|layer [0-9]+/[0-9]+ done)' "$d/stderr" | sed 's/^/   /' | cut -c1-600 | head -12
  [ $rc -ne 0 ] || fail "$name: exit 0 after the fault"
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "$name: the job hung (killed by timeout after $took s)"
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)" "$took" \
    $((DEADLINE + MARGIN)) || fail "$name: ended $took s after the fault (bound: $DEADLINE + $MARGIN s)"
  [ -z "$left_h1" ] || fail "$name: h1's ranks ($left_h1) still running 6 s after the job ended"
  if [ -n "$left_h2" ] && { [ "$far_ends" = yes ] || [ $in_abort = no ]; }; then
    fail "$name: h2's ranks ($left_h2) still running 6 s after the job ended ($([ $in_abort = yes ] &&
      echo "in MPI_Abort" || echo "not in MPI_Abort: their own watchdog did not end them"))"
  elif [ -n "$left_h2" ]; then
    # Across a cut link hydra cannot reach the far side: its ranks reach their own deadline and
    # call MPI_Abort, which waits for their proxy, which waits for mpiexec. Cleanup kills them.
    echo "   note: h2's ranks ($left_h2) were still running 6 s after the job ended (in MPI_Abort,"
    echo "   waiting for hydra's proxy, which cannot reach mpiexec over the cut link); cleanup ends them"
  fi
  # Names members on the far side (world ranks 2 and 3, on h2).
  python3 - "$d/stderr" <<'EOF' || fail "$name: no watchdog message naming the far side's members"
import re, sys
named = set()
for line in open(sys.argv[1]):
    if not line.startswith("relayout watchdog:"):
        continue
    for m in re.finditer(r"(?:not arrived|not heard from[^:]*): members \[[\d ]*\] \(world \[([\d ]*)\]\)", line):
        named |= {int(x) for x in m.group(1).split()}
if not named & {2, 3}:
    sys.exit(f"members named: {sorted(named)} (expected members of the far side [2 3])")
print(f"   named: world {sorted(named)} (far side: [2 3])")
if named - {2, 3}:
    # A near-side member whose own deadline had not passed yet when the others asked around is
    # "not heard from" too: the message then names more than the far side.
    print(f"   note: also named near-side members {sorted(named - {2, 3})}")
EOF
}
fault_drill link-cut 'mh_link h2 down' 'mh_link h2 up' no
fault_drill sigstop-h2 'kill -STOP $(host_ranks h2)' 'kill -CONT $(host_ranks h2) 2>/dev/null' yes
