"""Reference quantizers and dequantizers for the weight layouts of the colibri C engine's
containers, written from the layout description (docs/FORMAT.md, "The colibri C container
layout"), in numpy only. Also dequantizes colibri's own container records, so a container
of either kind can be turned back into the f32 weights it stands for.

Every quantizer works in float32 as the C converters do: scale = max(amax / qmax, 1e-8) per
row (or per group), codes = clip(round-half-even(w / scale)). A tensor `W` [O, I] is stored
as flat U8 bytes plus a flat F32 `W.qs` array of scales.

    int8 rows       O*I bytes          O scales           value = q * s (two's complement)
    int4 rows       O*ceil(I/2)        O                  nibble n (even element low): (n - 8) * s
    int4 grouped    O*ceil(I/2)        O*ceil(I/gs)       as int4, scale per gs elements of a row
    int2 rows       O*ceil(I/4)        O                  2-bit c, element j in bits 2(j%4) of
                                                          byte j/4: (c - 2) * s
    int3 g64        O*ceil(I/64)*24    O*ceil(I/64)       per 64-element group: 16 bytes of low
                                                          2-bit codes (as int2), 8 bytes of high
                                                          bits (element j: bit j%8 of byte j/8);
                                                          (c - 4) * s, c = low | high << 2
"""

import numpy as np

F32 = np.float32


def _f32(w):
    return np.ascontiguousarray(np.asarray(w, dtype=F32))


def _scale(amax, qmax):
    return np.maximum(amax / F32(qmax), F32(1e-8)).astype(F32)


def _groups(w, gs):
    """[O, I] -> [O, ng, gs] zero-padded, and ng."""
    o, i = w.shape
    ng = -(-i // gs)
    pad = np.zeros((o, ng * gs), F32)
    pad[:, :i] = w
    return pad.reshape(o, ng, gs), ng


def _pack_nibbles(codes):
    """[O, I] codes 0..15 -> [O, ceil(I/2)] bytes, even element in the low nibble."""
    o, i = codes.shape
    if i % 2:
        codes = np.concatenate([codes, np.full((o, 1), 8, codes.dtype)], axis=1)
    c = codes.astype(np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def _pack_2bit(codes):
    """[..., n] codes 0..3 -> [..., ceil(n/4)] bytes, element j in bits 2(j%4) of byte j/4."""
    n = codes.shape[-1]
    padn = -(-n // 4) * 4
    c = np.zeros(codes.shape[:-1] + (padn,), np.uint8)
    c[..., :n] = codes
    c = c.reshape(codes.shape[:-1] + (padn // 4, 4))
    return (c[..., 0] | (c[..., 1] << 2) | (c[..., 2] << 4) | (c[..., 3] << 6)).astype(np.uint8)


def _unpack_2bit(b, n):
    b = b.astype(np.uint8)
    c = np.stack([(b >> (2 * k)) & 3 for k in range(4)], axis=-1)
    return c.reshape(b.shape[:-1] + (-1,))[..., :n]


def quant_int8(w, bits=8):
    w = _f32(w)
    qmax = (1 << (bits - 1)) - 1
    s = _scale(np.abs(w).max(axis=1, keepdims=True), qmax)
    q = np.clip(np.rint(w / s), -qmax - 1, qmax).astype(np.int8)
    return q.reshape(-1).view(np.uint8).copy(), s[:, 0].copy()


def quant_int4(w, bits=4):
    w = _f32(w)
    qmax = (1 << (bits - 1)) - 1
    s = _scale(np.abs(w).max(axis=1, keepdims=True), qmax)
    q = np.clip(np.rint(w / s), -8, qmax).astype(np.int32) + 8
    return _pack_nibbles(q).reshape(-1), s[:, 0].copy()


def quant_int4_grouped(w, gs, bits=4):
    w = _f32(w)
    o, i = w.shape
    qmax = (1 << (bits - 1)) - 1
    g, ng = _groups(w, gs)
    s = _scale(np.abs(g).max(axis=2, keepdims=True), qmax)
    q = np.clip(np.rint(g / s), -8, qmax).astype(np.int32).reshape(o, ng * gs)[:, :i] + 8
    return _pack_nibbles(q).reshape(-1), s.reshape(-1).copy()


def quant_int2(w):
    w = _f32(w)
    s = _scale(np.abs(w).max(axis=1, keepdims=True), 1)
    q = np.clip(np.rint(w / s), -2, 1).astype(np.int32) + 2
    return _pack_2bit(q).reshape(-1), s[:, 0].copy()


def quant_int3_g64(w):
    w = _f32(w)
    o, i = w.shape
    g, ng = _groups(w, 64)
    s = _scale(np.abs(g).max(axis=2, keepdims=True), 3)
    q = (np.clip(np.rint(g / s), -4, 3).astype(np.int32) + 4).astype(np.uint8)  # [O, ng, 64]
    lo = _pack_2bit(q & 3)  # [O, ng, 16]
    hb = ((q >> 2) & 1).reshape(o, ng, 8, 8)
    hi = np.zeros((o, ng, 8), np.uint8)
    for b in range(8):
        hi |= (hb[..., b] << b).astype(np.uint8)
    return np.concatenate([lo, hi], axis=2).reshape(-1), s.reshape(-1).copy()


def quant_merged_int8(gate, up, down):
    """The C OLMoE converter's merged expert: gate, up, down rows as int8 (torch round,
    scale = max(amax, 1e-12) / 127) back to back, and their row scales."""
    qs, ss = [], []
    for w in (gate, up, down):
        w = _f32(w)
        s = (np.maximum(np.abs(w).max(axis=1, keepdims=True), F32(1e-12)) / F32(127)).astype(F32)
        q = np.clip(np.rint(w / s), -128, 127).astype(np.int8)
        qs.append(q.reshape(-1))
        ss.append(s[:, 0])
    return np.concatenate(qs), np.concatenate(ss)


# ---- dequantizers ---------------------------------------------------------------------


def deq_int8(q, s, o, i):
    return q.view(np.int8).reshape(o, i).astype(F32) * s.reshape(o, 1)


def deq_int4(q, s, o, i, gs=0):
    b = q.reshape(o, -1)
    n = np.empty((o, b.shape[1] * 2), np.int32)
    n[:, 0::2] = b & 15
    n[:, 1::2] = b >> 4
    v = (n[:, :i] - 8).astype(F32)
    if gs == 0:
        return v * s.reshape(o, 1)
    return v * np.repeat(s.reshape(o, -1), gs, axis=1)[:, :i]


def deq_int2(q, s, o, i):
    return (_unpack_2bit(q.reshape(o, -1), i).astype(F32) - 2) * s.reshape(o, 1)


def deq_int3_g64(q, s, o, i):
    ng = -(-i // 64)
    b = q.reshape(o, ng, 24)
    lo = _unpack_2bit(b[..., :16], 64)
    hi = np.stack([(b[..., 16:] >> k) & 1 for k in range(8)], axis=-1).reshape(o, ng, 64)
    c = (lo | (hi << 2)).astype(F32) - 4
    return (c * s.reshape(o, ng, 1)).reshape(o, ng * 64)[:, :i]


def detect(nbytes, nscales, o, i):
    """The layout of a C-layout tensor from its byte and scale counts (what the loaders do)."""
    if nbytes == o * i:
        return ("int8", 0)
    if nbytes == o * (-(-i // 2)):
        if nscales == o:
            return ("int4", 0)
        per = nscales // o
        for gs in (16, 32, 48, 64, 96, 128, 192, 256):
            if gs <= i and -(-i // gs) == per:
                return ("int4", gs)
        lo, hi = -(-i // per), (i - 1) // (per - 1)
        if lo == hi:
            return ("int4", lo)
        raise ValueError(f"ambiguous int4 group size {lo}..{hi}")
    if nbytes == o * (-(-i // 4)):
        return ("int2", 0)
    if nbytes == o * (-(-i // 64)) * 24:
        return ("int3", 64)
    raise ValueError(f"{nbytes} bytes match no layout for [{o}, {i}]")


def dequant_c(q, s, o, i):
    fmt, gs = detect(q.size, s.size, o, i)
    return {
        "int8": lambda: deq_int8(q, s, o, i),
        "int4": lambda: deq_int4(q, s, o, i, gs),
        "int2": lambda: deq_int2(q, s, o, i),
        "int3": lambda: deq_int3_g64(q, s, o, i),
    }[fmt]()


# ---- colibri's own container records (docs/FORMAT.md) -----------------------------------


def _ours_int2(q, s, o, i, gs):
    """colibri int2: (c - 1.5) * s; per full 32-element block element k + 8j in bits 2j of
    byte k, the tail plain four per byte."""
    rows = q.reshape(o, -1)
    full = i // 32
    c = np.empty((o, i), np.int32)
    for b in range(full):
        blk = rows[:, b * 8:(b + 1) * 8]
        for j in range(4):
            c[:, b * 32 + 8 * j:b * 32 + 8 * j + 8] = (blk >> (2 * j)) & 3
    if i > full * 32:
        c[:, full * 32:] = _unpack_2bit(rows[:, full * 8:], i - full * 32)
    v = c.astype(F32) - F32(1.5)
    g = gs if gs else i
    return v * np.repeat(s.reshape(o, -1), g, axis=1)[:, :i]


def dequant_record(rec, q, s):
    """A tensor of a colibri container from its record {"format", "group_size", "shape"}."""
    o, i = rec["shape"]
    f, gs = rec["format"], rec.get("group_size") or 0
    if f == "int8":
        return deq_int8(q, s, o, i)
    if f == "int4":
        return deq_int4(q, s, o, i, gs)
    if f == "int2":
        return _ours_int2(q, s, o, i, gs)
    if f == "int3":
        return deq_int3_g64(q, s, o, i)
    if f == "int2-plain":
        return deq_int2(q, s, o, i)
    raise ValueError(f"format {f}")
