//! Per-sequence KV caches. One [`KvCache`] holds every layer's keys and values for the
//! positions a sequence has seen so far; the forward pass appends to it.
//!
//! Keys and values of grouped-query attention are stored in f16 by default ([`KvDtype`]):
//! half the memory and half the bytes attention reads per decoded token, as llama.cpp's
//! default cache; it moves the fixtures' logits by at most 1.4e-3 (tolerance 2e-3). MLA's
//! latent cache (already 4–8× smaller than expanded keys and values) stays f32: in f16 it
//! moves two MLA fixtures' logits past the tolerance (2.2e-3 and 2.8e-3). `COLIBRI_KV=f32|f16` forces
//! one dtype for every layer. Values beyond f16's range are clamped to ±65504 rather than
//! stored as infinities. The attention kernels over stored rows ([`KvRow::dot`], [`KvRow::axpy_to`])
//! convert on the fly (F16C on x86-64) and are tested against a scalar reference.

use half::f16;

/// Element type of the stored keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    /// The dtype `COLIBRI_KV=f32|f16` forces on every layer of new caches (read once);
    /// `None`: each attention kind's default.
    pub fn from_env() -> Option<KvDtype> {
        static D: std::sync::OnceLock<Option<KvDtype>> = std::sync::OnceLock::new();
        *D.get_or_init(|| match std::env::var("COLIBRI_KV").as_deref() {
            Ok("f32") | Ok("F32") => Some(KvDtype::F32),
            Ok("f16") | Ok("F16") => Some(KvDtype::F16),
            _ => None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }

    fn code(self) -> u32 {
        match self {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
        }
    }

    fn from_code(c: u32) -> Option<KvDtype> {
        match c {
            0 => Some(KvDtype::F32),
            1 => Some(KvDtype::F16),
            _ => None,
        }
    }
}

/// Stored keys or values of one layer, `len × width`, row-major by position.
#[derive(Clone, Debug)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Default for KvBuf {
    fn default() -> Self {
        KvBuf::F32(Vec::new())
    }
}

/// f32 → f16 without infinities: a value past f16's range is stored as ±65504.
#[inline]
fn to_f16(x: f32) -> f16 {
    f16::from_f32(x.clamp(-65504.0, 65504.0))
}

impl KvBuf {
    pub fn new(dtype: KvDtype) -> KvBuf {
        match dtype {
            KvDtype::F32 => KvBuf::F32(Vec::new()),
            KvDtype::F16 => KvBuf::F16(Vec::new()),
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            KvBuf::F32(_) => KvDtype::F32,
            KvBuf::F16(_) => KvDtype::F16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }

    pub fn truncate(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.truncate(n),
            KvBuf::F16(v) => v.truncate(n),
        }
    }

    /// Appends f32 values, converted to the stored type.
    pub fn extend_from_f32(&mut self, x: &[f32]) {
        match self {
            KvBuf::F32(v) => v.extend_from_slice(x),
            KvBuf::F16(v) => v.extend(x.iter().map(|&a| to_f16(a))),
        }
    }

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
            KvRow::F16(v) => ops::dot_f16(q, v),
        }
    }

    /// `o += w · row`.
    #[inline]
    pub fn axpy_to(self, o: &mut [f32], w: f32) {
        match self {
            KvRow::F32(v) => crate::arch::blocks::axpy(o, w, v),
            KvRow::F16(v) => ops::axpy_f16(o, w, v),
        }
    }

    /// The row as f32 into `out` (same length).
    #[inline]
    pub fn to_f32(self, out: &mut [f32]) {
        match self {
            KvRow::F32(v) => out.copy_from_slice(v),
            KvRow::F16(v) => ops::f16_to_f32(v, out),
        }
    }
}

/// The f16 row kernels: AVX2+FMA+F16C where the kernels run at that level, scalar otherwise.
pub mod ops {
    use half::f16;

    use crate::kernels::avx2;

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
        k: &super::KvBuf,
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
            super::KvBuf::F16(kv) if avx2() => {
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
        v: &super::KvBuf,
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
            super::KvBuf::F16(kv) if avx2() => {
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
}

/// Keys and values of one attention layer, `len × width` each, row-major by position.
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    pub k: KvBuf,
    pub v: KvBuf,
    /// Floats per position in `k` (kv heads × key head dim).
    pub k_width: usize,
    /// Floats per position in `v` (kv heads × value head dim).
    pub v_width: usize,
    /// Per-position side data some attention kinds keep (the DSA indexer's keys, f32 always),
    /// `len × extra_width`; empty for plain attention.
    pub extra: Vec<f32>,
    pub extra_width: usize,
}

#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    /// Positions held (the next token's position).
    pub len: usize,
    /// Positions this cache may hold at most (the model's context).
    pub capacity: usize,
}

impl KvCache {
    /// A cache with f32 keys and values (see [`with_dtype`](Self::with_dtype)).
    pub fn new(widths: &[(usize, usize)], capacity: usize) -> KvCache {
        Self::with_dtype(widths, capacity, KvDtype::F32)
    }

    pub fn with_dtype(widths: &[(usize, usize)], capacity: usize, dtype: KvDtype) -> KvCache {
        KvCache {
            layers: widths
                .iter()
                .map(|&(k_width, v_width)| LayerKv {
                    k: KvBuf::new(dtype),
                    v: KvBuf::new(dtype),
                    k_width,
                    v_width,
                    extra: Vec::new(),
                    extra_width: 0,
                })
                .collect(),
            len: 0,
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every position from `len` on (used to rewind a rejected speculative draft or
    /// to reset a conversation).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for l in &mut self.layers {
            l.k.truncate(len * l.k_width);
            l.v.truncate(len * l.v_width);
            l.extra.truncate(len * l.extra_width);
        }
        self.len = len;
    }

    /// Bytes one more position adds.
    pub fn bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                l.k_width * l.k.dtype().size() + l.v_width * l.v.dtype().size() + l.extra_width * 4
            })
            .sum()
    }

    /// Bytes held by the cache's tensors.
    pub fn size_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.k.size_bytes() + l.v.size_bytes() + l.extra.len() * 4)
            .sum()
    }
}

/// Leading bytes of a serialized [`KvCache`].
const KV_MAGIC: &[u8; 8] = b"COLIKV\0\0";
/// Bumped whenever the byte layout below changes. Version 3 added the per-layer dtype (f16
/// caches); version 2 snapshots (f32, no dtype) are still read.
const KV_FORMAT_VERSION: u32 = 3;
const KV_OLDEST_READ: u32 = 2;

impl KvCache {
    /// Serializes the cache (see [`write_to`](Self::write_to) for the layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.serialized_len());
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Bytes [`to_bytes`](Self::to_bytes) produces.
    pub fn serialized_len(&self) -> usize {
        8 + 4 + 4 + 8 + 8 + self.layers.len() * 16 + self.len * self.bytes_per_position()
    }

    /// Writes the cache as: magic `COLIKV\0\0`, u32 format version, u32 layer count,
    /// u64 positions, u64 capacity, per layer (u32 k_width, u32 v_width, u32 extra_width,
    /// u32 dtype: 0 f32, 1 f16), then per layer its `len × k_width` keys and `len × v_width`
    /// values in that dtype and `len × extra_width` side floats (f32). All little-endian.
    /// Only the first `len` positions are written, so a cache always round-trips exactly.
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(KV_MAGIC)?;
        w.write_all(&KV_FORMAT_VERSION.to_le_bytes())?;
        w.write_all(&(self.layers.len() as u32).to_le_bytes())?;
        w.write_all(&(self.len as u64).to_le_bytes())?;
        w.write_all(&(self.capacity as u64).to_le_bytes())?;
        for l in &self.layers {
            w.write_all(&(l.k_width as u32).to_le_bytes())?;
            w.write_all(&(l.v_width as u32).to_le_bytes())?;
            w.write_all(&(l.extra_width as u32).to_le_bytes())?;
            // One dtype per layer: keys and values are always created alike.
            w.write_all(&l.k.dtype().code().to_le_bytes())?;
        }
        let mut buf = Vec::with_capacity(1 << 16);
        for l in &self.layers {
            for (part, n) in [(&l.k, self.len * l.k_width), (&l.v, self.len * l.v_width)] {
                match part {
                    KvBuf::F32(v) => write_f32s(w, &v[..n], &mut buf)?,
                    KvBuf::F16(v) => {
                        for chunk in v[..n].chunks(1 << 14) {
                            buf.clear();
                            for x in chunk {
                                buf.extend_from_slice(&x.to_le_bytes());
                            }
                            w.write_all(&buf)?;
                        }
                    }
                }
            }
            write_f32s(w, &l.extra[..self.len * l.extra_width], &mut buf)?;
        }
        Ok(())
    }

    /// Parses bytes written by [`write_to`](Self::write_to) (or by version 2, all f32).
    /// Every length is checked against the bytes actually present before anything is
    /// allocated, so a truncated or hostile input is an error, never a panic or an
    /// oversized allocation.
    pub fn from_bytes(bytes: &[u8]) -> crate::Result<KvCache> {
        let bad = |msg: String| crate::Error::CorruptFile {
            file: std::path::PathBuf::from("<KV cache snapshot>"),
            msg,
        };
        let mut r = ByteReader { bytes, pos: 0 };
        if r.take(8)
            .ok_or_else(|| bad("shorter than its header".into()))?
            != KV_MAGIC
        {
            return Err(bad("not a colibri KV cache (bad magic)".into()));
        }
        let version = r.u32().ok_or_else(|| bad("truncated header".into()))?;
        if !(KV_OLDEST_READ..=KV_FORMAT_VERSION).contains(&version) {
            return Err(bad(format!(
                "format version {version}, this build reads versions {KV_OLDEST_READ} to {KV_FORMAT_VERSION}"
            )));
        }
        let n_layers = r.u32().ok_or_else(|| bad("truncated header".into()))? as usize;
        let len = r.u64().ok_or_else(|| bad("truncated header".into()))?;
        let capacity = r.u64().ok_or_else(|| bad("truncated header".into()))?;
        if len > capacity {
            return Err(bad(format!(
                "{len} positions exceed the capacity of {capacity}"
            )));
        }
        let len = usize::try_from(len).map_err(|_| bad("length does not fit in memory".into()))?;
        let capacity =
            usize::try_from(capacity).map_err(|_| bad("capacity does not fit in memory".into()))?;
        let entry = if version >= 3 { 16 } else { 12 };
        if n_layers > (bytes.len() - r.pos) / entry {
            return Err(bad(format!(
                "{n_layers} layers do not fit in {} bytes",
                bytes.len()
            )));
        }
        let mut widths = Vec::with_capacity(n_layers);
        let mut expected: usize = 0;
        for _ in 0..n_layers {
            let k = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let v = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let x = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let dtype = if version >= 3 {
                let c = r.u32().ok_or_else(|| bad("truncated layer table".into()))?;
                KvDtype::from_code(c).ok_or_else(|| bad(format!("unknown KV dtype code {c}")))?
            } else {
                KvDtype::F32
            };
            expected = (k + v)
                .checked_mul(dtype.size())
                .and_then(|b| b.checked_add(x.checked_mul(4)?))
                .and_then(|b| b.checked_mul(len))
                .and_then(|b| b.checked_add(expected))
                .ok_or_else(|| bad("sizes overflow".into()))?;
            widths.push((k, v, x, dtype));
        }
        let rest = bytes.len() - r.pos;
        if rest != expected {
            return Err(bad(format!(
                "{rest} bytes of tensors, the header describes {expected}"
            )));
        }
        let mut layers = Vec::with_capacity(n_layers);
        for &(k_width, v_width, extra_width, dtype) in &widths {
            let k = r.buf(dtype, len * k_width);
            let v = r.buf(dtype, len * v_width);
            let extra = r.f32s(len * extra_width);
            layers.push(LayerKv {
                k,
                v,
                k_width,
                v_width,
                extra,
                extra_width,
            });
        }
        Ok(KvCache {
            layers,
            len,
            capacity,
        })
    }

    /// Whether `self` has the shape of `expected` (a fresh cache from the model that is to
    /// continue it): same layers, same widths, same capacity. The dtypes may differ: a
    /// cache continues in the dtype it was saved in (attention reads either).
    pub fn same_layout(&self, expected: &KvCache) -> bool {
        self.capacity == expected.capacity
            && self.layers.len() == expected.layers.len()
            && self.layers.iter().zip(&expected.layers).all(|(a, b)| {
                a.k_width == b.k_width && a.v_width == b.v_width && a.extra_width == b.extra_width
            })
    }
}

fn write_f32s(w: &mut impl std::io::Write, v: &[f32], buf: &mut Vec<u8>) -> std::io::Result<()> {
    for chunk in v.chunks(1 << 14) {
        buf.clear();
        for x in chunk {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        w.write_all(buf)?;
    }
    Ok(())
}

struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl ByteReader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// `n` floats; the caller has checked that they are present.
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        let raw = self.take(n * 4).unwrap_or_default();
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
    /// `n` elements of `dtype`; the caller has checked that they are present.
    fn buf(&mut self, dtype: KvDtype, n: usize) -> KvBuf {
        match dtype {
            KvDtype::F32 => KvBuf::F32(self.f32s(n)),
            KvDtype::F16 => {
                let raw = self.take(n * 2).unwrap_or_default();
                KvBuf::F16(
                    raw.chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dtype: KvDtype) -> KvCache {
        let mut c = KvCache::with_dtype(&[(4, 2), (3, 3)], 16, dtype);
        c.len = 5;
        for (i, l) in c.layers.iter_mut().enumerate() {
            let k: Vec<f32> = (0..5 * l.k_width)
                .map(|x| x as f32 * 0.5 + i as f32)
                .collect();
            let v: Vec<f32> = (0..5 * l.v_width).map(|x| -(x as f32) - 0.25).collect();
            l.k.extend_from_f32(&k);
            l.v.extend_from_f32(&v);
        }
        c.layers[1].extra_width = 2;
        c.layers[1].extra = (0..10).map(|x| x as f32 / 3.0).collect();
        c
    }

    #[test]
    fn kv_bytes_round_trip_exactly() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let c = sample(dtype);
            let b = c.to_bytes();
            assert_eq!(b.len(), c.serialized_len());
            let d = KvCache::from_bytes(&b).unwrap();
            assert_eq!(d.len, 5);
            assert_eq!(d.capacity, 16);
            assert!(d.same_layout(&c));
            for (a, b) in c.layers.iter().zip(&d.layers) {
                assert_eq!(b.k.dtype(), dtype);
                assert_eq!(a.k.to_f32_vec(), b.k.to_f32_vec());
                assert_eq!(a.v.to_f32_vec(), b.v.to_f32_vec());
                assert_eq!(a.extra, b.extra);
            }
        }
        // f16 halves the key and value bytes.
        assert_eq!(
            sample(KvDtype::F16).size_bytes() - 40,
            (sample(KvDtype::F32).size_bytes() - 40) / 2
        );
    }

    /// A version-2 snapshot (f32, no dtype in the layer table) still reads, as f32.
    #[test]
    fn kv_version_2_snapshots_still_read() {
        let c = sample(KvDtype::F32);
        let mut v2 = Vec::new();
        v2.extend_from_slice(KV_MAGIC);
        v2.extend_from_slice(&2u32.to_le_bytes());
        v2.extend_from_slice(&2u32.to_le_bytes());
        v2.extend_from_slice(&5u64.to_le_bytes());
        v2.extend_from_slice(&16u64.to_le_bytes());
        for l in &c.layers {
            for w in [l.k_width, l.v_width, l.extra_width] {
                v2.extend_from_slice(&(w as u32).to_le_bytes());
            }
        }
        for l in &c.layers {
            for x in
                l.k.to_f32_vec()
                    .iter()
                    .chain(&l.v.to_f32_vec())
                    .chain(&l.extra)
            {
                v2.extend_from_slice(&x.to_le_bytes());
            }
        }
        let d = KvCache::from_bytes(&v2).unwrap();
        assert!(d.same_layout(&c));
        assert_eq!(d.layers[1].k.dtype(), KvDtype::F32);
        assert_eq!(d.layers[1].v.to_f32_vec(), c.layers[1].v.to_f32_vec());
        assert_eq!(d.layers[1].extra, c.layers[1].extra);
    }

    #[test]
    fn kv_bytes_damage_is_an_error() {
        let b = sample(KvDtype::F16).to_bytes();
        // Every truncation is refused.
        for n in [0, 7, 8, 20, 40, b.len() - 1] {
            assert!(KvCache::from_bytes(&b[..n]).is_err(), "truncated to {n}");
        }
        // A trailing byte, a bad magic, a future version, a huge length, a bad dtype.
        let mut longer = b.clone();
        longer.push(0);
        assert!(KvCache::from_bytes(&longer).is_err());
        let mut m = b.clone();
        m[0] ^= 1;
        assert!(KvCache::from_bytes(&m).is_err());
        let mut v = b.clone();
        v[8] = 9;
        assert!(KvCache::from_bytes(&v).is_err());
        let mut huge = b.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(KvCache::from_bytes(&huge).is_err());
        let mut dt = b.clone();
        dt[44..48].copy_from_slice(&7u32.to_le_bytes());
        assert!(KvCache::from_bytes(&dt).is_err());
        let mut layers = b;
        layers[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(KvCache::from_bytes(&layers).is_err());
    }

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
            let want = ops::dot_f16_scalar(&q, &k);
            assert!(
                (got - want).abs() <= 1e-5 * n as f32,
                "dot {n}: {got} vs {want}"
            );
            let mut o1: Vec<f32> = (0..n).map(|_| rnd()).collect();
            let mut o2 = o1.clone();
            KvRow::F16(&k).axpy_to(&mut o1, 0.37);
            ops::axpy_f16_scalar(&mut o2, 0.37, &k);
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
        ops::group_scores(&kb, width, hd, hd, 2, &qs, &ends, 0.5, &mut sc);
        let mut o = vec![0f32; g * hd];
        ops::group_values(&kb, width, hd, hd, 2, &sc, &ends, &mut o);
        let KvBuf::F16(kh) = &kb else { unreachable!() };
        for h in 0..g {
            let mut want_o = vec![0f32; hd];
            for j in 0..len - 2 {
                let row = &kh[(2 + j) * width + hd..(2 + j) * width + 2 * hd];
                let want = ops::dot_f16_scalar(&qs[h * hd..(h + 1) * hd], row) * 0.5;
                let got = sc[h * (len - 2) + j];
                assert!(
                    (got - want).abs() <= 1e-5,
                    "scores {h} {j}: {got} vs {want}"
                );
                ops::axpy_f16_scalar(&mut want_o, got, row);
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
            ops::group_scores(&kb, width, hd, hd, 0, &qs, ends, 0.5, &mut sc);
            let mut o = vec![0f32; g * hd];
            ops::group_values(&kb, width, hd, hd, 0, &sc, ends, &mut o);
            for (h, &e) in ends.iter().enumerate() {
                let mut one = vec![0f32; e];
                let q1 = &qs[h * hd..(h + 1) * hd];
                ops::group_scores(&kb, width, hd, hd, 0, q1, &[e], 0.5, &mut one);
                assert_eq!(&sc[h * len..h * len + e], &one[..], "scores of head {h}");
                let mut o1 = vec![0f32; hd];
                ops::group_values(&kb, width, hd, hd, 0, &one, &[e], &mut o1);
                assert_eq!(&o[h * hd..(h + 1) * hd], &o1[..], "values of head {h}");
                let KvBuf::F16(kh) = &kb else { unreachable!() };
                let want = ops::dot_f16_scalar(q1, &kh[(e - 1) * width + hd..e * width]) * 0.5;
                assert!((one[e - 1] - want).abs() <= 1e-5, "head {h} vs scalar");
            }
        }
        // Out of range values are clamped, never infinite.
        let mut b = KvBuf::new(KvDtype::F16);
        b.extend_from_f32(&[1e6, -1e6, 1.5]);
        assert_eq!(b.to_f32_vec(), vec![65504.0, -65504.0, 1.5]);
    }
}
