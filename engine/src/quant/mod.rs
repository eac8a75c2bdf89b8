//! Quantizers: f32 rows → the packed formats of [`WeightFormat`] (layouts in docs/FORMAT.md),
//! and the FP8 e4m3 block-scaled source format of the DeepSeek-V3 / GLM-5 FP8 releases.
//!
//! All quantizers are symmetric (no zero point) and deterministic: the same input gives the
//! same bytes on every machine and thread count, which the resumable converter relies on.

pub mod eval;
pub mod lowbit;

use crate::format::QBLOCK;
use crate::format::{ScaleType, WeightFormat};
use rayon::prelude::*;

/// A quantized matrix: packed rows back to back, then its scales (`rows × groups`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Packed {
    pub data: Vec<u8>,
    pub scales: Vec<u8>,
}

/// Rounds `s` to what `st` stores, so codes are chosen against the scale actually kept.
fn stored_scale(st: ScaleType, s: f32) -> f32 {
    match st {
        ScaleType::F32 => s,
        ScaleType::F16 => half::f16::from_f32(s).to_f32(),
        ScaleType::E8M0 => crate::format::mxfp4::scale(e8m0_of(s)),
        ScaleType::BF16 => half::bf16::from_f32(s).to_f32(),
    }
}

fn push_scale(st: ScaleType, s: f32, out: &mut Vec<u8>) {
    match st {
        ScaleType::F32 => out.extend_from_slice(&s.to_le_bytes()),
        ScaleType::F16 => out.extend_from_slice(&half::f16::from_f32(s).to_le_bytes()),
        ScaleType::E8M0 => out.push(e8m0_of(s)),
        ScaleType::BF16 => out.extend_from_slice(&half::bf16::from_f32(s).to_le_bytes()),
    }
}

/// The E8M0 byte of the power of two nearest `s` (in log scale).
fn e8m0_of(s: f32) -> u8 {
    if s > 0.0 && s.is_finite() {
        (s.log2().round() as i32 + 127).clamp(0, 254) as u8
    } else {
        127
    }
}

/// Whether every group scale of `values` (for `format`'s group size) is representable in
/// f16 without falling into subnormals or overflowing; the converter keeps f32 scales for
/// tensors where it is not.
pub fn f16_scales_ok(values: &[f32], cols: usize, group: usize, levels: f32) -> bool {
    let g = if group == 0 { cols.max(1) } else { group };
    values.chunks(cols.max(1)).all(|row| {
        row.chunks(g).all(|c| {
            let amax = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            amax == 0.0 || {
                let s = amax / levels;
                s >= half::f16::MIN_POSITIVE.to_f32() && s <= half::f16::MAX.to_f32()
            }
        })
    })
}

/// Best int4 codes (`q + 8`) and scale for one group: the scale is searched over a few
/// candidates around `amax / 7` to minimise the squared error (clipping the largest
/// magnitude slightly often pays off with 16 levels).
fn quant_group_i4(v: &[f32], st: ScaleType, codes: &mut [u8]) -> f32 {
    quant_group_symmetric(v, st, codes, 8.0)
}

/// Best int5 codes (`q + 16`) and scale for one group, as [`quant_group_i4`] with 32 levels.
fn quant_group_i5(v: &[f32], st: ScaleType, codes: &mut [u8]) -> f32 {
    quant_group_symmetric(v, st, codes, 16.0)
}

/// Symmetric codes `q + half` with `q` in `-half..half` and the scale among `amax / d`, `d`
/// from `half - 1` to `half` in quarters, that gives the least squared error.
fn quant_group_symmetric(v: &[f32], st: ScaleType, codes: &mut [u8], half: f32) -> f32 {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax == 0.0 || !amax.is_finite() {
        codes.iter_mut().for_each(|c| *c = half as u8);
        return 0.0;
    }
    let (lo, hi) = (-half, half - 1.0);
    let mut best = (f32::INFINITY, 0f32);
    for step in [1.0f32, 0.75, 0.5, 0.25, 0.0] {
        let s = stored_scale(st, amax / (half - step));
        if s == 0.0 {
            continue;
        }
        let inv = 1.0 / s;
        let err: f32 = v
            .iter()
            .map(|x| {
                let q = (x * inv).round().clamp(lo, hi);
                (x - q * s) * (x - q * s)
            })
            .sum();
        if err < best.0 {
            best = (err, s);
        }
    }
    let s = best.1;
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    for (c, x) in codes.iter_mut().zip(v) {
        *c = ((x * inv).round().clamp(lo, hi) + half) as u8;
    }
    s
}

/// Best int2 codes (0..4 meaning (c - 1.5)·s) and scale for one group.
fn quant_group_i2(v: &[f32], st: ScaleType, codes: &mut [u8]) -> f32 {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if amax == 0.0 || !amax.is_finite() {
        codes
            .iter_mut()
            .enumerate()
            .for_each(|(i, c)| *c = 1 + (i & 1) as u8);
        return 0.0;
    }
    let mut best = (f32::INFINITY, 0f32);
    for f in [1.5f32, 1.75, 2.0, 2.25, 2.5, 3.0] {
        let s = stored_scale(st, amax / f);
        if s == 0.0 {
            continue;
        }
        let inv = 1.0 / s;
        let err: f32 = v
            .iter()
            .map(|x| {
                let c = (x * inv + 1.5).round().clamp(0.0, 3.0);
                let y = (c - 1.5) * s;
                (x - y) * (x - y)
            })
            .sum();
        if err < best.0 {
            best = (err, s);
        }
    }
    let s = best.1;
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    for (c, x) in codes.iter_mut().zip(v) {
        *c = (x * inv + 1.5).round().clamp(0.0, 3.0) as u8;
    }
    s
}

/// Packs int4 codes (0..16) two per byte, even element in the low nibble.
pub fn pack_i4(codes: &[u8], out: &mut Vec<u8>) {
    for pair in codes.chunks(2) {
        let hi = if pair.len() > 1 { pair[1] } else { 8 };
        out.push((pair[0] & 0x0F) | (hi << 4));
    }
}

/// Packs int2 codes (0..4) of one row: per full 32-element block, element `k + 8s` in bits
/// `2s` of byte `k`; after the last full block, four per byte, lowest first.
pub fn pack_i2(codes: &[u8], out: &mut Vec<u8>) {
    let full = codes.len() / QBLOCK;
    for b in 0..full {
        let c = &codes[b * QBLOCK..(b + 1) * QBLOCK];
        for k in 0..8 {
            out.push(c[k] | (c[k + 8] << 2) | (c[k + 16] << 4) | (c[k + 24] << 6));
        }
    }
    for quad in codes[full * QBLOCK..].chunks(4) {
        let mut byte = 0u8;
        for (i, c) in quad.iter().enumerate() {
            byte |= c << (2 * i);
        }
        out.push(byte);
    }
}

/// Quantizes one row into `data` and `scales` (appending).
pub fn quantize_row(format: WeightFormat, row: &[f32], data: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let cols = row.len();
    match format {
        WeightFormat::F32 => row
            .iter()
            .for_each(|v| data.extend_from_slice(&v.to_le_bytes())),
        WeightFormat::BF16 => row
            .iter()
            .for_each(|v| data.extend_from_slice(&half::bf16::from_f32(*v).to_le_bytes())),
        WeightFormat::F16 => row
            .iter()
            .for_each(|v| data.extend_from_slice(&half::f16::from_f32(*v).to_le_bytes())),
        WeightFormat::I8Row => {
            let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            let s = if amax.is_finite() { amax / 127.0 } else { 0.0 };
            let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
            for v in row {
                data.push((v * inv).round().clamp(-127.0, 127.0) as i8 as u8);
            }
            scales.extend_from_slice(&s.to_le_bytes());
        }
        WeightFormat::I8 { scale, .. } => {
            let g = format.group_len(cols).unwrap_or(cols).max(1);
            for chunk in row.chunks(g) {
                let amax = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
                let s = if amax.is_finite() {
                    stored_scale(scale, amax / 127.0)
                } else {
                    0.0
                };
                let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                for v in chunk {
                    data.push((v * inv).round().clamp(-127.0, 127.0) as i8 as u8);
                }
                push_scale(scale, s, scales);
            }
        }
        WeightFormat::I4 { scale, .. }
        | WeightFormat::I5 { scale, .. }
        | WeightFormat::I2 { scale, .. } => {
            let g = format.group_len(cols).unwrap_or(cols);
            let mut codes = vec![0u8; cols];
            for (gi, chunk) in row.chunks(g.max(1)).enumerate() {
                let c = &mut codes[gi * g..gi * g + chunk.len()];
                let s = match format {
                    WeightFormat::I4 { .. } => quant_group_i4(chunk, scale, c),
                    WeightFormat::I5 { .. } => quant_group_i5(chunk, scale, c),
                    _ => quant_group_i2(chunk, scale, c),
                };
                push_scale(scale, s, scales);
            }
            match format {
                WeightFormat::I4 { .. } => pack_i4(&codes, data),
                WeightFormat::I5 { .. } => crate::format::int5::pack(&codes, data),
                _ => pack_i2(&codes, data),
            }
        }
        WeightFormat::I3G64 => lowbit::quantize_row_i3(row, data, scales),
        WeightFormat::I2Plain => lowbit::quantize_row_i2_plain(row, data, scales),
        WeightFormat::Mxfp4 => crate::format::mxfp4::quantize_row(row, data, scales),
        WeightFormat::I4Ct { scale, .. } => {
            // compressed-tensors' symmetric min-max observer: scale amax / 7.5, codes rounded
            // against the stored scale and clamped to -8..7.
            let g = format.group_len(cols).unwrap_or(cols);
            let mut codes = vec![0u8; cols];
            for (gi, chunk) in row.chunks(g.max(1)).enumerate() {
                let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = if amax.is_finite() {
                    stored_scale(scale, amax / 7.5)
                } else {
                    0.0
                };
                let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
                for (k, v) in chunk.iter().enumerate() {
                    codes[gi * g + k] = ((v * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                }
                push_scale(scale, s, scales);
            }
            pack_i4(&codes, data)
        }
        WeightFormat::I4Rows8 { .. } => {
            panic!("int4-rows8 interleaves whole matrices: quantize with quant::quantize")
        }
    }
}

/// Quantizes a `rows × cols` matrix (row-major f32), rows in parallel.
pub fn quantize(format: WeightFormat, rows: usize, cols: usize, values: &[f32]) -> Packed {
    assert_eq!(
        values.len(),
        rows * cols,
        "quantize: values do not fill rows × cols"
    );
    if format.interleaved() {
        let f = format.row_major();
        let mut p = quantize(f, rows, cols, values);
        crate::format::rows8::interleave_in_place(f, rows, cols, &mut p.data, &mut p.scales);
        return p;
    }
    let parts: Vec<Packed> = values
        .par_chunks(cols.max(1) * 64)
        .map(|chunk| {
            let mut p = Packed::default();
            for row in chunk.chunks(cols.max(1)) {
                quantize_row(format, row, &mut p.data, &mut p.scales);
            }
            p
        })
        .collect();
    let mut out = Packed {
        data: Vec::with_capacity(rows * format.row_bytes(cols)),
        scales: Vec::with_capacity(rows * format.scale_row_bytes(cols)),
    };
    for p in parts {
        out.data.extend_from_slice(&p.data);
        out.scales.extend_from_slice(&p.scales);
    }
    out
}

/// Decodes a whole quantized matrix back to f32 (tests, error measurement).
pub fn dequantize(format: WeightFormat, rows: usize, cols: usize, p: &Packed) -> Vec<f32> {
    if format.interleaved() {
        let (data, scales) =
            crate::format::rows8::deinterleave(format, rows, cols, &p.data, &p.scales);
        return dequantize(format.row_major(), rows, cols, &Packed { data, scales });
    }
    let (rb, sb) = (format.row_bytes(cols), format.scale_row_bytes(cols));
    let mut out = vec![0f32; rows * cols];
    for (r, o) in out.chunks_mut(cols.max(1)).enumerate() {
        crate::kernels::decode_row(
            format,
            &p.data[r * rb..(r + 1) * rb],
            &p.scales[r * sb..(r + 1) * sb],
            o,
        );
    }
    out
}

/// FP8 e4m3 ("fn": no infinities, 0x7F/0xFF are NaN) to f32, by table.
pub fn fp8_e4m3_to_f32(b: u8) -> f32 {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0f32; 256];
        for (i, v) in t.iter_mut().enumerate() {
            let sign = if i & 0x80 != 0 { -1.0 } else { 1.0 };
            let e = ((i >> 3) & 0x0F) as i32;
            let m = (i & 7) as f32;
            *v = if e == 15 && (i & 7) == 7 {
                f32::NAN
            } else if e == 0 {
                sign * m / 8.0 * 2f32.powi(-6)
            } else {
                sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
            };
        }
        t
    })[b as usize]
}

/// Dequantizes an FP8 e4m3 `rows × cols` weight with block scales (`weight_scale_inv`,
/// `[ceil(rows/block), ceil(cols/block)]`, multiplied in as DeepSeek's reference does).
pub fn dequant_fp8_blocks(
    w: &[u8],
    rows: usize,
    cols: usize,
    scale_inv: &[f32],
    block: usize,
) -> Vec<f32> {
    let bc = cols.div_ceil(block);
    let mut out = vec![0f32; rows * cols];
    out.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(r, o)| {
            let srow = &scale_inv[(r / block) * bc..(r / block + 1) * bc];
            for (c, v) in o.iter_mut().enumerate() {
                *v = fp8_e4m3_to_f32(w[r * cols + c]) * srow[c / block];
            }
        });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> f32 {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn rel_err(format: WeightFormat, rows: usize, cols: usize, seed: u64) -> f32 {
        let mut r = rng(seed);
        let v: Vec<f32> = (0..rows * cols).map(|_| r() * 0.05).collect();
        let p = quantize(format, rows, cols, &v);
        assert_eq!(p.data.len(), rows * format.row_bytes(cols));
        assert_eq!(p.scales.len(), rows * format.scale_row_bytes(cols));
        let d = dequantize(format, rows, cols, &p);
        let num: f32 = v.iter().zip(&d).map(|(a, b)| (a - b) * (a - b)).sum();
        let den: f32 = v.iter().map(|a| a * a).sum();
        (num / den).sqrt()
    }

    #[test]
    fn round_trip_errors_match_bit_widths() {
        let st = ScaleType::F16;
        for cols in [64, 97, 256] {
            let e8 = rel_err(WeightFormat::I8Row, 8, cols, 1);
            let e4 = rel_err(
                WeightFormat::I4 {
                    group: 32,
                    scale: st,
                },
                8,
                cols,
                1,
            );
            let e4r = rel_err(
                WeightFormat::I4 {
                    group: 0,
                    scale: ScaleType::F32,
                },
                8,
                cols,
                1,
            );
            let e2 = rel_err(
                WeightFormat::I2 {
                    group: 32,
                    scale: st,
                },
                8,
                cols,
                1,
            );
            let e5 = rel_err(
                WeightFormat::I5 {
                    group: 32,
                    scale: st,
                },
                8,
                cols,
                1,
            );
            assert!(e8 < 0.01, "int8 {e8}");
            // One more bit halves the step: about half int4's error.
            assert!(e5 > e8 && e5 < 0.6 * e4, "int5 {e5} against int4 {e4}");
            assert!(e4 < 0.12 && e4 > e8, "int4 {e4}");
            assert!(
                e4 <= e4r + 1e-6,
                "grouped int4 {e4} worse than per-row {e4r}"
            );
            assert!(e2 < 0.5 && e2 > e4, "int2 {e2}");
        }
    }

    #[test]
    fn int4_uses_the_c_layout_nibbles() {
        // Values that quantize exactly: scale 1, codes -8..7.
        let row: Vec<f32> = (0..16).map(|i| i as f32 - 8.0).collect();
        let mut data = Vec::new();
        let mut scales = Vec::new();
        quantize_row(
            WeightFormat::I4 {
                group: 0,
                scale: ScaleType::F32,
            },
            &row,
            &mut data,
            &mut scales,
        );
        let s = f32::from_le_bytes(scales[..4].try_into().unwrap());
        assert_eq!(s, 1.0);
        // Element 0 (-8 → 0) low nibble, element 1 (-7 → 1) high nibble.
        assert_eq!(data[0], 0x10);
        assert_eq!(data[7], 0xFE);
    }

    #[test]
    fn fp8_table_matches_known_values() {
        assert_eq!(fp8_e4m3_to_f32(0x00), 0.0);
        assert_eq!(fp8_e4m3_to_f32(0x38), 1.0);
        assert_eq!(fp8_e4m3_to_f32(0xB8), -1.0);
        assert_eq!(fp8_e4m3_to_f32(0x7E), 448.0);
        assert_eq!(fp8_e4m3_to_f32(0x01), 2f32.powi(-9));
        assert!(fp8_e4m3_to_f32(0x7F).is_nan());
        let w = [0x38u8, 0x40, 0x38, 0x40];
        // 2×2 weight, block 1: scales 1, 2, 3, 4.
        let d = dequant_fp8_blocks(&w, 2, 2, &[1.0, 2.0, 3.0, 4.0], 1);
        assert_eq!(d, vec![1.0, 4.0, 3.0, 8.0]);
    }
}
