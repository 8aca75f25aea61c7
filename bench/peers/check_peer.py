#!/usr/bin/env python3
"""Checks that torch_layer.py computes the demo model's layer: its output at --dtype fp64 against the
sum and sum of squares of relayout's double-precision reference (dsv4_layer --check --format json)
for the same flags. Usage: check_peer.py DSV4_LAYER [model flags...]; exit 0 when they agree."""
import json
import os
import subprocess
import sys


def main(argv):
    dsv4, flags = argv[0], argv[1:]
    ref = json.loads(subprocess.run([dsv4, "--check", "--format", "json", *flags], check=True,
                                    capture_output=True, text=True).stdout)["reference_checksum"]
    peer_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_layer.py")
    peer = json.loads(subprocess.run([sys.executable, peer_py, "--dtype", "fp64", "--checksum", "--repeat", "0",
                                      "--format", "json", *flags], check=True, capture_output=True, text=True).stdout)
    ok = True
    for k in ("sum", "sumsq"):
        r, p = ref[k], peer["output_" + k]
        # Both sum the same doubles in another order: ~1e-15 relative; a wrong term shows at 1e-6 or more.
        good = abs(r - p) <= 1e-9 * max(1.0, abs(r))
        ok &= good
        print(f"{k}: reference {r!r} torch {p!r} {'OK' if good else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
