#!/usr/bin/env python3
"""Summarizes tools/bench/compare.sh's raw outputs: per test, each engine's range over the
rounds (tok/s), the ratio colibri/llama.cpp per round (both measured in that round), the
read bandwidth colibri measured, and colibri's bytes per decoded token.

    tools/bench/summarize.py OUT_DIR
"""
import glob
import json
import re
import sys
from collections import defaultdict


def main():
    out = sys.argv[1]
    llama = defaultdict(dict)   # test -> round -> tok/s
    coli = defaultdict(dict)
    extra = defaultdict(list)
    for f in sorted(glob.glob(f"{out}/round-*-llama-*.txt")):
        r = int(re.search(r"round-(\d+)-", f).group(1))
        for line in open(f):
            if not line.startswith("{"):
                continue
            j = json.loads(line)
            kind = f"prefill {j['n_prompt']}" if j["n_prompt"] else f"decode {j['n_gen']}"
            if j["n_depth"]:
                kind += f" @ depth {j['n_depth']}"
            llama[kind][r] = j["avg_ts"]
    for f in sorted(glob.glob(f"{out}/round-*-colibri-*.txt")):
        r = int(re.search(r"round-(\d+)-", f).group(1))
        text = open(f).read()
        for what, v, n, d in re.findall(r"^(prefill|decode)\s+([\d.]+) tok/s\s+\((\d+) tokens at depth (\d+)", text, re.M):
            if n == "0":
                continue
            kind = f"{what} {n}" + (f" @ depth {d}" if d != "0" else "")
            coli[kind][r] = float(v)
        m = re.search(r"decode reads ([\d.]+) MB per token .*?: ([\d.]+) GB/s of ([\d.]+) GB/s read bandwidth \((\d+)%\)", text)
        tag = re.search(r"colibri-(\w+)\.txt", f).group(1)
        if m and tag != "p512":
            extra[f"{tag}: MB read per decoded token"].append(float(m.group(1)))
            extra[f"{tag}: decode GB/s"].append(float(m.group(2)))
            extra[f"{tag}: read bandwidth GB/s"].append(float(m.group(3)))
            extra[f"{tag}: % of bandwidth"].append(float(m.group(4)))
    rng = lambda v: f"{min(v):.1f}–{max(v):.1f}" if v else "—"
    print("| test | llama.cpp tok/s | colibri tok/s | colibri / llama.cpp (same round) |")
    print("|---|---|---|---|")
    for kind in sorted(set(llama) | set(coli), key=lambda k: (k.startswith("decode"), "@" in k, int(re.findall(r"\d+", k)[0]))):
        rounds = sorted(set(llama[kind]) & set(coli[kind]))
        ratios = [coli[kind][r] / llama[kind][r] for r in rounds]
        print(f"| {kind} | {rng(list(llama[kind].values()))} | {rng(list(coli[kind].values()))} | "
              + (f"{min(ratios):.2f}–{max(ratios):.2f}×" if ratios else "—") + " |")
    for k, v in extra.items():
        print(f"colibri {k}: {rng(v)}")


if __name__ == "__main__":
    main()
