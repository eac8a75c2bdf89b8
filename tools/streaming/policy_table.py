#!/usr/bin/env python3
"""The policy table of docs/STREAMING.md: `coli simulate --json` on routing traces, bytes per
token as a multiple of Belady's at 10%, 25% and 40% of each trace's experts, one Markdown row
per trace and capacity, the default policy's column last and the worst cell of every policy
in a closing row.

    python3 tools/streaming/policy_table.py [--coli target/release/coli] TRACE.json ...

Standard library only.
"""
import argparse
import json
import subprocess

POLICIES = ["lru", "lfu", "lfu-admit", "lrfu:4", "lrfu:16", "lrfu:64", "arc"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--capacity", default="10%,25%,40%")
    ap.add_argument("traces", nargs="+")
    a = ap.parse_args()
    worst = {}
    rows = []
    default = None
    for path in a.traces:
        out = subprocess.run(
            [a.coli, "simulate", "--trace", path, "--capacity", a.capacity, "--json"],
            check=True, capture_output=True, text=True).stdout
        sim = json.loads(out)
        default = sim["default_policy"]
        cols = POLICIES + [default]
        for cap in sorted({r["capacity"] for r in sim["results"]}):
            by = {r["policy"]: r for r in sim["results"] if r["capacity"] == cap}
            vals = [by[p]["vs_belady"] for p in cols]
            for p, v in zip(cols, vals):
                worst[p] = max(worst.get(p, 0.0), v)
            best_fixed = min(vals[:-1])
            share = 100.0 * cap / sim["total_experts"]
            rows.append(f"| {sim['trace']} | {cap} ({share:.0f}%) | "
                        + " | ".join(f"{v:.2f}" for v in vals) + f" | {best_fixed:.2f} |")
    cols = POLICIES + [f"**{default}** (default)"]
    print("| trace | capacity | " + " | ".join(cols) + " | best fixed |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        print(r)
    print("| worst | | " + " | ".join(f"{worst[p]:.2f}" for p in POLICIES + [default]) + " | |")


if __name__ == "__main__":
    main()
