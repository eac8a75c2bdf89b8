#!/usr/bin/env python3
"""Summarizes tools/bench/compare.sh's raw outputs: per test, llama.cpp's and each colibri
container's range over the rounds (tok/s) and the ratio colibri / llama.cpp per round (both
measured in that round); then, per container, the bytes colibri reads per decoded token,
the rate it reads them at and the read bandwidth measured in the same run.

    tools/bench/summarize.py OUT_DIR
"""
import glob
import json
import re
import sys
from collections import defaultdict


def rng(v, fmt="{:.1f}"):
    return (fmt.format(min(v)) + "–" + fmt.format(max(v))) if v else "—"


def main():
    out = sys.argv[1]
    llama = defaultdict(dict)  # test -> round -> tok/s
    coli = defaultdict(lambda: defaultdict(dict))  # container -> test -> round -> tok/s
    extra = defaultdict(lambda: defaultdict(list))
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
        m = re.search(r"round-(\d+)-colibri-(.+)-(p64|p512|d512)\.txt", f)
        r, name, tag = int(m.group(1)), m.group(2), m.group(3)
        text = open(f).read()
        for what, v, n, d in re.findall(
            r"^(prefill|decode)\s+([\d.]+) tok/s\s+\((\d+) tokens at depth (\d+)", text, re.M
        ):
            if n == "0":
                continue
            kind = f"{what} {n}" + (f" @ depth {d}" if d != "0" else "")
            coli[name][kind][r] = float(v)
        m = re.search(
            r"decode reads ([\d.]+) MB per token .*?: ([\d.]+) GB/s of ([\d.]+) GB/s read bandwidth \((\d+)%\)",
            text,
        )
        if m and tag != "p512":
            e = extra[f"{name} ({'depth 512' if tag == 'd512' else 'depth 0'})"]
            e["MB read per decoded token"].append(float(m.group(1)))
            e["decode reads at GB/s"].append(float(m.group(2)))
            e["read bandwidth GB/s (same run)"].append(float(m.group(3)))
            e["% of read bandwidth"].append(float(m.group(4)))
    names = sorted(coli)
    head = "| test | llama.cpp Q4_0 tok/s | " + " | ".join(
        f"{n} tok/s | {n} / llama.cpp" for n in names
    ) + " |"
    print(head)
    print("|" + "---|" * (2 + 2 * len(names)))
    kinds = sorted(
        set(llama) | {k for n in names for k in coli[n]},
        key=lambda k: (k.startswith("decode"), "@" in k, int(re.findall(r"\d+", k)[0])),
    )
    for kind in kinds:
        row = f"| {kind} | {rng(list(llama[kind].values()))} |"
        for n in names:
            rounds = sorted(set(llama[kind]) & set(coli[n][kind]))
            ratios = [coli[n][kind][r] / llama[kind][r] for r in rounds]
            row += f" {rng(list(coli[n][kind].values()))} | {rng(ratios, '{:.2f}') + '×' if ratios else '—'} |"
        print(row)
    for name, e in extra.items():
        print(f"\n{name}: " + "; ".join(f"{k} {rng(v)}" for k, v in e.items()))


if __name__ == "__main__":
    main()
