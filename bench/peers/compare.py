#!/usr/bin/env python3
"""dsv4_layer against its PyTorch peer (torch_layer.py) on the same layer, np 1, one thread each:
rounds alternate the two programs (relayout, torch, relayout, torch, ...), each run reporting its
best of --repeat forwards; prints tokens/s per round and relayout / torch per round.
Usage: compare.py --dsv4 PATH [--mpiexec CMD] [--rounds N] [--repeat N] [--tokens 128,1024]
                  [--dtypes fp32,bf16] [--format text|json]"""
import argparse
import json
import os
import subprocess
import sys

LAYER = ["--hidden", "512", "--heads", "8", "--head-dim", "64", "--q-lora", "256", "--experts", "16",
         "--topk", "4", "--moe-inter", "256", "--shared-inter", "256", "--layers", "1"]


def requests_for(tokens):
    # Two requests of half the tokens each (the README's hand-over runs use 512,512).
    return f"{tokens // 2},{tokens - tokens // 2}" if tokens >= 2 else "1"


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out[out.index("{"):])


def relayout(a, tokens, dtype, env):
    cmd = [*a.mpiexec.split(), "-n", "1", a.dsv4, *LAYER, "--requests", requests_for(tokens), "--repeat",
           str(a.repeat), "--format", "json"]
    if dtype != "fp32":
        cmd += ["--dtype", dtype]
    j = run_json(cmd, env)
    return j["timing"]["tokens_per_s"], j.get("isa", {})


def torch_peer(a, tokens, dtype, env):
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_layer.py")
    cmd = [sys.executable, peer, *LAYER, "--requests", requests_for(tokens), "--repeat", str(a.repeat),
           "--threads", "1", "--dtype", dtype, "--format", "json"]
    return run_json(cmd, env)["tokens_per_s"]


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--dsv4", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tokens", default="128,1024")
    p.add_argument("--dtypes", default="fp32", help="dtypes to compare (dsv4_layer --dtype, torch_layer.py --dtype); fp32 only until dsv4_layer has --dtype")
    p.add_argument("--format", default="text", choices=["text", "json"])
    a = p.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_PROC_BIND="false")
    rows = []
    isa = {}
    for dtype in a.dtypes.split(","):
        for tokens in (int(t) for t in a.tokens.split(",")):
            r, t = [], []
            for _ in range(a.rounds):
                tps, isa = relayout(a, tokens, dtype, env)
                r.append(tps)
                t.append(torch_peer(a, tokens, dtype, env))
            ratios = [x / y for x, y in zip(r, t)]
            rows.append({"tokens": tokens, "dtype": dtype, "relayout_tokens_per_s": r, "torch_tokens_per_s": t,
                         "ratio": ratios})
    if a.format == "json":
        print(json.dumps({"isa": isa, "rows": rows}))
        return 0
    print(f"relayout compiled for: {isa.get('compiled', '?')}")
    print(f"cpu: {isa.get('cpu', '?')}")
    print(f"{'tokens':>6} {'dtype':>5} {'relayout tok/s':>22} {'torch tok/s':>22} {'relayout/torch':>16}")
    span = lambda v, f: f"{min(v):{f}}-{max(v):{f}}"
    for row in rows:
        print(f"{row['tokens']:>6} {row['dtype']:>5} {span(row['relayout_tokens_per_s'], '.0f'):>22} "
              f"{span(row['torch_tokens_per_s'], '.0f'):>22} {span(row['ratio'], '.2f'):>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
