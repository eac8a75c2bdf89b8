"""Minimal safetensors reading without torch: every dtype the fixtures and containers use
comes back as a numpy array (bf16 widened to float32)."""

import json
import struct
from pathlib import Path

import numpy as np

_NP = {"F32": np.float32, "F16": np.float16, "U8": np.uint8, "I8": np.int8,
       "I32": np.int32, "I64": np.int64}


def read(path):
    """(tensors {name: array}, metadata {str: str}) of one safetensors file."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        raw = data[base + a:base + b]
        if h["dtype"] == "BF16":
            u = np.frombuffer(raw, np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, _NP[h["dtype"]]).copy()
        out[name] = arr.reshape(h["shape"])
    return out, meta


def read_dir(d):
    """Every tensor of every *.safetensors in a folder, and the metadata by file."""
    tensors, metas = {}, {}
    for f in sorted(Path(d).glob("*.safetensors")):
        t, m = read(f)
        t = {k: v for k, v in t.items() if not k.startswith("__pad.")}  # colibri filler
        for k in t:
            assert k not in tensors, f"duplicate tensor {k}"
        tensors.update(t)
        metas[f.name] = m
    return tensors, metas


def read_raw(path):
    """{name: (dtype, shape, bytes)} of one safetensors file, bytes untouched."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {k: (h["dtype"], h["shape"], data[base + h["data_offsets"][0]:base + h["data_offsets"][1]])
            for k, h in header.items()}


_DT = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint8): "U8",
       np.dtype(np.int8): "I8"}


# The order of the safetensors library's serializer (what the C converters' save_file
# calls write): wider dtypes first, then by name.
_RANK = {"F64": 9, "I64": 8, "F32": 7, "I32": 6, "BF16": 5, "F16": 4, "I16": 3, "I8": 2, "U8": 1}


def write(path, tensors):
    """Writes a safetensors file: values are numpy arrays or raw (dtype, shape, bytes)
    triples (to copy bf16 tensors unchanged). Data in the safetensors library's order
    (dtype, widest first, then name), header padded to 8 bytes."""
    items = {}
    for name, v in tensors.items():
        if isinstance(v, tuple):
            items[name] = v
        else:
            a = np.ascontiguousarray(v)
            items[name] = (_DT[a.dtype], list(a.shape), a.tobytes())
    entries, blobs, off = {}, [], 0
    for name in sorted(items, key=lambda n: (-_RANK[items[n][0]], n)):
        dt, shape, raw = items[name]
        entries[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(entries, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
