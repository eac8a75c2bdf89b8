//! AVX2 + FMA + F16C kernels. Each computes what its counterpart in `scalar` defines, in a
//! different summation order; the tests in `tests.rs` hold them to it.
//!
//! Products run as register tiles: `R` weight rows × `T` activation rows, one accumulator
//! per (row, token) pair. A tile loads and unpacks each piece of its weight rows once and
//! applies it to all `T` tokens; every pair sees the same operations in the same order
//! whatever `R` and `T` are, so results do not depend on the batch (decode is `T = 1`).
//! With several tokens (prefill) the activations come packed by tiles of 8 tokens
//! ([`Packing`]), rows are taken in chunks that stay in L2, and each row is cut into
//! column chunks whose activations stay in L1, the tile's accumulators saved and reloaded
//! between chunks (which changes no bit of any sum).
//!
//! Callers guarantee the CPU features (see `super::level`) and sizes (`Matrix` validated
//! them; `matmul` checks the rest).

// Register tiles are indexed by row and token on purpose (the compiler keeps them in
// registers when the loops over the const sizes unroll).
#![allow(clippy::needless_range_loop)]

use super::{scalar, Input, Packing, Q8Row, Weights, QBLOCK, TILE};
use crate::format::{ScaleType, WeightFormat};
use std::arch::x86_64::*;

/// Bytes ahead of the current weight position to prefetch. The hot loops carry enough
/// arithmetic per byte that the out-of-order window alone keeps too few cache-line misses in
/// flight to saturate memory; explicit prefetches fix that. 6 KiB measured 5–8% faster
/// decode than 2 KiB on the OLMoE-1B-7B synth (2 threads, AVX2): a decode task streams a
/// few short rows (1–4 KiB) back to back, and 2 KiB ahead was not enough in flight.
pub(super) const PREFETCH: usize = 6144;

#[inline(always)]
pub(super) unsafe fn prefetch(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
}

/// Bytes ahead for [`prefetch_l2`].
pub(super) const PREFETCH_L2: usize = 12288;

/// A prefetch into L2 only (hint T1), for the decode loops of `avx2_rows8.rs`. On Zen 4 a T0
/// prefetch holds one of the core's few L1 miss buffers until its line arrives, which caps
/// the lines in flight; hinted to L2 the same stream decoded int4-g64 at 23–28 GB/s against
/// 17–21 with T0 6 KiB ahead (2 threads, read bandwidth 29–32 GB/s; one thread 15–17 against
/// 12–13: `kernel_bench 256 2 1`, alternated). 12 KiB ahead keeps about as many lines in
/// flight as 6 KiB did before. The other loops keep T0: on the Zen 3 machine they were
/// tuned on, L2 hints measured no better (nor worse), and the int8 rows of lm_head already
/// stream at the read bandwidth with T0 (3.3–3.6 against 3.5–3.8 ms a token with T1).
#[inline(always)]
pub(super) unsafe fn prefetch_l2(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
}

/// The integer step of the int8-activation kernels, per level: how unsigned bytes times
/// signed bytes are summed. [`Madd`] (AVX2) goes through `maddubs` and `madd`; [`Vnni`]
/// (AVX-512 VNNI) adds 4 products straight into an int32 lane with `vpdpbusd`. Both sums are
/// exact, so a kernel written once over this trait gives the same bits on either level. The
/// methods are `inline(always)` without target features of their own: they compile inside
/// each level's `#[target_feature]` wrapper.
pub(super) trait IntSums {
    /// A 32-element block's running sums for one token.
    type Block: Copy;
    /// A block's starting sums for a token whose offset correction (`8·Σq` of the block) is
    /// `corr`: [`Vnni`] starts its int32 chain at `−corr`, which saves a subtraction a block
    /// and token; [`Madd`]'s int16 lanes could not hold it and start at zero.
    unsafe fn block(corr: i32) -> Self::Block;
    /// Adds one word of int4 codes (`lo` the even, `hi` the odd elements) times their
    /// activations to a block; `T` is the tile's token count.
    unsafe fn add_word<const T: usize>(
        b: Self::Block,
        lo: __m256i,
        hi: __m256i,
        qe: __m256i,
        qo: __m256i,
    ) -> Self::Block;
    /// A block's exact `Σ (code − 8)·q` as int32 lanes (lane `i`: the products of bytes
    /// `4i..4i + 4`), `corr` the value [`Self::block`] was given.
    unsafe fn block_sum(b: Self::Block, corr: i32) -> __m256i;
    /// One pair's products (`lo·qe + hi·qo`), the lanes [`Self::reduce4`] takes.
    unsafe fn pair(lo: __m256i, hi: __m256i, qe: __m256i, qo: __m256i) -> __m256i;
    /// Four pairs' products as one vector of int32 block sums: lanes 0–3 the pairs' first
    /// blocks, lanes 4–7 their second blocks.
    unsafe fn reduce4(m: [__m256i; 4]) -> __m256i;
    /// `u · s` summed per 4 bytes into int32 lanes.
    unsafe fn dot4(u: __m256i, s: __m256i) -> __m256i;
}

/// [`IntSums`] on AVX2.
pub(super) struct Madd;

impl IntSums for Madd {
    /// int16 lanes: 8 words of 2 · 2 · 15 · 127 stay under 2¹⁵ (at most 30 480).
    type Block = __m256i;
    #[inline(always)]
    unsafe fn block(_corr: i32) -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn add_word<const T: usize>(
        b: __m256i,
        lo: __m256i,
        hi: __m256i,
        qe: __m256i,
        qo: __m256i,
    ) -> __m256i {
        _mm256_add_epi16(b, Self::pair(lo, hi, qe, qo))
    }
    #[inline(always)]
    unsafe fn block_sum(b: __m256i, corr: i32) -> __m256i {
        _mm256_sub_epi32(
            _mm256_madd_epi16(b, _mm256_set1_epi16(1)),
            _mm256_set1_epi32(corr),
        )
    }
    #[inline(always)]
    unsafe fn pair(lo: __m256i, hi: __m256i, qe: __m256i, qo: __m256i) -> __m256i {
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, qe), _mm256_maddubs_epi16(hi, qo))
    }
    #[inline(always)]
    unsafe fn reduce4(m: [__m256i; 4]) -> __m256i {
        // Two int16 levels (sums of 4 lanes: at most 4 · 7 620 = 30 480), then int32.
        _mm256_madd_epi16(
            _mm256_hadd_epi16(_mm256_hadd_epi16(m[0], m[1]), _mm256_hadd_epi16(m[2], m[3])),
            _mm256_set1_epi16(1),
        )
    }
    #[inline(always)]
    unsafe fn dot4(u: __m256i, s: __m256i) -> __m256i {
        // The pairs `maddubs` adds cannot saturate here (2 · 128 · 127 < 2¹⁵).
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// [`IntSums`] on AVX-512 VNNI: no int16 stage and no `madd` (2 instructions per word and
/// token against 4). Up to 4 tokens even and odd codes feed separate chains, each 4 deep
/// per block, not 8; with more tokens there are chains enough and registers too few.
pub(super) struct Vnni;

impl IntSums for Vnni {
    /// Two int32 chains (the second stays zero above 4 tokens).
    type Block = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn block(corr: i32) -> (__m256i, __m256i) {
        (_mm256_set1_epi32(-corr), _mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn add_word<const T: usize>(
        b: (__m256i, __m256i),
        lo: __m256i,
        hi: __m256i,
        qe: __m256i,
        qo: __m256i,
    ) -> (__m256i, __m256i) {
        let e = _mm256_dpbusd_epi32(b.0, lo, qe);
        if T <= 4 {
            (e, _mm256_dpbusd_epi32(b.1, hi, qo))
        } else {
            (_mm256_dpbusd_epi32(e, hi, qo), b.1)
        }
    }
    #[inline(always)]
    unsafe fn block_sum(b: (__m256i, __m256i), _corr: i32) -> __m256i {
        _mm256_add_epi32(b.0, b.1)
    }
    #[inline(always)]
    unsafe fn pair(lo: __m256i, hi: __m256i, qe: __m256i, qo: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, qe), hi, qo)
    }
    #[inline(always)]
    unsafe fn reduce4(m: [__m256i; 4]) -> __m256i {
        _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]))
    }
    #[inline(always)]
    unsafe fn dot4(u: __m256i, s: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    }
}

#[inline(always)]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[inline(always)]
unsafe fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[inline(always)]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// Scale `g` of a row; f16 through F16C (the portable conversion costs more than the
/// group it scales).
#[inline(always)]
unsafe fn scale(st: ScaleType, s: *const u8, g: usize) -> f32 {
    match st {
        ScaleType::F32 => std::ptr::read_unaligned(s.add(4 * g) as *const f32),
        ScaleType::F16 => {
            let h = std::ptr::read_unaligned(s.add(2 * g) as *const u16);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }
        ScaleType::E8M0 => crate::format::mxfp4::scale(*s.add(g)),
        ScaleType::BF16 => {
            f32::from_bits((std::ptr::read_unaligned(s.add(2 * g) as *const u16) as u32) << 16)
        }
    }
}

/// Scales `first..first + out.len()` of a row as f32 (8 at a time through F16C).
#[inline(always)]
unsafe fn scales_f32(st: ScaleType, s: *const u8, first: usize, out: &mut [f32]) {
    let mut k = 0;
    if st == ScaleType::F16 {
        while k + 8 <= out.len() {
            let h = _mm_loadu_si128(s.add(2 * (first + k)) as *const __m128i);
            _mm256_storeu_ps(out.as_mut_ptr().add(k), _mm256_cvtph_ps(h));
            k += 8;
        }
    }
    while k < out.len() {
        out[k] = scale(st, s, first + k);
        k += 1;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8 * k)),
                _mm256_loadu_ps(pb.add(i + 8 * k)),
                *a,
            );
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i)),
            _mm256_loadu_ps(pb.add(i)),
            acc[0],
        );
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s = a[i].mul_add(b[i], s);
        i += 1;
    }
    s
}

/// Sum of a buffer read as f32 with 8 independent accumulators (bandwidth yardstick).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn sum_f32(buf: &[u8]) -> f32 {
    let n = buf.len() / 4;
    let p = buf.as_ptr() as *const f32;
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut i = 0;
    while i + 64 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_ps(*a, _mm256_loadu_ps(p.add(i + 8 * k)));
        }
        i += 64;
    }
    let mut t = _mm256_setzero_ps();
    for a in acc {
        t = _mm256_add_ps(t, a);
    }
    hsum(t)
}

/// [`scalar::quantize_row`], 32 elements at a time: the same scale per block and the same
/// rounding (half to even), so the same bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], qsum: &mut [i32]) {
    let cols = x.len();
    let full = cols / QBLOCK;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..full {
        let p = x.as_ptr().add(b * QBLOCK);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)),
        );
        let (db, inv) = scalar::block_scale(hmax(m));
        let iv = _mm256_set1_ps(inv);
        let lim = _mm256_set1_ps(127.0);
        let nlim = _mm256_set1_ps(-127.0);
        let mut r = [_mm256_setzero_si256(); 4];
        for (k, o) in r.iter_mut().enumerate() {
            let y = _mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[k], iv), nlim), lim);
            *o = _mm256_cvtps_epi32(y);
        }
        let s = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        let p16 = (
            _mm256_packs_epi32(r[0], r[1]),
            _mm256_packs_epi32(r[2], r[3]),
        );
        let p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16.0, p16.1), order);
        _mm256_storeu_si256(q.as_mut_ptr().add(b * QBLOCK) as *mut __m256i, p8);
        d[b] = db;
        qsum[b] = hsum_epi32(s);
    }
    if full * QBLOCK < cols {
        let r = full * QBLOCK..cols;
        scalar::quantize_row(
            &x[r.clone()],
            &mut q[r],
            &mut d[full..full + 1],
            &mut qsum[full..full + 1],
        );
    }
}

// ---------------------------------------------------------------------------------------
// Tiles
// ---------------------------------------------------------------------------------------

/// Everything a tile kernel reads: the weights and the prepared activations as raw
/// pointers with their row strides.
pub struct Ctx<'a> {
    format: WeightFormat,
    cols: usize,
    /// Elements per scale.
    g: usize,
    st: ScaleType,
    w: *const u8,
    w_row: usize,
    s: *const u8,
    s_row: usize,
    /// f32 activations packed by block ([`super::F32Panel`]; int4 order for int4 weights).
    xp: *const f32,
    /// int8 activations packed by block ([`super::Q8Panel`]).
    qb: *const i8,
    db: *const f32,
    sb: *const i32,
    /// int8 activations in int4 order packed by pair ([`super::Q8I4Panel`]).
    qp: *const i8,
    d8: *const f32,
    corr8: *const i32,
    /// The packing of the block panels and of the pair panel.
    blocks: Packing,
    pairs: Packing,
    input: &'a Input<'a>,
}

impl Ctx<'_> {
    #[inline(always)]
    unsafe fn row(&self, r: usize) -> *const u8 {
        self.w.add(r * self.w_row)
    }
    #[inline(always)]
    unsafe fn srow(&self, r: usize) -> *const u8 {
        self.s.add(r * self.s_row)
    }
    #[inline(always)]
    unsafe fn row_slice(&self, r: usize) -> &[u8] {
        std::slice::from_raw_parts(self.row(r), self.w_row)
    }
    #[inline(always)]
    unsafe fn srow_slice(&self, r: usize) -> &[u8] {
        std::slice::from_raw_parts(self.srow(r), self.s_row)
    }
    #[inline(always)]
    fn nblocks(&self) -> usize {
        self.cols.div_ceil(QBLOCK)
    }
    /// Token `t`'s quantized row for the reference tail.
    #[inline(always)]
    fn q8row(&self, t: usize) -> Q8Row<'_> {
        let a = self.input.q8();
        let nb = self.nblocks();
        Q8Row {
            q: &a.q[t * self.cols..(t + 1) * self.cols],
            d: &a.d[t * nb..(t + 1) * nb],
            qsum: &a.qsum[t * nb..(t + 1) * nb],
        }
    }
}

/// The reference sum over a row's blocks from `first` on (those the SIMD loop leaves), for
/// token `t`; 0 without calling it when there are none, the usual case (the call's setup,
/// once per row and token, cost 4% of a decode step).
#[inline(always)]
fn q8_tail(c: &Ctx, row: &[u8], srow: &[u8], t: usize, first: usize) -> f32 {
    if first * QBLOCK >= c.cols {
        return 0.0;
    }
    scalar::dot_q8_blocks(c.format, row, srow, &c.q8row(t), c.cols, first)
}

/// Accumulators of a tile carried from one chunk of its rows to the next (k-blocking):
/// row `i`'s token `j` at `state[8·i + j]`. Saved and reloaded whole, so chunking changes
/// nothing in a (row, token) pair's arithmetic.
type State = *mut [f32; 8];

/// The chunk is the first of its rows: start from zero.
const FIRST: u32 = 1;
/// The chunk is the last: finish the sums into `out`.
const LAST: u32 = 2;

/// A tile kernel: rows `r..r+R` × tokens `t..t+T` over units `u0..u1` of the rows (32-
/// element blocks, or pairs of them for int4 × int8), finished into `out[i·T + j]` on the
/// last chunk.
type TileFn = unsafe fn(&Ctx, usize, usize, usize, usize, State, u32, &mut [f32]);

#[inline(always)]
unsafe fn load_acc<const R: usize, const T: usize>(flags: u32, state: State) -> [[__m256; T]; R] {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    if flags & FIRST == 0 {
        for (i, a) in acc.iter_mut().enumerate() {
            for (j, v) in a.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(state.add(8 * i + j) as *const f32);
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn save_acc<const R: usize, const T: usize>(acc: &[[__m256; T]; R], state: State) {
    for (i, a) in acc.iter().enumerate() {
        for (j, v) in a.iter().enumerate() {
            _mm256_storeu_ps(state.add(8 * i + j) as *mut f32, *v);
        }
    }
}

/// The instantiated tile shapes of one kernel: 4 rows × 1 token for decode (four
/// independent accumulators, the weight streams of four rows), and `rp` rows × T tokens for
/// prefill, T up to `tmax`, with 1 × T tiles for the rows left over.
///
/// Measured on AVX2 (Zen 3, one core, 4096 columns, 64 tokens): the integer kernels are
/// bound by the two ports that run both `maddubs`/`madd` and FMA, and do best with one row
/// and 8 tokens (the unpacked row and 8 accumulators fill the registers); the
/// f32-activation kernels are bound by loading activations, and do best with 2 rows sharing
/// each loaded activation across 4 tokens.
struct Shapes {
    r4t1: TileFn,
    rp: usize,
    /// `rp` × T for T = 1..=tmax.
    main: [TileFn; 8],
    /// 1 × T for T = 1..=tmax.
    r1: [TileFn; 8],
    tmax: usize,
    /// Units per row and activation bytes per unit and token (for the chunk size).
    units: usize,
    unit_bytes: usize,
    /// Activation bytes of a token tile's chunk, which stays in L1 while the rows of a row
    /// chunk stream past. Measured (bf16 and int4-g64, 4096 columns, 64 tokens): the f32
    /// kernels do best with 8 KiB (30 against 22 GMAC/s with 32 KiB), the integer ones with
    /// 32 KiB (40 against 34).
    l1: usize,
}

macro_rules! shapes_q8 {
    ($units:expr, $ub:expr, $k:ident $(:: <$($p:ty),*>)?) => {{
        let r1 = [
            $k::<$($($p,)*)? 1, 1> as TileFn,
            $k::<$($($p,)*)? 1, 2>,
            $k::<$($($p,)*)? 1, 3>,
            $k::<$($($p,)*)? 1, 4>,
            $k::<$($($p,)*)? 1, 5>,
            $k::<$($($p,)*)? 1, 6>,
            $k::<$($($p,)*)? 1, 7>,
            $k::<$($($p,)*)? 1, 8>,
        ];
        Shapes {
            r4t1: $k::<$($($p,)*)? 4, 1>,
            rp: 1,
            main: r1,
            r1,
            tmax: 8,
            units: $units,
            unit_bytes: $ub,
            l1: 32 << 10,
        }
    }};
}

macro_rules! shapes_f32 {
    ($units:expr, $k:ident $(:: <$($p:ty),*>)?) => {{
        let r1 = [
            $k::<$($($p,)*)? 1, 1> as TileFn,
            $k::<$($($p,)*)? 1, 2>,
            $k::<$($($p,)*)? 1, 3>,
            $k::<$($($p,)*)? 1, 4>,
            $k::<$($($p,)*)? 1, 1>,
            $k::<$($($p,)*)? 1, 1>,
            $k::<$($($p,)*)? 1, 1>,
            $k::<$($($p,)*)? 1, 1>,
        ];
        let main = [
            $k::<$($($p,)*)? 2, 1> as TileFn,
            $k::<$($($p,)*)? 2, 2>,
            $k::<$($($p,)*)? 2, 3>,
            $k::<$($($p,)*)? 2, 4>,
            $k::<$($($p,)*)? 2, 1>,
            $k::<$($($p,)*)? 2, 1>,
            $k::<$($($p,)*)? 2, 1>,
            $k::<$($($p,)*)? 2, 1>,
        ];
        Shapes {
            r4t1: $k::<$($($p,)*)? 4, 1>,
            rp: 2,
            main,
            r1,
            tmax: 4,
            units: $units,
            unit_bytes: 4 * QBLOCK,
            l1: 8 << 10,
        }
    }};
}

thread_local! {
    /// Per-thread accumulator state of the tiles of one row chunk (k-blocking).
    static SCRATCH: std::cell::RefCell<Vec<[f32; 8]>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Weight bytes of a row chunk: it stays in L2 while every token tile passes over it.
const L2_ROWS: usize = 192 << 10;

/// `out[t * ld + r] = dot(row r, token t)` for `r` in `rows`, every token of `input`.
///
/// # Safety
/// AVX2, FMA and F16C must be present (and AVX-512 F/BW/VL/VNNI where `vnni`); `out` must be
/// valid for those writes and not written by anyone else meanwhile; `input` must hold the
/// forms `prepare_for` makes.
pub unsafe fn matmul_rows(
    w: &Weights,
    input: &Input,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    vnni: bool,
) {
    let cols = w.cols;
    let n = input.n;
    let int8 = w.int8;
    let i4 = matches!(w.format, WeightFormat::I4 { .. });
    let (qb, db, sb) = if int8 && !i4 {
        let a = input.q8_panel();
        (a.q.as_ptr(), a.d.as_ptr(), a.qsum.as_ptr())
    } else {
        (std::ptr::null(), std::ptr::null(), std::ptr::null())
    };
    let (qp, d8, corr8) = if int8 && i4 {
        let a = input.q8_i4();
        (a.qp.as_ptr(), a.d8.as_ptr(), a.corr8.as_ptr())
    } else {
        (std::ptr::null(), std::ptr::null(), std::ptr::null())
    };
    let xp = match (int8, i4) {
        (false, true) => input.x_i4().x.as_ptr(),
        (false, false) => input.x_panel().x.as_ptr(),
        _ => std::ptr::null(),
    };
    let c = Ctx {
        format: w.format,
        cols,
        g: w.format.group_len(cols).unwrap_or(cols).max(1),
        st: w.format.scale_type().unwrap_or(ScaleType::F32),
        w: w.data.as_ptr(),
        w_row: w.format.row_bytes(cols),
        s: w.scales.as_ptr(),
        s_row: w.format.scale_row_bytes(cols),
        xp,
        qb,
        db,
        sb,
        qp,
        d8,
        corr8,
        blocks: input.blocks_packing(),
        pairs: input.pairs_packing(),
        input,
    };
    let (blocks, pairs) = (cols / QBLOCK, cols / QBLOCK / 2);
    let q8u = QBLOCK + 8;
    let shapes = match (w.format, int8) {
        (WeightFormat::I8Row, true) => shapes_q8!(blocks, q8u, i8q8_tile::<RowScaled>),
        (WeightFormat::I8 { .. }, true) => shapes_q8!(blocks, q8u, i8q8_tile::<GroupScaled>),
        (WeightFormat::I4 { .. }, true) => shapes_q8!(pairs, 128, i4q8_tile),
        (WeightFormat::I2 { .. }, true) => shapes_q8!(blocks, q8u, i2q8_tile),
        (WeightFormat::F32, _) => shapes_f32!(blocks, f32_tile::<DeqF32>),
        (WeightFormat::BF16, _) => shapes_f32!(blocks, f32_tile::<DeqBf16>),
        (WeightFormat::F16, _) => shapes_f32!(blocks, f32_tile::<DeqF16>),
        (WeightFormat::I8Row, false) => shapes_f32!(blocks, f32_tile::<DeqI8Row>),
        (WeightFormat::I8 { .. }, false) => shapes_f32!(blocks, f32_tile::<DeqI8>),
        (WeightFormat::I4 { .. }, false) => shapes_f32!(blocks, f32_tile::<DeqI4>),
        (WeightFormat::I2 { .. }, false) => shapes_f32!(blocks, f32_tile::<DeqI2>),
        (
            WeightFormat::I3G64
            | WeightFormat::I2Plain
            | WeightFormat::I5 { .. }
            | WeightFormat::Mxfp4
            | WeightFormat::I4Ct { .. },
            _,
        ) => {
            unreachable!("formats without tiles take the per-row path (matmul.rs)")
        }
        (WeightFormat::I4Rows8 { .. }, _) => {
            unreachable!("int4-rows8 runs on avx2_rows8.rs or per row (matmul.rs)")
        }
    };
    let units = shapes.units;
    let mut o = [0f32; 16];
    // int4 in whole pairs scaled per pair or per block, with int8 activations: decode and
    // batched decode (up to a tile of 8 tokens) stream one row at a time (`i4q8_row_tn`).
    // int8 rows batch on the tiles: a row kernel of that shape measured no faster
    // (`kernel_bench 256 2 1,2,4,8`, int8-g32 and per-row int8).
    let row_tn: Option<&[RowTn; TILE]> = match w.format {
        WeightFormat::I4 { .. } if int8 && cols.is_multiple_of(2 * QBLOCK) => {
            if c.g == QBLOCK {
                Some(&I4_ROW_TN_G32)
            } else if c.g == 2 * QBLOCK {
                Some(&I4_ROW_TN_G64)
            } else {
                None
            }
        }
        _ => None,
    };
    if let (Some(tn), true) = (row_tn, (1..=TILE).contains(&n)) {
        // Decode and batched decode: each row read once, its codes unpacked once for every
        // token.
        for r in rows {
            tn[n - 1](&c, r, &mut o[..n]);
            for (j, v) in o[..n].iter().enumerate() {
                *out.add(j * ld + r) = *v;
            }
        }
        return;
    }
    if n == 1 {
        // Decode. int8 in whole blocks, scaled per row or per block, streams one row at a
        // time as int4 does above (see `i4q8_row_tn`).
        let i8_rows = match w.format {
            WeightFormat::I8Row => Some(false),
            WeightFormat::I8 { .. } if c.g == QBLOCK => Some(true),
            _ => None,
        };
        if let (Some(grouped), true) = (i8_rows, int8 && cols.is_multiple_of(QBLOCK)) {
            let row_t1: unsafe fn(&Ctx, usize) -> f32 = match (vnni, grouped) {
                (true, true) => i8q8_row_t1_vnni::<true>,
                (true, false) => i8q8_row_t1_vnni::<false>,
                (false, true) => i8q8_row_t1::<true>,
                (false, false) => i8q8_row_t1::<false>,
            };
            for r in rows {
                *out.add(r) = row_t1(&c, r);
            }
            return;
        }
        // The others: four rows at a time, each row in one pass.
        let mut r = rows.start;
        while r + 4 <= rows.end {
            (shapes.r4t1)(
                &c,
                r,
                0,
                0,
                units,
                std::ptr::null_mut(),
                FIRST | LAST,
                &mut o[..4],
            );
            for (i, v) in o[..4].iter().enumerate() {
                *out.add(r + i) = *v;
            }
            r += 4;
        }
        for r in r..rows.end {
            (shapes.r1[0])(
                &c,
                r,
                0,
                0,
                units,
                std::ptr::null_mut(),
                FIRST | LAST,
                &mut o[..1],
            );
            *out.add(r) = o[0];
        }
        return;
    }
    // Prefill: rows in chunks whose weights stay in L2; for each token tile, the rows'
    // units in chunks whose activations stay in L1 while the chunk's rows stream past.
    let row_bytes = c.w_row + c.s_row;
    let rc = (L2_ROWS / row_bytes.max(1)).clamp(4, 256);
    let kc = (shapes.l1 / (shapes.tmax * shapes.unit_bytes)).max(1);
    let nk = units.div_ceil(kc).max(1);
    SCRATCH.with(|s| {
        let mut scratch = s.borrow_mut();
        if scratch.len() < rc * 8 {
            scratch.resize(rc * 8, [0.0; 8]);
        }
        let state = scratch.as_mut_ptr();
        let mut r0 = rows.start;
        while r0 < rows.end {
            let r1 = (r0 + rc).min(rows.end);
            let mut t = 0;
            while t < n {
                // A tile of tokens never straddles two packed tiles.
                let nt = (n - t).min(shapes.tmax).min(TILE - t % TILE);
                let (fm, f1) = (shapes.main[nt - 1], shapes.r1[nt - 1]);
                for k in 0..nk {
                    let (u0, u1) = (k * kc, ((k + 1) * kc).min(units));
                    let flags = if k == 0 { FIRST } else { 0 } | if k + 1 == nk { LAST } else { 0 };
                    let mut r = r0;
                    while r < r1 {
                        let (f, nr) = if r + shapes.rp <= r1 {
                            (fm, shapes.rp)
                        } else {
                            (f1, 1)
                        };
                        f(
                            &c,
                            r,
                            t,
                            u0,
                            u1,
                            state.add(8 * (r - r0)),
                            flags,
                            &mut o[..nr * nt],
                        );
                        if flags & LAST != 0 {
                            for i in 0..nr {
                                for j in 0..nt {
                                    *out.add((t + j) * ld + r + i) = o[i * nt + j];
                                }
                            }
                        }
                        r += nr;
                    }
                }
                t += nt;
            }
            r0 = r1;
        }
    });
}

/// The weight scales of a window of up to 64 scale groups (or, for [`Self::load_units`],
/// 64 units) of each row of a tile, as f32, so the unit loop reads a scale with one
/// broadcast.
struct ScaleWindow<const R: usize> {
    buf: [[f32; 64]; R],
    /// The window's first entry and one past its last.
    u0: usize,
    u1: usize,
}

impl<const R: usize> ScaleWindow<R> {
    #[inline(always)]
    fn new() -> Self {
        ScaleWindow {
            buf: [[0.0; 64]; R],
            u0: 0,
            u1: 0,
        }
    }

    /// Loads the scales of groups `g0..min(g0 + 64, end)` of rows `r0..r0+R`.
    #[inline(always)]
    unsafe fn load_groups(&mut self, c: &Ctx, r0: usize, g0: usize, end: usize) {
        self.u0 = g0;
        self.u1 = (g0 + 64).min(end);
        for i in 0..R {
            scales_f32(c.st, c.srow(r0 + i), g0, &mut self.buf[i][..self.u1 - g0]);
        }
    }

    /// Loads one scale per unit for units `u0..min(u0 + 64, end)` of rows `r0..r0+R`, a
    /// unit being `unit` elements and the rows' groups `c.g` elements (a multiple of the
    /// unit, or the whole row): each group's scale repeated.
    #[inline(always)]
    unsafe fn load_units(&mut self, c: &Ctx, r0: usize, u0: usize, end: usize, unit: usize) {
        let upg = units_per_group(c, unit);
        if upg == 1 {
            return self.load_groups(c, r0, u0, end);
        }
        self.u0 = u0;
        self.u1 = (u0 + 64).min(end);
        let n = self.u1 - u0;
        let (g0, k0) = (u0 / upg, u0 % upg);
        let ng = (k0 + n).div_ceil(upg);
        let mut tmp = [0f32; 64];
        for i in 0..R {
            scales_f32(c.st, c.srow(r0 + i), g0, &mut tmp[..ng]);
            let (mut gi, mut k) = (0, k0);
            for v in self.buf[i][..n].iter_mut() {
                *v = tmp[gi];
                k += 1;
                if k == upg {
                    k = 0;
                    gi += 1;
                }
            }
        }
    }

    /// Scale of entry `u` (inside the window) of row `i`, in all lanes.
    #[inline(always)]
    unsafe fn splat(&self, i: usize, u: usize) -> __m256 {
        _mm256_broadcast_ss(self.buf.get_unchecked(i).get_unchecked(u - self.u0))
    }

    /// Scales of entries `u` and `u + 1` of row `i`: lanes 0-3 and 4-7.
    #[inline(always)]
    unsafe fn splat2(&self, i: usize, u: usize) -> __m256 {
        let b = self.buf.get_unchecked(i);
        _mm256_set_m128(
            _mm_broadcast_ss(b.get_unchecked(u + 1 - self.u0)),
            _mm_broadcast_ss(b.get_unchecked(u - self.u0)),
        )
    }
}

/// Units of `unit` elements per scale group (every unit of the row when one group covers
/// it).
#[inline(always)]
fn units_per_group(c: &Ctx, unit: usize) -> usize {
    if c.g >= c.cols {
        c.cols.div_ceil(unit) + 1
    } else {
        (c.g / unit).max(1)
    }
}

/// Runs `$body` for every unit `$u` of `$u0..$u1` with `$set` run first whenever the scale
/// group changes (`$win.splat(i, $g)` gives its scales). Where a group is one unit the loop
/// has no group bookkeeping at all, which measured a quarter of decode speed (int4-g32,
/// int8-g32).
macro_rules! walk_groups {
    ($c:expr, $r0:expr, $u0:expr, $u1:expr, $unit:expr, $win:ident, |$u:ident, $g:ident| $set:block $body:block) => {{
        let (c, r0, u0, u1): (&Ctx, usize, usize, usize) = ($c, $r0, $u0, $u1);
        let upg = units_per_group(c, $unit);
        let mut b = u0;
        if upg == 1 {
            while b < u1 {
                $win.load_groups(c, r0, b, u1);
                for $u in b..$win.u1 {
                    let $g = $u;
                    $set
                    $body
                }
                b = $win.u1;
            }
        } else if b < u1 {
            let gend = (u1 - 1) / upg + 1;
            let mut gi = b / upg;
            while b < u1 {
                if gi >= $win.u1 {
                    $win.load_groups(c, r0, gi, gend);
                }
                let be = ((gi + 1) * upg).min(u1);
                {
                    let $g = gi;
                    $set
                }
                for $u in b..be {
                    $body
                }
                b = be;
                gi += 1;
            }
        }
    }};
}

// --- f32 activations: every format, dequantized 8 elements at a time ------------------

/// How a format's codes become values: `(code - OFF) · scale`, the scale per group, per row
/// or none.
#[derive(PartialEq, Eq)]
enum Scaling {
    None,
    Row,
    Group,
}

trait Deq {
    /// Bytes of one full 32-element block.
    const BB: usize;
    const SCALING: Scaling;
    const OFF: f32 = 0.0;
    /// The 8 code values of chunk `k` (0..4) of the block at `p`, in activation order.
    unsafe fn chunk(p: *const u8, k: usize) -> __m256;
}

struct DeqF32;
impl Deq for DeqF32 {
    const BB: usize = 128;
    const SCALING: Scaling = Scaling::None;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        _mm256_loadu_ps((p as *const f32).add(8 * k))
    }
}

#[inline(always)]
unsafe fn load_bf16x8(p: *const u8) -> __m256 {
    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
}

struct DeqBf16;
impl Deq for DeqBf16 {
    const BB: usize = 64;
    const SCALING: Scaling = Scaling::None;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        load_bf16x8(p.add(16 * k))
    }
}

struct DeqF16;
impl Deq for DeqF16 {
    const BB: usize = 64;
    const SCALING: Scaling = Scaling::None;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.add(16 * k) as *const __m128i))
    }
}

#[inline(always)]
unsafe fn i8_chunk(p: *const u8, k: usize) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
        p.add(8 * k) as *const __m128i
    )))
}

struct DeqI8Row;
impl Deq for DeqI8Row {
    const BB: usize = 32;
    const SCALING: Scaling = Scaling::Row;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        i8_chunk(p, k)
    }
}

struct DeqI8;
impl Deq for DeqI8 {
    const BB: usize = 32;
    const SCALING: Scaling = Scaling::Group;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        i8_chunk(p, k)
    }
}

struct DeqI4;
impl Deq for DeqI4 {
    const BB: usize = 16;
    const SCALING: Scaling = Scaling::Group;
    const OFF: f32 = 8.0;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8 * (k / 2)) as *const __m128i));
        let c = if k.is_multiple_of(2) {
            _mm256_and_si256(v, _mm256_set1_epi32(0x0F))
        } else {
            _mm256_srli_epi32(v, 4)
        };
        _mm256_cvtepi32_ps(c)
    }
}

struct DeqI2;
impl Deq for DeqI2 {
    const BB: usize = 8;
    const SCALING: Scaling = Scaling::Group;
    const OFF: f32 = 1.5;
    #[inline(always)]
    unsafe fn chunk(p: *const u8, k: usize) -> __m256 {
        let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
        let v = match k {
            0 => v,
            1 => _mm256_srli_epi32(v, 2),
            2 => _mm256_srli_epi32(v, 4),
            _ => _mm256_srli_epi32(v, 6),
        };
        _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(3)))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn f32_tile<D: Deq, const R: usize, const T: usize>(
    c: &Ctx,
    r0: usize,
    t0: usize,
    u0: usize,
    u1: usize,
    state: State,
    flags: u32,
    out: &mut [f32],
) {
    let cols = c.cols;
    let full = cols / QBLOCK;
    let w: [*const u8; R] = std::array::from_fn(|i| c.row(r0 + i));
    // Token j's block b at `x + b·stride + 32·j` (the packed panel).
    let x = c.xp.add(c.blocks.base(t0) * QBLOCK);
    let stride = c.blocks.slots(t0) * QBLOCK;
    let mut acc = load_acc::<R, T>(flags, state);
    // Per row of the tile, the group's scale and the offset times it (Scaling::Group).
    let mut sv = [_mm256_setzero_ps(); R];
    let mut ov = [_mm256_setzero_ps(); R];
    // One block of every row of the tile (a macro: closures would not inherit the
    // function's target features).
    macro_rules! block {
        ($b:expr) => {{
            let b = $b;
            if (b * D::BB) % 64 < D::BB {
                for p in w.iter() {
                    prefetch(p.add(b * D::BB + PREFETCH));
                }
            }
            for k in 0..4 {
                for i in 0..R {
                    let code = D::chunk(w[i].add(b * D::BB), k);
                    let wv = if D::SCALING == Scaling::Group {
                        _mm256_fmadd_ps(code, sv[i], ov[i])
                    } else {
                        code
                    };
                    for j in 0..T {
                        acc[i][j] = _mm256_fmadd_ps(
                            wv,
                            _mm256_loadu_ps(x.add(b * stride + j * QBLOCK + 8 * k)),
                            acc[i][j],
                        );
                    }
                }
            }
        }};
    }
    if D::SCALING == Scaling::Group {
        // Groups are whole blocks (or one group covers the row).
        let mut win = ScaleWindow::<R>::new();
        let off = _mm256_set1_ps(-D::OFF);
        walk_groups!(c, r0, u0, u1, QBLOCK, win, |bb, g| {
            for i in 0..R {
                sv[i] = win.splat(i, g);
                ov[i] = _mm256_mul_ps(off, sv[i]);
            }
        } {
            block!(bb);
        });
    } else {
        for b in u0..u1 {
            block!(b);
        }
    }
    if flags & LAST == 0 {
        save_acc(&acc, state);
        return;
    }
    for i in 0..R {
        let row = c.row_slice(r0 + i);
        let srow = c.srow_slice(r0 + i);
        let has_tail = full * QBLOCK < cols;
        let sg = if D::SCALING == Scaling::Group && has_tail {
            scalar::scale_at(c.st, srow, (cols - 1) / c.g)
        } else {
            1.0
        };
        for j in 0..T {
            let mut s = hsum(acc[i][j]);
            if has_tail {
                let xn = c.input.row(t0 + j);
                let mut t = 0f32;
                for jj in full * QBLOCK..cols {
                    t = (scalar::elem(c.format, row, jj, cols) * sg).mul_add(xn[jj], t);
                }
                s += t;
            }
            if D::SCALING == Scaling::Row {
                s *= scalar::scale_at(ScaleType::F32, srow, 0);
            }
            out[i * T + j] = s;
        }
    }
}

// --- int8 activations -----------------------------------------------------------------

trait I8Scaling {
    const GROUPED: bool;
}
struct RowScaled;
impl I8Scaling for RowScaled {
    const GROUPED: bool = false;
}
struct GroupScaled;
impl I8Scaling for GroupScaled {
    const GROUPED: bool = true;
}

/// int8 weights (per row or grouped) × int8 activations: per block the exact integer sum
/// through `maddubs` (|w| times q with w's sign) and `madd`, times the block's activation
/// scale, times the weight scale (per group, or per row at the end).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn i8q8_tile<S: I8Scaling, const R: usize, const T: usize>(
    c: &Ctx,
    r0: usize,
    t0: usize,
    u0: usize,
    u1: usize,
    state: State,
    flags: u32,
    out: &mut [f32],
) {
    let cols = c.cols;
    let full = cols / QBLOCK;
    let ones = _mm256_set1_epi16(1);
    let w: [*const u8; R] = std::array::from_fn(|i| c.row(r0 + i));
    // Token j's block b: codes at `q + 32·(b·slots + j)`, scale at `d + b·slots + j`.
    let slots = c.blocks.slots(t0);
    let q = c.qb.add(c.blocks.base(t0) * QBLOCK);
    let d = c.db.add(c.blocks.base(t0));
    let mut acc = load_acc::<R, T>(flags, state);
    // A macro, not a closure: closures do not inherit the function's target features.
    macro_rules! body {
        ($b:expr, $sv:expr) => {{
            let (b, sv): (usize, &[__m256; R]) = ($b, $sv);
            if b % 2 == 0 {
                for p in w.iter() {
                    prefetch(p.add(b * QBLOCK + PREFETCH));
                }
            }
            let qbk = q.add(b * slots * QBLOCK);
            let dbk = d.add(b * slots);
            for i in 0..R {
                let wv = _mm256_loadu_si256(w[i].add(b * QBLOCK) as *const __m256i);
                let aw = _mm256_abs_epi8(wv);
                for j in 0..T {
                    let qv = _mm256_loadu_si256(qbk.add(j * QBLOCK) as *const __m256i);
                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(qv, wv));
                    let f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                    let dv = _mm256_broadcast_ss(&*dbk.add(j));
                    acc[i][j] = if S::GROUPED {
                        _mm256_fmadd_ps(_mm256_mul_ps(f, dv), sv[i], acc[i][j])
                    } else {
                        _mm256_fmadd_ps(f, dv, acc[i][j])
                    };
                }
            }
        }};
    }
    let mut sv = [_mm256_setzero_ps(); R];
    if S::GROUPED {
        let mut win = ScaleWindow::<R>::new();
        walk_groups!(c, r0, u0, u1, QBLOCK, win, |bb, g| {
            for (i, v) in sv.iter_mut().enumerate() {
                *v = win.splat(i, g);
            }
        } {
            body!(bb, &sv);
        });
    } else {
        for b in u0..u1 {
            body!(b, &sv);
        }
    }
    if flags & LAST == 0 {
        save_acc(&acc, state);
        return;
    }
    for i in 0..R {
        let row = c.row_slice(r0 + i);
        let srow = c.srow_slice(r0 + i);
        for j in 0..T {
            let tail = q8_tail(c, row, srow, t0 + j, full);
            let s = hsum(acc[i][j]);
            out[i * T + j] = if S::GROUPED {
                s + tail
            } else {
                s.mul_add(scalar::scale_at(ScaleType::F32, srow, 0), tail)
            };
        }
    }
}

/// Decode of one int8 row (one token) with int8 activations, whole 32-element blocks, scaled
/// per block (`GROUPED`, int8-g32) or per row: [`i8q8_tile`]'s arithmetic, bit for bit, one
/// row at a time for the reason [`i4q8_row_tn`] gives.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i8q8_row_t1<const GROUPED: bool>(c: &Ctx, r: usize) -> f32 {
    i8q8_row::<Madd, GROUPED>(c, r)
}

/// [`i8q8_row_t1`] on AVX-512 VNNI ([`Vnni`]): the same lanes, so the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn i8q8_row_t1_vnni<const GROUPED: bool>(c: &Ctx, r: usize) -> f32 {
    i8q8_row::<Vnni, GROUPED>(c, r)
}

/// The body of [`i8q8_row_t1`] for either level: per block the exact int32 lanes of |w|
/// times q with w's sign, times the block's activation scale (and weight scale).
#[inline(always)]
unsafe fn i8q8_row<S: IntSums, const GROUPED: bool>(c: &Ctx, r: usize) -> f32 {
    let blocks = c.cols / QBLOCK;
    let w = c.row(r);
    let sr = c.srow(r);
    let slots = c.blocks.slots(0);
    let q = c.qb.add(c.blocks.base(0) * QBLOCK);
    let d = c.db.add(c.blocks.base(0));
    let mut acc = _mm256_setzero_ps();
    let mut sb = [0f32; 8];
    let mut b = 0;
    while b < blocks {
        let n = (blocks - b).min(8);
        if GROUPED {
            scales_f32(c.st, sr, b, &mut sb[..n]);
        }
        for k in 0..n {
            let bb = b + k;
            if bb % 2 == 0 {
                prefetch(w.add(bb * QBLOCK + PREFETCH));
            }
            let wv = _mm256_loadu_si256(w.add(bb * QBLOCK) as *const __m256i);
            let qv = _mm256_loadu_si256(q.add(bb * slots * QBLOCK) as *const __m256i);
            let p = S::dot4(_mm256_abs_epi8(wv), _mm256_sign_epi8(qv, wv));
            let f = _mm256_cvtepi32_ps(p);
            let dv = _mm256_broadcast_ss(&*d.add(bb * slots));
            acc = if GROUPED {
                let sv = _mm256_broadcast_ss(sb.get_unchecked(k));
                _mm256_fmadd_ps(_mm256_mul_ps(f, dv), sv, acc)
            } else {
                _mm256_fmadd_ps(f, dv, acc)
            };
        }
        b += n;
    }
    let s = hsum(acc);
    if GROUPED {
        s + 0.0
    } else {
        s.mul_add(scalar::scale_at(ScaleType::F32, c.srow_slice(r), 0), 0.0)
    }
}

/// int4 weights × int8 activations, a pair of blocks (64 elements, 32 bytes) at a time: the
/// low nibbles of the 32 bytes are the even elements of both blocks, the high nibbles the
/// odd ones, matching the activations' int4 order, so the unpack is two ANDs and a shift.
/// Codes stay unsigned (`q + 8`, which `maddubs` wants); the offset `8·sum(q)` is taken
/// off per pair, or, where a pair's blocks share a scale, once per row and token at the end.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn i4q8_tile<const R: usize, const T: usize>(
    c: &Ctx,
    r0: usize,
    t0: usize,
    u0: usize,
    u1: usize,
    state: State,
    flags: u32,
    out: &mut [f32],
) {
    let cols = c.cols;
    let pairs = cols / QBLOCK / 2;
    let g = c.g;
    let ones = _mm256_set1_epi16(1);
    let m0f = _mm256_set1_epi8(0x0F);
    let w: [*const u8; R] = std::array::from_fn(|i| c.row(r0 + i));
    // Token j's pair p at unit `p·slots + j` of the packed panel.
    let slots = c.pairs.slots(t0);
    let base = c.pairs.base(t0);
    let qp = c.qp.add(base * 64);
    let d8 = c.d8.add(base * 8);
    let cr = c.corr8.add(base * 8);
    let mut acc = load_acc::<R, T>(flags, state);
    let uniform = g >= cols || g.is_multiple_of(2 * QBLOCK);
    let ppg = if g >= cols {
        pairs.max(1)
    } else {
        (g / (2 * QBLOCK)).max(1)
    };
    // A macro, not a closure: closures do not inherit the function's target features.
    macro_rules! body {
        ($p:expr, $sv:expr, $corr:expr) => {{
            let (p, sv): (usize, &[__m256; R]) = ($p, $sv);
            if p % 2 == 0 {
                for pw in w.iter() {
                    prefetch(pw.add(p * 32 + PREFETCH));
                }
            }
            let qpp = qp.add(p * slots * 64);
            let d8p = d8.add(p * slots * 8);
            let crp = cr.add(p * slots * 8);
            for i in 0..R {
                let v = _mm256_loadu_si256(w[i].add(p * 32) as *const __m256i);
                let lo = _mm256_and_si256(v, m0f);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
                for j in 0..T {
                    let qe = _mm256_loadu_si256(qpp.add(j * 64) as *const __m256i);
                    let qo = _mm256_loadu_si256(qpp.add(j * 64 + 32) as *const __m256i);
                    let s16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, qe),
                        _mm256_maddubs_epi16(hi, qo),
                    );
                    let mut iv = _mm256_madd_epi16(s16, ones);
                    if $corr {
                        iv = _mm256_sub_epi32(
                            iv,
                            _mm256_loadu_si256(crp.add(j * 8) as *const __m256i),
                        );
                    }
                    let ds = _mm256_mul_ps(_mm256_loadu_ps(d8p.add(j * 8)), sv[i]);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv), ds, acc[i][j]);
                }
            }
        }};
    }
    let mut win = ScaleWindow::<R>::new();
    let mut sv = [_mm256_setzero_ps(); R];
    if uniform {
        // Whole pairs share a scale.
        walk_groups!(c, r0, u0, u1, 2 * QBLOCK, win, |pp, g| {
            for (i, v) in sv.iter_mut().enumerate() {
                *v = win.splat(i, g);
            }
        } {
            body!(pp, &sv, false);
        });
    } else {
        // Groups of an odd number of blocks: each block of a pair has its own scale (a
        // window of 64 blocks); the code offset is subtracted per pair.
        let mut p = u0;
        while p < u1 {
            win.load_units(c, r0, 2 * p, 2 * u1, QBLOCK);
            let pe = win.u1 / 2;
            for pp in p..pe {
                for (i, v) in sv.iter_mut().enumerate() {
                    *v = win.splat2(i, 2 * pp);
                }
                body!(pp, &sv, true);
            }
            p = pe;
        }
    }
    if flags & LAST == 0 {
        save_acc(&acc, state);
        return;
    }
    let cp = c.input.q8_i4().cp.as_ptr();
    for i in 0..R {
        let row = c.row_slice(r0 + i);
        let srow = c.srow_slice(r0 + i);
        // With pair-uniform scales the offset correction `Σ_p s(p)·cp(p)` is one dot of
        // the row's scales with the token's per-pair offsets, made here once per row and
        // token instead of one subtraction per pair.
        let mut sp = [0f32; 8];
        for j in 0..T {
            let mut corr = 0f32;
            if uniform {
                let cpt = cp.add((t0 + j) * pairs);
                if ppg == 1 {
                    let mut cv = _mm256_setzero_ps();
                    let mut p = 0;
                    while p + 8 <= pairs {
                        scales_f32(c.st, c.srow(r0 + i), p, &mut sp);
                        cv = _mm256_fmadd_ps(
                            _mm256_loadu_ps(sp.as_ptr()),
                            _mm256_loadu_ps(cpt.add(p)),
                            cv,
                        );
                        p += 8;
                    }
                    corr = hsum(cv);
                    while p < pairs {
                        corr = scale(c.st, c.srow(r0 + i), p).mul_add(*cpt.add(p), corr);
                        p += 1;
                    }
                } else {
                    let mut p = 0;
                    let mut gi = 0;
                    while p < pairs {
                        let pe = (p + ppg).min(pairs);
                        let mut sum = 0f32;
                        for pp in p..pe {
                            sum += *cpt.add(pp);
                        }
                        corr = scale(c.st, c.srow(r0 + i), gi).mul_add(sum, corr);
                        p = pe;
                        gi += 1;
                    }
                }
            }
            out[i * T + j] = (hsum(acc[i][j]) - corr) + q8_tail(c, row, srow, t0 + j, 2 * pairs);
        }
    }
}

/// Decode of one int4 row for `T` tokens (1 to 8: one packed tile) with int8
/// activations, the row's 32-element blocks in whole pairs, and a scale per pair (int4-g64,
/// `G32 = false`) or per block (int4-g32): [`i4q8_tile`]'s arithmetic per token, bit for bit,
/// without its bookkeeping, the row's codes unpacked once for all the tokens.
///
/// One row at a time, because a decode matvec is bound by memory, not arithmetic: rows are
/// contiguous, so one row after another is a single sequential stream that the hardware
/// prefetcher follows, where four rows side by side are four short streams inside each page.
/// Measured on Zen 3 AVX2 (2048 columns, 256 MiB, 2 threads): 21–25 GB/s against 21 for the
/// four-row tile, and the OLMoE-1B-7B synth's decode 19–24 tok/s against 17–21, alternated;
/// in the cache the four-row tile is faster (19 against 16 GB/s a core), which decode never is.
/// For a batch of 2–8 tokens the tiles' 1 × T shape carries a scale window and k-blocking
/// state built for prefill's long rows of tokens: this kernel, 4 tokens 65–79 → 79–110
/// GMAC/s (`kernel_bench 256 2 1,2,4,8`, int4-g64, 2048 columns; docs/PERFORMANCE.md).
///
/// The scales are converted 8 pairs at a time into a stack buffer (the tiles' 64-group window
/// cost a fifth of the time on 1024-column rows), and with a scale per pair the code-offset
/// correction `Σ s(p)·cp(p)` is accumulated from those same 8 scales.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i4q8_row_tn<const G32: bool, const T: usize>(c: &Ctx, r: usize, out: &mut [f32]) {
    let pairs = c.cols / (2 * QBLOCK);
    let ones = _mm256_set1_epi16(1);
    let m0f = _mm256_set1_epi8(0x0F);
    let w = c.row(r);
    let sr = c.srow(r);
    // Token j's pair p at unit `p·slots + j` of the packed panel (the tokens are the first
    // tile's: a decode batch is at most one tile).
    let slots = c.pairs.slots(0);
    let base = c.pairs.base(0);
    let qp = c.qp.add(base * 64);
    let d8 = c.d8.add(base * 8);
    let cr = c.corr8.add(base * 8);
    let cp = c.input.q8_i4().cp.as_ptr();
    let mut acc = [_mm256_setzero_ps(); T];
    let mut cv = [_mm256_setzero_ps(); T];
    let mut sb = [0f32; 16];
    macro_rules! pair {
        ($p:expr, $k:expr) => {{
            let (p, k): (usize, usize) = ($p, $k);
            if p % 2 == 0 {
                prefetch(w.add(p * 32 + PREFETCH));
            }
            let v = _mm256_loadu_si256(w.add(p * 32) as *const __m256i);
            let lo = _mm256_and_si256(v, m0f);
            let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
            let sv = if G32 {
                _mm256_set_m128(
                    _mm_broadcast_ss(sb.get_unchecked(2 * k + 1)),
                    _mm_broadcast_ss(sb.get_unchecked(2 * k)),
                )
            } else {
                _mm256_broadcast_ss(sb.get_unchecked(k))
            };
            let qpp = qp.add(p * slots * 64);
            let d8p = d8.add(p * slots * 8);
            for j in 0..T {
                let qe = _mm256_loadu_si256(qpp.add(j * 64) as *const __m256i);
                let qo = _mm256_loadu_si256(qpp.add(j * 64 + 32) as *const __m256i);
                let s16 =
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, qe), _mm256_maddubs_epi16(hi, qo));
                let mut iv = _mm256_madd_epi16(s16, ones);
                if G32 {
                    iv = _mm256_sub_epi32(
                        iv,
                        _mm256_loadu_si256(cr.add((p * slots + j) * 8) as *const __m256i),
                    );
                }
                let ds = _mm256_mul_ps(_mm256_loadu_ps(d8p.add(j * 8)), sv);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iv), ds, acc[j]);
            }
        }};
    }
    let per = if G32 { 2 } else { 1 };
    let mut p = 0;
    while p + 8 <= pairs {
        scales_f32(c.st, sr, per * p, &mut sb[..8 * per]);
        if !G32 {
            let s8 = _mm256_loadu_ps(sb.as_ptr());
            for (j, v) in cv.iter_mut().enumerate() {
                *v = _mm256_fmadd_ps(s8, _mm256_loadu_ps(cp.add(j * pairs + p)), *v);
            }
        }
        for k in 0..8 {
            pair!(p + k, k);
        }
        p += 8;
    }
    let rest = pairs - p;
    if rest > 0 {
        scales_f32(c.st, sr, per * p, &mut sb[..rest * per]);
        for k in 0..rest {
            pair!(p + k, k);
        }
    }
    for j in 0..T {
        let mut corr = 0f32;
        if !G32 {
            corr = hsum(cv[j]);
            for k in 0..rest {
                corr = sb[k].mul_add(*cp.add(j * pairs + p + k), corr);
            }
        }
        out[j] = (hsum(acc[j]) - corr) + 0.0;
    }
}

/// [`i4q8_row_tn`] for one row and the first `T` tokens.
type RowTn = unsafe fn(&Ctx, usize, &mut [f32]);

macro_rules! row_tn_table {
    ($g32:literal) => {
        [
            i4q8_row_tn::<$g32, 1> as RowTn,
            i4q8_row_tn::<$g32, 2>,
            i4q8_row_tn::<$g32, 3>,
            i4q8_row_tn::<$g32, 4>,
            i4q8_row_tn::<$g32, 5>,
            i4q8_row_tn::<$g32, 6>,
            i4q8_row_tn::<$g32, 7>,
            i4q8_row_tn::<$g32, 8>,
        ]
    };
}

static I4_ROW_TN_G64: [RowTn; TILE] = row_tn_table!(false);
static I4_ROW_TN_G32: [RowTn; TILE] = row_tn_table!(true);

/// int2 weights × int8 activations: per block, one 64-bit broadcast and a per-lane shift
/// put the 32 codes in order; `(2c - 3)·q` summed exactly as `Σ 2c·q − 3·sum(q)`, halved at
/// the end.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn i2q8_tile<const R: usize, const T: usize>(
    c: &Ctx,
    r0: usize,
    t0: usize,
    u0: usize,
    u1: usize,
    state: State,
    flags: u32,
    out: &mut [f32],
) {
    let cols = c.cols;
    let full = cols / QBLOCK;
    let ones = _mm256_set1_epi16(1);
    let m03 = _mm256_set1_epi8(3);
    let shifts = _mm256_set_epi64x(6, 4, 2, 0);
    let w: [*const u8; R] = std::array::from_fn(|i| c.row(r0 + i));
    let slots = c.blocks.slots(t0);
    let base = c.blocks.base(t0);
    let q = c.qb.add(base * QBLOCK);
    let d = c.db.add(base);
    let qs = c.sb.add(base);
    let mut acc = load_acc::<R, T>(flags, state);
    let mut win = ScaleWindow::<R>::new();
    let mut sv = [_mm256_setzero_ps(); R];
    walk_groups!(c, r0, u0, u1, QBLOCK, win, |bb, g| {
        for (i, v) in sv.iter_mut().enumerate() {
            *v = win.splat(i, g);
        }
    } {
        if bb % 8 == 0 {
            for p in w.iter() {
                prefetch(p.add(bb * 8 + PREFETCH));
            }
        }
        let qbk = q.add(bb * slots * QBLOCK);
        for i in 0..R {
            let bytes = std::ptr::read_unaligned(w[i].add(bb * 8) as *const i64);
            let cv =
                _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(bytes), shifts), m03);
            let c2 = _mm256_add_epi8(cv, cv);
            for j in 0..T {
                let qv = _mm256_loadu_si256(qbk.add(j * QBLOCK) as *const __m256i);
                let iv = _mm256_madd_epi16(_mm256_maddubs_epi16(c2, qv), ones);
                let corr = _mm256_setr_epi32(3 * *qs.add(bb * slots + j), 0, 0, 0, 0, 0, 0, 0);
                let f = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_sub_epi32(iv, corr)),
                    _mm256_broadcast_ss(&*d.add(bb * slots + j)),
                );
                acc[i][j] = _mm256_fmadd_ps(f, sv[i], acc[i][j]);
            }
        }
    });
    if flags & LAST == 0 {
        save_acc(&acc, state);
        return;
    }
    for i in 0..R {
        let row = c.row_slice(r0 + i);
        let srow = c.srow_slice(r0 + i);
        for j in 0..T {
            out[i * T + j] = 0.5 * hsum(acc[i][j]) + q8_tail(c, row, srow, t0 + j, full);
        }
    }
}
