//! Scalar reference kernels. They define what every SIMD path must compute (the property
//! tests compare against them) and they are the fallback where no SIMD path applies.

use super::{block_range, Act, ActRow, Q8View, QBLOCK};
use crate::format::{ScaleType, WeightFormat};

/// Multi-accumulator f32 dot product (the compiler vectorises it).
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 32;
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let mut s = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        s = x.mul_add(*y, s);
    }
    s + acc.iter().sum::<f32>()
}

#[inline(always)]
pub fn bf16_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits(((hi as u32) << 24) | ((lo as u32) << 16))
}

/// Scale number `g` of a row's scale bytes.
#[inline(always)]
pub fn scale_at(st: ScaleType, s: &[u8], g: usize) -> f32 {
    match st {
        ScaleType::F32 => f32::from_le_bytes([s[4 * g], s[4 * g + 1], s[4 * g + 2], s[4 * g + 3]]),
        ScaleType::F16 => half::f16::from_le_bytes([s[2 * g], s[2 * g + 1]]).to_f32(),
        ScaleType::E8M0 => crate::format::mxfp4::scale(s[g]),
        ScaleType::BF16 => bf16_to_f32(s[2 * g], s[2 * g + 1]),
    }
}

/// The stored nibble (`q + 8`, 0..16) of element `j` of an int4 row.
#[inline(always)]
pub fn i4_code(w: &[u8], j: usize) -> u8 {
    (w[j / 2] >> ((j & 1) * 4)) & 0x0F
}

/// The stored 2-bit code (0..4) of element `j` of an int2 row of `cols` elements. Full
/// 32-element blocks hold element `k + 8s` of the block in bits `2s` of the block's byte `k`;
/// the elements after the last full block are packed plainly, four per byte, lowest first.
#[inline(always)]
pub fn i2_code(w: &[u8], j: usize, cols: usize) -> u8 {
    let full = cols / QBLOCK * QBLOCK;
    if j < full {
        let (b, e) = (j / QBLOCK, j % QBLOCK);
        (w[b * 8 + (e % 8)] >> (2 * (e / 8))) & 3
    } else {
        let t = j - full;
        (w[full / 4 + t / 4] >> (2 * (t % 4))) & 3
    }
}

/// Dequantized value of element `j` without its scale (decoding, the reference dots and the
/// SIMD paths' row tails).
#[inline(always)]
pub fn elem(format: WeightFormat, w: &[u8], j: usize, cols: usize) -> f32 {
    match format {
        WeightFormat::F32 => {
            f32::from_le_bytes([w[4 * j], w[4 * j + 1], w[4 * j + 2], w[4 * j + 3]])
        }
        WeightFormat::BF16 => bf16_to_f32(w[2 * j], w[2 * j + 1]),
        WeightFormat::F16 => half::f16::from_le_bytes([w[2 * j], w[2 * j + 1]]).to_f32(),
        WeightFormat::I8Row | WeightFormat::I8 { .. } => w[j] as i8 as f32,
        WeightFormat::I4 { .. } => i4_code(w, j) as f32 - 8.0,
        WeightFormat::I5 { .. } => crate::format::int5::code(w, j, cols) as f32 - 16.0,
        WeightFormat::I2 { .. } => i2_code(w, j, cols) as f32 - 1.5,
        WeightFormat::I3G64 => crate::format::lowbit::i3_code(w, j) as f32 - 4.0,
        WeightFormat::I2Plain => crate::format::lowbit::i2p_code(w, j) as f32 - 2.0,
        WeightFormat::Mxfp4 => {
            crate::format::mxfp4::VALUES[crate::format::mxfp4::code(w, j) as usize]
        }
        WeightFormat::I4Rows8 { .. } => {
            unreachable!("int4-rows8 rows are taken out as int4 first (rows8::gather_row)")
        }
        WeightFormat::I4Ct { .. } => {
            unreachable!("compressed-tensors int4 values need their scale (format::ct_int4)")
        }
    }
}

/// Element `j` of a compressed-tensors int4 row ([`WeightFormat::I4Ct`]): the code times its
/// group's scale, rounded to the scale's dtype.
#[inline(always)]
pub fn ct_elem(format: WeightFormat, w: &[u8], scales: &[u8], j: usize, cols: usize) -> f32 {
    let g = format.group_len(cols).unwrap_or(cols);
    let st = format.scale_type().unwrap_or(ScaleType::F32);
    crate::format::ct_int4::value(i4_code(w, j), scale_at(st, scales, j / g), st)
}

/// Lanes of the compressed-tensors int4 dot product with f32 activations: element `j` is
/// accumulated in lane `j % CT_LANES` (one fused multiply-add each, in order), the lanes then
/// summed first to last. The AVX2 path keeps four vectors of 8 (`kernels::ct_int4`).
pub const CT_LANES: usize = 32;

/// Decodes one row (dequantized) into `out` (length = cols).
pub fn decode_row(format: WeightFormat, w: &[u8], scales: &[u8], out: &mut [f32]) {
    let cols = out.len();
    if crate::format::ct_int4::is(format) {
        for (j, o) in out.iter_mut().enumerate() {
            *o = ct_elem(format, w, scales, j, cols);
        }
        return;
    }
    match (format.group_len(cols), format.scale_type()) {
        (Some(g), Some(st)) => {
            for (gi, chunk) in out.chunks_mut(g).enumerate() {
                let s = scale_at(st, scales, gi);
                for (k, o) in chunk.iter_mut().enumerate() {
                    *o = elem(format, w, gi * g + k, cols) * s;
                }
            }
        }
        _ => {
            for (j, o) in out.iter_mut().enumerate() {
                *o = elem(format, w, j, cols);
            }
        }
    }
}

/// Reference `dot(row, x)` with f32 activations: per group, the sum of code × x, times the
/// group's scale.
pub fn dot(format: WeightFormat, w: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    let cols = x.len();
    match format {
        WeightFormat::I4Ct { .. } => {
            let mut acc = [0f32; CT_LANES];
            for (j, xv) in x.iter().enumerate() {
                acc[j % CT_LANES] =
                    ct_elem(format, w, scales, j, cols).mul_add(*xv, acc[j % CT_LANES]);
            }
            acc.iter().sum()
        }
        WeightFormat::F32 => match bytemuck::try_cast_slice::<u8, f32>(w) {
            Ok(wf) => dot_f32(wf, x),
            Err(_) => (0..cols).map(|j| elem(format, w, j, cols) * x[j]).sum(),
        },
        WeightFormat::BF16 | WeightFormat::F16 => {
            let mut acc = [0f32; 8];
            for (j, xv) in x.iter().enumerate() {
                acc[j % 8] = elem(format, w, j, cols).mul_add(*xv, acc[j % 8]);
            }
            acc.iter().sum()
        }
        _ => {
            let g = format.group_len(cols).unwrap_or(cols);
            let st = format.scale_type().unwrap_or(ScaleType::F32);
            let mut total = 0f32;
            for gi in 0..cols.div_ceil(g) {
                let mut s = 0f32;
                for (j, xv) in x
                    .iter()
                    .enumerate()
                    .take(((gi + 1) * g).min(cols))
                    .skip(gi * g)
                {
                    s = elem(format, w, j, cols).mul_add(*xv, s);
                }
                total = s.mul_add(scale_at(st, scales, gi), total);
            }
            total
        }
    }
}

/// Reference `dot(row, x)` with int8 activations `a` (natural order): per 32-element block
/// an exact integer sum of code × q, times the block's activation scale and the weight
/// scale of the group holding the block.
pub fn dot_q8(format: WeightFormat, w: &[u8], scales: &[u8], a: &impl Q8View, cols: usize) -> f32 {
    dot_q8_blocks(format, w, scales, a, cols, 0)
}

/// As [`dot_q8`], from block `first` to the end of the row (the SIMD paths hand over the
/// leftover blocks to this).
pub fn dot_q8_blocks(
    format: WeightFormat,
    w: &[u8],
    scales: &[u8],
    a: &impl Q8View,
    cols: usize,
    first: usize,
) -> f32 {
    let g = format.group_len(cols).unwrap_or(cols);
    let st = format.scale_type().unwrap_or(ScaleType::F32);
    let (q, d) = (a.q(), a.d());
    let mut total = 0f32;
    for (b, db) in d.iter().enumerate().take(cols.div_ceil(QBLOCK)).skip(first) {
        let r = block_range(b, cols);
        let s = scale_at(st, scales, r.start / g);
        let isum: i32 = match format {
            WeightFormat::I8Row | WeightFormat::I8 { .. } => {
                r.map(|j| (w[j] as i8 as i32) * q[j] as i32).sum()
            }
            WeightFormat::I4 { .. } => r.map(|j| (i4_code(w, j) as i32 - 8) * q[j] as i32).sum(),
            WeightFormat::I5 { .. } => r
                .map(|j| (crate::format::int5::code(w, j, cols) as i32 - 16) * q[j] as i32)
                .sum(),
            // (c - 1.5) * q summed as (2c - 3) * q / 2, exact in integers.
            WeightFormat::I2 { .. } => r
                .map(|j| (2 * i2_code(w, j, cols) as i32 - 3) * q[j] as i32)
                .sum(),
            WeightFormat::I3G64 => r
                .map(|j| (crate::format::lowbit::i3_code(w, j) as i32 - 4) * a.q()[j] as i32)
                .sum(),
            WeightFormat::I2Plain => r
                .map(|j| (crate::format::lowbit::i2p_code(w, j) as i32 - 2) * a.q()[j] as i32)
                .sum(),
            // Twice the FP4 value is an integer: the sum is exact, halved below.
            WeightFormat::Mxfp4 => r
                .map(|j| {
                    let c = crate::format::mxfp4::code(w, j) as usize;
                    crate::format::mxfp4::DOUBLED[c] as i32 * q[j] as i32
                })
                .sum(),
            _ => unreachable!("dot_q8 is only called for quantized formats"),
        };
        let isum = if matches!(format, WeightFormat::I2 { .. } | WeightFormat::Mxfp4) {
            isum as f32 * 0.5
        } else {
            isum as f32
        };
        total = isum.mul_add(db * s, total);
    }
    total
}

/// Reference for a prepared activation: dispatches to [`dot`] or [`dot_q8`].
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    match &act.q8 {
        Some(a) => dot_q8(format, w, scales, a, act.x.len()),
        None => dot(format, w, scales, &act.x),
    }
}

/// [`dot_act`] for a row of an `Input`.
pub fn dot_row(format: WeightFormat, w: &[u8], scales: &[u8], act: &ActRow) -> f32 {
    match &act.q8 {
        Some(a) => dot_q8(format, w, scales, a, act.x.len()),
        None => dot(format, w, scales, act.x),
    }
}

/// Reference activation quantizer: per 32-element block `d = amax / 127`, `q = x / d`
/// rounded half to even and clamped to ±127, `qsum = sum(q)`.
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], qsum: &mut [i32]) {
    for b in 0..x.len().div_ceil(QBLOCK) {
        let r = block_range(b, x.len());
        let amax = x[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
        let (db, inv) = block_scale(amax);
        let mut s = 0i32;
        for j in r {
            let v = (x[j] * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            q[j] = v;
            s += v as i32;
        }
        d[b] = db;
        qsum[b] = s;
    }
}

/// A block's scale and its inverse (0 for an all-zero block), shared with the SIMD
/// quantizers so they give the same bytes.
#[inline(always)]
pub fn block_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}
