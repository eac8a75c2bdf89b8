//! bf16 weights × bf16 activations on AVX-512 BF16 (`vdpbf16ps`), opt-in with
//! `COLIBRI_BF16_ACT=1` ([`super::bf16_act`]).
//!
//! Why: a bf16 matrix with f32 activations (`avx2.rs`) widens every weight to f32 and pays
//! one FMA per 8 products; `vdpbf16ps` multiplies 16 bf16 pairs into 8 f32 lanes in one
//! instruction. The price is the activations rounded to bf16 (what llama.cpp does for its
//! bf16 matrices, and what a bf16 checkpoint computes with in transformers), so the results
//! are not the f32 path's bits: the switch is per process and off by default, and its cost
//! in accuracy is measured in docs/PERFORMANCE.md.
//!
//! Arithmetic (the reference is [`dot_ref`], bit for bit): per (row, token) one vector of 8
//! f32 lanes; 16 columns at a time, lane `i` adds the product of columns `2i + 1` and then
//! that of columns `2i` (each product exact, each sum rounded to nearest even, denormals
//! flushed: the instruction's definition); a row's last partial 16 columns count as zeros;
//! then the 8 lanes are summed as [`super::avx2::hsum`] does. Every tile shape runs that
//! same sequence, so a token gets the same bits in decode, batched decode and prefill.

#![allow(clippy::needless_range_loop)]

use super::avx2::{hsum, prefetch, PREFETCH};
use super::Input;
use std::arch::x86_64::*;

/// Columns per `vdpbf16ps` (16 bf16 pairs of weight and activation).
pub(super) const CHUNK: usize = 16;
/// Weight rows that stay in L2 while every token tile passes over them (prefill).
const L2_BYTES: usize = 192 << 10;
/// Token tile: 4 rows × 4 tokens are 16 accumulators, with the 4 weight vectors and an
/// activation in 21 of AVX-512's 32 vector registers.
const TOKENS: usize = 4;
const ROWS: usize = 4;

/// An f32 with a denormal flushed to (signed) zero, as `vdpbf16ps` treats its inputs and
/// results.
fn ftz(x: f32) -> f32 {
    if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// The reference: `dot(row, x)` for a row of `cols` bf16 weights (`w`, little-endian bytes)
/// and activations already rounded to bf16 (`x`, at least `cols` values), in the kernel's
/// order.
pub fn dot_ref(w: &[u8], x: &[u16], cols: usize) -> f32 {
    let bf = |b: u16| ftz(f32::from_bits((b as u32) << 16));
    let wv = |c: usize| {
        if c < cols {
            u16::from_le_bytes([w[2 * c], w[2 * c + 1]])
        } else {
            0
        }
    };
    let xv = |c: usize| if c < cols { x[c] } else { 0 };
    let mut lanes = [0f32; 8];
    for k in 0..cols.div_ceil(CHUNK) {
        for (i, acc) in lanes.iter_mut().enumerate() {
            let (e, o) = (k * CHUNK + 2 * i, k * CHUNK + 2 * i + 1);
            *acc = ftz(ftz(*acc) + bf(wv(o)) * bf(xv(o)));
            *acc = ftz(*acc + bf(wv(e)) * bf(xv(e)));
        }
    }
    // `hsum`: the two halves, then lanes 0+2 and 1+3, then those two.
    let s: [f32; 4] = std::array::from_fn(|i| lanes[i] + lanes[i + 4]);
    let (a, b) = (s[0] + s[2], s[1] + s[3]);
    a + b
}

/// `acc[r][j]` over the full chunks `0..full` and the masked tail, rows at `w` (`w_row`
/// bytes apart), tokens at `x` (`x_row` values apart, zero-padded to whole chunks); stores
/// the sums at `out[j * ld + r]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const T: usize>(
    w: *const u8,
    w_row: usize,
    cols: usize,
    x: *const u16,
    x_row: usize,
    out: *mut f32,
    ld: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let full = cols / CHUNK;
    for k in 0..full {
        if k % 2 == 0 {
            for r in 0..R {
                prefetch(w.add(r * w_row + k * 2 * CHUNK + PREFETCH));
            }
        }
        let wv: [__m256bh; R] = std::array::from_fn(|r| {
            std::mem::transmute(_mm256_loadu_si256(
                w.add(r * w_row + k * 2 * CHUNK) as *const __m256i
            ))
        });
        for j in 0..T {
            let xv: __m256bh = std::mem::transmute(_mm256_loadu_si256(
                x.add(j * x_row + k * CHUNK) as *const __m256i,
            ));
            for r in 0..R {
                acc[r][j] = _mm256_dpbf16_ps(acc[r][j], wv[r], xv);
            }
        }
    }
    let tail = cols - full * CHUNK;
    if tail > 0 {
        // The row's last columns: the bytes past its end are not read (masked to zero).
        let mask: __mmask16 = (1u32 << tail) as __mmask16 - 1;
        let wv: [__m256bh; R] = std::array::from_fn(|r| {
            std::mem::transmute(_mm256_maskz_loadu_epi16(
                mask,
                w.add(r * w_row + full * 2 * CHUNK) as *const i16,
            ))
        });
        for j in 0..T {
            let xv: __m256bh = std::mem::transmute(_mm256_loadu_si256(
                x.add(j * x_row + full * CHUNK) as *const __m256i,
            ));
            for r in 0..R {
                acc[r][j] = _mm256_dpbf16_ps(acc[r][j], wv[r], xv);
            }
        }
    }
    for r in 0..R {
        for j in 0..T {
            *out.add(j * ld + r) = hsum(acc[r][j]);
        }
    }
}

type TileFn = unsafe fn(*const u8, usize, usize, *const u16, usize, *mut f32, usize);

/// `[R == 4, R == 1][T - 1]`.
static TILES: [[TileFn; TOKENS]; 2] = [
    [tile::<4, 1>, tile::<4, 2>, tile::<4, 3>, tile::<4, 4>],
    [tile::<1, 1>, tile::<1, 2>, tile::<1, 3>, tile::<1, 4>],
];

/// `out[t * ld + r] = dot(row r, token t)` for `r` in `rows`, every token of `input`, with
/// the activations rounded to bf16 ([`Input::x_bf16`]).
///
/// # Safety
/// AVX2, FMA, F16C and AVX-512 F/BW/VL/BF16 must be present; `w` must be bf16; `out` must be
/// valid for those writes and not written by anyone else meanwhile.
pub(super) unsafe fn matmul_rows(
    w: &super::Weights,
    input: &Input,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    let cols = w.cols;
    let w_row = 2 * cols;
    let (xb, x_row) = input.x_bf16();
    let n = input.n;
    let rc = (L2_BYTES / w_row.max(1)).clamp(ROWS, 1024) / ROWS * ROWS;
    let mut c0 = rows.start;
    while c0 < rows.end {
        let c1 = (c0 + rc).min(rows.end);
        let mut t = 0;
        while t < n {
            let nt = (n - t).min(TOKENS);
            let mut r = c0;
            while r < c1 {
                let nr = if c1 - r >= ROWS { ROWS } else { 1 };
                TILES[usize::from(nr == 1)][nt - 1](
                    w.data.as_ptr().add(r * w_row),
                    w_row,
                    cols,
                    xb.as_ptr().add(t * x_row),
                    x_row,
                    out.add(t * ld + r),
                    ld,
                );
                r += nr;
            }
            t += nt;
        }
        c0 = c1;
    }
}
