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


# OpenBLAS (the BLAS of Debian's torch) picks its kernels by CPU model; a model newer than its
# tables falls back to an old core (an Emerald Rapids Xeon, model 207, got "Prescott", SSE3 kernels:
# 33 GFLOP/s where its AVX-512 kernels give 160-180), which would make the peer look slow for a
# reason no torch user on a supported CPU sees. --openblas-core auto names, in that case, the newest
# core whose instructions the CPU has (OPENBLAS_CORETYPE); "asis" keeps OpenBLAS's own choice.
FALLBACK_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "katmai", "coppermine",
                  "northwood", "banias", "unknown"}


def openblas_core(env):
    probe = "import torch; torch.randn(2, 2) @ torch.randn(2, 2)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=dict(env, OPENBLAS_VERBOSE="2"))
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith("Core:"):
            return line.split(":", 1)[1].strip()
    return "?"


def best_core(cpu_flags):
    if "avx512_bf16" in cpu_flags:
        return "Cooperlake"
    if "avx512f" in cpu_flags:
        return "SkylakeX"
    if "avx2" in cpu_flags:
        return "Haswell"
    return None


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--dsv4", required=True)
    p.add_argument("--mpiexec", default="mpiexec")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tokens", default="128,1024")
    p.add_argument("--dtypes", default="fp32", help="dtypes to compare (dsv4_layer --dtype, torch_layer.py --dtype); fp32 only until dsv4_layer has --dtype")
    p.add_argument("--format", default="text", choices=["text", "json"])
    p.add_argument("--openblas-core", default="auto",
                   help="auto: OpenBLAS's kernels for this CPU where it fell back to an old core; asis; or a core name")
    a = p.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_PROC_BIND="false")
    detected = openblas_core(env)
    if a.openblas_core not in ("auto", "asis"):
        env["OPENBLAS_CORETYPE"] = a.openblas_core
    elif a.openblas_core == "auto" and "OPENBLAS_CORETYPE" not in os.environ and detected.lower() in FALLBACK_CORES:
        with open("/proc/cpuinfo") as f:
            flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
        core = best_core(flags)
        if core:
            env["OPENBLAS_CORETYPE"] = core
    used = openblas_core(env)
    blas = {"detected": detected, "used": used}
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
        print(json.dumps({"isa": isa, "openblas_core": blas, "rows": rows}))
        return 0
    print(f"relayout compiled for: {isa.get('compiled', '?')}")
    print(f"cpu: {isa.get('cpu', '?')}")
    print(f"torch's OpenBLAS core: {used}" + (f" (it detected {detected}, a fallback: set by --openblas-core)"
                                            if used != detected else ""))
    print(f"{'tokens':>6} {'dtype':>5} {'relayout tok/s':>22} {'torch tok/s':>22} {'relayout/torch':>16}")
    span = lambda v, f: f"{min(v):{f}}-{max(v):{f}}"
    for row in rows:
        print(f"{row['tokens']:>6} {row['dtype']:>5} {span(row['relayout_tokens_per_s'], '.0f'):>22} "
              f"{span(row['torch_tokens_per_s'], '.0f'):>22} {span(row['ratio'], '.2f'):>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
