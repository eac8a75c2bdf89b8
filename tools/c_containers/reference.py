#!/usr/bin/env python3
"""Transformers logits on a container's dequantized weights: the reference a container is
measured against (docs/FORMAT.md, "The colibri C container layout").

    python tools/c_containers/reference.py --fixture tests/fixtures/glm_moe_dsa \\
        --container DIR --out reference.f32 [--dense-attention]

The container may be in the C layout (`name` U8/I8 + `name.qs`, merged experts) or a
colibri container (records in `__metadata__`). Every tensor it holds is dequantized to f32
(cformats.py); tensors it lacks (a DSA indexer or MTP layer left out) are taken from the
fixture. The model is the fixture's (config, architecture), run by transformers in f32 with
eager attention on the fixture's ref.json `input_ids`; the logits (positions × vocab, f32
little-endian) go to --out. --dense-attention sets `index_topk` past the context, so the DSA
indexer selects every causal position: the reference for a container without the indexer.
"""

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cformats as cf  # noqa: E402
import st  # noqa: E402

MERGED = re.compile(r"(model\.layers\.\d+\.mlp\.experts\.\d+)\.merged_weight$")


def dequantized(container, fixture_tensors):
    tensors, metas = st.read_dir(container)
    out = {}
    records = {}
    for meta in metas.values():
        if "colibri.tensors" in meta:
            records.update(json.loads(meta["colibri.tensors"]))
    for name, t in tensors.items():
        if name.startswith("__pad.") or name.endswith(".qs"):
            continue
        if name in records and records[name]["format"] not in ("f32", "bf16", "f16"):
            out[name] = cf.dequant_record(records[name], t.reshape(-1), tensors[name + ".qs"]
                                          .astype(np.float32).reshape(-1))
            continue
        m = MERGED.match(name)
        if m:
            p = m.group(1)
            gate = fixture_tensors[f"{p}.gate_proj.weight"].shape
            down = fixture_tensors[f"{p}.down_proj.weight"].shape
            q, s = t.reshape(-1).view(np.uint8), tensors[f"{p}.qs"].reshape(-1)
            n, k = gate[0] * gate[1], gate[0]
            out[f"{p}.gate_proj.weight"] = cf.deq_int8(q[:n], s[:k], *gate)
            out[f"{p}.up_proj.weight"] = cf.deq_int8(q[n:2 * n], s[k:2 * k], *gate)
            out[f"{p}.down_proj.weight"] = cf.deq_int8(q[2 * n:], s[2 * k:], *down)
            continue
        if name + ".qs" in tensors:
            o, i = fixture_tensors[name].shape
            out[name] = cf.dequant_c(t.reshape(-1).view(np.uint8), tensors[name + ".qs"]
                                     .reshape(-1), o, i)
            continue
        out[name] = t.astype(np.float32)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--container", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dense-attention", action="store_true")
    a = ap.parse_args()
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(2)
    fixture = Path(a.fixture)
    fixture_tensors, _ = st.read_dir(fixture)
    weights = dict(fixture_tensors)
    deq = dequantized(a.container, fixture_tensors)
    for k, v in deq.items():
        if k not in weights:
            raise SystemExit(f"container tensor {k} is not in the fixture")
        if tuple(v.shape) != tuple(weights[k].shape):
            raise SystemExit(f"{k}: shape {v.shape} vs fixture {weights[k].shape}")
        weights[k] = v
    cfg = json.loads((fixture / "config.json").read_text())
    if a.dense_attention:
        cfg["index_topk"] = 1 << 20
    ref = json.loads((fixture / "ref.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(cfg))
        st.write(Path(tmp) / "model.safetensors",
                 {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()})
        cls = getattr(transformers, cfg["architectures"][0])
        model = cls.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager",
                                    experts_implementation="eager").eval()
        with torch.no_grad():
            logits = model(torch.tensor([ref["input_ids"]])).logits[0].float().numpy()
    logits.astype("<f4").tofile(a.out)
    changed = sum(1 for k in deq)
    print(f"{a.out}: {logits.shape[0]} x {logits.shape[1]} logits, {changed} tensors from "
          f"the container, {len(weights) - changed} from the fixture")


if __name__ == "__main__":
    main()
