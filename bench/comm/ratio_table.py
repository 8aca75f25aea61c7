#!/usr/bin/env python3
"""Pairs each relayout collective with the raw MPI call of the same size (medians over the
repetitions) from Google Benchmark JSON files and prints a markdown table:
collective, bytes, np, relayout time, MPI time, ratio, busbw. Usage: ratio_table.py np2.json ..."""
import json
import re
import sys


def medians(path):
    with open(path) as f:
        data = json.load(f)
    np = data.get("context", {}).get("mpi_ranks")
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        m = re.match(r"(\w+)/(relayout|mpi)/(\d+)", b["run_name"])
        if m:
            out[(m.group(1), int(m.group(3)), m.group(2))] = b
    return np, out


def size_text(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main(paths):
    worst = 0.0
    print("| collective | size | np | relayout (us) | MPI (us) | ratio | busbw relayout (GB/s) | busbw MPI (GB/s) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        np = re.search(r"np(\d+)", path)
        np = np.group(1) if np else "?"
        _, rows = medians(path)
        for (name, size, kind), b in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            if kind != "relayout" or (name, size, "mpi") not in rows:
                continue
            raw = rows[(name, size, "mpi")]
            ratio = b["real_time"] / raw["real_time"]
            worst = max(worst, ratio)
            print(f"| {name} | {size_text(size)} | {np} | {b['real_time']:.2f} | {raw['real_time']:.2f} | "
                  f"{ratio:.3f} | {b.get('busbw_GBps', 0):.3f} | {raw.get('busbw_GBps', 0):.3f} |")
    print(f"\nworst relayout/MPI median ratio: {worst:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main(sys.argv[1:])
