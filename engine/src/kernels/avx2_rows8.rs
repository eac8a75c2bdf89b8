//! int4 × int8 products eight weight rows at a time, the rows interleaved on the fly so
//! that lane `i` of every vector belongs to row `i` (issue 11's interleaved layout).
//!
//! Why: the tiles of `avx2.rs` keep one (row, token) pair in a vector, so every 64 weights of
//! every pair pay an integer widening, a convert, a scale multiply and an FMA. With 8 rows in
//! the lanes, a 32-element block's integer sums stay in int16 across the whole block (8
//! `maddubs`, at most 8 · 2 · 15 · 127 = 30 480) and one `madd`, one convert, one multiply and
//! one FMA then serve 8 rows: 11 operations on the two multiply pipes per 256 MACs against
//! 20 (`interleaved_bench`, docs/PERFORMANCE.md).
//!
//! Prefill: with the activations in int4 order (a pair's 64 codes as `[even | odd]`, see
//! [`super::Q8I4Panel`]), 4 packed bytes of a row (8 elements) multiply 4 even and 4 odd
//! activation codes, so interleaving rows is an 8 × 8 transpose of 32-bit words, 24 shuffles
//! per 8 rows × 64 columns. A row chunk is interleaved once into a buffer that stays in L2
//! and every token tile reads it ([`tile`]). No file format changes, and streamed experts
//! need no repacking.
//!
//! Decode and batched decode (up to 8 tokens; 4 on VNNI, whose tiles are cheaper): reading 8
//! rows side by side is 8 short streams,
//! which memory serves worse than one, so the rows are read one after another and only
//! their exact block sums are transposed, 8 rows at a time ([`row_sums`], [`finish`]).
//!
//! The arithmetic is the scalar reference's ([`scalar::dot_q8`]) exactly: per 32-element
//! block the exact integer `Σ (code − 8)·q`, then `acc = fma(isum, d·s, acc)` block after
//! block. So these kernels give the reference's bits, and a token gets the same bits in
//! decode, batched decode and prefill (`tests.rs`).
//!
//! Served: int4 with a scale per 32 or 64 elements (f16 or f32), int8 activations, rows of
//! a multiple of 64 columns (every int4 matrix colibri writes). Other int4 groupings take
//! the tiles of `avx2.rs`.

#![allow(clippy::needless_range_loop)]

use super::avx2::{prefetch, prefetch_l2, IntSums, Madd, Vnni, PREFETCH, PREFETCH_L2};
use super::{Input, Packing, Weights, QBLOCK, TILE};
use crate::format::{ScaleType, WeightFormat};
use std::arch::x86_64::*;

/// Rows per interleaved group (the lanes of a vector).
const ROWS: usize = 8;
/// Interleaved bytes of one pair (64 columns) of a group: 8 words of 32 bytes.
const PAIR_BYTES: usize = 256;
/// An all-zero accumulator (a constant, usable where the AVX intrinsics are not enabled).
const ZERO: __m256 = unsafe { std::mem::transmute([0f32; 8]) };

/// Tokens per register tile: 4 int16 sums and 4 accumulators with the unpacked codes and
/// broadcast activations fill the 16 registers.
const TOKENS: usize = 4;
/// Weight bytes of a prefill row chunk, interleaved once and read by every token tile.
const L2_ROWS: usize = 192 << 10;

/// Whether these kernels compute `w`'s products.
pub(super) fn serves(w: &Weights) -> bool {
    matches!(
        w.format,
        WeightFormat::I4 { group: 32 | 64, .. } | WeightFormat::I4Rows8 { group: 32 | 64, .. }
    ) && w.int8
        && w.cols > 0
        && w.cols.is_multiple_of(2 * QBLOCK)
}

/// Transposes an 8 × 8 matrix of 32-bit words held as 8 rows.
#[inline(always)]
unsafe fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    // Words 0/4, 1/5, 2/6, 3/7 of rows 0–3 and of rows 4–7.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256(u0, u4, 0x20),
        _mm256_permute2x128_si256(u1, u5, 0x20),
        _mm256_permute2x128_si256(u2, u6, 0x20),
        _mm256_permute2x128_si256(u3, u7, 0x20),
        _mm256_permute2x128_si256(u0, u4, 0x31),
        _mm256_permute2x128_si256(u1, u5, 0x31),
        _mm256_permute2x128_si256(u2, u6, 0x31),
        _mm256_permute2x128_si256(u3, u7, 0x31),
    ]
}

/// One group of up to 8 rows: their code and scale pointers (a group short of 8 rows
/// repeats its first row in the missing lanes, whose results are dropped).
struct Group {
    w: [*const u8; ROWS],
    s: [*const u8; ROWS],
    rows: usize,
}

impl Group {
    unsafe fn new(w: &Weights, r0: usize, r1: usize) -> Group {
        let (rb, sb) = (w.format.row_bytes(w.cols), w.format.scale_row_bytes(w.cols));
        let rows = (r1 - r0).min(ROWS);
        let at = |i: usize| if i < rows { r0 + i } else { r0 };
        Group {
            w: std::array::from_fn(|i| w.data.as_ptr().add(at(i) * rb)),
            s: std::array::from_fn(|i| w.scales.as_ptr().add(at(i) * sb)),
            rows,
        }
    }
}

/// Writes pairs `p0..p1` of the group's rows interleaved into `dst` (256 bytes a pair:
/// word `u` of the pair, i.e. columns `8u..8u + 8`, of rows 0–7), and the scales of those
/// columns into `sv` as f32, 8 lanes per scale unit (a block for `G32`, else a pair).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn interleave<const G32: bool>(
    g: &Group,
    st: ScaleType,
    p0: usize,
    p1: usize,
    dst: *mut u8,
    sv: *mut f32,
) {
    interleave_codes(g, p0, p1, dst);
    transpose_scales::<G32>(g, st, p0, p1, sv);
}

/// The codes part of [`interleave`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn interleave_codes(g: &Group, p0: usize, p1: usize, dst: *mut u8) {
    for p in p0..p1 {
        if p % 2 == 0 {
            for w in g.w {
                prefetch(w.add(p * 32 + PREFETCH));
            }
        }
        let r: [__m256i; 8] =
            std::array::from_fn(|i| _mm256_loadu_si256(g.w[i].add(p * 32) as *const __m256i));
        let t = transpose8(r);
        let d = dst.add((p - p0) * PAIR_BYTES);
        for (u, v) in t.iter().enumerate() {
            _mm256_storeu_si256(d.add(u * 32) as *mut __m256i, *v);
        }
    }
}

/// The scales part of [`interleave`]: 8 lanes (rows) per scale unit.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_scales<const G32: bool>(
    g: &Group,
    st: ScaleType,
    p0: usize,
    p1: usize,
    sv: *mut f32,
) {
    let per = if G32 { 2 } else { 1 };
    let (u0, u1) = (per * p0, per * p1);
    let mut u = u0;
    while u + 8 <= u1 {
        let r: [__m256i; 8] = std::array::from_fn(|i| {
            _mm256_castps_si256(match st {
                ScaleType::F16 => {
                    _mm256_cvtph_ps(_mm_loadu_si128(g.s[i].add(2 * u) as *const __m128i))
                }
                ScaleType::F32 => _mm256_loadu_ps(g.s[i].add(4 * u) as *const f32),
                ScaleType::E8M0 | ScaleType::BF16 => {
                    unreachable!("int4-rows8 has f16 or f32 scales")
                }
            })
        });
        let t = transpose8(r);
        for (k, v) in t.iter().enumerate() {
            _mm256_storeu_ps(sv.add((u - u0 + k) * 8), _mm256_castsi256_ps(*v));
        }
        u += 8;
    }
    for u in u..u1 {
        for i in 0..ROWS {
            let v = match st {
                ScaleType::F16 => _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                    (g.s[i].add(2 * u) as *const u16).read_unaligned() as i32,
                ))),
                ScaleType::F32 => (g.s[i].add(4 * u) as *const f32).read_unaligned(),
                ScaleType::E8M0 | ScaleType::BF16 => {
                    unreachable!("int4-rows8 has f16 or f32 scales")
                }
            };
            *sv.add((u - u0) * 8 + i) = v;
        }
    }
}

/// `n` f16 scales at `src` as f32 at `dst` (a multiple of 8 values: an interleaved group's
/// scales, 8 rows per unit, [`crate::rows8`]; f32 scales are read where they lie).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_f16_scales(src: *const u8, n: usize, dst: *mut f32) {
    for k in (0..n).step_by(8) {
        let v = _mm256_cvtph_ps(_mm_loadu_si128(src.add(2 * k) as *const __m128i));
        _mm256_storeu_ps(dst.add(k), v);
    }
}

/// The int8 activations of a tile of tokens in the pair panel: token `j`'s pair `p` at
/// unit `p · slots + j` from `base`.
#[derive(Clone, Copy)]
struct Acts {
    qp: *const i8,
    d8: *const f32,
    corr8: *const i32,
    slots: usize,
}

impl Acts {
    unsafe fn new(input: &Input, pk: Packing, t: usize) -> Acts {
        let a = input.q8_i4();
        let base = pk.base(t);
        Acts {
            qp: a.qp.as_ptr().add(base * 64),
            d8: a.d8.as_ptr().add(base * 8),
            corr8: a.corr8.as_ptr().add(base * 8),
            slots: pk.slots(t),
        }
    }
}

/// `acc[j]` (lane `i`: row `i`, token `j` of the tile) over pairs `p0..p1`, the group's
/// codes interleaved at `codes` and its scales at `sv` (both from pair `p0`): per block,
/// the exact integer sum of (code − 8)·q, then one FMA with the weight and activation
/// scales, in block order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const T: usize, const G32: bool>(
    codes: *const u8,
    sv: *const f32,
    a: Acts,
    p0: usize,
    p1: usize,
    acc: *mut __m256,
) {
    tile_body::<Madd, T, G32>(codes, sv, a, p0, p1, acc)
}

/// [`tile`] on AVX-512 VNNI ([`Vnni`]), up to 8 tokens (AVX-512's 32 vector registers hold
/// their sums, and the unpacked codes then serve twice as many tokens): the same bits.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_vnni<const T: usize, const G32: bool>(
    codes: *const u8,
    sv: *const f32,
    a: Acts,
    p0: usize,
    p1: usize,
    acc: *mut __m256,
) {
    tile_body::<Vnni, T, G32>(codes, sv, a, p0, p1, acc)
}

/// The body of [`tile`] for either level.
#[inline(always)]
unsafe fn tile_body<S: IntSums, const T: usize, const G32: bool>(
    codes: *const u8,
    sv: *const f32,
    a: Acts,
    p0: usize,
    p1: usize,
    acc: *mut __m256,
) {
    let m0f = _mm256_set1_epi8(0x0F);
    let mut ac: [__m256; T] = std::array::from_fn(|j| *acc.add(j));
    // Pointers bumped pair by pair, so every access in the unrolled body is a constant
    // offset from one of them.
    let mut c = codes;
    let mut s = sv;
    let mut q = a.qp.add(p0 * a.slots * 64);
    let mut d8 = a.d8.add(p0 * a.slots * 8);
    let mut cr = a.corr8.add(p0 * a.slots * 8);
    for _ in p0..p1 {
        for h in 0..2 {
            let mut sums: [S::Block; T] = std::array::from_fn(|j| S::block(*cr.add(j * 8 + 4 * h)));
            for k in 0..4 {
                let u = 4 * h + k;
                let x = _mm256_loadu_si256(c.add(u * 32) as *const __m256i);
                let lo = _mm256_and_si256(x, m0f);
                let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m0f);
                for j in 0..T {
                    let qj = q.add(j * 64 + 4 * u) as *const i32;
                    let qe = _mm256_set1_epi32(qj.read_unaligned());
                    let qo = _mm256_set1_epi32(qj.add(8).read_unaligned());
                    sums[j] = S::add_word::<T>(sums[j], lo, hi, qe, qo);
                }
            }
            let sh = _mm256_loadu_ps(if G32 { s.add(8 * h) } else { s });
            for j in 0..T {
                let isum = S::block_sum(sums[j], *cr.add(j * 8 + 4 * h));
                let ds = _mm256_mul_ps(sh, _mm256_set1_ps(*d8.add(j * 8 + 4 * h)));
                ac[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), ds, ac[j]);
            }
        }
        c = c.add(PAIR_BYTES);
        s = s.add(if G32 { 16 } else { 8 });
        q = q.add(a.slots * 64);
        d8 = d8.add(a.slots * 8);
        cr = cr.add(a.slots * 8);
    }
    for j in 0..T {
        *acc.add(j) = ac[j];
    }
}

/// A tile: `T` tokens (1..=4) over a group's interleaved pairs, `T` accumulators at `acc`.
type TileFn = unsafe fn(*const u8, *const f32, Acts, usize, usize, *mut __m256);

static TILES_G32: [TileFn; TOKENS] = [
    tile::<1, true>,
    tile::<2, true>,
    tile::<3, true>,
    tile::<4, true>,
];
static TILES_G64: [TileFn; TOKENS] = [
    tile::<1, false>,
    tile::<2, false>,
    tile::<3, false>,
    tile::<4, false>,
];

static TILES_VNNI_G32: [TileFn; TILE] = [
    tile_vnni::<1, true>,
    tile_vnni::<2, true>,
    tile_vnni::<3, true>,
    tile_vnni::<4, true>,
    tile_vnni::<5, true>,
    tile_vnni::<6, true>,
    tile_vnni::<7, true>,
    tile_vnni::<8, true>,
];
static TILES_VNNI_G64: [TileFn; TILE] = [
    tile_vnni::<1, false>,
    tile_vnni::<2, false>,
    tile_vnni::<3, false>,
    tile_vnni::<4, false>,
    tile_vnni::<5, false>,
    tile_vnni::<6, false>,
    tile_vnni::<7, false>,
    tile_vnni::<8, false>,
];

/// [`interleave`], [`transpose_scales`] and [`finish`] for one scale grouping.
type InterleaveFn = unsafe fn(&Group, ScaleType, usize, usize, *mut u8, *mut f32);
type TransposeScalesFn = unsafe fn(&Group, ScaleType, usize, usize, *mut f32);
type FinishFn =
    unsafe fn(*const i32, usize, *const f32, Acts, usize, usize, (usize, usize), &mut __m256);

/// Pairs per chunk of [`row_sums`]: the block sums of 4 pairs fill one vector.
const CHUNK: usize = 4;

/// Decode's first half: the exact block sums of one row for `T` tokens, the row read once
/// from start to end (one sequential stream: decode is bound by memory, and 8 rows read
/// side by side as the prefill tile does are 8 short streams, measured at 14.5 against
/// 19–25 GB/s). Per chunk of 4 pairs and token, one vector at `dst + (j · chunks + c) · 8`:
/// lanes 0–3 the first blocks of the chunk's pairs, lanes 4–7 their second blocks, each
/// `Σ code·q` (the offset `8·Σq` is taken off in [`finish`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_sums<const T: usize>(w: *const u8, a: Acts, pairs: usize, dst: *mut i32) {
    row_sums_body::<Madd, T>(w, a, pairs, dst)
}

/// [`row_sums`] on AVX-512 VNNI ([`Vnni`]): the same values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_sums_vnni<const T: usize>(w: *const u8, a: Acts, pairs: usize, dst: *mut i32) {
    row_sums_body::<Vnni, T>(w, a, pairs, dst)
}

/// The body of [`row_sums`] for either level.
#[inline(always)]
unsafe fn row_sums_body<S: IntSums, const T: usize>(
    w: *const u8,
    a: Acts,
    pairs: usize,
    dst: *mut i32,
) {
    let m0f = _mm256_set1_epi8(0x0F);
    let step = a.slots * 64;
    let chunks = pairs.div_ceil(CHUNK);
    // A macro, not a closure: closures do not inherit the function's target features.
    macro_rules! pair {
        ($m:ident, $p:expr, $k:expr) => {{
            let (p, k): (usize, usize) = ($p, $k);
            // Every pair, although a line holds two: one prefetch a line measured 13–15
            // against 16 GB/s (`kernel_bench 256 1 1`, int4-g64). Into L2, 12 KiB ahead
            // ([`prefetch_l2`]): on Zen 4 26.7–30.5 against 20.9–23.8 GB/s with T0 6 KiB
            // ahead (`COLIBRI_ISA=avx2 kernel_bench 256 2 1`, 3 alternated pairs); on Zen 3
            // the hint measured no different.
            prefetch_l2(w.add(p * 32 + PREFETCH_L2));
            let x = _mm256_loadu_si256(w.add(p * 32) as *const __m256i);
            let lo = _mm256_and_si256(x, m0f);
            let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m0f);
            let q = a.qp.add(p * step);
            for j in 0..T {
                let qe = _mm256_loadu_si256(q.add(j * 64) as *const __m256i);
                let qo = _mm256_loadu_si256(q.add(j * 64 + 32) as *const __m256i);
                $m[j][k] = S::pair(lo, hi, qe, qo);
            }
        }};
    }
    macro_rules! store {
        ($m:ident, $c:expr) => {{
            for j in 0..T {
                let v = S::reduce4($m[j]);
                _mm256_storeu_si256(dst.add((j * chunks + $c) * 8) as *mut __m256i, v);
            }
        }};
    }
    let full = pairs / CHUNK;
    for c in 0..full {
        let mut m = [[_mm256_setzero_si256(); CHUNK]; T];
        for k in 0..CHUNK {
            pair!(m, c * CHUNK + k, k);
        }
        store!(m, c);
    }
    if full < chunks {
        let mut m = [[_mm256_setzero_si256(); CHUNK]; T];
        for k in 0..pairs - full * CHUNK {
            pair!(m, full * CHUNK + k, k);
        }
        store!(m, full);
    }
}

/// Decode's second half, for chunks `c0..c1` of 4 pairs: 8 rows' block sums ([`row_sums`],
/// row `i` at `sums + i · stride`) transposed so that lane `i` is row `i`, then, block after
/// block, the offset taken off and one FMA with the weight scales (`sv`, as
/// [`transpose_scales`] writes them) and token `j`'s activation scale: the arithmetic of
/// [`tile`], bit for bit.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn finish<const G32: bool>(
    sums: *const i32,
    stride: usize,
    sv: *const f32,
    a: Acts,
    j: usize,
    pairs: usize,
    (c0, c1): (usize, usize),
    acc: &mut __m256,
) {
    let mut ac = *acc;
    // The pair body: a macro so that `k` is a constant and `v` stays in registers.
    macro_rules! pair {
        ($v:ident, $c:expr, $k:expr) => {{
            let p = $c * CHUNK + $k;
            let unit = (p * a.slots + j) * 8;
            for h in 0..2 {
                let s = _mm256_loadu_ps(if G32 {
                    sv.add((2 * p + h) * 8)
                } else {
                    sv.add(p * 8)
                });
                let isum = _mm256_sub_epi32(
                    $v[$k + 4 * h],
                    _mm256_set1_epi32(*a.corr8.add(unit + 4 * h)),
                );
                let ds = _mm256_mul_ps(s, _mm256_set1_ps(*a.d8.add(unit + 4 * h)));
                ac = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), ds, ac);
            }
        }};
    }
    for c in c0..c1 {
        let r: [__m256i; 8] = std::array::from_fn(|i| {
            _mm256_loadu_si256(sums.add(i * stride + c * 8) as *const __m256i)
        });
        let v = transpose8(r);
        match pairs - c * CHUNK {
            1 => pair!(v, c, 0),
            2 => {
                pair!(v, c, 0);
                pair!(v, c, 1);
            }
            3 => {
                pair!(v, c, 0);
                pair!(v, c, 1);
                pair!(v, c, 2);
            }
            _ => {
                pair!(v, c, 0);
                pair!(v, c, 1);
                pair!(v, c, 2);
                pair!(v, c, 3);
            }
        }
    }
    *acc = ac;
}

/// [`row_sums`] for 1..=4 tokens.
type RowSumsFn = unsafe fn(*const u8, Acts, usize, *mut i32);
static ROW_SUMS: [RowSumsFn; TOKENS] = [row_sums::<1>, row_sums::<2>, row_sums::<3>, row_sums::<4>];
static ROW_SUMS_VNNI: [RowSumsFn; TOKENS] = [
    row_sums_vnni::<1>,
    row_sums_vnni::<2>,
    row_sums_vnni::<3>,
    row_sums_vnni::<4>,
];

/// The token tiles of `n` tokens: up to `max` tokens, never straddling a packed tile of 8.
fn token_tiles(n: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut t = 0;
    std::iter::from_fn(move || {
        (t < n).then(|| {
            let nt = (n - t).min(max).min(TILE - t % TILE);
            t += nt;
            (t - nt, nt)
        })
    })
}

/// Prefetches slice `k` of `n` of the span `(p, bytes)` into L2, one hint a line.
#[inline(always)]
unsafe fn prefetch_slice((p, bytes): (*const u8, usize), k: usize, n: usize) {
    let lines = bytes.div_ceil(64);
    let (l0, l1) = (lines * k / n, lines * (k + 1) / n);
    for l in l0..l1 {
        prefetch_l2(p.wrapping_add(l * 64));
    }
}

/// Stores lanes `0..rows` of `acc[j]` as token `t + j`'s outputs of rows `r0..`.
#[inline(always)]
unsafe fn store(acc: &[__m256], t: usize, r0: usize, rows: usize, out: *mut f32, ld: usize) {
    for (j, v) in acc.iter().enumerate() {
        // A plain copy of the 8 lanes (no intrinsic: the caller has no target features).
        let lanes: [f32; 8] = std::mem::transmute(*v);
        for (i, x) in lanes[..rows].iter().enumerate() {
            *out.add((t + j) * ld + r0 + i) = *x;
        }
    }
}

thread_local! {
    /// Per-thread interleaved codes and scales of a row chunk (prefill) or a column chunk
    /// (decode).
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<f32>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// `out[t * ld + r] = dot(row r, token t)` for `r` in `rows`, every token of `input`.
///
/// On AVX-512 VNNI (`vnni`) the integer sums run on `vpdpbusd` ([`tile_vnni`],
/// [`row_sums_vnni`]); the results are the same bits.
///
/// # Safety
/// AVX2, FMA and F16C must be present, and AVX-512 F/BW/VL/VNNI where `vnni`; [`serves`]
/// must hold; `out` must be valid for those writes and not written by anyone else
/// meanwhile; `input` must hold its int4-order pair panel (`prepare_for`).
pub(super) unsafe fn matmul_rows(
    w: &Weights,
    input: &Input,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
    vnni: bool,
) {
    let g32 = matches!(
        w.format,
        WeightFormat::I4 { group: 32, .. } | WeightFormat::I4Rows8 { group: 32, .. }
    );
    let st = w.format.scale_type().unwrap_or(ScaleType::F32);
    let (tiles, interleave, transpose_scales, finish): (
        &[TileFn],
        InterleaveFn,
        TransposeScalesFn,
        FinishFn,
    ) = if g32 {
        (
            if vnni {
                &TILES_VNNI_G32[..]
            } else {
                &TILES_G32[..]
            },
            interleave::<true>,
            transpose_scales::<true>,
            finish::<true>,
        )
    } else {
        (
            if vnni {
                &TILES_VNNI_G64[..]
            } else {
                &TILES_G64[..]
            },
            interleave::<false>,
            transpose_scales::<false>,
            finish::<false>,
        )
    };
    let row_sums = if vnni { &ROW_SUMS_VNNI } else { &ROW_SUMS };
    let per = if g32 { 2 } else { 1 };
    let pairs = w.cols / (2 * QBLOCK);
    let n = input.n;
    let pk = input.pairs_packing();
    // Up to `by_rows` tokens, the rows are read one after another ([`row_sums`]), 4 tokens
    // at a time; more, they are interleaved for the tiles (4 tokens, or 8 on VNNI:
    // [`tile_vnni`]). On VNNI the tiles are so much cheaper that they win from 5 tokens on,
    // where the row sums would need a second pass: `kernel_bench 256 2 5,6,7,8` (int4-g64,
    // streamed) 85–91 GMAC/s by rows against 83–119 by tiles (95–119 from 6 tokens), while
    // for 2 and 4 tokens the rows' single stream keeps ahead (82–89 / 105–108 against 52–53 /
    // 88–89).
    let interleaved = w.format.interleaved();
    let by_rows = if interleaved {
        0
    } else if vnni {
        TOKENS
    } else {
        TILE
    };
    let max = if vnni && n > by_rows { TILE } else { TOKENS };
    let acts: Vec<(usize, usize, Acts)> = token_tiles(n, max)
        .map(|(t, nt)| (t, nt, Acts::new(input, pk, t)))
        .collect();
    if interleaved {
        return interleaved_rows(w, st, per, pairs, &acts, tiles, rows, out, ld);
    }
    SCRATCH.with(|s| {
        let (codes, scales, sums) = &mut *s.borrow_mut();
        let mut acc = [ZERO; TILE];
        if n <= by_rows {
            // Decode and batched decode: the rows of a group one after another, each read
            // once for all the tokens ([`row_sums`]), then the group's float part per token
            // ([`finish`]).
            let chunks = pairs.div_ceil(CHUNK);
            let stride = TILE * chunks * 8;
            let srow = w.format.scale_row_bytes(w.cols);
            sums.resize(ROWS * stride, 0);
            scales.resize(per * pairs * ROWS, 0.0);
            let mut r0 = rows.start;
            while r0 < rows.end {
                let g = Group::new(w, r0, rows.end);
                // The next group's scales: a short stream of its own, read all at once.
                let next = g.s[0].wrapping_add(ROWS * srow);
                for l in (0..ROWS * srow).step_by(64) {
                    prefetch(next.wrapping_add(l));
                }
                transpose_scales(&g, st, 0, pairs, scales.as_mut_ptr());
                for i in 0..g.rows {
                    let dst = sums.as_mut_ptr().add(i * stride);
                    for &(t, nt, a) in &acts {
                        row_sums[nt - 1](g.w[i], a, pairs, dst.add(t * chunks * 8));
                    }
                }
                for &(t, nt, a) in &acts {
                    for j in 0..nt {
                        finish(
                            sums.as_ptr().add((t + j) * chunks * 8),
                            stride,
                            scales.as_ptr(),
                            a,
                            j,
                            pairs,
                            (0, chunks),
                            &mut acc[t + j],
                        );
                    }
                }
                store(&acc[..n], 0, r0, g.rows, out, ld);
                acc[..n].fill(ZERO);
                r0 += ROWS;
            }
            return;
        }
        // Prefill: a chunk of rows interleaved once (it stays in L2), then every token
        // tile passes over it group by group.
        let (rb, sb) = (w.format.row_bytes(w.cols), w.format.scale_row_bytes(w.cols));
        let row_bytes = rb + sb;
        // One token tile (up to 8 tokens on VNNI: most experts of a prefill chunk) reads
        // the interleaved rows once, so they need not stay in L2: a group at a time, the
        // next group's rows prefetched while this one's tile computes. More tiles share a
        // chunk of rows that stays in L2, and the next chunk is prefetched as they run.
        // `expert_bench 6 64` (OLMoE's experts, 64 tokens): with the prefetch 111–137
        // against 96–122 GMAC/s (3 alternated runs each).
        let rc = if acts.len() == 1 {
            ROWS
        } else {
            (L2_ROWS / row_bytes.max(1)).clamp(ROWS, 256) / ROWS * ROWS
        };
        let group_codes = pairs * PAIR_BYTES;
        let group_scales = per * pairs * ROWS;
        codes.resize(rc / ROWS * group_codes, 0);
        scales.resize(rc / ROWS * group_scales, 0.0);
        let mut groups: Vec<Group> = Vec::with_capacity(rc / ROWS);
        let mut c0 = rows.start;
        while c0 < rows.end {
            let c1 = (c0 + rc).min(rows.end);
            groups.clear();
            groups.extend((c0..c1).step_by(ROWS).map(|r| Group::new(w, r, c1)));
            for (k, g) in groups.iter().enumerate() {
                interleave(
                    g,
                    st,
                    0,
                    pairs,
                    codes.as_mut_ptr().add(k * group_codes),
                    scales.as_mut_ptr().add(k * group_scales),
                );
            }
            // The next chunk's rows into L2 while this one's tiles compute, a slice before
            // each group of the first token tile.
            let n1 = (c1 + rc).min(rows.end);
            let next_codes = (w.data.as_ptr().wrapping_add(c1 * rb), (n1 - c1) * rb);
            let next_scales = (w.scales.as_ptr().wrapping_add(c1 * sb), (n1 - c1) * sb);
            let slices = groups.len();
            for (ti, &(t, nt, a)) in acts.iter().enumerate() {
                for (k, g) in groups.iter().enumerate() {
                    if ti == 0 {
                        prefetch_slice(next_codes, k, slices);
                        prefetch_slice(next_scales, k, slices);
                    }
                    let acc = &mut acc[..nt];
                    acc.fill(ZERO);
                    tiles[nt - 1](
                        codes.as_ptr().add(k * group_codes),
                        scales.as_ptr().add(k * group_scales),
                        a,
                        0,
                        pairs,
                        acc.as_mut_ptr(),
                    );
                    store(acc, t, c0 + k * ROWS, g.rows, out, ld);
                }
            }
            c0 = c1;
        }
    });
}

/// [`matmul_rows`] on rows stored interleaved ([`crate::rows8`]): the tiles read the groups
/// where they lie, for decode as for prefill, with no transposes; only f16 scales are
/// widened, a group (or a chunk of groups that stays in L2 for several token tiles) at a
/// time. The same tiles, so the same bits as on row-major int4.
#[allow(clippy::too_many_arguments)]
unsafe fn interleaved_rows(
    w: &Weights,
    st: ScaleType,
    per: usize,
    pairs: usize,
    acts: &[(usize, usize, Acts)],
    tiles: &[TileFn],
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    let group_codes = pairs * PAIR_BYTES;
    let units = per * pairs;
    let group_scales = units * ROWS;
    let (rb, sb) = (w.format.row_bytes(w.cols), w.format.scale_row_bytes(w.cols));
    // One token tile (decode, and most experts of a prefill chunk) reads each group once,
    // a group at a time, as one sequential stream that the hardware prefetchers follow: a
    // software prefetch of the group one or more ahead, as [`matmul_rows`] does for the rows
    // it interleaves, cut a 256 MiB decode from 34 to 18–22 GB/s (`kernel_bench 256 2 1`,
    // the yardstick 34 GB/s). More token tiles share a chunk of groups that stays in L2, the
    // next chunk prefetched while they run.
    let (rc, prefetch_next) = if acts.len() == 1 {
        (ROWS, false)
    } else {
        (
            (L2_ROWS / (rb + sb).max(1)).clamp(ROWS, 256) / ROWS * ROWS,
            true,
        )
    };
    SCRATCH.with(|s| {
        let (_, scales, _) = &mut *s.borrow_mut();
        scales.resize(rc / ROWS * group_scales, 0.0);
        let mut acc = [ZERO; TILE];
        let mut c0 = rows.start;
        while c0 < rows.end {
            let c1 = (c0 + rc).min(rows.end);
            let groups = (c1 - c0) / ROWS;
            let codes = w.data.as_ptr().add(c0 * rb);
            let sv: *const f32 = if st == ScaleType::F32 {
                w.scales.as_ptr().add(c0 * sb) as *const f32
            } else {
                widen_f16_scales(
                    w.scales.as_ptr().add(c0 * sb),
                    groups * group_scales,
                    scales.as_mut_ptr(),
                );
                scales.as_ptr()
            };
            let n1 = (c1 + rc).min(rows.end);
            let next_codes = (w.data.as_ptr().wrapping_add(c1 * rb), (n1 - c1) * rb);
            let next_scales = (w.scales.as_ptr().wrapping_add(c1 * sb), (n1 - c1) * sb);
            for (ti, &(t, nt, a)) in acts.iter().enumerate() {
                for k in 0..groups {
                    if ti == 0 && prefetch_next {
                        prefetch_slice(next_codes, k, groups);
                        prefetch_slice(next_scales, k, groups);
                    }
                    let acc = &mut acc[..nt];
                    acc.fill(ZERO);
                    tiles[nt - 1](
                        codes.add(k * group_codes),
                        sv.add(k * group_scales),
                        a,
                        0,
                        pairs,
                        acc.as_mut_ptr(),
                    );
                    store(acc, t, c0 + k * ROWS, ROWS, out, ld);
                }
            }
            c0 = c1;
        }
    });
}
