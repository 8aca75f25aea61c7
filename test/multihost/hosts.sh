# Test hosts on one machine, sourced by run.sh and bench.sh (bash, as root).
#
# A host is a network namespace with its own UTS (hostname h1, h2, ...), IPC, mount and PID
# namespaces: a private tmpfs on /dev/shm, a private /etc/hosts naming every host, and its own
# process tree whose init is a small reaper. Two hosts are joined by one veth link (eth0 on each
# side, 10.231.0.N/24); nothing is configured in the machine's own namespaces, and nothing outside
# this machine is ever contacted. MPI processes on different hosts share no shared memory, no SysV
# IPC and cannot see each other's pids (so no CMA either): their only path is the link.
#
# mpiexec runs on h1's network (like a login shell on node h1) and starts every hydra proxy, h1's
# included, through `launch`, which enters the named host's namespaces (mpiexec-hosts). Cleanup (mh_cleanup) kills
# each host's init, which takes every process of that host with it, then deletes the namespaces.

MH_SUBNET=10.231.0
MH_HOSTS=()
MH_DIR=""
MH_PREFIX="rlmh$$"

mh_die() {
  echo "test-multihost: $*" >&2
  exit 1
}

# The reason this machine cannot run the test, or nothing.
mh_unsupported() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (network, UTS, mount and PID namespaces; run as root, e.g. sudo make test-multihost)"; return; }
  local t
  for t in ip unshare nsenter; do
    command -v "$t" >/dev/null 2>&1 || { echo "needs '$t' on PATH"; return; }
  done
  local probe="${MH_PREFIX}probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "'ip netns add' failed: this machine (or container) does not allow network namespaces"
    return
  fi
  if ! ip link add name mhprobe0 netns "$probe" type veth peer name mhprobe1 netns "$probe" 2>/dev/null; then
    ip netns del "$probe"
    echo "cannot create a veth pair inside a network namespace (no veth support?)"
    return
  fi
  if ! ip netns exec "$probe" unshare --uts --ipc --mount --pid --fork --mount-proc true 2>/dev/null; then
    ip netns del "$probe"
    echo "'unshare --uts --ipc --mount --pid' failed: UTS/IPC/mount/PID namespaces are not allowed here"
    return
  fi
  ip netns del "$probe"
  [ "${1:-}" = --preflight ] && return
  for t in mpiexec.mpich hydra_pmi_proxy python3 timeout chrt; do
    command -v "$t" >/dev/null 2>&1 || { echo "needs '$t' on PATH"; return; }
  done
}

mh_ns() { echo "${MH_PREFIX}$1"; }

# mh_create N [DELAY_US RATE_MBIT]: hosts h1..hN (N = 2) joined by a veth link, or, with a delay
# and rate, by a TUN device eth0 on each host and delayline.py between them (for kernels without
# tc netem; the bench only).
mh_create() {
  local n=$1 delay_us=${2:-} rate_mbit=${3:-} i
  [ "$n" -eq 2 ] || mh_die "mh_create: only two hosts are wired (got $n)"
  MH_DIR=$(mktemp -d /tmp/relayout-multihost.XXXXXX)
  {
    echo "127.0.0.1 localhost"
    for i in $(seq 1 "$n"); do echo "$MH_SUBNET.$i h$i"; done
  } >"$MH_DIR/hosts"
  for i in $(seq 1 "$n"); do
    MH_HOSTS+=("h$i")
    ip netns add "$(mh_ns "h$i")" || mh_die "ip netns add $(mh_ns "h$i") failed"
  done
  if [ -z "$delay_us" ]; then
    ip link add name eth0 netns "$(mh_ns h1)" type veth peer name eth0 netns "$(mh_ns h2)" ||
      mh_die "cannot create the veth link h1 <-> h2"
  else
    for i in 1 2; do ip -n "$(mh_ns "h$i")" tuntap add dev eth0 mode tun || mh_die "cannot create a TUN device"; done
    chrt -f 20 python3 "$(dirname "${BASH_SOURCE[0]}")/delayline.py" "$(mh_ns h1)" "$(mh_ns h2)" "$delay_us" \
      "$rate_mbit" "$MH_DIR/delayline.ready" </dev/null >>"$MH_DIR/init.log" 2>&1 &
    echo $! >"/tmp/${MH_PREFIX}.delayline"
    local tries=0
    until [ -f "$MH_DIR/delayline.ready" ]; do
      tries=$((tries + 1))
      [ $tries -le 100 ] || mh_die "the delay line did not start (see $MH_DIR/init.log)"
      sleep 0.05
    done
  fi
  for i in $(seq 1 "$n"); do
    local ns
    ns=$(mh_ns "h$i")
    ip -n "$ns" addr add "$MH_SUBNET.$i/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    # The host's init: sets the hostname, mounts the private /dev/shm and /etc/hosts, then reaps.
    ip netns exec "$ns" unshare --uts --ipc --mount --pid --fork --mount-proc --propagation private \
      bash -c "hostname h$i && mount -t tmpfs -o mode=1777,size=512m tmpfs /dev/shm &&
               mount --bind '$MH_DIR/hosts' /etc/hosts && echo ready > '$MH_DIR/ready.h$i' &&
               exec bash -c 'trap : TERM INT; while :; do sleep 1; done'" \
      </dev/null >>"$MH_DIR/init.log" 2>&1 &
    echo $! >"$MH_DIR/unshare.h$i"
  done
  for i in $(seq 1 "$n"); do
    local u tries=0
    u=$(cat "$MH_DIR/unshare.h$i")
    while [ ! -f "$MH_DIR/ready.h$i" ]; do
      tries=$((tries + 1))
      [ $tries -le 100 ] || mh_die "host h$i did not start (see $MH_DIR/init.log)"
      sleep 0.05
    done
    cat "/proc/$u/task/$u/children" | tr -d ' ' >"$MH_DIR/init.h$i"
    [ -s "$MH_DIR/init.h$i" ] || mh_die "host h$i has no init process"
  done
  # Both ends of the link up before anything is launched.
  local tries=0
  until [[ "$(mh_operstate h1)" =~ ^(up|unknown)$ && "$(mh_operstate h2)" =~ ^(up|unknown)$ ]]; do
    tries=$((tries + 1))
    [ $tries -le 100 ] || mh_die "the link h1 <-> h2 did not come up"
    sleep 0.05
  done
  # Every namespace of ours, for mh_assert_clean to look for in the whole machine afterwards.
  for i in $(seq 1 "$n"); do
    local init
    init=$(cat "$MH_DIR/init.h$i")
    readlink "/proc/$init/ns/net" "/proc/$init/ns/pid" >>"$MH_DIR/namespaces"
  done
  cp "$MH_DIR/namespaces" "/tmp/${MH_PREFIX}.namespaces"
  # "$MH_MPIEXEC" HOSTS PPN ARGS... launches across the hosts (a script, so `timeout` can run it).
  export RELAYOUT_MH_DIR=$MH_DIR
  MH_MPIEXEC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/mpiexec-hosts
}

# mh_on HOST CMD...: runs CMD inside HOST (all its namespaces).
mh_on() {
  local host=$1
  shift
  nsenter -t "$(cat "$MH_DIR/init.$host")" -n -u -i -m -p -- "$@"
}

# mh_job LIMIT_S OUT ERR CMD...: runs CMD (an mpiexec) with stdout to OUT and stderr to ERR, at
# most LIMIT_S seconds; sets MH_RC to its exit code (124: the limit). MPICH 4.0 over UCX 1.13's
# TCP transport now and then never returns from MPI_Finalize (one rank flushing an endpoint while
# the others wait in the PMI barrier; openucx/ucx#8738): when OUT already holds the program's
# complete JSON report and the job has not ended 10 s later, it is ended and MH_RC is "finalize".
mh_job() {
  local limit=$1 out=$2 err=$3 waited=0 complete=""
  shift 3
  timeout -k 5 "$limit" "$@" >"$out" 2>"$err" &
  local job=$!
  while kill -0 "$job" 2>/dev/null; do
    sleep 0.5
    waited=$((waited + 1))
    if [ -z "$complete" ] && [ "$(tail -c 2 "$out" 2>/dev/null | head -c 1)" = "}" ]; then complete=$waited; fi
    if [ -n "$complete" ] && [ $((waited - complete)) -ge 20 ]; then
      kill -TERM "$job" 2>/dev/null
      wait "$job" 2>/dev/null
      MH_RC=finalize
      return
    fi
  done
  wait "$job"
  MH_RC=$?
}

# Bytes that entered HOST through its link so far.
mh_rx_bytes() { ip netns exec "$(mh_ns "$1")" cat /sys/class/net/eth0/statistics/rx_bytes; }

mh_operstate() { ip netns exec "$(mh_ns "$1")" cat /sys/class/net/eth0/operstate; }

mh_link() { ip -n "$(mh_ns "$1")" link set eth0 "$2"; }

# Processes inside the hosts (their inits included), as pids in the machine's namespace.
mh_pids() {
  local h
  for h in "${MH_HOSTS[@]}"; do ip netns pids "$(mh_ns "$h")" 2>/dev/null; done
}

mh_cleanup() {
  local h
  for h in "${MH_HOSTS[@]}"; do
    # SIGKILL to a PID namespace's init kills every process of that namespace.
    [ -n "$MH_DIR" ] && [ -s "$MH_DIR/init.$h" ] && kill -KILL "$(cat "$MH_DIR/init.$h")" 2>/dev/null
  done
  # Whatever else still runs in a host's network (mpiexec, launchers): by pid, ours only.
  local p
  for p in $(mh_pids); do kill -KILL "$p" 2>/dev/null; done
  for h in "${MH_HOSTS[@]}"; do
    [ -n "$MH_DIR" ] && [ -s "$MH_DIR/unshare.$h" ] && wait "$(cat "$MH_DIR/unshare.$h")" 2>/dev/null
  done
  local tries=0
  while [ -n "$(mh_pids)" ] && [ $tries -lt 50 ]; do
    tries=$((tries + 1))
    sleep 0.1
  done
  if [ -f "/tmp/${MH_PREFIX}.delayline" ]; then
    kill -KILL "$(cat "/tmp/${MH_PREFIX}.delayline")" 2>/dev/null
    wait "$(cat "/tmp/${MH_PREFIX}.delayline")" 2>/dev/null
  fi
  for h in "${MH_HOSTS[@]}"; do ip netns del "$(mh_ns "$h")" 2>/dev/null; done
  [ -n "$MH_DIR" ] && rm -rf "$MH_DIR"
}

# What cleanup must leave: no namespace, link or process of ours anywhere on the machine (a
# process still inside one of our network or PID namespaces would keep it, and its veth, alive
# unnamed). Prints what is left; fails if anything is.
mh_assert_clean() {
  local left="" h list="/tmp/${MH_PREFIX}.namespaces"
  for h in "${MH_HOSTS[@]}"; do
    ip netns list | grep -qw "$(mh_ns "$h")" && left="$left namespace $(mh_ns "$h");"
  done
  if [ -f "$list" ]; then
    local f
    for f in /proc/[0-9]*/ns/net /proc/[0-9]*/ns/pid; do
      local ns
      ns=$(readlink "$f" 2>/dev/null) || continue
      grep -qxF "$ns" "$list" && left="$left process ${f#/proc/} in $ns;"
    done
    rm -f "$list"
  fi
  [ -n "$MH_DIR" ] && [ -e "$MH_DIR" ] && left="$left directory $MH_DIR;"
  if [ -f "/tmp/${MH_PREFIX}.delayline" ]; then
    kill -0 "$(cat "/tmp/${MH_PREFIX}.delayline")" 2>/dev/null && left="$left delay line process;"
    rm -f "/tmp/${MH_PREFIX}.delayline"
  fi
  if [ -n "$left" ]; then
    echo "test-multihost: left behind:$left" >&2
    return 1
  fi
}
