//! AVX2 + FMA + F16C kernels of the per-row API (`kernels::dot_act` on a prepared row):
//! one weight row against one activation row, for callers that work row by row (formats
//! without tiles, one-off dot products). Products go through the tiles of `avx2.rs`. Each
//! computes what its counterpart in `scalar` defines, in a different summation order; the
//! tests in `tests.rs` hold them to it.
//!
//! Callers guarantee the CPU features (see `super::level`); the slices' lengths are those of
//! a row of the matrix, which `Matrix` has validated.

use super::avx2::{hsum, prefetch, PREFETCH};
use super::{scalar, Act, Q8Act, QBLOCK};
use crate::format::{ScaleType, WeightFormat};
use std::arch::x86_64::*;

/// Scale `g` of a row; f16 through F16C (the portable conversion costs more than the
/// 64-element group it scales).
#[inline(always)]
unsafe fn scale(st: ScaleType, s: &[u8], g: usize) -> f32 {
    match st {
        ScaleType::F32 => f32::from_le_bytes([s[4 * g], s[4 * g + 1], s[4 * g + 2], s[4 * g + 3]]),
        ScaleType::F16 => {
            let h = u16::from_le_bytes([s[2 * g], s[2 * g + 1]]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }
        ScaleType::E8M0 => crate::format::mxfp4::scale(s[g]),
        ScaleType::BF16 => scalar::bf16_to_f32(s[2 * g], s[2 * g + 1]),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    let cols = act.x.len();
    if let Some(q) = &act.q8 {
        return match format {
            WeightFormat::I8Row => dot_i8_q8(w, scales, act, q),
            WeightFormat::I8 { scale, .. } => dot_i8g_q8(w, scales, scale, format, act, q),
            WeightFormat::I4 { scale, .. } => dot_i4_q8(w, scales, scale, format, act, q),
            WeightFormat::I2 { scale, .. } => dot_i2_q8(w, scales, scale, format, act, q),
            _ => scalar::dot_act(format, w, scales, act),
        };
    }
    match format {
        WeightFormat::F32 => match bytemuck::try_cast_slice::<u8, f32>(w) {
            Ok(wf) => super::avx2::dot_f32(wf, &act.x),
            Err(_) => scalar::dot(format, w, scales, &act.x),
        },
        WeightFormat::BF16 => dot_bf16(w, &act.x),
        WeightFormat::F16 => dot_f16(w, &act.x),
        WeightFormat::I8Row => dot_i8(w, &act.x) * scalar::scale_at(ScaleType::F32, scales, 0),
        WeightFormat::I8 { .. } => scalar::dot(format, w, scales, &act.x),
        // `kernels::dot_act` sends the C engine's formats to `lowbit` before this.
        WeightFormat::I3G64
        | WeightFormat::I2Plain
        | WeightFormat::I5 { .. }
        | WeightFormat::I4Ct { .. }
        | WeightFormat::Mxfp4 => scalar::dot(format, w, scales, &act.x),
        WeightFormat::I4Rows8 { .. } => {
            unreachable!("int4-rows8 rows are taken out as int4 first (rows8::gather_row)")
        }
        WeightFormat::I4 { scale, .. } | WeightFormat::I2 { scale, .. } => {
            let g = format.group_len(cols).unwrap_or(cols);
            if !g.is_multiple_of(QBLOCK) && g < cols {
                return scalar::dot(format, w, scales, &act.x);
            }
            if matches!(format, WeightFormat::I4 { .. }) {
                dot_i4(w, scales, scale, g, act)
            } else {
                dot_i2(w, scales, scale, g, act)
            }
        }
    }
}

#[inline(always)]
unsafe fn load_bf16x8(p: *const u8) -> __m256 {
    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(
                load_bf16x8(pw.add(2 * (i + 8 * k))),
                _mm256_loadu_ps(px.add(i + 8 * k)),
                *a,
            );
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            load_bf16x8(pw.add(2 * i)),
            _mm256_loadu_ps(px.add(i)),
            acc[0],
        );
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s = scalar::bf16_to_f32(w[2 * i], w[2 * i + 1]).mul_add(x[i], s);
        i += 1;
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 16 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(pw.add(2 * (i + 8 * k)) as *const __m128i));
            *a = _mm256_fmadd_ps(v, _mm256_loadu_ps(px.add(i + 8 * k)), *a);
        }
        i += 16;
    }
    while i + 8 <= n {
        let v = _mm256_cvtph_ps(_mm_loadu_si128(pw.add(2 * i) as *const __m128i));
        acc[0] = _mm256_fmadd_ps(v, _mm256_loadu_ps(px.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    while i < n {
        s = half::f16::from_le_bytes([w[2 * i], w[2 * i + 1]])
            .to_f32()
            .mul_add(x[i], s);
        i += 1;
    }
    s
}

/// `sum(code * x)` of an int8 row, unscaled.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (pw, px) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        if i % 64 == 0 {
            prefetch(pw.add(i + PREFETCH));
        }
        for (k, a) in acc.iter_mut().enumerate() {
            let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(pw.add(i + 8 * k) as *const __m128i));
            *a = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(v),
                _mm256_loadu_ps(px.add(i + 8 * k)),
                *a,
            );
        }
        i += 32;
    }
    while i + 8 <= n {
        let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(pw.add(i) as *const __m128i));
        acc[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), _mm256_loadu_ps(px.add(i)), acc[0]);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s = (w[i] as i8 as f32).mul_add(x[i], s);
        i += 1;
    }
    s
}

/// Full 32-element blocks of group `gi` (size `g`) and the elements after them that the
/// group still holds (the row's tail, only in the last group).
#[inline(always)]
fn group_blocks(
    gi: usize,
    g: usize,
    cols: usize,
) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let full = cols / QBLOCK;
    let (e0, e1) = (gi * g, ((gi + 1) * g).min(cols));
    let b0 = (e0 / QBLOCK).min(full);
    let b1 = (e1 / QBLOCK).min(full);
    (b0..b1, (b1 * QBLOCK).max(e0)..e1)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i4(w: &[u8], scales: &[u8], st: ScaleType, g: usize, act: &Act) -> f32 {
    let cols = act.x.len();
    let mask = _mm256_set1_epi32(0x0F);
    let (pw, pxp) = (w.as_ptr(), act.xp.as_ptr());
    let mut total = _mm256_setzero_ps();
    let mut corr = 0f32;
    let mut tail = 0f32;
    for gi in 0..cols.div_ceil(g) {
        let s = scale(st, scales, gi);
        let (blocks, rest) = group_blocks(gi, g, cols);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut bs = 0f32;
        for b in blocks {
            let p = pw.add(b * 16);
            if b % 4 == 0 {
                prefetch(p.add(PREFETCH));
            }
            let xp = pxp.add(b * QBLOCK);
            let va = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
            let vb = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8) as *const __m128i));
            a0 = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_and_si256(va, mask)),
                _mm256_loadu_ps(xp),
                a0,
            );
            a1 = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_srli_epi32(va, 4)),
                _mm256_loadu_ps(xp.add(8)),
                a1,
            );
            a0 = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_and_si256(vb, mask)),
                _mm256_loadu_ps(xp.add(16)),
                a0,
            );
            a1 = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_srli_epi32(vb, 4)),
                _mm256_loadu_ps(xp.add(24)),
                a1,
            );
            bs += act.bsum[b];
        }
        total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(s), total);
        corr = (8.0 * bs).mul_add(s, corr);
        let mut t = 0f32;
        for j in rest {
            t = (scalar::i4_code(w, j) as f32 - 8.0).mul_add(act.x[j], t);
        }
        tail = t.mul_add(s, tail);
    }
    hsum(total) - corr + tail
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i2(w: &[u8], scales: &[u8], st: ScaleType, g: usize, act: &Act) -> f32 {
    let cols = act.x.len();
    let mask = _mm256_set1_epi32(3);
    let (pw, px) = (w.as_ptr(), act.x.as_ptr());
    let mut total = _mm256_setzero_ps();
    let mut corr = 0f32;
    let mut tail = 0f32;
    for gi in 0..cols.div_ceil(g) {
        let s = scale(st, scales, gi);
        let (blocks, rest) = group_blocks(gi, g, cols);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut bs = 0f32;
        for b in blocks {
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(pw.add(b * 8) as *const __m128i));
            if b % 8 == 0 {
                prefetch(pw.add(b * 8 + PREFETCH));
            }
            let x = px.add(b * QBLOCK);
            let c0 = _mm256_and_si256(v, mask);
            let c1 = _mm256_and_si256(_mm256_srli_epi32(v, 2), mask);
            let c2 = _mm256_and_si256(_mm256_srli_epi32(v, 4), mask);
            let c3 = _mm256_srli_epi32(v, 6);
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0), _mm256_loadu_ps(x), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1), _mm256_loadu_ps(x.add(8)), a1);
            a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c2), _mm256_loadu_ps(x.add(16)), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c3), _mm256_loadu_ps(x.add(24)), a1);
            bs += act.bsum[b];
        }
        total = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(s), total);
        corr = (1.5 * bs).mul_add(s, corr);
        let mut t = 0f32;
        for j in rest {
            t = (scalar::i2_code(w, j, cols) as f32 - 1.5).mul_add(act.x[j], t);
        }
        tail = t.mul_add(s, tail);
    }
    hsum(total) - corr + tail
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8_q8(w: &[u8], scales: &[u8], act: &Act, q: &Q8Act) -> f32 {
    let cols = act.x.len();
    let full = cols / QBLOCK;
    let ones = _mm256_set1_epi16(1);
    let (pw, pq) = (w.as_ptr(), q.q.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for b in 0..full {
        let wv = _mm256_loadu_si256(pw.add(b * QBLOCK) as *const __m256i);
        if b % 2 == 0 {
            prefetch(pw.add(b * QBLOCK + PREFETCH));
        }
        let qv = _mm256_loadu_si256(pq.add(b * QBLOCK) as *const __m256i);
        // maddubs wants one unsigned operand: |w| times q with w's sign.
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(qv, wv));
        let i = _mm256_madd_epi16(p, ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(q.d[b]), acc);
    }
    let s = scalar::scale_at(ScaleType::F32, scales, 0);
    hsum(acc) * s + scalar::dot_q8_blocks(WeightFormat::I8Row, w, scales, q, cols, full)
}

/// Grouped int8 × int8 activations: per block the exact integer sum, times the block's
/// activation scale and its group's weight scale.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8g_q8(
    w: &[u8],
    scales: &[u8],
    st: ScaleType,
    format: WeightFormat,
    act: &Act,
    q: &Q8Act,
) -> f32 {
    let cols = act.x.len();
    let full = cols / QBLOCK;
    let bpg = (format.group_len(cols).unwrap_or(cols) / QBLOCK).max(1);
    let ones = _mm256_set1_epi16(1);
    let (pw, pq) = (w.as_ptr(), q.q.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut gi, mut k) = (0, 0);
    let mut s = scale(st, scales, 0);
    for b in 0..full {
        if k == bpg {
            k = 0;
            gi += 1;
            s = scale(st, scales, gi);
        }
        k += 1;
        let wv = _mm256_loadu_si256(pw.add(b * QBLOCK) as *const __m256i);
        if b % 2 == 0 {
            prefetch(pw.add(b * QBLOCK + PREFETCH));
        }
        let qv = _mm256_loadu_si256(pq.add(b * QBLOCK) as *const __m256i);
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(qv, wv));
        let i = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        let f = _mm256_set1_ps(q.d[b] * s);
        if b % 2 == 0 {
            acc0 = _mm256_fmadd_ps(i, f, acc0);
        } else {
            acc1 = _mm256_fmadd_ps(i, f, acc1);
        }
    }
    hsum(_mm256_add_ps(acc0, acc1)) + scalar::dot_q8_blocks(format, w, scales, q, cols, full)
}

/// Converts scales `first..first + out.len()` of a row to f32 (8 at a time through F16C).
#[inline(always)]
unsafe fn scales_f32(st: ScaleType, s: &[u8], first: usize, out: &mut [f32]) {
    match st {
        ScaleType::F32 | ScaleType::E8M0 | ScaleType::BF16 => {
            for (k, o) in out.iter_mut().enumerate() {
                *o = scale(st, s, first + k);
            }
        }
        ScaleType::F16 => {
            let mut k = 0;
            while k + 8 <= out.len() {
                let h = _mm_loadu_si128(s.as_ptr().add(2 * (first + k)) as *const __m128i);
                _mm256_storeu_ps(out.as_mut_ptr().add(k), _mm256_cvtph_ps(h));
                k += 8;
            }
            while k < out.len() {
                out[k] = scale(st, s, first + k);
                k += 1;
            }
        }
    }
}

#[inline(always)]
unsafe fn i4_q8_pair(
    pw: *const u8,
    pq: *const i8,
    pc: *const i32,
    m0f: __m256i,
    ones: __m256i,
) -> __m256 {
    let v = _mm256_loadu_si256(pw as *const __m256i);
    let lo = _mm256_and_si256(v, m0f);
    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
    let qe = _mm256_loadu_si256(pq as *const __m256i);
    let qo = _mm256_loadu_si256(pq.add(32) as *const __m256i);
    let s16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, qe), _mm256_maddubs_epi16(hi, qo));
    let i = _mm256_sub_epi32(
        _mm256_madd_epi16(s16, ones),
        _mm256_loadu_si256(pc as *const __m256i),
    );
    _mm256_cvtepi32_ps(i)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i4_q8(
    w: &[u8],
    scales: &[u8],
    st: ScaleType,
    format: WeightFormat,
    act: &Act,
    q: &Q8Act,
) -> f32 {
    let cols = act.x.len();
    let g = format.group_len(cols).unwrap_or(cols);
    let pairs = cols / QBLOCK / 2;
    let ones = _mm256_set1_epi16(1);
    let m0f = _mm256_set1_epi8(0x0F);
    let (pw, pq, pd, pc) = (w.as_ptr(), q.qp.as_ptr(), q.d8.as_ptr(), q.corr8.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    if g >= 2 * QBLOCK && (g >= cols || g.is_multiple_of(2 * QBLOCK)) {
        // Whole pairs per group: walk group by group with the scale in a register, the
        // row's scales converted to f32 a window at a time.
        let pairs_per_group = (g / (2 * QBLOCK)).max(1);
        let n_groups = pairs.div_ceil(pairs_per_group);
        let mut buf = [0f32; 64];
        let mut p = 0;
        for g0 in (0..n_groups).step_by(64) {
            let n = (n_groups - g0).min(64);
            scales_f32(st, scales, g0, &mut buf[..n]);
            if pairs_per_group == 1 {
                // 64-wide groups: one pair per group, two groups per iteration.
                let mut k = 0;
                while k + 2 <= n {
                    let p = g0 + k;
                    prefetch(pw.add(p * 32 + PREFETCH));
                    let a = i4_q8_pair(pw.add(p * 32), pq.add(p * 64), pc.add(p * 8), m0f, ones);
                    let b = i4_q8_pair(
                        pw.add(p * 32 + 32),
                        pq.add(p * 64 + 64),
                        pc.add(p * 8 + 8),
                        m0f,
                        ones,
                    );
                    let (sa, sb) = (_mm256_set1_ps(buf[k]), _mm256_set1_ps(buf[k + 1]));
                    acc0 =
                        _mm256_fmadd_ps(a, _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8)), sa), acc0);
                    acc1 = _mm256_fmadd_ps(
                        b,
                        _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8 + 8)), sb),
                        acc1,
                    );
                    k += 2;
                }
                if k < n {
                    let p = g0 + k;
                    let a = i4_q8_pair(pw.add(p * 32), pq.add(p * 64), pc.add(p * 8), m0f, ones);
                    let sa = _mm256_set1_ps(buf[k]);
                    acc0 =
                        _mm256_fmadd_ps(a, _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8)), sa), acc0);
                }
                continue;
            }
            for &sg in &buf[..n] {
                let sv = _mm256_set1_ps(sg);
                let end = (p + pairs_per_group).min(pairs);
                while p + 2 <= end {
                    prefetch(pw.add(p * 32 + PREFETCH));
                    let a = i4_q8_pair(pw.add(p * 32), pq.add(p * 64), pc.add(p * 8), m0f, ones);
                    let b = i4_q8_pair(
                        pw.add(p * 32 + 32),
                        pq.add(p * 64 + 64),
                        pc.add(p * 8 + 8),
                        m0f,
                        ones,
                    );
                    acc0 =
                        _mm256_fmadd_ps(a, _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8)), sv), acc0);
                    acc1 = _mm256_fmadd_ps(
                        b,
                        _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8 + 8)), sv),
                        acc1,
                    );
                    p += 2;
                }
                if p < end {
                    let a = i4_q8_pair(pw.add(p * 32), pq.add(p * 64), pc.add(p * 8), m0f, ones);
                    acc0 =
                        _mm256_fmadd_ps(a, _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8)), sv), acc0);
                    p += 1;
                }
            }
        }
    } else {
        // 32-wide groups: each block of a pair has its own scale.
        for p in 0..pairs {
            prefetch(pw.add(p * 32 + PREFETCH));
            let a = i4_q8_pair(pw.add(p * 32), pq.add(p * 64), pc.add(p * 8), m0f, ones);
            let (sa, sb) = (
                scale(st, scales, 2 * p * QBLOCK / g),
                scale(st, scales, (2 * p + 1) * QBLOCK / g),
            );
            let sv = _mm256_set_m128(_mm_set1_ps(sb), _mm_set1_ps(sa));
            acc0 = _mm256_fmadd_ps(a, _mm256_mul_ps(_mm256_loadu_ps(pd.add(p * 8)), sv), acc0);
        }
    }
    hsum(_mm256_add_ps(acc0, acc1)) + scalar::dot_q8_blocks(format, w, scales, q, cols, 2 * pairs)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i2_q8(
    w: &[u8],
    scales: &[u8],
    st: ScaleType,
    format: WeightFormat,
    act: &Act,
    q: &Q8Act,
) -> f32 {
    let cols = act.x.len();
    let g = format.group_len(cols).unwrap_or(cols);
    let full = cols / QBLOCK;
    let ones = _mm256_set1_epi16(1);
    let m03 = _mm256_set1_epi8(3);
    let shifts = _mm256_set_epi64x(6, 4, 2, 0);
    let (pw, pq) = (w.as_ptr(), q.q.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut corr = 0f32;
    for b in 0..full {
        let bytes = std::ptr::read_unaligned(pw.add(b * 8) as *const i64);
        if b % 8 == 0 {
            prefetch(pw.add(b * 8 + PREFETCH));
        }
        // 64-bit lane s holds the block's bytes shifted by 2s: elements 8s..8s+8 in order.
        let c = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(bytes), shifts), m03);
        let qv = _mm256_loadu_si256(pq.add(b * QBLOCK) as *const __m256i);
        let i = _mm256_madd_epi16(_mm256_maddubs_epi16(c, qv), ones);
        let f = q.d[b] * scale(st, scales, (b * QBLOCK / g).min(cols.div_ceil(g) - 1));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(f), acc);
        corr = (1.5 * q.qsum[b] as f32).mul_add(f, corr);
    }
    hsum(acc) - corr + scalar::dot_q8_blocks(format, w, scales, q, cols, full)
}
