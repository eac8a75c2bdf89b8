#!/usr/bin/env python3
"""Bytes one decoded token of a GGUF MoE model reads, in MB, as docs/PERFORMANCE.md counts
them for llama.cpp: every tensor but the token embedding table (looked up, not read), and of
the expert tensors (`*_exps`) the share of the experts a token uses.

    python tools/bench/gguf_decode_bytes.py MODEL.gguf [--gguf-py $LLAMA/gguf-py]

Needs llama.cpp's gguf-py (and numpy): run it with the llama baseline's virtual
environment (../shared/bench/llama_baseline.sh makes one).
"""

import argparse
import sys

ap = argparse.ArgumentParser()
ap.add_argument("gguf")
ap.add_argument("--gguf-py", help="llama.cpp's gguf-py folder, when gguf is not installed")
a = ap.parse_args()
if a.gguf_py:
    sys.path.insert(0, a.gguf_py)
import gguf  # noqa: E402

r = gguf.GGUFReader(a.gguf)
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
used = 1.0
if f"{arch}.expert_count" in r.fields:
    n = int(r.fields[f"{arch}.expert_count"].parts[-1][0])
    k = int(r.fields[f"{arch}.expert_used_count"].parts[-1][0])
    used = k / n
total = 0.0
for t in r.tensors:
    if t.name.startswith("token_embd"):
        continue
    total += int(t.n_bytes) * (used if "_exps" in t.name else 1.0)
print(f"{total / 1e6:.1f}")
