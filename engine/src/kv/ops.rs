//! The attention kernels over stored rows: [`KvRow`], a stretch of stored keys or values as
//! attention reads it, and the f16 row kernels: AVX2+FMA+F16C where the kernels run at that
//! level, scalar otherwise (one row at a time, or a head group's scores and weighted values in
//! register tiles).

use super::KvBuf;
use crate::kernels::avx2;
use half::f16;

impl KvBuf {
    /// Elements `start..start + len`.
    #[inline]
    pub fn row(&self, start: usize, len: usize) -> KvRow<'_> {
        match self {
            KvBuf::F32(v) => KvRow::F32(&v[start..start + len]),
            KvBuf::F16(v) => KvRow::F16(&v[start..start + len]),
        }
    }

    /// Every element as f32 (tests, comparisons).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.row(0, self.len()).to_f32(&mut out);
        out
    }
}

/// A stretch of stored keys or values, read by attention.
#[derive(Clone, Copy, Debug)]
pub enum KvRow<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KvRow<'_> {
    pub fn len(&self) -> usize {
        match self {
            KvRow::F32(v) => v.len(),
            KvRow::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `dot(q, row)`.
    #[inline]
    pub fn dot(self, q: &[f32]) -> f32 {
        match self {
            KvRow::F32(v) => crate::kernels::dot_f32(q, v),
            KvRow::F16(v) => dot_f16(q, v),
        }
    }

    /// `o += w · row`.
    #[inline]
    pub fn axpy_to(self, o: &mut [f32], w: f32) {
        match self {
            KvRow::F32(v) => crate::arch::simd::axpy(o, w, v),
            KvRow::F16(v) => axpy_f16(o, w, v),
        }
    }

    /// The row as f32 into `out` (same length).
    #[inline]
    pub fn to_f32(self, out: &mut [f32]) {
        match self {
            KvRow::F32(v) => out.copy_from_slice(v),
            KvRow::F16(v) => f16_to_f32(v, out),
        }
    }
}

/// `dot(q, k)` with `k` in f16.
#[inline]
pub fn dot_f16(q: &[f32], k: &[f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: level Avx2 is chosen only when avx2, fma and f16c are detected.
        return unsafe { x86::dot_f16(q, k) };
    }
    dot_f16_scalar(q, k)
}

/// `o += w · v` with `v` in f16.
#[inline]
pub fn axpy_f16(o: &mut [f32], w: f32, v: &[f16]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: as in `dot_f16`.
        return unsafe { x86::axpy_f16(o, w, v) };
    }
    axpy_f16_scalar(o, w, v)
}

pub fn f16_to_f32(v: &[f16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: as in `dot_f16`.
        return unsafe { x86::f16_to_f32(v, out) };
    }
    for (o, x) in out.iter_mut().zip(v) {
        *o = x.to_f32();
    }
}

/// `scores[h * len + j] = dot(qs[h], k at position first + j) · scale` for the `g` query
/// heads `qs` (`g × hd`) over `len` positions of one kv head (`hd` elements at `off` of
/// every `width`-element position): one call per head group instead of one per position.
/// Head `h` sees only positions `j < ends[h]` (the others are left as they are): several
/// rows of one sequence share a call, each up to its own causal end, and each head's
/// sums are the same operations whatever shares the call.
#[allow(clippy::too_many_arguments)]
pub fn group_scores(
    k: &KvBuf,
    width: usize,
    off: usize,
    hd: usize,
    first: usize,
    qs: &[f32],
    ends: &[usize],
    scale: f32,
    scores: &mut [f32],
) {
    let g = qs.len() / hd;
    let len = scores.len() / g.max(1);
    assert!(
        ends.len() == g && ends.iter().all(|&e| e <= len),
        "group_scores: ends"
    );
    match k {
        #[cfg(target_arch = "x86_64")]
        KvBuf::F16(kv) if avx2() => {
            // SAFETY: as in `dot_f16`; every row read is inside `kv` (checked below).
            assert!(len == 0 || (first + len - 1) * width + off + hd <= kv.len());
            unsafe { x86::group_scores(kv, width, off, hd, first, qs, ends, scale, scores) }
        }
        _ => {
            for j in 0..len {
                let row = k.row((first + j) * width + off, hd);
                for (h, q) in qs.chunks_exact(hd).enumerate() {
                    if j < ends[h] {
                        scores[h * len + j] = row.dot(q) * scale;
                    }
                }
            }
        }
    }
}

/// `o[h] += Σ_{j < ends[h]} w[h * len + j] · v at position first + j`, the value side of
/// [`group_scores`].
#[allow(clippy::too_many_arguments)]
pub fn group_values(
    v: &KvBuf,
    width: usize,
    off: usize,
    hd: usize,
    first: usize,
    w: &[f32],
    ends: &[usize],
    o: &mut [f32],
) {
    let g = o.len() / hd;
    let len = w.len() / g.max(1);
    assert!(
        ends.len() == g && ends.iter().all(|&e| e <= len),
        "group_values: ends"
    );
    match v {
        #[cfg(target_arch = "x86_64")]
        KvBuf::F16(kv) if avx2() => {
            assert!(len == 0 || (first + len - 1) * width + off + hd <= kv.len());
            // SAFETY: as in `group_scores`.
            unsafe { x86::group_values(kv, width, off, hd, first, w, ends, o) }
        }
        _ => {
            for j in 0..len {
                let row = v.row((first + j) * width + off, hd);
                for (h, oh) in o.chunks_exact_mut(hd).enumerate() {
                    if j < ends[h] {
                        row.axpy_to(oh, w[h * len + j]);
                    }
                }
            }
        }
    }
}

/// The reference the SIMD paths are tested against.
pub fn dot_f16_scalar(q: &[f32], k: &[f16]) -> f32 {
    q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum()
}

pub fn axpy_f16_scalar(o: &mut [f32], w: f32, v: &[f16]) {
    for (a, b) in o.iter_mut().zip(v) {
        *a += w * b.to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
// Register tiles index their accumulators by (head, chunk): the index is the point.
#[allow(clippy::needless_range_loop)]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(q: &[f32], k: &[f16]) -> f32 {
        dot(q.as_ptr(), k.as_ptr(), q.len().min(k.len()))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_f16(o: &mut [f32], w: f32, v: &[f16]) {
        axpy(o.as_mut_ptr(), w, v.as_ptr(), o.len().min(v.len()))
    }

    #[inline(always)]
    unsafe fn dot(pq: *const f32, pk: *const f16, n: usize) -> f32 {
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pq.add(i)), load8(pk.add(i)), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(pq.add(i + 8)), load8(pk.add(i + 8)), a1);
            i += 16;
        }
        if i + 8 <= n {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(pq.add(i)), load8(pk.add(i)), a0);
            i += 8;
        }
        let v = _mm256_add_ps(a0, a1);
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        let mut s = _mm_cvtss_f32(s);
        while i < n {
            s += *pq.add(i) * (*pk.add(i)).to_f32();
            i += 1;
        }
        s
    }

    #[inline(always)]
    unsafe fn axpy(po: *mut f32, w: f32, pv: *const f16, n: usize) {
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i + 8 <= n {
            let x = _mm256_fmadd_ps(wv, load8(pv.add(i)), _mm256_loadu_ps(po.add(i)));
            _mm256_storeu_ps(po.add(i), x);
            i += 8;
        }
        while i < n {
            *po.add(i) += w * (*pv.add(i)).to_f32();
            i += 1;
        }
    }

    /// Positions ahead to prefetch: the cache of one head is strided by `width` (4 KiB
    /// and more on real models: a new page per position), which the hardware
    /// prefetchers do not follow.
    const AHEAD: usize = 4;

    /// Prefetches every cache line of one head's `hd` values at `p`.
    #[inline(always)]
    unsafe fn prefetch_row(p: *const f16, hd: usize) {
        let (p, bytes) = (p as *const i8, hd * std::mem::size_of::<f16>());
        let mut off = 0;
        while off < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.add(off));
            off += 64;
        }
    }

    /// One kv head's stored rows: position `j` (from the span's first) at `base + j·width`.
    #[derive(Clone, Copy)]
    struct Rows {
        base: *const f16,
        width: usize,
    }

    impl Rows {
        /// The `hd` elements at `off` of every `width`-element position of `buf`, from
        /// position `first`.
        unsafe fn new(buf: &[f16], off: usize, first: usize, width: usize) -> Rows {
            Rows {
                base: buf.as_ptr().add(off + first * width),
                width,
            }
        }

        #[inline(always)]
        unsafe fn at(self, j: usize) -> *const f16 {
            self.base.add(j * self.width)
        }
    }

    /// The lane sums of eight accumulators, lane `i` of the result from `a[i]`, each by
    /// the tree `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))` whatever the other seven hold:
    /// a score's bits do not depend on which scores share its tile.
    #[inline(always)]
    unsafe fn lane_sums(a: &[__m256; 8]) -> __m256 {
        let q0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        let q1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        // q0 = [a0..a3 over lanes 0-3, a0..a3 over lanes 4-7], q1 the same for a4..a7.
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(q0, q1),
            _mm256_permute2f128_ps::<0x31>(q0, q1),
        )
    }

    /// `out[qi · P + p]` = dot of query head `qi` (of `Q`, `hd` apart from `q`) with the
    /// key at `k[p]`: one FMA chain per (head, position) over the 8-element chunks, the
    /// chains summed by [`lane_sums`], the elements past the last whole chunk added one by
    /// one. Every (head, position) pair gets the same operations in every tile shape, so
    /// a decode step (one query, 8 positions a tile) and a prefill block (8 queries, one
    /// position a tile) give a score the same bits. A tile loads each key chunk once for
    /// all `Q` heads and each query chunk once for all `P` positions (the one-dot loop
    /// converted a key once per query head).
    #[inline(always)]
    unsafe fn dot_tile<const Q: usize, const P: usize>(
        q: *const f32,
        hd: usize,
        k: &[*const f16; P],
        out: &mut [f32; 8],
    ) {
        let mut acc = [_mm256_setzero_ps(); 8];
        let full = hd / 8 * 8;
        let mut i = 0;
        while i < full {
            let mut kv = [_mm256_setzero_ps(); P];
            for p in 0..P {
                kv[p] = load8(k[p].add(i));
            }
            for qi in 0..Q {
                let qv = _mm256_loadu_ps(q.add(qi * hd + i));
                for p in 0..P {
                    acc[qi * P + p] = _mm256_fmadd_ps(qv, kv[p], acc[qi * P + p]);
                }
            }
            i += 8;
        }
        _mm256_storeu_ps(out.as_mut_ptr(), lane_sums(&acc));
        for qi in 0..Q {
            for p in 0..P {
                let s = &mut out[qi * P + p];
                for i in full..hd {
                    *s += *q.add(qi * hd + i) * (*k[p].add(i)).to_f32();
                }
            }
        }
    }

    /// Scores of `Q` query heads (`ends` theirs, `scores` their first row) over the
    /// positions they see, `P` positions a tile.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn score_sweep<const Q: usize, const P: usize>(
        row: Rows,
        hd: usize,
        q: *const f32,
        ends: &[usize],
        len: usize,
        scale: f32,
        scores: *mut f32,
    ) {
        let last = ends.iter().copied().max().unwrap_or(0);
        let mut t = [0f32; 8];
        let mut j = 0;
        while j < last {
            for p in 0..P {
                if j + AHEAD * P + p < last {
                    prefetch_row(row.at(j + AHEAD * P + p), hd);
                }
            }
            if j + P <= last {
                let mut k = [std::ptr::null(); P];
                for (p, kp) in k.iter_mut().enumerate() {
                    *kp = row.at(j + p);
                }
                dot_tile::<Q, P>(q, hd, &k, &mut t);
                for (qi, &e) in ends.iter().enumerate() {
                    for p in 0..P.min(e.saturating_sub(j)) {
                        *scores.add(qi * len + j + p) = t[qi * P + p] * scale;
                    }
                }
                j += P;
            } else {
                dot_tile::<Q, 1>(q, hd, &[row.at(j)], &mut t);
                for (qi, &e) in ends.iter().enumerate() {
                    if j < e {
                        *scores.add(qi * len + j) = t[qi] * scale;
                    }
                }
                j += 1;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn group_scores(
        k: &[f16],
        width: usize,
        off: usize,
        hd: usize,
        first: usize,
        qs: &[f32],
        ends: &[usize],
        scale: f32,
        scores: &mut [f32],
    ) {
        let g = qs.len() / hd;
        let len = scores.len() / g;
        let row = Rows::new(k, off, first, width);
        // Query heads 8, 4, 2 or 1 at a time, with 8 (head, position) chains a tile.
        let mut h0 = 0;
        while h0 < g {
            let (q, e, s) = (
                qs.as_ptr().add(h0 * hd),
                &ends[h0..],
                scores.as_mut_ptr().add(h0 * len),
            );
            h0 += match g - h0 {
                8.. => {
                    score_sweep::<8, 1>(row, hd, q, &e[..8], len, scale, s);
                    8
                }
                4.. => {
                    score_sweep::<4, 2>(row, hd, q, &e[..4], len, scale, s);
                    4
                }
                2.. => {
                    score_sweep::<2, 4>(row, hd, q, &e[..2], len, scale, s);
                    2
                }
                _ => {
                    score_sweep::<1, 8>(row, hd, q, &e[..1], len, scale, s);
                    1
                }
            };
        }
    }

    /// Positions a value sweep keeps in L1 (64 × 256 bytes for a 128-wide f16 head)
    /// while its tiles go through the head's chunks.
    const VALUE_BLOCK: usize = 64;

    /// `o[h][c0 .. c0 + 8C] += Σ w[h][j] · v_j` for `H` heads over positions `j0..j1`,
    /// the `H × C` sums in registers. Each element is the same FMA chain, position by
    /// position, as one head alone with [`axpy`] gives.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn value_tile<const H: usize, const C: usize>(
        row: Rows,
        hd: usize,
        c0: usize,
        (j0, j1): (usize, usize),
        w: *const f32,
        len: usize,
        ends: &[usize],
        o: *mut f32,
    ) {
        let mut acc = [[_mm256_setzero_ps(); C]; H];
        for h in 0..H {
            for c in 0..C {
                acc[h][c] = _mm256_loadu_ps(o.add(h * hd + c0 + 8 * c));
            }
        }
        for j in j0..j1 {
            let r = row.at(j).add(c0);
            if c0 == 0 && j + 2 * AHEAD < j1 {
                prefetch_row(row.at(j + 2 * AHEAD), hd);
            }
            let mut vv = [_mm256_setzero_ps(); C];
            for c in 0..C {
                vv[c] = load8(r.add(8 * c));
            }
            for h in 0..H {
                // Each head sees the positions before its own causal end.
                if j >= ends[h] {
                    continue;
                }
                let wb = _mm256_set1_ps(*w.add(h * len + j));
                for c in 0..C {
                    acc[h][c] = _mm256_fmadd_ps(wb, vv[c], acc[h][c]);
                }
            }
        }
        for h in 0..H {
            for c in 0..C {
                _mm256_storeu_ps(o.add(h * hd + c0 + 8 * c), acc[h][c]);
            }
        }
    }

    /// [`value_tile`]s for `H` heads over every position they see, `VALUE_BLOCK`
    /// positions at a time, then the elements past the last whole chunk one by one.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn value_sweep<const H: usize, const C: usize>(
        row: Rows,
        hd: usize,
        w: *const f32,
        len: usize,
        ends: &[usize],
        o: *mut f32,
    ) {
        let last = ends.iter().copied().max().unwrap_or(0);
        let chunks = hd / 8;
        let mut j0 = 0;
        while j0 < last {
            let span = (j0, (j0 + VALUE_BLOCK).min(last));
            let mut c = 0;
            while c + C <= chunks {
                value_tile::<H, C>(row, hd, 8 * c, span, w, len, ends, o);
                c += C;
            }
            while c < chunks {
                value_tile::<H, 1>(row, hd, 8 * c, span, w, len, ends, o);
                c += 1;
            }
            j0 = span.1;
        }
        for (h, &e) in ends.iter().enumerate() {
            for j in 0..e {
                let (r, wj) = (row.at(j), *w.add(h * len + j));
                for i in chunks * 8..hd {
                    *o.add(h * hd + i) += wj * (*r.add(i)).to_f32();
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn group_values(
        v: &[f16],
        width: usize,
        off: usize,
        hd: usize,
        first: usize,
        w: &[f32],
        ends: &[usize],
        o: &mut [f32],
    ) {
        let g = o.len() / hd;
        let len = w.len() / g;
        let row = Rows::new(v, off, first, width);
        // Heads 4, 2 or 1 at a time with 8 sums a tile in registers.
        let mut h0 = 0;
        while h0 < g {
            let (wp, e, op) = (
                w.as_ptr().add(h0 * len),
                &ends[h0..],
                o.as_mut_ptr().add(h0 * hd),
            );
            h0 += match g - h0 {
                4.. => {
                    value_sweep::<4, 2>(row, hd, wp, len, &e[..4], op);
                    4
                }
                2.. => {
                    value_sweep::<2, 4>(row, hd, wp, len, &e[..2], op);
                    2
                }
                _ => {
                    value_sweep::<1, 8>(row, hd, wp, len, &e[..1], op);
                    1
                }
            };
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_to_f32(v: &[f16], out: &mut [f32]) {
        let n = out.len().min(v.len());
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(out.as_mut_ptr().add(i), load8(v.as_ptr().add(i)));
            i += 8;
        }
        while i < n {
            out[i] = v[i].to_f32();
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvDtype;

    #[test]
    fn f16_rows_match_the_scalar_reference() {
        let mut s = 0x1234_5678_9abc_def1u64;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        for n in [1, 7, 8, 15, 16, 17, 64, 100, 128, 576] {
            let q: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let k: Vec<f16> = (0..n).map(|_| f16::from_f32(rnd() * 3.0)).collect();
            let got = KvRow::F16(&k).dot(&q);
            let want = dot_f16_scalar(&q, &k);
            assert!(
                (got - want).abs() <= 1e-5 * n as f32,
                "dot {n}: {got} vs {want}"
            );
            let mut o1: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let mut o2 = o1.clone();
            KvRow::F16(&k).axpy_to(&mut o1, 0.37);
            axpy_f16_scalar(&mut o2, 0.37, &k);
            for (a, b) in o1.iter().zip(&o2) {
                assert!((a - b).abs() <= 1e-6, "axpy {n}");
            }
            let mut f = vec![0f32; n];
            KvRow::F16(&k).to_f32(&mut f);
            assert!(f.iter().zip(&k).all(|(a, b)| *a == b.to_f32()));
        }
        // Whole head groups: 3 query heads over 37 positions of a 2-head cache (head 1).
        let (hd, width, len, g) = (40, 80, 37, 3);
        let kf: Vec<f32> = (0..len * width).map(|_| rnd()).collect();
        let mut kb = KvBuf::new(KvDtype::F16);
        kb.extend_from_f32(&kf);
        let qs: Vec<f32> = (0..g * hd).map(|_| rnd()).collect();
        let mut sc = vec![0f32; g * (len - 2)];
        let ends = [len - 2; 3];
        group_scores(&kb, width, hd, hd, 2, &qs, &ends, 0.5, &mut sc);
        let mut o = vec![0f32; g * hd];
        group_values(&kb, width, hd, hd, 2, &sc, &ends, &mut o);
        let KvBuf::F16(kh) = &kb else { unreachable!() };
        for h in 0..g {
            let mut want_o = vec![0f32; hd];
            for j in 0..len - 2 {
                let row = &kh[(2 + j) * width + hd..(2 + j) * width + 2 * hd];
                let want = dot_f16_scalar(&qs[h * hd..(h + 1) * hd], row) * 0.5;
                let got = sc[h * (len - 2) + j];
                assert!(
                    (got - want).abs() <= 1e-5,
                    "scores {h} {j}: {got} vs {want}"
                );
                axpy_f16_scalar(&mut want_o, got, row);
            }
            for (a, b) in o[h * hd..(h + 1) * hd].iter().zip(&want_o) {
                assert!((a - b).abs() <= 1e-4, "values {h}");
            }
        }
        // Rows of a block (a prefill's attention task): query heads with their own causal
        // ends give, head by head, the bits of a call for that head alone, whatever tile
        // shapes the two calls take (9 heads: 8 + 1; 5: 4 + 1; alone: 1 × 8 positions), also
        // with a head width that leaves elements past the last whole chunk (36).
        for (hd, g) in [(32, 9), (36, 9), (36, 5), (64, 3)] {
            let (width, len) = (2 * hd, 23);
            let kf: Vec<f32> = (0..len * width).map(|_| rnd()).collect();
            let mut kb = KvBuf::new(KvDtype::F16);
            kb.extend_from_f32(&kf);
            let qs: Vec<f32> = (0..g * hd).map(|_| rnd()).collect();
            let ends = &[23, 23, 20, 23, 23, 9, 23, 1, 23][..g];
            let mut sc = vec![0f32; g * len];
            group_scores(&kb, width, hd, hd, 0, &qs, ends, 0.5, &mut sc);
            let mut o = vec![0f32; g * hd];
            group_values(&kb, width, hd, hd, 0, &sc, ends, &mut o);
            for (h, &e) in ends.iter().enumerate() {
                let mut one = vec![0f32; e];
                let q1 = &qs[h * hd..(h + 1) * hd];
                group_scores(&kb, width, hd, hd, 0, q1, &[e], 0.5, &mut one);
                assert_eq!(&sc[h * len..h * len + e], &one[..], "scores of head {h}");
                let mut o1 = vec![0f32; hd];
                group_values(&kb, width, hd, hd, 0, &one, &[e], &mut o1);
                assert_eq!(&o[h * hd..(h + 1) * hd], &o1[..], "values of head {h}");
                let KvBuf::F16(kh) = &kb else { unreachable!() };
                let want = dot_f16_scalar(q1, &kh[(e - 1) * width + hd..e * width]) * 0.5;
                assert!((one[e - 1] - want).abs() <= 1e-5, "head {h} vs scalar");
            }
        }
        // Out of range values are clamped, never infinite.
        let mut b = KvBuf::new(KvDtype::F16);
        b.extend_from_f32(&[1e6, -1e6, 1.5]);
        assert_eq!(b.to_f32_vec(), vec![65504.0, -65504.0, 1.5]);
    }
}
