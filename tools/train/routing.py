#!/usr/bin/env python3
"""Routing statistics of expert traces (the JSON `coli trace --output` writes).

    python tools/train/routing.py TRACE.json [TRACE.json ...] [--markdown]

Per trace and per MoE layer, over every routed token (prefill rows and decode steps, in
order):
- usage skew: the share of all routings that went to the most used quarter of the experts
  (uniform use: 25%), the most used expert's count over the mean, and the entropy of the
  usage distribution over its maximum ln(E) (1 = uniform);
- consecutive-token overlap: the share of a token's k experts that the token d positions
  before also used, for d = 1..5, against the chance level k/E.
Each trace's summary is the mean over its layers.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

DISTANCES = (1, 2, 3, 4, 5)


def token_routes(trace: dict) -> dict[int, list[list[int]]]:
    """layer -> the expert list of every routed token, in order."""
    out: dict[int, list[list[int]]] = {}
    for step in trace["steps"]:
        for lay in step["layers"]:
            out.setdefault(lay["layer"], []).extend(lay["experts"])
    return out


def layer_stats(routes: list[list[int]], n_experts: int, k: int) -> dict:
    counts = [0] * n_experts
    for r in routes:
        for e in r:
            counts[e] += 1
    total = sum(counts)
    srt = sorted(counts, reverse=True)
    quarter = max(1, n_experts // 4)
    p = [c / total for c in counts if c]
    entropy = -sum(x * math.log(x) for x in p) / math.log(n_experts)
    overlap = {}
    for d in DISTANCES:
        pairs = [(routes[i - d], routes[i]) for i in range(d, len(routes))]
        if pairs:
            overlap[d] = sum(len(set(a) & set(b)) / max(1, len(b)) for a, b in pairs) / len(pairs)
    return {"tokens": len(routes), "top_quarter_share": sum(srt[:quarter]) / total,
            "max_over_mean": srt[0] / (total / n_experts), "entropy": entropy,
            "unused": sum(1 for c in counts if c == 0), "overlap": overlap}


def summarize(path: Path) -> dict:
    t = json.loads(path.read_text())
    n_experts, k = t["n_experts"], t["top_k"]
    layers = {l: layer_stats(r, n_experts, k) for l, r in sorted(token_routes(t).items())}
    mean = lambda key: sum(s[key] for s in layers.values()) / len(layers)  # noqa: E731
    overlap = {d: sum(s["overlap"][d] for s in layers.values()) / len(layers) for d in DISTANCES}
    return {"trace": path.name, "model": t.get("model", ""), "layers": len(layers), "experts": n_experts,
            "k": k, "tokens": next(iter(layers.values()))["tokens"], "chance": k / n_experts,
            "top_quarter_share": mean("top_quarter_share"), "max_over_mean": mean("max_over_mean"),
            "entropy": mean("entropy"), "unused": mean("unused"), "overlap": overlap,
            "per_layer": layers}


def markdown(rows: list[dict]) -> str:
    head = ("| trace | layers × experts, k | tokens | top-quarter share | max/mean | entropy | "
            "overlap d=1 (chance) | d=2..5 |\n|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        o = r["overlap"]
        body += (f"| {r['trace']} | {r['layers']} × {r['experts']}, {r['k']} | {r['tokens']} | "
                 f"{r['top_quarter_share'] * 100:.1f}% | {r['max_over_mean']:.2f} | {r['entropy']:.3f} | "
                 f"{o[1] * 100:.1f}% ({r['chance'] * 100:.1f}%) | "
                 + ", ".join(f"{o[d] * 100:.1f}" for d in DISTANCES[1:]) + "% |\n")
    return head + body


def per_layer_markdown(r: dict) -> str:
    s = f"| {r['trace']} layer | top-quarter share | max/mean | entropy | unused | overlap d=1 |\n|---|---|---|---|---|---|\n"
    for l, x in r["per_layer"].items():
        s += (f"| {l} | {x['top_quarter_share'] * 100:.1f}% | {x['max_over_mean']:.2f} | {x['entropy']:.3f} | "
              f"{x['unused']} | {x['overlap'][1] * 100:.1f}% |\n")
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--per-layer", action="store_true", help="with --markdown: a table per trace")
    a = ap.parse_args()
    rows = [summarize(p) for p in a.traces]
    if a.markdown:
        print(markdown(rows))
        if a.per_layer:
            for r in rows:
                print(per_layer_markdown(r))
    else:
        for r in rows:
            r.pop("per_layer")
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
