//! MXFP4 rows ([`WeightFormat::Mxfp4`]; codes and scales in `format/mxfp4.rs`): with int8
//! activations one `pshufb` turns a block's 32 codes into the int8 values of twice the FP4
//! values, then the int8 × int8 multiply-add of the int4 kernels gives the block's exact
//! integer sum, times half the block's scale (the reference's bits); with f32 activations
//! the same int8 values, converted to f32, times the activations in 8 lanes.

use super::{scalar, Act};
use crate::format::WeightFormat;

/// `dot(row, act)` on the fastest path: on AVX2 the exact block sums with int8 activations
/// (the reference's bits) or the decoded codes times f32 activations (8 lanes: the
/// reference's value within rounding), else the reference.
#[inline]
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    debug_assert_eq!(format, WeightFormat::Mxfp4);
    #[cfg(target_arch = "x86_64")]
    if super::level().has_avx2() {
        let cols = act.x.len();
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        return unsafe {
            match &act.q8 {
                Some(q8) => x86::dot_q8(w, scales, &q8.q, &q8.d, cols),
                None => x86::dot_f32(w, scales, &act.x),
            }
        };
    }
    scalar::dot_act(format, w, scales, act)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::format::mxfp4::{code, scale, BLOCK_BYTES, DOUBLED, VALUES};
    use crate::format::QBLOCK;
    use std::arch::x86_64::*;

    /// The reference's `dot_q8` for MXFP4 with the same bits: per whole block the exact
    /// integer sum `Σ 2·value × q` (a `pshufb` of the codes into int8, then `maddubs` on
    /// |w| × sign(q, w), `madd` into int32), then the reference's float steps; a partial
    /// last block goes to the reference.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8(w: &[u8], scales: &[u8], q: &[i8], d: &[f32], cols: usize) -> f32 {
        let ones = _mm256_set1_epi16(1);
        let whole = cols / QBLOCK;
        let mut total = 0f32;
        for b in 0..whole {
            // Natural order: element 2k is the low nibble of byte k, 2k + 1 its high nibble.
            let (a, c) = doubled(w, b);
            let vals = _mm256_set_m128i(c, a);
            let act = _mm256_loadu_si256(q.as_ptr().add(b * QBLOCK) as *const __m256i);
            let prod =
                _mm256_maddubs_epi16(_mm256_sign_epi8(vals, vals), _mm256_sign_epi8(act, vals));
            let isum = super::super::avx2::hsum_epi32(_mm256_madd_epi16(prod, ones));
            let s = scale(scales[b]);
            total = (isum as f32 * 0.5).mul_add(d[b] * s, total);
        }
        tail_blocks(w, scales, q, d, cols, whole, total)
    }

    /// 32 codes of block `b` as the int8 values of [`DOUBLED`], natural order.
    #[inline(always)]
    unsafe fn doubled(w: &[u8], b: usize) -> (__m128i, __m128i) {
        let lut = _mm_loadu_si128(DOUBLED.as_ptr() as *const __m128i);
        let mask = _mm_set1_epi8(0x0F);
        let bytes = _mm_loadu_si128(w.as_ptr().add(b * BLOCK_BYTES) as *const __m128i);
        let lo = _mm_shuffle_epi8(lut, _mm_and_si128(bytes, mask));
        let hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bytes, 4), mask));
        (_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi))
    }

    /// `dot(row, x)` with f32 activations: per whole block the 32 decoded values (the
    /// doubled codes converted to f32) times `x` in 8 lanes, times half the block's scale;
    /// a partial last block on the reference's steps.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f32(w: &[u8], scales: &[u8], x: &[f32]) -> f32 {
        let cols = x.len();
        let whole = cols / QBLOCK;
        let mut acc = _mm256_setzero_ps();
        let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        for (b, &e) in scales.iter().enumerate().take(whole) {
            let (a, c) = doubled(w, b);
            let xp = x.as_ptr().add(b * QBLOCK);
            let mut s = _mm256_mul_ps(f(a), _mm256_loadu_ps(xp));
            s = _mm256_fmadd_ps(f(_mm_srli_si128(a, 8)), _mm256_loadu_ps(xp.add(8)), s);
            s = _mm256_fmadd_ps(f(c), _mm256_loadu_ps(xp.add(16)), s);
            s = _mm256_fmadd_ps(f(_mm_srli_si128(c, 8)), _mm256_loadu_ps(xp.add(24)), s);
            acc = _mm256_fmadd_ps(s, _mm256_set1_ps(0.5 * scale(e)), acc);
        }
        let mut total = super::super::avx2::hsum(acc);
        for (b, &e) in scales
            .iter()
            .enumerate()
            .take(cols.div_ceil(QBLOCK))
            .skip(whole)
        {
            let r = super::super::block_range(b, cols);
            let s: f32 = r.map(|j| VALUES[code(w, j) as usize] * x[j]).sum();
            total += s * scale(e);
        }
        total
    }

    /// The reference's steps for blocks `first..` (partial last block included), continuing
    /// `total`.
    fn tail_blocks(
        w: &[u8],
        scales: &[u8],
        q: &[i8],
        d: &[f32],
        cols: usize,
        first: usize,
        mut total: f32,
    ) -> f32 {
        for (b, &db) in d.iter().enumerate().take(cols.div_ceil(QBLOCK)).skip(first) {
            let r = super::super::block_range(b, cols);
            let isum: i32 = r
                .map(|j| DOUBLED[code(w, j) as usize] as i32 * q[j] as i32)
                .sum();
            total = (isum as f32 * 0.5).mul_add(db * scale(scales[b]), total);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::mxfp4::{code, quantize_row, scale, BLOCK_BYTES, DOUBLED, VALUES};
    use crate::format::QBLOCK;
    use crate::kernels::{prepare, tests::Rng};

    fn random_row(cols: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
        let w = (0..cols.div_ceil(QBLOCK) * BLOCK_BYTES)
            .map(|_| rng.next() as u8)
            .collect();
        let s = (0..cols.div_ceil(QBLOCK))
            .map(|_| 118 + (rng.next() % 16) as u8)
            .collect();
        (w, s)
    }

    #[test]
    fn codes_decode_as_transformers_lut_and_scales_are_powers_of_two() {
        // Byte 0x71: element 0 is code 1 (0.5), element 1 code 7 (6.0); 0xF8: -0.0 and -6.
        let w = [0x71u8, 0xF8];
        let vals: Vec<f32> = (0..4).map(|j| VALUES[code(&w, j) as usize]).collect();
        assert_eq!(vals, [0.5, 6.0, -0.0, -6.0]);
        assert_eq!(scale(127), 1.0);
        assert_eq!(scale(130), 8.0);
        assert_eq!(scale(120), 1.0 / 128.0);
        assert_eq!(scale(0), 2f32.powi(-127));
        for (v, d) in VALUES.iter().zip(DOUBLED) {
            assert_eq!(2.0 * v, d as f32);
        }
    }

    #[test]
    fn quantize_row_round_trips_representable_values() {
        let x: Vec<f32> = (0..64).map(|j| VALUES[j % 16] * 0.25).collect();
        let (mut c, mut s) = (Vec::new(), Vec::new());
        quantize_row(&x, &mut c, &mut s);
        let mut back = vec![0f32; 64];
        scalar::decode_row(WeightFormat::Mxfp4, &c, &s, &mut back);
        assert_eq!(back, x);
    }

    /// The AVX2 path gives the reference's bits with int8 activations and its value within
    /// rounding with f32 ones, on every shape (partial blocks included).
    #[test]
    fn simd_dot_is_the_reference() {
        let mut rng = Rng(0x3f4_0001);
        for i in 0..400 {
            let cols = match i % 4 {
                0 => 32 * (1 + (rng.next() % 100) as usize),
                1 => 1 + (rng.next() % 200) as usize,
                2 => 2880,
                _ => 32 * (1 + (rng.next() % 8) as usize) + 1 + (rng.next() % 31) as usize,
            };
            let (w, s) = random_row(cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
            for int8 in [false, true] {
                let act = prepare(WeightFormat::Mxfp4, &x, int8);
                assert_eq!(act.q8.is_some(), int8);
                let fast = dot_act(WeightFormat::Mxfp4, &w, &s, &act);
                let reference = scalar::dot_act(WeightFormat::Mxfp4, &w, &s, &act);
                if int8 {
                    assert_eq!(fast.to_bits(), reference.to_bits(), "cols {cols}");
                } else {
                    let mag: f32 = (0..cols)
                        .map(|j| (VALUES[code(&w, j) as usize] * scale(s[j / 32]) * x[j]).abs())
                        .sum();
                    assert!((fast - reference).abs() <= 1e-5 * mag + 1e-6, "cols {cols}");
                }
            }
        }
    }

    /// The reference against the dequantized row in f64.
    #[test]
    fn reference_dot_is_the_dequantized_dot() {
        let mut rng = Rng(0x3f4_0002);
        for cols in [32, 64, 100, 2880] {
            let (w, s) = random_row(cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let want: f64 = (0..cols)
                .map(|j| {
                    VALUES[code(&w, j) as usize] as f64 * scale(s[j / QBLOCK]) as f64 * x[j] as f64
                })
                .sum();
            let got = scalar::dot(WeightFormat::Mxfp4, &w, &s, &x) as f64;
            assert!(
                (got - want).abs() < 1e-4 * want.abs().max(1.0),
                "{got} {want}"
            );
        }
    }
}
