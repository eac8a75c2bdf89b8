//! The int5 kernels ([`WeightFormat::I5`]; the codes' layout is `format/int5.rs`): a step's
//! 8 blocks sit in the 8 lanes of the int32 sums, so `vpdpbusd` (or `maddubs` + `madd`) adds
//! every product of a block into its own lane: no horizontal sums, no shuffles, one scale
//! multiply per 8 blocks. The activations are put in the same order once per token
//! ([`order_q8`]).

use super::{scalar, Act, Level, Q8Act, Weights};
use crate::format::int5::{place, STEP};
use crate::format::WeightFormat;

/// Puts int8 activations in the lanes of the codes ([`place`]): `qp[position(j)] = q[j]`
/// over the whole steps (the rest is read in natural order by the reference).
pub fn order_q8(a: &mut Q8Act) {
    let cols = a.q.len();
    let whole = cols / STEP * STEP;
    a.qp = vec![0; whole];
    for j in 0..whole {
        a.qp[place(j, cols).2] = a.q[j];
    }
    a.d8.clear();
    a.corr8.clear();
}

/// `dot(row, act)` on the fastest path: [`matmul_rows`] over this one row, else the
/// reference.
#[inline]
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    let one = Weights {
        format,
        rows: 1,
        cols: act.x.len(),
        data: w,
        scales,
        int8: act.q8.is_some(),
        rows8: false,
    };
    let mut out = 0f32;
    // SAFETY: `out` is one row × one token, and ours.
    if unsafe { matmul_rows(&one, std::slice::from_ref(act), 0..1, &mut out, 1) } {
        return out;
    }
    scalar::dot_act(format, w, scales, act)
}

/// `out[t * ld + r]` for `r` in `rows` and every token of `acts` (prepared for this matrix):
/// row after row, each against every token while it sits in L1, so the matrix is read once
/// however many tokens there are. `false` (nothing written) where there is no SIMD path:
/// other levels, or f32 activations; the caller then runs the reference.
///
/// # Safety
/// `out` must be valid for those writes and no one else may write them meanwhile.
pub(super) unsafe fn matmul_rows(
    w: &Weights,
    acts: &[Act],
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) -> bool {
    let Some(q8) = acts
        .iter()
        .map(|a| a.q8.as_ref())
        .collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    match super::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Avx2 is only chosen when avx2, fma and f16c are detected; the activations
        // were prepared for int5 (`order_q8`).
        Level::Avx2 => simd::rows_avx2(w, &q8, rows, out, ld),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, and Avx512Vnni only when avx512f/bw/vl/vnni are detected too.
        Level::Avx512Vnni => simd::rows_vnni(w, &q8, rows, out, ld),
        _ => return false,
    }
    true
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::super::avx2::{prefetch, prefetch_l2};
    use super::super::{scalar, Q8Act, Weights, QBLOCK};
    use crate::format::int5::{STEP, STEP_BLOCKS};
    use crate::format::{ScaleType, WeightFormat};
    use std::arch::x86_64::*;

    /// Rows ahead the loop prefetches into L1 and into L2 (the same place that many rows on,
    /// both planes). From memory on 2 threads (`kernel_bench 68 2 1`, OLMoE's head: 50 304
    /// rows of 2048), 2 and 6 read 36–41 GB/s; L1 alone 2 rows ahead 27–30 (4 or 8 rows
    /// 25–30), nothing at all 21–22.
    const PREFETCH_L1_ROWS: usize = 2;
    const PREFETCH_L2_ROWS: usize = 6;

    /// Tokens one pass over a row serves: its codes are unpacked once for all of them.
    const MAX_TOKENS: usize = 4;

    /// How `row` reads its scales (a const parameter, so the common case's loop holds no
    /// call: one would make LLVM keep the unpacked codes on the stack around it).
    const SCALES_F16_G32: u8 = 0;
    const SCALES_F32_G32: u8 = 1;
    const SCALES_ANY: u8 = 2;

    fn scales_kind(format: WeightFormat, cols: usize) -> u8 {
        match (format.scale_type(), format.group_len(cols)) {
            (Some(ScaleType::F16), Some(QBLOCK)) => SCALES_F16_G32,
            (Some(ScaleType::F32), Some(QBLOCK)) => SCALES_F32_G32,
            _ => SCALES_ANY,
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows_avx2(
        w: &Weights,
        q8: &[&Q8Act],
        rows: std::ops::Range<usize>,
        out: *mut f32,
        ld: usize,
    ) {
        rows_body::<false>(w, q8, rows, out, ld)
    }

    /// [`rows_avx2`] on AVX-512 VNNI: the high bits added under a byte mask, the products
    /// summed by `vpdpbusd`; the same int32 lanes, so the same bits.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub unsafe fn rows_vnni(
        w: &Weights,
        q8: &[&Q8Act],
        rows: std::ops::Range<usize>,
        out: *mut f32,
        ld: usize,
    ) {
        rows_body::<true>(w, q8, rows, out, ld)
    }

    #[inline(always)]
    unsafe fn rows_body<const VNNI: bool>(
        w: &Weights,
        q8: &[&Q8Act],
        rows: std::ops::Range<usize>,
        out: *mut f32,
        ld: usize,
    ) {
        match scales_kind(w.format, w.cols) {
            SCALES_F16_G32 => rows_of::<VNNI, SCALES_F16_G32>(w, q8, rows, out, ld),
            SCALES_F32_G32 => rows_of::<VNNI, SCALES_F32_G32>(w, q8, rows, out, ld),
            _ => rows_of::<VNNI, SCALES_ANY>(w, q8, rows, out, ld),
        }
    }

    #[inline(always)]
    unsafe fn rows_of<const VNNI: bool, const K: u8>(
        w: &Weights,
        q8: &[&Q8Act],
        rows: std::ops::Range<usize>,
        out: *mut f32,
        ld: usize,
    ) {
        for r in rows {
            let (data, scales) = (w.row(r), w.srow(r));
            let mut t = 0;
            while t < q8.len() {
                let n = (q8.len() - t).min(MAX_TOKENS);
                let q = &q8[t..t + n];
                let put = |v: &[f32]| {
                    for (k, v) in v.iter().enumerate() {
                        *out.add((t + k) * ld + r) = *v;
                    }
                };
                let f = w.format;
                match n {
                    1 => put(&row::<VNNI, 1, K>(f, data, scales, [q[0]])),
                    2 => put(&row::<VNNI, 2, K>(f, data, scales, [q[0], q[1]])),
                    3 => put(&row::<VNNI, 3, K>(f, data, scales, [q[0], q[1], q[2]])),
                    _ => put(&row::<VNNI, 4, K>(
                        f,
                        data,
                        scales,
                        [q[0], q[1], q[2], q[3]],
                    )),
                }
                t += n;
            }
        }
    }

    /// One row against `T` tokens. Per step of 8 blocks: 8 vectors of 32 codes from 128
    /// bytes of nibbles and 32 bytes of high bits, unpacked once; per token their products
    /// with the activations summed into lane `b` for block `b` (exact int32), the offset
    /// `16·Σq` taken off in integers, then the 8 blocks scaled by their activation and
    /// weight scales in one multiply and one fused add. Blocks after the last whole step as
    /// the reference does them. Each token's arithmetic is the same for any `T` and on
    /// either level, so its result is too.
    #[inline(always)]
    unsafe fn row<const VNNI: bool, const T: usize, const K: u8>(
        format: WeightFormat,
        w: &[u8],
        scales: &[u8],
        q: [&Q8Act; T],
    ) -> [f32; T] {
        let cols = q[0].q.len();
        let steps = cols / STEP;
        if steps == 0 || q.iter().any(|q| q.qp.len() < steps * STEP) {
            return q.map(|q| scalar::dot_q8(format, w, scales, q, cols));
        }
        let st = format.scale_type().unwrap_or(ScaleType::F32);
        let g = format.group_len(cols).unwrap_or(cols).max(1);
        let (pw, ph) = (w.as_ptr(), w.as_ptr().add(cols.div_ceil(2)));
        let m4 = _mm256_set1_epi8(0x0F);
        let sixteen = _mm256_set1_epi8(16);
        // AVX2: lane `i` takes byte `i / 8` of its vector's 4 bytes of high bits (they sit
        // in both 128-bit halves) and tests bit `i % 8`.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let one = _mm256_set1_epi16(1);
        let (ahead, far) = (PREFETCH_L1_ROWS * w.len(), PREFETCH_L2_ROWS * w.len());
        let mut acc = [_mm256_setzero_ps(); T];
        let mut sb = [0f32; STEP_BLOCKS];
        for s in 0..steps {
            let nib = pw.add(128 * s);
            prefetch(nib.wrapping_add(ahead));
            prefetch(nib.wrapping_add(64 + ahead));
            prefetch_l2(nib.wrapping_add(far));
            prefetch_l2(nib.wrapping_add(64 + far));
            let hb = ph.add(32 * s);
            if s % 2 == 0 {
                prefetch(hb.wrapping_add(ahead));
                prefetch_l2(hb.wrapping_add(far));
            }
            // Macros and plain variables, not closures or an array: those left the vectors
            // going through the stack (closures have no target features of their own, so
            // they pass vectors in memory, and the copies outlived inlining).
            macro_rules! low {
                ($u:expr) => {
                    _mm256_and_si256(_mm256_loadu_si256(nib.add(32 * $u) as *const __m256i), m4)
                };
            }
            macro_rules! high {
                ($u:expr) => {
                    _mm256_and_si256(
                        _mm256_srli_epi16(
                            _mm256_loadu_si256(nib.add(32 * $u) as *const __m256i),
                            4,
                        ),
                        m4,
                    )
                };
            }
            macro_rules! fifth {
                ($c:expr, $v:expr) => {{
                    let c = $c;
                    let bits = std::ptr::read_unaligned(hb.add(4 * $v) as *const u32);
                    if VNNI {
                        _mm256_mask_add_epi8(c, bits, c, sixteen)
                    } else {
                        let b = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), spread);
                        let hit = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
                        _mm256_or_si256(c, _mm256_and_si256(hit, sixteen))
                    }
                }};
            }
            let c0 = fifth!(low!(0), 0);
            let c1 = fifth!(low!(1), 1);
            let c2 = fifth!(low!(2), 2);
            let c3 = fifth!(low!(3), 3);
            let c4 = fifth!(high!(0), 4);
            let c5 = fifth!(high!(1), 5);
            let c6 = fifth!(high!(2), 6);
            let c7 = fifth!(high!(3), 7);
            let b0 = STEP_BLOCKS * s;
            // `K` says what the scales are (`scales_kind`).
            let sv = match K {
                SCALES_F16_G32 => _mm256_cvtph_ps(_mm_loadu_si128(
                    scales.as_ptr().add(2 * b0) as *const __m128i
                )),
                SCALES_F32_G32 => _mm256_loadu_ps(scales.as_ptr().add(4 * b0) as *const f32),
                _ => {
                    for (n, v) in sb.iter_mut().enumerate() {
                        *v = scalar::scale_at(st, scales, (b0 + n) * QBLOCK / g);
                    }
                    _mm256_loadu_ps(sb.as_ptr())
                }
            };
            for t in 0..T {
                let pq = q[t].qp.as_ptr().add(STEP * s);
                macro_rules! qv {
                    ($v:expr) => {
                        _mm256_loadu_si256(pq.add(32 * $v) as *const __m256i)
                    };
                }
                let sums = if VNNI {
                    // Two chains of four.
                    let z = _mm256_setzero_si256();
                    let e = _mm256_dpbusd_epi32(z, c0, qv!(0));
                    let o = _mm256_dpbusd_epi32(z, c1, qv!(1));
                    let e = _mm256_dpbusd_epi32(e, c2, qv!(2));
                    let o = _mm256_dpbusd_epi32(o, c3, qv!(3));
                    let e = _mm256_dpbusd_epi32(e, c4, qv!(4));
                    let o = _mm256_dpbusd_epi32(o, c5, qv!(5));
                    let e = _mm256_dpbusd_epi32(e, c6, qv!(6));
                    let o = _mm256_dpbusd_epi32(o, c7, qv!(7));
                    _mm256_add_epi32(e, o)
                } else {
                    // Codes ≤ 31 times |q| ≤ 127: a maddubs lane ≤ 7 874, two ≤ 15 748.
                    macro_rules! two {
                        ($a:expr, $b:expr, $v:expr) => {
                            _mm256_madd_epi16(
                                _mm256_add_epi16(
                                    _mm256_maddubs_epi16($a, qv!($v)),
                                    _mm256_maddubs_epi16($b, qv!($v + 1)),
                                ),
                                one,
                            )
                        };
                    }
                    _mm256_add_epi32(
                        _mm256_add_epi32(two!(c0, c1, 0), two!(c2, c3, 2)),
                        _mm256_add_epi32(two!(c4, c5, 4), two!(c6, c7, 6)),
                    )
                };
                let qs = _mm256_loadu_si256(q[t].qsum.as_ptr().add(b0) as *const __m256i);
                let i = _mm256_sub_epi32(sums, _mm256_slli_epi32(qs, 4));
                let d = _mm256_mul_ps(_mm256_loadu_ps(q[t].d.as_ptr().add(b0)), sv);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), d, acc[t]);
            }
        }
        let mut out = [0f32; T];
        for (t, o) in out.iter_mut().enumerate() {
            let a = acc[t];
            let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            *o = _mm_cvtss_f32(s);
            if STEP_BLOCKS * steps < cols.div_ceil(QBLOCK) {
                *o += scalar::dot_q8_blocks(format, w, scales, q[t], cols, STEP_BLOCKS * steps);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_row, prepare, scalar};
    use super::*;
    use crate::format::ScaleType;

    use super::super::tests::Rng;
    use crate::format::int5::{code, pack};
    use crate::format::QBLOCK;

    #[test]
    fn every_element_has_its_own_nibble_and_bit_and_a_step_puts_block_b_in_lane_b() {
        // Step 0, block 0: elements 0..4 are bytes 0..4's low nibbles, 16..20 their high
        // nibbles; block 1 starts at byte 4; word 1 holds elements 4..8.
        assert_eq!(place(0, 256), (0, false, 0));
        assert_eq!(place(3, 256), (3, false, 3));
        assert_eq!(place(16, 256), (0, true, 128));
        assert_eq!(place(32, 256), (4, false, 4));
        assert_eq!(place(4, 256), (32, false, 32));
        // 300 columns: one whole step, then 44 elements plainly.
        assert_eq!(place(256, 300), (128, false, 256));
        assert_eq!(place(257, 300), (128, true, 257));
        for cols in [1usize, 31, 64, 100, 256, 300, 512, 2048] {
            let (mut nibbles, mut bits) = (vec![false; 2 * cols.div_ceil(2)], vec![false; cols]);
            for j in 0..cols {
                let (byte, high, bit) = place(j, cols);
                let n = 2 * byte + high as usize;
                assert!(
                    !nibbles[n] && !bits[bit],
                    "cols {cols}: element {j} shares a place"
                );
                nibbles[n] = true;
                bits[bit] = true;
                if j < cols / STEP * STEP {
                    // Lane (bit % 32) / 4 of its vector is its block.
                    assert_eq!((bit % 32) / 4, (j % STEP) / QBLOCK, "cols {cols}, j {j}");
                    assert_eq!(bit / STEP, j / STEP);
                }
            }
        }
    }

    #[test]
    fn codes_round_trip_through_the_two_planes() {
        let mut rng = Rng(7);
        for cols in [1, 33, 64, 96, 130, 256, 300, 2048] {
            let codes: Vec<u8> = (0..cols).map(|_| (rng.next() % 32) as u8).collect();
            let mut packed = Vec::new();
            pack(&codes, &mut packed);
            let f = WeightFormat::I5 {
                group: 32,
                scale: ScaleType::F16,
            };
            assert_eq!(packed.len(), f.row_bytes(cols));
            for (j, c) in codes.iter().enumerate() {
                assert_eq!(code(&packed, j, cols), *c, "cols {cols}, element {j}");
            }
        }
    }

    #[test]
    fn quantized_rows_decode_within_half_a_step() {
        let mut rng = Rng(11);
        let cols = 160;
        let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
        let f = WeightFormat::I5 {
            group: 32,
            scale: ScaleType::F32,
        };
        let (mut w, mut s) = (Vec::new(), Vec::new());
        crate::quant::quantize_row(f, &x, &mut w, &mut s);
        let mut back = vec![0f32; cols];
        decode_row(f, &w, &s, &mut back);
        for (g, chunk) in x.chunks(32).enumerate() {
            let step = scalar::scale_at(ScaleType::F32, &s, g);
            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            // 32 levels: the step is about amax / 16, and nothing is clipped by more than a
            // step (the scale search stops at amax / 16).
            assert!(step <= amax / 15.0 + 1e-6 && step >= amax / 16.0 - 1e-6);
            for (k, v) in chunk.iter().enumerate() {
                let e = (back[32 * g + k] - v).abs();
                assert!(e <= step * 1.0001, "group {g} element {k}: {v} → error {e}");
            }
        }
    }

    /// The SIMD paths against the reference: the same integer sums per block, so the results
    /// agree to float rounding; every group layout, odd sizes (tails after the last pair).
    #[test]
    fn fast_paths_match_the_scalar_reference() {
        let mut rng = Rng(3);
        for (group, scale) in [
            (32, ScaleType::F16),
            (32, ScaleType::F32),
            (64, ScaleType::F16),
            (96, ScaleType::F16),
            (0, ScaleType::F32),
        ] {
            let f = WeightFormat::I5 { group, scale };
            for cols in [32, 64, 96, 192, 256, 320, 576, 2048] {
                if group > 0 && cols % group as usize != 0 && group != 32 {
                    continue;
                }
                let w: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
                let (mut d, mut s) = (Vec::new(), Vec::new());
                crate::quant::quantize_row(f, &w, &mut d, &mut s);
                let act = prepare(f, &x, true);
                let q = act.q8.as_ref().expect("int5 takes int8 activations");
                let want = scalar::dot_q8(f, &d, &s, q, cols);
                let mag: f32 = x.iter().map(|v| v.abs()).sum::<f32>() + 1.0;
                let mut paths = vec![("this level", dot_act(f, &d, &s, &act))];
                #[cfg(target_arch = "x86_64")]
                {
                    use std::arch::is_x86_feature_detected as has;
                    let one = Weights {
                        format: f,
                        rows: 1,
                        cols,
                        data: &d,
                        scales: &s,
                        int8: true,
                        rows8: false,
                    };
                    let mut out = 0f32;
                    if has!("avx2") && has!("fma") && has!("f16c") {
                        // SAFETY: the features were just detected; one output, ours.
                        unsafe { simd::rows_avx2(&one, &[q], 0..1, &mut out, 1) };
                        paths.push(("avx2", out));
                        if has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                            // SAFETY: as above.
                            unsafe { simd::rows_vnni(&one, &[q], 0..1, &mut out, 1) };
                            paths.push(("vnni", out));
                        }
                    }
                }
                if let [_, (_, avx2), (_, vnni)] = paths[..] {
                    assert_eq!(avx2.to_bits(), vnni.to_bits(), "{} cols {cols}", f.name());
                }
                for (path, got) in paths {
                    assert!(
                        (got - want).abs() <= 1e-5 * mag,
                        "{} on {path}, cols {cols}: {got} vs {want}",
                        f.name()
                    );
                }
            }
        }
    }
}
