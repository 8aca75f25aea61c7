#!/usr/bin/env python3
"""The bytes that must cross between test hosts in one dsv4_layer run, from what the layer reports.

Inputs: the layer's `--format json` report (calls and bytes per collective, group and rank), the
layout's groups (`relayout explain --format json`), the run's `--trace` directory and the number of
ranks per host (ranks are placed in blocks: 0..ppn-1 on h1, ...). Only collectives whose group has
members on more than one host count. For each such group instance, with k hosts among its members,
the least that must enter the hosts (summed over hosts) for every member's result to be right, for
any implementation that does not compress the floats it moves:

  all_reduce           k * n       every host needs the other hosts' contribution to all n bytes
  all_gather(v)        (k - 1) * R each host lacks the blocks of the other hosts; the blocks add up to R
  reduce_scatter(v)    S           each block's owner needs the other hosts' partial sums of it
  all_to_all           per member, its send bytes times (members on other hosts) / (members)
  dispatch / combine   the (row, destination rank) pairs the trace shows crossing hosts: a row travels
                       once per rank holding one of its experts (H floats and its k expert ids and
                       weights out, H floats back); checked against the reported bytes

(n, R, S: the bytes the layer reports for one member: buffer, received, sent.) Prints one JSON object.
"""
import argparse
import json
import os
import sys


def load_trace(path):
    recs = []
    for name in sorted(os.listdir(path)):
        if not name.startswith("rank"):
            continue
        with open(os.path.join(path, name)) as f:
            for line in f:
                r = json.loads(line)
                if "boundary" in r:
                    recs.append(r)
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", required=True)
    ap.add_argument("--explain", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--ppn", type=int, required=True)
    a = ap.parse_args()
    report = json.load(open(a.report))
    groups = json.load(open(a.explain))["groups"]
    host = lambda r: r // a.ppn

    def group_of(kind, rank):
        return next(g for g in groups[kind] if rank in g)

    # reported[(op, kind, group)][rank] = bytes
    reported = {}
    for rank in report["ranks"]:
        for c in rank["collectives"]:
            g = tuple(group_of(c["group"], rank["rank"]))
            reported.setdefault((c["op"], c["group"], g), {})[rank["rank"]] = c["bytes"]

    bound = {}
    naive = 0  # the plain sum over ranks of what each reports for cross-host collectives
    ep_reported = {"dispatch": 0, "combine": 0}
    for (op, kind, g), per_rank in sorted(reported.items()):
        k = len({host(r) for r in g})
        if op in ep_reported:
            ep_reported[op] += sum(per_rank.values())
        if k < 2:
            continue
        naive += sum(per_rank.values())
        key = op + "@" + kind
        one = min(per_rank.values())
        if op == "all_reduce":
            b = k * one
        elif op.startswith("all_gather"):
            b = (k - 1) * one
        elif op.startswith("reduce_scatter"):
            b = one
        elif op == "all_to_all":
            b = sum(s * sum(1 for m in g if host(m) != host(r)) // len(g) for r, s in per_rank.items())
        elif op in ep_reported:
            continue  # from the trace, below
        else:
            sys.exit(f"wire_bound: no rule for collective {op}")
        bound[key] = bound.get(key, 0) + b

    if ep_reported["dispatch"]:
        recs = load_trace(a.trace)
        hidden = recs[0]["hidden"]
        # Where each row sits before the dispatch (split_rows), per layer: owner -> rank.
        source = {}
        for r in recs:
            if r["boundary"] == "split_rows":
                for row in r["rows"]:
                    source[(r["layer"], tuple(row[:3]))] = r["global_rank"]
        # The expert ranks list one row per (row, local expert); a row travels once per rank.
        pairs = set()
        for r in recs:
            if r["boundary"] == "dispatch+experts":
                for row in r["rows"]:
                    pairs.add((r["layer"], tuple(row[:3]), r["global_rank"]))
        cross = sum(1 for (layer, owner, dest) in pairs if host(source[(layer, owner)]) != host(dest))
        back = hidden * 4
        if len(pairs) * back != ep_reported["combine"]:
            sys.exit(f"wire_bound: the trace's {len(pairs)} (row, rank) pairs x {back} bytes do not match the "
                     f"{ep_reported['combine']} combine bytes the layer reports")
        out, rem = divmod(ep_reported["dispatch"], len(pairs))
        if rem or (out - back) % 8 or out <= back:
            sys.exit(f"wire_bound: {ep_reported['dispatch']} dispatch bytes are not {len(pairs)} pairs of "
                     f"{back} bytes plus k (id, weight) entries")
        if cross:
            bound["dispatch@moe_ep"] = cross * out
            bound["combine@moe_ep"] = cross * back
        bound["_pairs"] = {"total": len(pairs), "cross_host": cross, "topk": (out - back) // 8}

    total = sum(v for k, v in bound.items() if not k.startswith("_"))
    print(json.dumps({"path": report["path"], "cross_host_bound_bytes": total, "by_collective": bound,
                      "reported_cross_host_collectives_all_ranks": naive}))


if __name__ == "__main__":
    main()
