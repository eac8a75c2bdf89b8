//! Vectorized element-wise pieces of the forward pass: `exp` for SiLU and the attention
//! softmax, the sum of squares of RMSNorm, and `axpy` (the weighted sums of experts and of
//! attention values, the KV cache's f32 rows among them).
//!
//! `exp` is Cephes' single-precision polynomial (within 2 ulp of the correctly rounded
//! value over the range used; libm's `expf` is within 1), evaluated 8 lanes at a time with
//! AVX2+FMA. The scalar path runs the same polynomial with the same fused operations, and
//! a slice's tail is padded into a full vector, so an element's result never depends on
//! where in a slice it sits (batch independence holds bit for bit).

use crate::kernels::avx2;

/// `y += a·x`. A plain multiply and add, which the compiler vectorises; `f32::mul_add`
/// would become a libm call per element on builds without the `fma` target feature.
#[inline]
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

// Cephes expf: exp(x) = 2^n · p(r), r = x - n·ln2 split in two constants.
const EXP_HI: f32 = 88.376_26;
const EXP_LO: f32 = -87.336_55;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5e-1, // 0.500_000_01 as written before: the same f32
];

/// The scalar form of the vector `exp` (same operations, same rounding).
#[inline]
pub fn exp_scalar(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * LOG2E + 0.5).floor();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let z = r * r;
    let mut y = P[0];
    for &c in &P[1..] {
        y = y.mul_add(r, c);
    }
    let y = y.mul_add(z, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `x[i] = exp(x[i])`.
pub fn exp_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: level Avx2 is chosen only when avx2, fma and f16c are detected.
        return unsafe { x86::exp_in_place(x) };
    }
    x.iter_mut().for_each(|v| *v = exp_scalar(*v));
}

/// `g[i] = silu(g[i]) · u[i]` with `silu(x) = x / (1 + exp(-x))`.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len());
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: as in `exp_in_place`.
        return unsafe { x86::silu_mul(g, u) };
    }
    for (a, b) in g.iter_mut().zip(u) {
        *a = *a / (1.0 + exp_scalar(-*a)) * b;
    }
}

/// In-place softmax with the vector `exp` (attention scores; the routers keep the exact
/// one in `blocks`).
pub fn softmax_fast(x: &mut [f32]) {
    softmax_fast_with_sink(x, None)
}

/// [`softmax_fast`] over `x` and, when given, one more logit `sink` that takes its share of
/// the denominator and is then dropped (gpt-oss's attention sinks: transformers concatenates
/// the sink to the scores, softmaxes, and drops its column).
pub fn softmax_fast_with_sink(x: &mut [f32], sink: Option<f32>) {
    let m = x
        .iter()
        .copied()
        .fold(sink.unwrap_or(f32::NEG_INFINITY), f32::max);
    for v in x.iter_mut() {
        *v -= m;
    }
    exp_in_place(x);
    // Eight partial sums, added pairwise: vectorizes, and the same for every position.
    let mut acc = [0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for v in chunks.remainder() {
        s += v;
    }
    if let Some(z) = sink {
        s += exp_scalar(z - m);
    }
    let inv = 1.0 / s;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `Σ x²` accumulated in f64 over eight lanes (RMSNorm's moment, as exact as torch's).
pub fn sum_squares_f64(x: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += (*v as f64) * (*v as f64);
        }
    }
    let mut s = acc.iter().sum::<f64>();
    for v in chunks.remainder() {
        s += (*v as f64) * (*v as f64);
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    #[inline(always)]
    pub unsafe fn exp8(x: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
            _mm256_set1_ps(EXP_HI),
        );
        let n = _mm256_floor_ps(_mm256_fmadd_ps(
            x,
            _mm256_set1_ps(LOG2E),
            _mm256_set1_ps(0.5),
        ));
        // Same as the scalar fused operations: r = (-n)·lo + ((-n)·hi + x).
        let neg = _mm256_sub_ps(_mm256_setzero_ps(), n);
        let r = _mm256_fmadd_ps(neg, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fmadd_ps(neg, _mm256_set1_ps(LN2_LO), r);
        let z = _mm256_mul_ps(r, r);
        let mut y = _mm256_set1_ps(P[0]);
        for &c in &P[1..] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_add_ps(_mm256_fmadd_ps(y, z, r), _mm256_set1_ps(1.0));
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }

    /// `exp` of every 8 floats of `x`, the tail padded to a full vector.
    ///
    /// Written out rather than as a map over a closure: a closure does not inherit this
    /// function's target features, so `exp8`'s intrinsics inlined into one became calls
    /// (`_mm256_fmadd_ps` showed in profiles as a function of its own, ~2% of a prefill).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for c in &mut chunks {
            _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr())));
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let mut pad = [0f32; 8];
            pad[..rest.len()].copy_from_slice(rest);
            _mm256_storeu_ps(pad.as_mut_ptr(), exp8(_mm256_loadu_ps(pad.as_ptr())));
            let n = rest.len();
            rest.copy_from_slice(&pad[..n]);
        }
    }

    #[inline(always)]
    unsafe fn silu_mul8(g: __m256, u: __m256) -> __m256 {
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn silu_mul(g: &mut [f32], u: &[f32]) {
        let n = g.len();
        let mut i = 0;
        while i + 8 <= n {
            let v = silu_mul8(
                _mm256_loadu_ps(g.as_ptr().add(i)),
                _mm256_loadu_ps(u.as_ptr().add(i)),
            );
            _mm256_storeu_ps(g.as_mut_ptr().add(i), v);
            i += 8;
        }
        if i < n {
            let (mut pg, mut pu) = ([0f32; 8], [0f32; 8]);
            pg[..n - i].copy_from_slice(&g[i..]);
            pu[..n - i].copy_from_slice(&u[i..]);
            let v = silu_mul8(_mm256_loadu_ps(pg.as_ptr()), _mm256_loadu_ps(pu.as_ptr()));
            _mm256_storeu_ps(pg.as_mut_ptr(), v);
            g[i..].copy_from_slice(&pg[..n - i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn vector_exp_is_within_two_ulp_and_matches_its_scalar_form() {
        let xs: Vec<f32> = (0..20001)
            .map(|i| -87.0 + i as f32 * (175.0 / 20000.0))
            .collect();
        let mut v = xs.clone();
        exp_in_place(&mut v);
        for (&x, &got) in xs.iter().zip(&v) {
            let want = (x as f64).exp() as f32;
            assert!(ulps(got, want) <= 2, "exp({x}) = {got}, want {want}");
            assert_eq!(
                got.to_bits(),
                exp_scalar(x).to_bits(),
                "exp({x}) scalar form"
            );
        }
        // Out of range: no NaN, no infinity.
        let mut e = [-1000.0, 1000.0, f32::NEG_INFINITY];
        exp_in_place(&mut e);
        assert!(e.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn silu_and_softmax_agree_with_their_definitions_at_any_length() {
        for n in [1, 7, 8, 9, 31, 64, 1000] {
            let g: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 12.0).collect();
            let u: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut s = g.clone();
            silu_mul(&mut s, &u);
            for i in 0..n {
                let want = g[i] / (1.0 + (-g[i] as f64).exp() as f32) * u[i];
                assert!(
                    (s[i] - want).abs() <= 1e-6 * (1.0 + want.abs()),
                    "silu {n} {i}"
                );
                // The same element alone gives the same bits (no position dependence).
                let mut one = [g[i]];
                silu_mul(&mut one, &u[i..i + 1]);
                assert_eq!(one[0].to_bits(), s[i].to_bits());
            }
            let mut p = g.clone();
            softmax_fast(&mut p);
            let mut q = g.clone();
            crate::arch::blocks::softmax(&mut q);
            for (a, b) in p.iter().zip(&q) {
                assert!((a - b).abs() <= 1e-6, "softmax {n}");
            }
        }
        let x: Vec<f32> = (0..1003).map(|i| i as f32 * 0.01 - 3.0).collect();
        let want: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        assert!((sum_squares_f64(&x) - want).abs() <= want * 1e-14);
    }

    /// A sink is one more logit in the denominator, dropped from the output: transformers'
    /// `softmax(cat([scores, sink]))[..., :-1]`, for a sink below, among and above the scores.
    #[test]
    fn softmax_with_a_sink_is_the_softmax_of_scores_and_sink_without_the_sink() {
        for sink in [-30.0f32, 0.3, 9.0] {
            for n in [1, 5, 8, 13] {
                let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).sin() * 3.0).collect();
                let mut got = x.clone();
                softmax_fast_with_sink(&mut got, Some(sink));
                let z = x
                    .iter()
                    .chain([&sink])
                    .fold(f64::MIN, |m, v| m.max(*v as f64));
                let den: f64 = x.iter().chain([&sink]).map(|v| (*v as f64 - z).exp()).sum();
                for (g, v) in got.iter().zip(&x) {
                    let want = ((*v as f64 - z).exp() / den) as f32;
                    assert!((g - want).abs() <= 1e-6, "sink {sink} n {n}: {g} vs {want}");
                }
                let total: f32 = got.iter().sum();
                assert!(
                    total < 1.0 || sink < -20.0,
                    "the sink takes its share: {total}"
                );
            }
        }
        let x: Vec<f32> = (0..1003).map(|i| i as f32 * 0.01 - 3.0).collect();
        let want: f64 = x.iter().map(|v| (*v as f64) * (*v as f64)).sum();
        assert!((sum_squares_f64(&x) - want).abs() <= want * 1e-14);
    }
}
