#!/usr/bin/env python3
"""A link with latency and bandwidth between two test hosts, for kernels without tc netem.

delayline.py NETNS_A NETNS_B DELAY_US RATE_MBIT READY_FILE

Attaches to the TUN device eth0 in each network namespace (made by `ip tuntap add`), and moves
every IP packet one host sends to the other: each direction is a link of RATE_MBIT (a packet
leaves once the previous one has been serialised at that rate) followed by DELAY_US of one-way
latency. Packets keep their order. Run it with a real-time priority (chrt -f) so that busy-polling
MPI ranks on the same cores do not delay it. Writes READY_FILE once both ends are attached; ends on
SIGTERM or SIGKILL. (No checksums or offloads to care about: a TUN device without offloads hands
over complete packets no larger than its MTU.)
"""
import collections
import ctypes
import fcntl
import os
import select
import struct
import sys
import time

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def attach(netns):
    """Opens eth0 of the network namespace netns (a name under /run/netns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns}")
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"eth0", IFF_TUN | IFF_NO_PI))
        return fd
    finally:
        libc.setns(home, CLONE_NEWNET)
        os.close(target)
        os.close(home)


def main():
    ns_a, ns_b, delay_us, rate_mbit, ready = sys.argv[1:6]
    delay = float(delay_us) * 1e-6
    seconds_per_byte = 8.0 / (float(rate_mbit) * 1e6)
    fds = [attach(ns_a), attach(ns_b)]
    peer = {fds[0]: fds[1], fds[1]: fds[0]}
    queue = {fd: collections.deque() for fd in fds}  # (departure time, packet) to write into fd
    wire_free = {fd: 0.0 for fd in fds}  # when the link towards fd has serialised its last packet
    open(ready, "w").close()
    while True:
        now = time.monotonic()
        due = [q[0][0] for q in queue.values() if q]
        timeout = max(0.0, min(due) - now) if due else None
        readable, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in readable:
            out = peer[fd]
            while True:
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                sent = max(now, wire_free[out]) + len(pkt) * seconds_per_byte
                wire_free[out] = sent
                queue[out].append((sent + delay, pkt))
        now = time.monotonic()
        for fd, q in queue.items():
            while q and q[0][0] <= now:
                try:
                    os.write(fd, q.popleft()[1])
                except OSError:
                    pass  # the far end is down: the packet is lost, as on a cut link


if __name__ == "__main__":
    main()
