#!/usr/bin/env python3
"""The demo model's decoder layer in plain PyTorch: the peer `make bench` times dsv4_layer against.

Same math as examples/demo/model/reference.hpp (RMSNorm, low-rank query, one shared KV head, causal
attention per request, softmax top-k routing renormalised, SwiGLU experts plus a shared expert,
two residuals) and the same values: weights and inputs come from the same counter-based generator
(apps/demo_model/weights.hpp), so at --dtype fp64 the output is the reference's, and --checksum
prints its sum and sum of squares to compare with `dsv4_layer --check --format json`.
Written the way an engine author would write it in eager PyTorch (one matmul per projection, a loop
over the experts); one thread unless --threads says otherwise.
"""
import argparse
import json
import math
import sys
import time

import numpy as np
import torch

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)

# apps/demo_model/weights.hpp: enum class Tensor
EMBEDDING, ATTN_NORM, WQ_A, Q_NORM, WQ_B, WKV, KV_NORM, WO_B, FFN_NORM, ROUTER = range(1, 11)
EXPERT_W1, EXPERT_W3, EXPERT_W2, SHARED_W1, SHARED_W3, SHARED_W2 = range(11, 17)


def mix64(x):
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic, as in C++)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & M64
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & M64
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & M64
        return x ^ (x >> np.uint64(31))


def tensor_key(seed, layer, tensor, expert=0):
    inner = (np.uint64(layer) << np.uint64(40)) ^ (np.uint64(tensor) << np.uint64(32)) ^ np.uint64(expert & 0xFFFFFFFF)
    return mix64(np.uint64(seed) ^ mix64(np.array(inner, dtype=np.uint64)))


def counter_uniform(key, index, scale):
    """Uniform in [-scale, scale) from the top 24 bits, computed in float32 as the C++ does."""
    bits = mix64(key ^ mix64(index.astype(np.uint64))) >> np.uint64(40)
    u = bits.astype(np.float32) * np.float32(2.0 / 16777216.0) - np.float32(1.0)
    return np.float32(scale) * u


def init_scale(fan_in):
    return np.float32(1.0 / math.sqrt(fan_in))


def matrix(key, rows, cols, scale):
    idx = np.arange(rows * cols, dtype=np.uint64)
    return torch.from_numpy(counter_uniform(key, idx, scale).reshape(rows, cols))


def norm(key, n):
    return torch.from_numpy(np.float32(1.0) + counter_uniform(key, np.arange(n, dtype=np.uint64), 0.25))


def layer_weights(a, layer):
    H, Q, D, HD, I, S = a.hidden, a.q_lora, a.head_dim, a.heads * a.head_dim, a.moe_inter, a.shared_inter
    k = lambda t, e=0: tensor_key(a.seed, layer, t, e)
    w = {
        "attn_norm": norm(k(ATTN_NORM), H), "q_norm": norm(k(Q_NORM), Q),
        "kv_norm": norm(k(KV_NORM), D), "ffn_norm": norm(k(FFN_NORM), H),
        "wq_a": matrix(k(WQ_A), Q, H, init_scale(H)), "wq_b": matrix(k(WQ_B), HD, Q, init_scale(Q)),
        "wkv": matrix(k(WKV), D, H, init_scale(H)), "wo_b": matrix(k(WO_B), H, HD, init_scale(HD)),
        "router": matrix(k(ROUTER), a.experts, H, init_scale(H)),
        "w1": [matrix(k(EXPERT_W1, e), I, H, init_scale(H)) for e in range(a.experts)],
        "w3": [matrix(k(EXPERT_W3, e), I, H, init_scale(H)) for e in range(a.experts)],
        "w2": [matrix(k(EXPERT_W2, e), H, I, init_scale(I)) for e in range(a.experts)],
    }
    if S > 0:
        w["shared"] = (matrix(k(SHARED_W1), S, H, init_scale(H)), matrix(k(SHARED_W3), S, H, init_scale(H)),
                       matrix(k(SHARED_W2), H, S, init_scale(S)))
    return w


def cast(w, dtype):
    if isinstance(w, dict):
        return {n: cast(v, dtype) for n, v in w.items()}
    if isinstance(w, (list, tuple)):
        return type(w)(cast(v, dtype) for v in w)
    return w.to(dtype)


def inputs(a):
    owners = [(r << 32) | p for r, n in enumerate(a.requests) for p in range(n)]
    idx = (np.array(owners, dtype=np.uint64)[:, None] * np.uint64(a.hidden) +
           np.arange(a.hidden, dtype=np.uint64)[None, :])
    return torch.from_numpy(counter_uniform(tensor_key(a.seed, 0, EMBEDDING), idx, 1.0))


def wide(x):
    """x in fp32 at least: norms and softmaxes of bf16 activations run in fp32, as engines do."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def rms_norm(x, w, eps):
    xf = wide(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.to(y.dtype)).to(x.dtype)


def attention(q, kv, a):
    """Causal attention of every request over its own rows, one shared KV head (K = V)."""
    n, D = kv.shape
    q = q.view(n, a.heads, D)
    out = torch.empty_like(q)
    scale = 1.0 / math.sqrt(D)
    start = 0
    for L in a.requests:
        qs, ks = q[start:start + L], kv[start:start + L]
        s = wide(torch.einsum("lhd,md->hlm", qs, ks)) * scale
        pos = torch.arange(L)
        mask = pos[None, :] > pos[:, None]
        if a.window > 0:
            mask |= pos[None, :] <= pos[:, None] - a.window
        s.masked_fill_(mask, float("-inf"))
        p = torch.softmax(s, dim=-1).to(kv.dtype)
        out[start:start + L] = torch.einsum("hlm,md->lhd", p, ks)
        start += L
    return out.reshape(n, a.heads * D)


def moe(h, w, a):
    logits = wide(h @ w["router"].t())
    scores = torch.softmax(logits, dim=-1)
    top_w, top_i = torch.topk(scores, a.topk, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)).to(h.dtype)
    y = torch.zeros_like(h)
    for e in range(a.experts):
        tok, slot = torch.nonzero(top_i == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        xe = h.index_select(0, tok)
        ye = (torch.nn.functional.silu(xe @ w["w1"][e].t()) * (xe @ w["w3"][e].t())) @ w["w2"][e].t()
        y.index_add_(0, tok, ye * top_w[tok, slot].unsqueeze(1))
    if "shared" in w:
        w1, w3, w2 = w["shared"]
        y += (torch.nn.functional.silu(h @ w1.t()) * (h @ w3.t())) @ w2.t()
    return y


def layer(x, w, a):
    eps = 1e-6
    xn = rms_norm(x, w["attn_norm"], eps)
    q = rms_norm(xn @ w["wq_a"].t(), w["q_norm"], eps) @ w["wq_b"].t()
    kv = rms_norm(xn @ w["wkv"].t(), w["kv_norm"], eps)
    residual = x + attention(q, kv, a) @ w["wo_b"].t()
    h = rms_norm(residual, w["ffn_norm"], eps)
    return residual + moe(h, w, a)


def forward(x, weights, a):
    for w in weights:
        x = layer(x, w, a)
    return x


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--q-lora", type=int, default=32)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--moe-inter", type=int, default=32)
    p.add_argument("--shared-inter", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--window", type=int, default=0)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--requests", default="5,3,4,2,6,1,3", help="tokens per request, comma separated")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp64"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="forwards timed after one warm-up; the best is reported")
    p.add_argument("--checksum", action="store_true", help="print the sum and sum of squares of the output")
    p.add_argument("--format", default="text", choices=["text", "json"])
    a = p.parse_args(argv)
    try:
        a.requests = [int(t) for t in a.requests.split(",")]
    except ValueError:
        p.error("--requests: a comma-separated list of positive integers")
    if any(n < 1 for n in a.requests):
        p.error("--requests: every request needs >= 1 token")
    if a.topk < 1 or a.topk > a.experts:
        p.error("--topk: must be in [1, --experts]")
    if a.repeat < 0 or a.threads < 1:
        p.error("--repeat must be >= 0 and --threads >= 1")
    return a


def main(argv):
    a = parse(argv)
    torch.set_num_threads(a.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}[a.dtype]
    weights = [cast(layer_weights(a, l), dtype) for l in range(a.layers)]
    x = inputs(a).to(dtype)
    with torch.no_grad():
        y = forward(x, weights, a)  # the warm-up, and the output the checksum reads
        best = math.inf
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            forward(x, weights, a)
            best = min(best, time.perf_counter() - t0)
    tokens = sum(a.requests)
    r = {"peer": "torch", "torch": torch.__version__, "dtype": a.dtype, "threads": a.threads, "tokens": tokens,
         "layers": a.layers}
    if a.repeat > 0:
        r.update(best_forward_s=best, tokens_per_s=tokens / best)
    if a.checksum:
        yd = y.double()
        r.update(output_sum=float(yd.sum()), output_sumsq=float((yd * yd).sum()))
    if a.format == "json":
        print(json.dumps(r))
    else:
        print(" ".join(f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
