//! Activations as the kernels read them: one row prepared for a format ([`Act`], the per-row
//! kernels), and [`Input`], rows prepared once for every matrix that reads them (int8 per
//! 32-element block, int4 order, packed by 8-token tiles for the SIMD tiles). How each form
//! is made is `prepare.rs`'s.

use crate::format::WeightFormat;
use std::sync::{Arc, Mutex, OnceLock};

/// One activation row quantized to int8 per 32-element block: `x[j] ≈ q[j] * d[j / 32]`.
#[derive(Clone, Copy, Debug)]
pub struct Q8Row<'a> {
    /// Natural order.
    pub q: &'a [i8],
    /// One scale per block (the last block may be partial).
    pub d: &'a [f32],
    /// `sum(q)` per block (the offset correction of the int4/int2 codes).
    pub qsum: &'a [i32],
}

/// One activation row of an [`Input`] as the reference kernels see it (borrowed).
#[derive(Clone, Copy, Debug)]
pub struct ActRow<'a> {
    pub x: &'a [f32],
    /// Present when the matrix uses int8 activations.
    pub q8: Option<Q8Row<'a>>,
}

/// Quantized activations as the reference kernels read them (either form).
pub trait Q8View {
    fn q(&self) -> &[i8];
    fn d(&self) -> &[f32];
}

impl Q8View for Q8Row<'_> {
    fn q(&self) -> &[i8] {
        self.q
    }
    fn d(&self) -> &[f32] {
        self.d
    }
}

impl Q8View for Q8Act {
    fn q(&self) -> &[i8] {
        &self.q
    }
    fn d(&self) -> &[f32] {
        &self.d
    }
}

// The per-row API (one owned prepared row per call): the per-row kernels (NEON, formats
// without tiles) and the reference fallback use it; the tiles use `Input`.

/// Activations quantized to int8 per 32-element block: `x[j] ≈ q[j] * d[j / 32]`.
#[derive(Clone, Debug, Default)]
pub struct Q8Act {
    /// Natural order.
    pub q: Vec<i8>,
    /// One scale per block (the last block may be partial).
    pub d: Vec<f32>,
    /// `sum(q)` per block (the offset correction of the int4/int2 codes).
    pub qsum: Vec<i32>,
    /// int4 SIMD order: per pair of full blocks A, B: `[A even | B even | A odd | B odd]`
    /// (int3-g64, int2-plain and int5 have their own orders: `lowbit::order_q8`, `int5::order_q8`).
    pub qp: Vec<i8>,
    /// int4 SIMD: per pair, the block scales as the 8 lanes of the pair's sums `[dA×4, dB×4]`.
    pub d8: Vec<f32>,
    /// int4 SIMD: per pair, the code offset `8·sum(q)` of A in lane 0 and of B in lane 4, so
    /// the correction is one integer subtraction.
    pub corr8: Vec<i32>,
}

/// One activation row prepared for one weight format.
#[derive(Clone, Debug, Default)]
pub struct Act {
    /// The activations, natural order.
    pub x: Vec<f32>,
    /// int4 f32 path: per full block, `[even 0..16 | odd 0..16 | even 16..32 | odd 16..32]`.
    pub xp: Vec<f32>,
    /// Sum of `x` per full block (offset correction of the int4/int2 codes).
    pub bsum: Vec<f32>,
    pub q8: Option<Q8Act>,
}

/// `n` activation rows quantized per block (natural order), back to back.
#[derive(Clone, Debug, Default)]
pub struct Q8Rows {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub qsum: Vec<i32>,
}

/// Tokens per packed tile of activations.
pub const TILE: usize = 8;

/// Activations packed for the SIMD tiles, as GEMM libraries pack their second operand:
/// tokens in tiles of [`TILE`] (the last may hold fewer), and within a tile unit after unit
/// (a 32-element block, or an int4 pair of blocks), each unit holding its tokens side by
/// side. A tile's units are contiguous, so a kernel walks them with one pointer and a small
/// constant stride, and a token's place within the unit is a constant offset.
/// `at(t, u)` is the index, in units of one token's unit, of token `t`'s unit `u`.
#[derive(Clone, Copy, Debug)]
pub struct Packing {
    pub n: usize,
    /// Units per token.
    pub units: usize,
}

impl Packing {
    /// Tokens in the tile holding token `t`.
    #[inline(always)]
    pub fn slots(&self, t: usize) -> usize {
        (self.n - t / TILE * TILE).min(TILE)
    }
    /// Index of token `t`'s unit 0; unit `u` is `slots(t) · u` further.
    #[inline(always)]
    pub fn base(&self, t: usize) -> usize {
        t / TILE * TILE * self.units + t % TILE
    }
    #[inline(always)]
    pub fn at(&self, t: usize, u: usize) -> usize {
        self.base(t) + u * self.slots(t)
    }
}

/// f32 activations packed by 32-element block ([`Packing`]; full blocks only), in natural
/// order or in int4 order: per block `[even 0..16 | odd 0..16 | even 16..32 | odd 16..32]`,
/// read as four 8-lane chunks: low nibbles of bytes 0..8, high nibbles of bytes 0..8, low of
/// 8..16, high of 8..16.
#[derive(Clone, Debug, Default)]
pub struct F32Panel {
    pub x: Vec<f32>,
}

/// Quantized activations packed by 32-element block ([`Packing`]; full blocks only): codes
/// (32 per unit), scales and sums (one per unit).
#[derive(Clone, Debug, Default)]
pub struct Q8Panel {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub qsum: Vec<i32>,
}

/// Quantized activations in int4 order, packed by pair of full blocks A, B ([`Packing`]):
/// `qp` = 64 codes `[A even | B even | A odd | B odd]` (matching the nibbles of 32 packed
/// bytes), `d8` = the block scales as the 8 lanes of the pair's sums `[dA×4, dB×4]`,
/// `corr8` = the code offset `8·sum(q)` of A in lane 0 and of B in lane 4 (so the
/// correction is one integer subtraction).
#[derive(Clone, Debug, Default)]
pub struct Q8I4Panel {
    pub qp: Vec<i8>,
    pub d8: Vec<f32>,
    pub corr8: Vec<i32>,
    /// Per token (natural order, `pairs` each) the pair's offset in f32,
    /// `8·(dA·sum(qA) + dB·sum(qB))`, for kernels that subtract it once per row.
    pub cp: Vec<f32>,
}

/// Activation rows prepared once for every matrix that reads them. The f32 rows are
/// borrowed; the other forms are made on first use (thread-safe) and kept.
pub struct Input<'a> {
    pub x: &'a [f32],
    pub n: usize,
    pub cols: usize,
    pub(super) q8: OnceLock<Q8Rows>,
    pub(super) q8_panel: OnceLock<Q8Panel>,
    pub(super) q8_i4: OnceLock<Q8I4Panel>,
    pub(super) x_panel: OnceLock<F32Panel>,
    pub(super) x_i4: OnceLock<F32Panel>,
    /// The rows rounded to bf16, each padded with zeros to whole 16-column chunks
    /// ([`Input::x_bf16`]).
    pub(super) x_bf16: OnceLock<(Vec<u16>, usize)>,
    /// Rows prepared one by one for the per-row kernels, per (format, int8).
    pub(super) per_row: Mutex<Vec<PerRow>>,
}

pub(super) type PerRow = ((WeightFormat, bool), Arc<[Act]>);
