//! The colibri C engine's sub-4-bit weight formats, which its containers may hold and which
//! colibri reads in place (docs/FORMAT.md, "The colibri C container layout"):
//!
//! - [`WeightFormat::I3G64`]: int3 in groups of 64 elements, 24 bytes per group (16 bytes of
//!   low 2-bit codes, then 8 bytes of high bits), code `c` meaning `(c - 4) * scale`, one
//!   f32 scale per group: 3.5 bits per weight with the scales.
//! - [`WeightFormat::I2Plain`]: int2 rows, four codes per byte, code `c` meaning
//!   `(c - 2) * scale`, one f32 scale per row.
//!
//! Both keep their 2-bit codes in the same plain order (element `j` of a run in bits
//! `2(j%4)` of byte `j/4`). The scalar reference is `scalar::dot`/`scalar::dot_q8_blocks`
//! over the codes as `format/lowbit.rs` decodes them; the AVX2 paths expand 32 codes at a time into natural order
//! (one byte each), so the activations need no reordering: f32 activations multiply the codes
//! converted to f32, int8 activations go through `maddubs` with the code offset taken off in
//! integers per 32-element block.

use super::{scalar, Act, Level};
use crate::format::WeightFormat;
/// Puts int8 activations in the order the 2-bit planes unpack to, per 64-element chunk `c`
/// (an int3 group; 16 bytes of int2): `qp[64c + 16k + m] = q[64c + 4m + k]` (a shift by
/// `2k` and a mask give element `4m + k` of byte `m`). Per chunk, `d8` holds the activation
/// scales as the 8 lanes of the chunk's integer sums see them (lanes 0, 1, 4, 5 sum the
/// chunk's first 32 elements, lanes 2, 3, 6, 7 its second) and `corr8` the code offset
/// times each block's sum of q (lanes 0 and 2), so the offset is one integer subtraction.
pub fn order_q8(format: WeightFormat, a: &mut super::Q8Act) {
    let off = if format == WeightFormat::I3G64 { 4 } else { 2 };
    let chunks = a.q.len() / 64;
    a.qp = vec![0; chunks * 64];
    a.d8 = vec![0.0; chunks * 8];
    a.corr8 = vec![0; chunks * 8];
    for c in 0..chunks {
        for k in 0..4 {
            for m in 0..16 {
                a.qp[64 * c + 16 * k + m] = a.q[64 * c + 4 * m + k];
            }
        }
        for (lane, blk) in [0, 0, 1, 1, 0, 0, 1, 1].into_iter().enumerate() {
            a.d8[8 * c + lane] = a.d[2 * c + blk];
        }
        a.corr8[8 * c] = off * a.qsum[2 * c];
        a.corr8[8 * c + 2] = off * a.qsum[2 * c + 1];
    }
}

/// `dot(row, act)` for the formats of this file, on the fastest path.
#[inline]
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    match super::level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        Level::Avx2 | Level::Avx512Vnni => unsafe { avx2::dot_act(format, w, scales, act) },
        _ => scalar::dot_act(format, w, scales, act),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::{scalar, Act, Q8Act, QBLOCK};
    use crate::format::lowbit::{i2p_code, i3_code, I3_GROUP_BYTES};
    use crate::format::WeightFormat;
    use std::arch::x86_64::*;

    const PREFETCH: usize = 2048;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
        match (format, &act.q8) {
            (WeightFormat::I3G64, Some(q)) => dot_q8::<true>(format, w, scales, act, q),
            (WeightFormat::I2Plain, Some(q)) => dot_q8::<false>(format, w, scales, act, q),
            (WeightFormat::I3G64, None) => dot_f32::<true>(w, scales, act),
            (WeightFormat::I2Plain, None) => dot_f32::<false>(w, scales, act),
            _ => scalar::dot_act(format, w, scales, act),
        }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[inline(always)]
    fn scale(s: &[u8], g: usize) -> f32 {
        f32::from_le_bytes([s[4 * g], s[4 * g + 1], s[4 * g + 2], s[4 * g + 3]])
    }

    /// 8 bytes of plain 2-bit codes → the 32 codes, one byte each, in element order.
    #[inline(always)]
    unsafe fn expand2(p: *const u8) -> __m256i {
        let b = _mm256_broadcastsi128_si256(_mm_loadl_epi64(p as *const __m128i));
        // Lane j takes byte j/4 (the upper 128-bit lane reads the same 8 bytes).
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7,
            7, 7, 7,
        );
        let v = _mm256_shuffle_epi8(b, idx);
        // Lane j keeps bits 2(j%4)..+2 of its byte: 16-bit shifts by 2, 4, 6 bring them down
        // for the lanes with j%4 = 1, 2, 3 (what a shift drags in from the neighbour byte
        // lies above the two bits kept).
        let k = |m: i32| _mm256_set1_epi32(m);
        let c0 = _mm256_and_si256(v, k(0x03));
        let c1 = _mm256_and_si256(_mm256_srli_epi16(v, 2), k(0x0300));
        let c2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), k(0x03_0000));
        let c3 = _mm256_and_si256(_mm256_srli_epi16(v, 6), k(0x0300_0000));
        _mm256_or_si256(_mm256_or_si256(c0, c1), _mm256_or_si256(c2, c3))
    }

    /// 4 bytes of int3 high bits → 4 or 0 per element, one byte each, in element order.
    #[inline(always)]
    unsafe fn expand1(p: *const u8) -> __m256i {
        let b = _mm256_broadcastsi128_si256(_mm_cvtsi32_si128(std::ptr::read_unaligned(
            p as *const i32,
        )));
        let idx = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let v = _mm256_shuffle_epi8(b, idx);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let hit = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
        _mm256_and_si256(hit, _mm256_set1_epi8(4))
    }

    /// Codes of full 32-element block `b`.
    #[inline(always)]
    unsafe fn block_codes<const I3: bool>(pw: *const u8, b: usize) -> __m256i {
        if I3 {
            let g = (b / 2) * I3_GROUP_BYTES;
            let h = b % 2;
            _mm256_or_si256(expand2(pw.add(g + 8 * h)), expand1(pw.add(g + 16 + 4 * h)))
        } else {
            expand2(pw.add(b * 8))
        }
    }

    #[inline(always)]
    fn block_bytes<const I3: bool>(b: usize) -> usize {
        if I3 {
            (b / 2) * I3_GROUP_BYTES
        } else {
            b * 8
        }
    }

    /// `sum((code - offset) * x) * scale` over groups, f32 activations.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f32<const I3: bool>(w: &[u8], scales: &[u8], act: &Act) -> f32 {
        let cols = act.x.len();
        let full = cols / QBLOCK;
        let off = if I3 { 4.0f32 } else { 2.0 };
        let per_group = if I3 { 2 } else { full.max(1) };
        let (pw, px) = (w.as_ptr(), act.x.as_ptr());
        let mut total = _mm256_setzero_ps();
        let mut corr = 0f32;
        let (mut b, mut g) = (0, 0);
        while b < full {
            let s = scale(scales, g);
            let end = (b + per_group).min(full);
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut bs = 0f32;
            while b < end {
                if b % 8 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(
                        pw.add(block_bytes::<I3>(b) + PREFETCH) as *const i8
                    );
                }
                let c = block_codes::<I3>(pw, b);
                let lo = _mm256_castsi256_si128(c);
                let hi = _mm256_extracti128_si256(c, 1);
                let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                let x = px.add(b * QBLOCK);
                a0 = _mm256_fmadd_ps(f(lo), _mm256_loadu_ps(x), a0);
                a1 = _mm256_fmadd_ps(f(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x.add(8)), a1);
                a0 = _mm256_fmadd_ps(f(hi), _mm256_loadu_ps(x.add(16)), a0);
                a1 = _mm256_fmadd_ps(f(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x.add(24)), a1);
                bs += act.bsum[b];
                b += 1;
            }
            total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(s), total);
            corr = (off * bs).mul_add(s, corr);
            g += 1;
        }
        let mut tail = 0f32;
        for j in full * QBLOCK..cols {
            let (c, g) = if I3 {
                (i3_code(w, j), j / 64)
            } else {
                (i2p_code(w, j), 0)
            };
            tail = ((c as f32 - off) * scale(scales, g)).mul_add(act.x[j], tail);
        }
        hsum(total) - corr + tail
    }

    /// int8 activations in `order_q8`'s order: per 64-element chunk the low plane's 16
    /// bytes give the codes of elements `4m + k` with one shift and mask per `k` (and the
    /// int3 high bits one compare per `k`), two `maddubs` cover the chunk, the offset is taken
    /// off in integers. Exact integer sums per 32-element block as the reference; the
    /// elements after the last whole chunk as the reference does them.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_q8<const I3: bool>(
        format: WeightFormat,
        w: &[u8],
        scales: &[u8],
        act: &Act,
        q: &Q8Act,
    ) -> f32 {
        let cols = act.x.len();
        let chunks = cols / 64;
        let chunk_bytes = if I3 { I3_GROUP_BYTES } else { 16 };
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let ones = _mm256_set1_epi16(1);
        // High bit of element 4m + k is bit 4(m % 2) + k of byte m / 2.
        let hidx = _mm256_setr_epi8(
            0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
            6, 7, 7,
        );
        let bits = |k0: i8| {
            let (a, b) = (1i8 << k0, 1i8 << (k0 + 1));
            let (a4, b4) = ((a as u8) << 4, (b as u8) << 4);
            let (a4, b4) = (a4 as i8, b4 as i8);
            _mm256_setr_epi8(
                a, a4, a, a4, a, a4, a, a4, a, a4, a, a4, a, a4, a, a4, b, b4, b, b4, b, b4, b, b4,
                b, b4, b, b4, b, b4, b, b4,
            )
        };
        let (h01, h23) = (bits(0), bits(2));
        let (pw, pq, pd, pc) = (w.as_ptr(), q.qp.as_ptr(), q.d8.as_ptr(), q.corr8.as_ptr());
        let row_scale = scale(scales, 0);
        let mut acc = _mm256_setzero_ps();
        for c in 0..chunks {
            let p = pw.add(c * chunk_bytes);
            if c % 4 == 0 {
                _mm_prefetch::<_MM_HINT_T0>(p.add(PREFETCH) as *const i8);
            }
            let lo = _mm_loadu_si128(p as *const __m128i);
            let mut t01 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(lo, 2), lo), m3);
            let mut t23 = _mm256_and_si256(
                _mm256_set_m128i(_mm_srli_epi16(lo, 6), _mm_srli_epi16(lo, 4)),
                m3,
            );
            if I3 {
                let h = _mm256_shuffle_epi8(
                    _mm256_broadcastsi128_si256(_mm_loadl_epi64(p.add(16) as *const __m128i)),
                    hidx,
                );
                let hi = |mask: __m256i| {
                    let hit = _mm256_cmpeq_epi8(_mm256_and_si256(h, mask), mask);
                    _mm256_and_si256(hit, four)
                };
                t01 = _mm256_or_si256(t01, hi(h01));
                t23 = _mm256_or_si256(t23, hi(h23));
            }
            let qa = _mm256_loadu_si256(pq.add(64 * c) as *const __m256i);
            let qb = _mm256_loadu_si256(pq.add(64 * c + 32) as *const __m256i);
            // codes 0..7 unsigned, q signed: each maddubs pair ≤ 2·7·127, their sum < 2^15.
            let s16 =
                _mm256_add_epi16(_mm256_maddubs_epi16(t01, qa), _mm256_maddubs_epi16(t23, qb));
            let i = _mm256_sub_epi32(
                _mm256_madd_epi16(s16, ones),
                _mm256_loadu_si256(pc.add(8 * c) as *const __m256i),
            );
            let s = if I3 { scale(scales, c) } else { row_scale };
            let d = _mm256_mul_ps(_mm256_loadu_ps(pd.add(8 * c)), _mm256_set1_ps(s));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), d, acc);
        }
        hsum(acc) + scalar::dot_q8_blocks(format, w, scales, q, cols, 2 * chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode_row, prepare, scalar};
    use super::*;
    use crate::format::lowbit::{i2p_code, i3_code, pack_i3, pack_plain2};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn f(&mut self) -> f32 {
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    const FORMATS: [WeightFormat; 2] = [WeightFormat::I3G64, WeightFormat::I2Plain];

    /// Random codes of every value (random bytes are valid codes) and random positive scales.
    fn random_row(format: WeightFormat, cols: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
        let w = (0..format.row_bytes(cols))
            .map(|_| rng.next() as u8)
            .collect();
        let s = (0..format.groups_per_row(cols))
            .flat_map(|_| (0.01 + rng.f().abs()).to_le_bytes())
            .collect();
        (w, s)
    }

    fn magnitude(format: WeightFormat, w: &[u8], s: &[u8], x: &[f32]) -> f32 {
        let mut d = vec![0f32; x.len()];
        decode_row(format, w, s, &mut d);
        d.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-3
    }

    #[test]
    fn codes_follow_the_layout_byte_by_byte() {
        // int3: element 5 of group 1 = low bits 2..4 of byte 24 + 1, high bit 5 of byte 24 + 16.
        let mut w = vec![0u8; 48];
        w[24 + 1] = 0b0000_1100; // element 5 (byte 1, bits 2..4) low code 3
        w[24 + 16] = 0b0010_0000; // element 5 high bit
        assert_eq!(i3_code(&w, 64 + 5), 7);
        assert_eq!(i3_code(&w, 64 + 4), 0);
        w[16] = 0x80; // element 7 of group 0: high bit only
        assert_eq!(i3_code(&w, 7), 4);
        // plain int2: element 6 = bits 4..6 of byte 1.
        assert_eq!(i2p_code(&[0, 0b0011_0000], 6), 3);
        // pack/unpack round trip, with a padded last group.
        let codes: Vec<u8> = (0..150).map(|i| (i * 5 % 8) as u8).collect();
        let mut packed = Vec::new();
        pack_i3(&codes, &mut packed);
        assert_eq!(packed.len(), WeightFormat::I3G64.row_bytes(150));
        for (j, c) in codes.iter().enumerate() {
            assert_eq!(i3_code(&packed, j), *c, "element {j}");
        }
        assert_eq!(i3_code(&packed, 150), 4, "padding is code 4 (zero)");
        let codes: Vec<u8> = (0..37).map(|i| (i * 3 % 4) as u8).collect();
        let mut packed = Vec::new();
        pack_plain2(&codes, &mut packed);
        assert_eq!(packed.len(), WeightFormat::I2Plain.row_bytes(37));
        for (j, c) in codes.iter().enumerate() {
            assert_eq!(i2p_code(&packed, j), *c);
        }
    }

    #[test]
    fn decoding_gives_code_minus_offset_times_the_group_scale() {
        let mut rng = Rng(3);
        for format in FORMATS {
            let cols = 150;
            let (w, s) = random_row(format, cols, &mut rng);
            let mut d = vec![0f32; cols];
            decode_row(format, &w, &s, &mut d);
            for (j, v) in d.iter().enumerate() {
                let (c, g, off) = match format {
                    WeightFormat::I3G64 => (i3_code(&w, j), j / 64, 4.0),
                    _ => (i2p_code(&w, j), 0, 2.0),
                };
                let sc = f32::from_le_bytes(s[4 * g..4 * g + 4].try_into().unwrap());
                assert_eq!(*v, (c as f32 - off) * sc);
            }
        }
    }

    #[test]
    fn fast_paths_match_the_scalar_reference() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let mut checked = 0;
        for format in FORMATS {
            for _ in 0..200 {
                let cols = match rng.below(4) {
                    0 => 1 + rng.below(40),
                    1 => 32 * (1 + rng.below(12)),
                    2 => 64 * (1 + rng.below(6)) + 1 + 2 * rng.below(31),
                    _ => 1 + rng.below(700),
                };
                let (w, s) = random_row(format, cols, &mut rng);
                let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
                let mag = magnitude(format, &w, &s, &x);
                for int8 in [false, true] {
                    let act = prepare(format, &x, int8);
                    assert_eq!(act.q8.is_some(), int8);
                    let fast = crate::kernels::dot_act(format, &w, &s, &act);
                    let reference = scalar::dot_act(format, &w, &s, &act);
                    assert!(
                        (fast - reference).abs() <= 2e-5 * mag,
                        "{format:?} cols {cols} int8 {int8}: fast {fast} vs reference {reference} (scale {mag})"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 800);
    }

    #[test]
    fn int8_activations_stay_close_to_f32() {
        let mut rng = Rng(11);
        for format in FORMATS {
            for cols in [64, 256, 333] {
                let (w, s) = random_row(format, cols, &mut rng);
                let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let exact = scalar::dot(format, &w, &s, &x);
                let q = crate::kernels::dot_act(format, &w, &s, &prepare(format, &x, true));
                let mag = magnitude(format, &w, &s, &x);
                assert!(
                    (exact - q).abs() <= mag / 127.0,
                    "{format:?} {cols}: {exact} vs {q}"
                );
            }
        }
    }
}
