#!/usr/bin/env python3
"""Test vectors for the C layouts: one f32 matrix (random rows, a zero row, rows whose
values fall exactly on rounding ties) packed in every C format by cformats.py, with the
dequantized values. engine/tests/c_containers.rs checks that colibri detects each layout,
decodes it to exactly these values, and that its own int3 / int2 quantizers produce exactly
these bytes."""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cformats as cf  # noqa: E402
import st  # noqa: E402


def matrix():
    rng = np.random.default_rng(17)
    o, i = 7, 200
    w = (rng.standard_normal((o, i)) * 0.05).astype(np.float32)
    w[1] = 0.0
    # exact ties: int3 scale 1.0 (amax 3), values k + 0.5 round to even
    w[2, :8] = [3.0, 0.5, 1.5, -0.5, -1.5, 2.5, -2.5, -3.0]
    w[2, 8:] = 0.25
    # int2 scale 1.0 (amax 1): -1.5 -> -2 (code 0), 0.5 -> 0, -0.5 -> 0
    w[3, :6] = [1.0, 0.5, -0.5, -1.5 / 1.5, 0.5, -1.0]
    w[4] *= 40.0  # large values
    w[5, ::3] = 0.0
    return w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    w = matrix()
    o, i = w.shape
    out = {"input": w}
    for name, (q, s), deq in [
        ("int8", cf.quant_int8(w), cf.deq_int8),
        ("int4", cf.quant_int4(w), lambda q, s, o, i: cf.deq_int4(q, s, o, i)),
        ("int4_g32", cf.quant_int4_grouped(w, 32), lambda q, s, o, i: cf.deq_int4(q, s, o, i, 32)),
        ("int4_g48", cf.quant_int4_grouped(w, 48), lambda q, s, o, i: cf.deq_int4(q, s, o, i, 48)),
        ("int4_g64", cf.quant_int4_grouped(w, 64), lambda q, s, o, i: cf.deq_int4(q, s, o, i, 64)),
        ("int2", cf.quant_int2(w), cf.deq_int2),
        ("int3", cf.quant_int3_g64(w), cf.deq_int3_g64),
    ]:
        out[f"{name}.weight"] = q
        out[f"{name}.weight.qs"] = s
        out[f"{name}.dequantized"] = deq(q, s, o, i).astype(np.float32)
        # the generic detector agrees with the name
        assert cf.detect(q.size, s.size, o, i)[0] == name.split("_")[0], name
    st.write(Path(a.out), out)


if __name__ == "__main__":
    main()
