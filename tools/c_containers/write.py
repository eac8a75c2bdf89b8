#!/usr/bin/env python3
"""Writes colibri C engine containers from a Hub-layout checkpoint (the tiny transformers
fixtures in tests/fixtures), laid out as the C project's converters document it:

  glm      `tools/convert_fp8_to_int4.py`: each quantized matrix `name` as flat U8 bytes plus
           `name.qs` flat F32 scales; norms, routers (`mlp.gate.weight`) and biases F32;
           resident matrices at --ebits (per class: --shared/o/kvb/attn/dmlp-bits), routed
           experts at --xbits (per projection: --gate/up/down-bits), embed/lm_head at
           --io-bits; 3 bits is int3-g64, bits <= 4 with --group-size > 0 grouped int4, else
           int2/int4/int8 rows. The main pass leaves out the DSA indexer and the MTP layer
           (out-00000.safetensors); --indexer writes the indexer (out-idx-00000, at int8
           by default), --mtp the MTP layer (out-mtp-00000, int8 by default).
  merged   `tools/convert_olmoe_merged.py`: every routed expert's gate, up and down rows as
           one int8 `model.layers.L.mlp.experts.E.merged_weight` and `...experts.E.qs`, the
           dense tensors copied unchanged, shards model-NNNNN.safetensors, no index.
  split    the older `tools/convert_olmoe.py`: per-expert int8 tensors (values confined to
           --ebits) with `.qs` row scales, the rest unchanged.

    python tools/c_containers/write.py glm --input tests/fixtures/glm_moe_dsa --output OUT \\
        --ebits 8 --xbits 4 --group-size 32 [--indexer] [--mtp]

numpy only (no torch). Quantizers: cformats.py.
"""

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cformats as cf  # noqa: E402
import st  # noqa: E402

SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


def layer_of(name):
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def kind(name, n_layers, mode):
    """What the GLM converter does with a tensor: skip, f32, or a class to quantize."""
    li = layer_of(name)
    if mode == "indexer":
        if li < 0 or li >= n_layers or ".indexer." not in name:
            return "skip"
        return "f32" if name.endswith("norm.weight") else "q"
    if mode == "mtp":
        if li != n_layers or ".indexer." in name:
            return "skip"
    elif li >= n_layers or any(k in name for k in (".indexer.", "eh_proj", "enorm", "hnorm",
                                                    "shared_head")):
        return "skip"
    if name.endswith("e_score_correction_bias") or name.endswith("mlp.gate.weight"):
        return "f32"
    if name.endswith("norm.weight"):
        return "f32"
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return "io"
    if ".mlp.experts." in name and name.endswith(".weight"):
        return "x"
    if "shared_experts" in name:
        return "sh"
    if name.endswith("o_proj.weight"):
        return "o"
    if name.endswith("kv_b_proj.weight"):
        return "kvb"
    if name.endswith(("q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight")):
        return "attn"
    if name.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")):
        return "dmlp"
    return "q" if name.endswith(".weight") else "f32"


def quantize(w, bits, group_size):
    if bits == 3:
        return cf.quant_int3_g64(w)
    if group_size > 0 and bits <= 4:
        return cf.quant_int4_grouped(w, group_size, bits)
    if bits <= 2:
        return cf.quant_int2(w)
    if bits <= 4:
        return cf.quant_int4(w, bits)
    return cf.quant_int8(w, bits)


def raw_dir(d):
    raw = {}
    for f in sorted(Path(d).glob("*.safetensors")):
        raw.update(st.read_raw(f))
    return raw


def copy_side_files(src, dst):
    for f in SIDE_FILES:
        if (src / f).exists():
            shutil.copy2(src / f, dst / f)


def glm(a):
    src, out = Path(a.input), Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    n_layers = cfg["num_hidden_layers"]
    tensors, _ = st.read_dir(src)
    per_class = {k: v for k, v in (("sh", a.shared_bits), ("o", a.o_bits), ("kvb", a.kvb_bits),
                                   ("attn", a.attn_bits), ("dmlp", a.dmlp_bits)) if v is not None}
    per_proj = {k: v for k, v in (("gate_proj", a.gate_bits), ("up_proj", a.up_bits),
                                  ("down_proj", a.down_bits)) if v is not None}
    passes = [("main", a.ebits, "out-00000.safetensors")]
    if a.indexer:
        passes.append(("indexer", 8 if a.side_bits is None else a.side_bits,
                       "out-idx-00000.safetensors"))
    if a.mtp:
        passes.append(("mtp", 8 if a.side_bits is None else a.side_bits,
                       "out-mtp-00000.safetensors"))
    for mode, ebits, fname in passes:
        xbits = a.xbits if (a.xbits is not None and mode == "main") else ebits
        out_d = {}
        for name in sorted(tensors):
            k = kind(name, n_layers, mode)
            if k == "skip":
                continue
            w = tensors[name].astype(np.float32)
            if k == "f32" or w.ndim != 2:
                out_d[name] = np.ascontiguousarray(w)
                continue
            bits = per_class.get(k, a.io_bits if k == "io" else xbits if k == "x" else ebits)
            if k == "x":
                for proj, b in per_proj.items():
                    if f".{proj}." in name:
                        bits = b
            q, s = quantize(w, bits, a.group_size)
            out_d[name] = q
            out_d[name + ".qs"] = s
        if out_d:
            st.write(out / fname, out_d)
    copy_side_files(src, out)


EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


def merged(a):
    src, out = Path(a.input), Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    tensors, _ = st.read_dir(src)
    raw = raw_dir(src)
    dense, experts = {}, {}
    for name, t in tensors.items():
        m = EXPERT.match(name)
        if m:
            experts.setdefault((int(m.group(1)), int(m.group(2))), {})[m.group(3)] = t
        else:
            dense[name] = raw[name]  # unchanged (bf16 stays bf16)
    shards = [dense]
    cur = {}
    for (layer, e), p in sorted(experts.items()):
        q, s = cf.quant_merged_int8(p["gate_proj"], p["up_proj"], p["down_proj"])
        cur[f"model.layers.{layer}.mlp.experts.{e}.merged_weight"] = q
        cur[f"model.layers.{layer}.mlp.experts.{e}.qs"] = s
        if len(cur) >= a.flush_every:
            shards.append(cur)
            cur = {}
    if cur:
        shards.append(cur)
    for i, sh in enumerate(shards):
        st.write(out / f"model-{i:05d}.safetensors", sh)
    copy_side_files(src, out)


def split(a):
    src, out = Path(a.input), Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    tensors, _ = st.read_dir(src)
    raw = raw_dir(src)
    out_d = {}
    for name, t in sorted(tensors.items()):
        if EXPERT.match(name):
            q, s = cf.quant_int8(t, a.ebits)
            out_d[name] = q.view(np.int8).reshape(t.shape)
            out_d[name + ".qs"] = s
        else:
            out_d[name] = raw[name]
    st.write(out / "model.safetensors", out_d)
    copy_side_files(src, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="layout", required=True)
    g = sub.add_parser("glm")
    for p in (g, sub.add_parser("merged"), sub.add_parser("split")):
        p.add_argument("--input", required=True)
        p.add_argument("--output", required=True)
    g.add_argument("--ebits", type=int, default=4)
    g.add_argument("--xbits", type=int)
    g.add_argument("--io-bits", type=int, default=8)
    g.add_argument("--group-size", type=int, default=64)
    for c in ("shared", "o", "kvb", "attn", "dmlp", "gate", "up", "down"):
        g.add_argument(f"--{c}-bits", type=int)
    g.add_argument("--indexer", action="store_true", help="also write the DSA indexer pass")
    g.add_argument("--mtp", action="store_true", help="also write the MTP layer pass")
    g.add_argument("--side-bits", type=int, help="bits of the --indexer/--mtp passes (8)")
    sub.choices["merged"].add_argument("--flush-every", type=int, default=512)
    sub.choices["split"].add_argument("--ebits", type=int, default=8)
    a = ap.parse_args()
    {"glm": glm, "merged": merged, "split": split}[a.layout](a)


if __name__ == "__main__":
    main()
