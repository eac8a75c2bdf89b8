//! compressed-tensors int4 rows ([`WeightFormat::I4Ct`]; the value of an element in
//! `format/ct_int4.rs`): f32 activations only, each element the code times its group's scale
//! rounded to the scale's dtype — what transformers computes with — accumulated in the lanes
//! the scalar reference defines ([`scalar::CT_LANES`]), so every path keeps its bits.
//!
//! Several tokens (prefill, batched decode) decode a row once into f32 and take the dot of
//! that row with each token; one token decodes and multiplies in one pass.

use super::{scalar, Act, Weights};
use crate::format::{ScaleType, WeightFormat, QBLOCK};

/// `dot(row, act)` on the fastest path (f32 activations; the reference's bits).
#[inline]
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    debug_assert!(
        act.q8.is_none(),
        "compressed-tensors int4 takes f32 activations"
    );
    #[cfg(target_arch = "x86_64")]
    if super::level().has_avx2() && simd_groups(format, act.x.len()) {
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        return unsafe { x86::dot_fused(format, w, scales, &act.x) };
    }
    scalar::dot(format, w, scales, &act.x)
}

/// Whether every 32-element block of a row lies in one scale group (the SIMD paths' shape).
fn simd_groups(format: WeightFormat, cols: usize) -> bool {
    format
        .group_len(cols)
        .is_some_and(|g| g.is_multiple_of(QBLOCK) || g >= cols)
}

/// Rows `rows` of `w` against every token of `acts` (`out[t * ld + r]`): each row decoded once
/// into f32, then its dot with each token in the reference's lanes. Returns `false` (nothing
/// written) where the SIMD path does not apply.
///
/// # Safety
/// `out` must be valid for those writes and no one else may write them meanwhile.
pub unsafe fn matmul_rows(
    w: &Weights,
    acts: &[Act],
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if acts.len() > 1 && super::level().has_avx2() && simd_groups(w.format, w.cols) {
        let mut buf = vec![0f32; w.cols];
        for r in rows {
            x86::decode(w.format, w.row(r), w.srow(r), &mut buf);
            for (t, a) in acts.iter().enumerate() {
                *out.add(t * ld + r) = x86::dot_lanes(&buf, &a.x);
            }
        }
        return true;
    }
    let _ = (w, acts, rows, out, ld);
    false
}

/// The scale type of a compressed-tensors format (bf16 as published).
fn scale_type(format: WeightFormat) -> ScaleType {
    format.scale_type().unwrap_or(ScaleType::F32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{scalar, scale_type};
    use crate::format::{ScaleType, WeightFormat, QBLOCK};
    use std::arch::x86_64::*;

    /// The 32 values of block `b`: codes times the group's scale, rounded to `st`, as four
    /// vectors of 8 (elements `8k..8k + 8` in vector `k`).
    #[inline(always)]
    unsafe fn block(w: &[u8], b: usize, s: f32, st: ScaleType) -> [__m256; 4] {
        let mask = _mm_set1_epi8(0x0F);
        let bytes = _mm_loadu_si128(w.as_ptr().add(b * QBLOCK / 2) as *const __m128i);
        let lo = _mm_and_si128(bytes, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
        // Element 2k is the low nibble of byte k, 2k + 1 its high nibble.
        let (e0, e1) = (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi));
        let eight = _mm256_set1_epi32(8);
        let sv = _mm256_set1_ps(s);
        let f = |v: __m128i| {
            let c = _mm256_sub_epi32(_mm256_cvtepu8_epi32(v), eight);
            round(_mm256_mul_ps(_mm256_cvtepi32_ps(c), sv), st)
        };
        [
            f(e0),
            f(_mm_srli_si128(e0, 8)),
            f(e1),
            f(_mm_srli_si128(e1, 8)),
        ]
    }

    /// An exact f32 product rounded to the scale's dtype, to nearest, ties to even (bf16 by
    /// the bit trick `half` uses; f16 through F16C's conversion).
    #[inline(always)]
    unsafe fn round(p: __m256, st: ScaleType) -> __m256 {
        match st {
            ScaleType::BF16 => {
                let u = _mm256_castps_si256(p);
                let lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
                let r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb);
                _mm256_castsi256_ps(_mm256_and_si256(
                    r,
                    _mm256_set1_epi32(0xFFFF_0000u32 as i32),
                ))
            }
            ScaleType::F16 => _mm256_cvtph_ps(_mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT)),
            ScaleType::F32 | ScaleType::E8M0 => p,
        }
    }

    /// The scale of the group holding element `j`.
    #[inline(always)]
    fn scale_of(format: WeightFormat, scales: &[u8], j: usize, cols: usize) -> f32 {
        let g = format.group_len(cols).unwrap_or(cols);
        scalar::scale_at(scale_type(format), scales, j / g)
    }

    /// Lanes summed first to last, as the reference's `iter().sum()`.
    #[inline(always)]
    unsafe fn finish(acc: [__m256; 4], tail: impl FnOnce(&mut [f32; 32])) -> f32 {
        let mut lanes = [0f32; 32];
        for (k, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * k), *a);
        }
        tail(&mut lanes);
        lanes.iter().sum()
    }

    /// Decode and multiply in one pass (one token).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_fused(format: WeightFormat, w: &[u8], scales: &[u8], x: &[f32]) -> f32 {
        let cols = x.len();
        let st = scale_type(format);
        let whole = cols / QBLOCK;
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..whole {
            let v = block(w, b, scale_of(format, scales, b * QBLOCK, cols), st);
            for k in 0..4 {
                let xv = _mm256_loadu_ps(x.as_ptr().add(b * QBLOCK + 8 * k));
                acc[k] = _mm256_fmadd_ps(v[k], xv, acc[k]);
            }
        }
        finish(acc, |lanes| {
            for j in whole * QBLOCK..cols {
                let v = scalar::ct_elem(format, w, scales, j, cols);
                lanes[j % QBLOCK] = v.mul_add(x[j], lanes[j % QBLOCK]);
            }
        })
    }

    /// A row's values into `out` (`cols` floats), the reference's values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn decode(format: WeightFormat, w: &[u8], scales: &[u8], out: &mut [f32]) {
        let cols = out.len();
        let st = scale_type(format);
        let whole = cols / QBLOCK;
        for b in 0..whole {
            let v = block(w, b, scale_of(format, scales, b * QBLOCK, cols), st);
            for (k, vk) in v.iter().enumerate() {
                _mm256_storeu_ps(out.as_mut_ptr().add(b * QBLOCK + 8 * k), *vk);
            }
        }
        for (j, o) in out.iter_mut().enumerate().skip(whole * QBLOCK) {
            *o = scalar::ct_elem(format, w, scales, j, cols);
        }
    }

    /// `dot(values, x)` in the reference's 32 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_lanes(v: &[f32], x: &[f32]) -> f32 {
        let cols = x.len();
        let whole = cols / QBLOCK;
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..whole {
            for (k, a) in acc.iter_mut().enumerate() {
                let o = b * QBLOCK + 8 * k;
                *a = _mm256_fmadd_ps(
                    _mm256_loadu_ps(v.as_ptr().add(o)),
                    _mm256_loadu_ps(x.as_ptr().add(o)),
                    *a,
                );
            }
        }
        finish(acc, |lanes| {
            for j in whole * QBLOCK..cols {
                lanes[j % QBLOCK] = v[j].mul_add(x[j], lanes[j % QBLOCK]);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::prepare;

    /// Random codes and bf16/f16/f32 scales: the AVX2 paths give the reference's bits, fused and
    /// decoded-then-dotted alike, on whole and partial blocks.
    #[test]
    fn simd_paths_keep_the_reference_bits() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for (cols, group) in [(64, 32), (96, 32), (128, 64), (40, 0), (256, 128), (72, 0)] {
            for st in [ScaleType::BF16, ScaleType::F16, ScaleType::F32] {
                let format = WeightFormat::I4Ct { group, scale: st };
                let w: Vec<u8> = (0..cols / 2).map(|_| next() as u8).collect();
                let mut scales = Vec::new();
                for _ in 0..format.groups_per_row(cols) {
                    let s = 0.01 + (next() % 1000) as f32 * 1e-4;
                    match st {
                        ScaleType::BF16 => scales.extend(half::bf16::from_f32(s).to_le_bytes()),
                        ScaleType::F16 => scales.extend(half::f16::from_f32(s).to_le_bytes()),
                        _ => scales.extend(s.to_le_bytes()),
                    }
                }
                let x: Vec<f32> = (0..cols)
                    .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
                    .collect();
                let want = scalar::dot(format, &w, &scales, &x);
                let act = prepare(format, &x, false);
                assert_eq!(dot_act(format, &w, &scales, &act).to_bits(), want.to_bits());
                let mut dec = vec![0f32; cols];
                scalar::decode_row(format, &w, &scales, &mut dec);
                #[cfg(target_arch = "x86_64")]
                if crate::kernels::level().has_avx2() && simd_groups(format, cols) {
                    let mut fast = vec![0f32; cols];
                    // SAFETY: AVX2 detected above.
                    unsafe {
                        x86::decode(format, &w, &scales, &mut fast);
                        assert_eq!(fast, dec);
                        assert_eq!(x86::dot_lanes(&fast, &x).to_bits(), want.to_bits());
                    }
                }
            }
        }
    }
}
