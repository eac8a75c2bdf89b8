#!/usr/bin/env python3
"""docs/FORMAT.md's table of formats measured on a trained model.

    python tools/train/formats.py --model models/olmoe-pydoc --text held_out.txt --work /tmp/formats \\
        [--coli target/release/coli] [--ctx 256] [--chunks 0] [--llama /tmp/formats/llama.json]

For every row: `coli convert` the Hub checkpoint into a container of that format (cached in
--work), then `coli perplexity --local --file TEXT --ctx N --compare MODEL --output json`:
perplexity on the held-out text and the mean KL(bf16 ‖ format) of the next-token
distributions, with the bf16 checkpoint as the reference, on the same windows. Expert top-p
rows run the bf16 checkpoint with --expert-topp. --llama adds the rows of
tools/train/llama_cpp.sh's report (llama.cpp's own bf16, Q8_0 and Q4_0 GGUFs on the same
text and window; KL against llama.cpp's bf16). Prints a markdown table and writes
formats.json in --work.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

# label, `coli convert` options (None: the Hub checkpoint itself), extra perplexity options
ROWS = [
    ("bf16 (Hub checkpoint)", None, []),
    ("experts int8, dense bf16", ["--experts", "int8"], []),
    ("experts int4-g32, dense bf16", ["--experts", "int4", "--group-size", "32"], []),
    ("experts int4-g64, dense bf16 (default)", ["--experts", "int4", "--group-size", "64"], []),
    ("experts int4 per row, dense bf16", ["--experts", "int4", "--group-size", "0"], []),
    ("experts bf16, dense int8 per row", ["--experts", "bf16", "--dense", "int8"], []),
    ("experts bf16, dense int8-g64", ["--experts", "bf16", "--dense", "int8-g64"], []),
    ("experts bf16, dense int8-g32", ["--experts", "bf16", "--dense", "int8-g32"], []),
    ("experts bf16, attention int4-g64, rest bf16", ["--experts", "bf16", "--attention", "int4-g64"], []),
    ("experts bf16, attention int4-g32, rest bf16", ["--experts", "bf16", "--attention", "int4-g32"], []),
    ("experts int4-g64, dense int8 per row", ["--experts", "int4", "--group-size", "64", "--dense", "int8"], []),
    ("experts int4-g64, dense int8-g32", ["--experts", "int4", "--group-size", "64", "--dense", "int8-g32"], []),
    ("experts int4-g64, dense int8-g32, attention int4-g32",
     ["--experts", "int4", "--group-size", "64", "--dense", "int8-g32", "--attention", "int4-g32"], []),
    ("experts bf16, lm_head int4-g32, rest bf16", ["--experts", "bf16", "--lm-head", "int4-g32"], []),
    ("experts int4-g64, dense int8-g32, attention int4-g32, lm_head int4-g32",
     ["--experts", "int4", "--group-size", "64", "--dense", "int8-g32", "--attention", "int4-g32",
      "--lm-head", "int4-g32"], []),
    ("experts bf16, lm_head int5-g32, rest bf16", ["--experts", "bf16", "--lm-head", "int5-g32"], []),
    ("experts int4-g64, dense int8-g32, attention int4-g32, lm_head int5-g32",
     ["--experts", "int4", "--group-size", "64", "--dense", "int8-g32", "--attention", "int4-g32",
      "--lm-head", "int5-g32"], []),
    ("experts int2-g32, dense bf16", ["--experts", "int2", "--group-size", "32"], []),
    ("bf16, expert top-p 0.9", None, ["--expert-topp", "0.9"]),
    ("bf16, expert top-p 0.6", None, ["--expert-topp", "0.6"]),
]


def folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.iterdir() if f.suffix == ".safetensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--coli", default="target/release/coli")
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=0)
    ap.add_argument("--llama", type=Path, help="JSON report of tools/train/llama_cpp.sh")
    ap.add_argument("--only", help="run only rows whose label contains this")
    ap.add_argument("--redo", action="store_true",
                    help="measure rows again that --work's formats.json already holds (default: reuse them)")
    ap.add_argument("--extra", action="append", default=[],
                    help="another row: 'LABEL|convert options|perplexity options' (options space separated)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = list(ROWS)
    for e in a.extra:
        label, conv, extra = (e.split("|") + ["", ""])[:3]
        rows.append((label, conv.split() if conv.strip() else None, extra.split()))
    results_path = a.work / "formats.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for label, conv, extra in rows:
        if a.only and a.only not in label:
            continue
        if label in results and not a.redo:
            continue
        target = a.model
        if conv is not None:
            target = a.work / ("container" + "".join(x.replace("-", "_") for x in conv))
            subprocess.run([a.coli, "convert", "--input", str(a.model), "--output", str(target), *conv],
                           check=True)
        t = time.time()
        cmd = [a.coli, "perplexity", "--local", "--model", str(target), "--file", str(a.text),
               "--ctx", str(a.ctx), "--compare", str(a.model), "--output", "json", *extra]
        if a.chunks:
            cmd += ["--chunks", str(a.chunks)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        r["bytes"] = folder_bytes(target)
        r["seconds"] = time.time() - t
        r["command"] = " ".join(cmd)
        results[label] = r
        results_path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"{label}: ppl {r['ppl']:.4f}, KL {r['kl_mean']:.3e}, top-1 {r['top1_agreement'] * 100:.2f}% "
              f"({r['seconds']:.0f} s)", flush=True)
    base = results.get("bf16 (Hub checkpoint)")
    print()
    print("| format | weights (MB) | perplexity | Δ vs bf16 | mean KL vs bf16 (nats) | same top token |")
    print("|---|---|---|---|---|---|")
    for label, _, _ in rows:
        r = results.get(label)
        if not r:
            continue
        d = (r["ppl"] / base["ppl"] - 1) * 100 if base else float("nan")
        print(f"| {label} | {r['bytes'] / 1e6:.1f} | {r['ppl']:.3f} | {d:+.2f}% | {r['kl_mean']:.2e} | "
              f"{r['top1_agreement'] * 100:.2f}% |")
    if a.llama and a.llama.exists():
        ll = json.loads(a.llama.read_text())
        sizes = ll.get("sizes", {})
        lb = ll.get("bf16", {}).get("ppl")
        for name in ("bf16", "Q8_0", "Q4_0"):
            r = ll.get(name)
            if not r:
                continue
            size = next((v for k, v in sizes.items() if k.endswith(f"-{name}.gguf")), 0)
            d = (r["ppl"] / lb - 1) * 100 if lb else float("nan")
            kl = f"{r['kl_mean']:.2e}" if "kl_mean" in r else "—"
            top = f"{r['top1_agreement'] * 100:.2f}%" if "top1_agreement" in r else "—"
            print(f"| llama.cpp {name} (GGUF) | {size / 1e6:.1f} | {r['ppl']:.3f} | {d:+.2f}% vs llama.cpp bf16 | "
                  f"{kl} | {top} |")


if __name__ == "__main__":
    main()
