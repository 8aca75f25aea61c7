#!/usr/bin/env python3
"""Prints the relayout / raw MPI table from bench_comm's Google Benchmark JSON files: for each
collective, size and rank count, the medians over repetitions of the relayout time, the MPI time
(measured alternately on the same buffers), their ratio, and both bus bandwidths.
Usage: ratio_table.py bench_comm_np2.json bench_comm_np4.json"""
import json
import re
import sys


def size_text(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main(paths):
    worst = 0.0
    print("| collective | size | np | relayout (us) | MPI (us) | ratio | busbw relayout (GB/s) | busbw MPI (GB/s) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        found = re.search(r"np(\d+)", path)
        np = found.group(1) if found else "?"
        with open(path) as f:
            data = json.load(f)
        rows = []
        for b in data["benchmarks"]:
            m = re.match(r"(\w+)/paired/(\d+)", b["run_name"])
            if m and b.get("aggregate_name") == "median":
                rows.append((m.group(1), int(m.group(2)), b))
        for name, size, b in sorted(rows, key=lambda r: (r[0], r[1])):
            worst = max(worst, b["ratio"])
            print(f"| {name} | {size_text(size)} | {np} | {b['real_time']:.2f} | {b['mpi_us']:.2f} | "
                  f"{b['ratio']:.3f} | {b['busbw_GBps']:.3f} | {b['busbw_mpi_GBps']:.3f} |")
    print(f"\nworst relayout/MPI median ratio: {worst:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main(sys.argv[1:])
