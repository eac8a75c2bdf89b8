#!/usr/bin/env python3
"""Converts a BigMoeOnEdge `route_trace v1` CSV (github.com/Helldez/BigMoeOnEdge,
docs/bench-data/*/NAME.route.csv, Apache-2.0) into colibri's routing-trace JSON, the format
`coli trace` writes and `coli simulate --trace` reads (engine/src/experts/trace.rs).

The CSV has `#` preamble lines (`# model=... n_layer=48 n_expert=128 n_expert_used=6`,
`# layer=L expert_bytes=B ...`) and one row per routed slot:
`turn,phase,step,layer,slot,expert,weight,residency,expert_bytes` (phase 0 = prompt, 1 = decode).

Each (turn, step) becomes one trace step with one row, its layers in the order they appear,
each row's experts in slot order (the router's ranking) with their weights. With
`--merge-prefill`, the prompt steps of a turn become one step of many rows instead (how
colibri runs a prompt: one forward step per prefill chunk); the source engine ran them one
token at a time, so the default keeps them as recorded.

Standard library only:
    python3 tools/streaming/route_csv_to_trace.py qwen.route.csv qwen3-30b-a3b.trace.json
"""
import argparse
import csv
import json
import sys


def read(path):
    meta, layer_bytes, body = {}, {}, []
    with open(path, newline="", encoding="utf-8") as f:
        for ln in f:
            if ln.startswith("#"):
                kv = dict(t.split("=", 1) for t in ln[1:].split() if "=" in t)
                if "layer" in kv and "expert_bytes" in kv:
                    layer_bytes[int(kv["layer"])] = int(kv["expert_bytes"])
                else:
                    meta.update(kv)
            else:
                body.append(ln)
    if not body:
        sys.exit(f"{path}: no rows")
    return meta, layer_bytes, list(csv.DictReader(body))


def convert(path, merge_prefill):
    meta, layer_bytes, rows = read(path)
    for key in ("n_layer", "n_expert", "n_expert_used"):
        if key not in meta:
            sys.exit(f"{path}: the preamble has no {key}")
    n_layers, n_experts, top_k = (int(meta[k]) for k in ("n_layer", "n_expert", "n_expert_used"))
    # (turn, phase, step) -> layer -> [(slot, expert, weight)], in file order.
    steps = {}
    for r in rows:
        key = (int(r["turn"]), int(r["phase"]), int(r["step"]))
        layer, expert = int(r["layer"]), int(r["expert"])
        if not (0 <= layer < n_layers and 0 <= expert < n_experts):
            sys.exit(f"{path}: layer {layer} / expert {expert} outside {n_layers} x {n_experts}")
        steps.setdefault(key, {}).setdefault(layer, []).append(
            (int(r["slot"]), expert, float(r["weight"]))
        )
    out = []
    pending = None  # a merged prompt: (turn, {layer: [row, ...]}, rows)

    def flush():
        nonlocal pending
        if pending is not None:
            _, layers, n = pending
            out.append({"rows": n, "layers": [
                {"layer": l, "experts": [[e for _, e, _ in row] for row in rs],
                 "weights": [[w for _, _, w in row] for row in rs]}
                for l, rs in layers.items()]})
            pending = None

    for (turn, phase, _step), layers in sorted(steps.items()):
        routed = {l: sorted(slots) for l, slots in layers.items()}
        if merge_prefill and phase == 0:
            if pending is None or pending[0] != turn:
                flush()
                pending = (turn, {}, 0)
            t, acc, n = pending
            if set(acc) and set(acc) != set(routed):
                sys.exit(f"{path}: turn {turn}: prompt steps route different layers; cannot merge")
            for l, row in routed.items():
                acc.setdefault(l, []).append(row)
            pending = (t, acc, n + 1)
            continue
        flush()
        out.append({"rows": 1, "layers": [
            {"layer": l, "experts": [[e for _, e, _ in row]], "weights": [[w for _, _, w in row]]}
            for l, row in routed.items()]})
    flush()
    model = meta.get("model", path).rsplit("/", 1)[-1]
    expert_bytes = max(layer_bytes.values()) if layer_bytes else int(rows[0]["expert_bytes"] or 0)
    return {"version": 1, "model": model, "n_layers": n_layers, "n_experts": n_experts,
            "top_k": top_k, "expert_bytes": expert_bytes, "steps": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("output")
    ap.add_argument("--merge-prefill", action="store_true",
                    help="one step of many rows per prompt instead of one step per prompt token")
    a = ap.parse_args()
    t = convert(a.csv, a.merge_prefill)
    with open(a.output, "w") as f:
        json.dump(t, f, separators=(", ", ": "))
    print(f"{a.output}: {t['model']}, {t['n_layers']} layers x {t['n_experts']} experts, "
          f"top-{t['top_k']}, {len(t['steps'])} steps, {sum(s['rows'] for s in t['steps'])} tokens",
          file=sys.stderr)


if __name__ == "__main__":
    main()
