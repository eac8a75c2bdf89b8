#!/usr/bin/env python3
"""What batching k sessions can buy at most, by bytes (issue 15).

A batched decode step reads every dense weight once for its k rows, and each routed expert
once for every row routed to it: k tokens cost `dense + u_k * experts` bytes where `u_k` is
the union of the k rows' experts over one row's. On a memory-bound machine the resident
speed-up is at most `k (dense + experts) / (dense + u_k experts)`; with the experts streamed
from a saturated disk it is at most `k / u_k` (misses grow with the union).

`u_k` comes from real routing (a trace in colibri's JSON, e.g. ../shared/traces: k decode
tokens drawn at random from different positions and prompts) and from uniform routing (what a
random-weight synth model does):

    tools/bench/batch_cap.py --dense-mb 270 --expert-mb 422 /work/shared/traces/*.trace.json

--experts/--top-k give the uniform figure for another model's shape (OLMoE: 64, 8).
"""
import argparse
import json
import random


def union_from_trace(path, ks, draws, rng):
    t = json.load(open(path))
    layers, top_k = t["n_layers"], t["top_k"]
    tokens = []
    for step in t["steps"]:
        by_layer = {l["layer"]: l for l in step["layers"]}
        if len(by_layer) < layers or step["rows"] != 1:
            continue
        tokens.append([set(by_layer[i]["experts"][0]) for i in range(layers)])
    out = {}
    for k in ks:
        total = 0.0
        for _ in range(draws):
            pick = rng.sample(tokens, k)
            total += sum(len(set().union(*(p[l] for p in pick))) for l in range(layers)) / layers
        out[k] = total / draws / top_k
    return t, len(tokens), out


def union_uniform(experts, top_k, k):
    return experts * (1 - (1 - top_k / experts) ** k) / top_k


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--dense-mb", type=float, default=270.0, help="dense bytes read per token (MB)")
    ap.add_argument("--expert-mb", type=float, default=422.0, help="routed-expert bytes per token (MB)")
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--draws", type=int, default=3000)
    a = ap.parse_args()
    ks = [int(v) for v in a.rows.split(",")]
    rng = random.Random(1)
    d, e = a.dense_mb, a.expert_mb

    def line(name, k, u):
        resident = k * (d + e) / (d + u * e)
        print(f"  {k} rows: union {u:.2f}x one row's experts; cap resident {resident:.2f}x, streamed (disk-bound) {k / u:.2f}x")

    print(f"uniform routing, {a.experts} experts top-{a.top_k}, {d:.0f} MB dense + {e:.0f} MB experts a token:")
    for k in ks:
        line("uniform", k, union_uniform(a.experts, a.top_k, k))
    for path in a.traces:
        t, n, us = union_from_trace(path, ks, a.draws, rng)
        print(f"{t['model']} ({t['n_layers']} x {t['n_experts']}, top-{t['top_k']}, {n} one-row tokens), same bytes:")
        for k in ks:
            line(path, k, us[k])


if __name__ == "__main__":
    main()
