#!/usr/bin/env bash
# `make bench-multihost` (root): bench_layer (one decoder layer per path, time = max over ranks of
# one forward, bytes per rank) on two test hosts (hosts.sh) under three links: the plain veth, and
# 50 us / 10 Gbit and 1 ms / 1 Gbit one-way latency / rate. The links use tc netem when the kernel
# has it, and delayline.py over TUN devices otherwise. Prints a Markdown table (docs/multihost.md).
# Each link is measured with a TCP ping-pong first (median round trip), since the delay line and
# the CPUs it shares with the ranks add their own latency.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-build/bin}
BIN=$(cd "$BIN" 2>/dev/null && pwd) || { echo "bench-multihost: no $BIN" >&2; exit 1; }
[ -x "$BIN/bench_layer" ] || { echo "bench-multihost: $BIN/bench_layer is missing (build it first)" >&2; exit 1; }
MIN_TIME=${MIN_TIME:-1}  # seconds per benchmark (bench_layer's --benchmark_min_time)
# shellcheck source=hosts.sh
source "$HERE/hosts.sh"
if reason=$(mh_unsupported) && [ -n "$reason" ]; then
  echo "bench-multihost: cannot run here: $reason" >&2
  exit 1
fi
OUT=$(mktemp -d /tmp/relayout-bench-multihost.XXXXXX)
trap 'mh_cleanup; mh_assert_clean; rm -rf "$OUT"' EXIT
trap 'exit 1' INT TERM

has_netem() {
  local ns="${MH_PREFIX}netem" ok=1
  ip netns add "$ns" 2>/dev/null || return 1
  ip -n "$ns" link add mhnetem0 type veth peer name mhnetem1 2>/dev/null &&
    ip netns exec "$ns" tc qdisc add dev mhnetem0 root netem delay 1ms 2>/dev/null && ok=0
  ip netns del "$ns"
  return $ok
}
NETEM=0
has_netem && NETEM=1
echo "links: $([ $NETEM -eq 1 ] && echo "tc netem on the veth" || echo "no tc netem in this kernel: delayline.py over TUN devices")"

rtt() {  # median TCP round trip h1 -> h2 of a 1-byte message, in microseconds
  cat >"$MH_DIR/pingpong.py" <<'EOF'
import socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5555)); s.listen(1); c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (d := c.recv(64)):
        c.sendall(d)
else:
    for _ in range(100):
        try:
            c = socket.create_connection(("h2", 5555)); break
        except OSError:
            time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = []
    for _ in range(200):
        a = time.perf_counter(); c.sendall(b"x"); c.recv(64); t.append(time.perf_counter() - a)
    print(round(sorted(t)[100] * 1e6))
EOF
  mh_on h2 timeout 30 python3 "$MH_DIR/pingpong.py" server &
  local server=$!
  mh_on h1 timeout 30 python3 "$MH_DIR/pingpong.py" client
  wait $server
}

measure() {  # LABEL [DELAY_US RATE_MBIT]
  local label=$1 delay=${2:-} rate=${3:-}
  if [ -n "$delay" ] && [ $NETEM -eq 1 ]; then
    mh_create 2
    local h
    for h in h1 h2; do ip netns exec "$(mh_ns $h)" tc qdisc add dev eth0 root netem delay "${delay}us" rate "${rate}mbit"; done
  elif [ -n "$delay" ]; then
    mh_create 2 "$delay" "$rate"
  else
    mh_create 2
  fi
  local r
  r=$(rtt)
  echo "== $label: TCP round trip h1 -> h2 -> h1 median $r us"
  local np ppn
  for np in 2 4; do
    ppn=$((np / 2))
    local a1 a2
    a1=$(mh_rx_bytes h1) a2=$(mh_rx_bytes h2)
    mh_job 300 "$OUT/$label-np$np.json" "$OUT/$label-np$np.err" "$MH_MPIEXEC" h1,h2 "$ppn" -n "$np" \
      "$BIN/bench_layer" --benchmark_min_time="$MIN_TIME" --benchmark_format=json
    [ "$MH_RC" = finalize ] && echo "(the job hung in MPI_Finalize after its complete report and was ended)"
    [ "$MH_RC" = 0 ] || [ "$MH_RC" = finalize ] ||
      { tail -5 "$OUT/$label-np$np.err"; echo "bench-multihost: bench_layer failed ($label, np $np): $MH_RC"; continue; }
    echo "$label np=$np ($ppn+$ppn): $(($(mh_rx_bytes h1) - a1 + $(mh_rx_bytes h2) - a2)) bytes entered the hosts"
    python3 - "$OUT/$label-np$np.json" "$label" "$r" "$np" >>"$OUT/rows" <<'EOF'
import json, sys
j, _ = json.JSONDecoder().raw_decode(open(sys.argv[1]).read())  # a killed mpiexec may add text after it
for b in j["benchmarks"]:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {int(sys.argv[4]) // 2}+{int(sys.argv[4]) // 2} | {b['label']} "
          f"| {b['KiB_per_rank']:.0f} | {b['real_time']:.1f} | {b['iterations']} |")
EOF
  done
  mh_cleanup
  mh_assert_clean || exit 1
  MH_HOSTS=() MH_DIR=""
}
LINKS=${LINKS:-veth 50us-10Gbit 1ms-1Gbit}
for link in $LINKS; do
  case $link in
    veth) measure veth ;;
    50us-10Gbit) measure "$link" 50 10000 ;;
    1ms-1Gbit) measure "$link" 1000 1000 ;;
    *) echo "bench-multihost: unknown link '$link' (veth, 50us-10Gbit, 1ms-1Gbit)" >&2; exit 1 ;;
  esac
done
echo
echo "| link | TCP RTT (us) | ranks | path | KiB / rank / forward | ms / forward | forwards |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
cat "$OUT/rows"
