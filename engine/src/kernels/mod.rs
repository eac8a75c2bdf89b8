//! Compute kernels: dot products of one weight row against activations, per storage format.
//!
//! Every format has a scalar reference ([`scalar`]) that defines the result; the SIMD paths
//! (AVX2+FMA+F16C on x86-64, NEON on aarch64) are chosen once at run time and are tested
//! against the reference. Activations are first *prepared* for a format ([`prepare`]): the
//! SIMD paths want them permuted to match the weights' packing (so the hot loop needs no
//! shuffles), with per-block sums precomputed, and optionally quantized to int8 per
//! 32-element block for integer dot products.

pub mod lowbit;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "aarch64")]
mod neon;

use crate::tensor::WeightFormat;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

pub use scalar::dot_f32 as dot_f32_scalar;

/// Elements per activation-quantization block (and per int2 packing block).
pub const QBLOCK: usize = 32;

/// Elements `b*32 .. min((b+1)*32, cols)`.
#[inline]
pub fn block_range(b: usize, cols: usize) -> std::ops::Range<usize> {
    b * QBLOCK..((b + 1) * QBLOCK).min(cols)
}

/// Which kernel family runs on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Scalar,
    Avx2,
    Neon,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2+fma",
            Level::Neon => "neon",
        }
    }
}

fn detect() -> Level {
    // COLIBRI_KERNELS=scalar forces the reference path (benchmarks, debugging).
    if std::env::var("COLIBRI_KERNELS").is_ok_and(|v| v == "scalar") {
        return Level::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return Level::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Level::Neon;
        }
    }
    Level::Scalar
}

/// The kernel family in use (detected once, then cached).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}

/// When routed-expert matrices quantize their activations to int8 (per 32-element block)
/// and use integer dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Act {
    /// Never: exact f32 activations everywhere.
    Off,
    /// For int4 and int2 experts only (the default). Measured on every fixture family, it
    /// moves the mean KL divergence from transformers by under 1% of what the int4 weights
    /// themselves cost, and it is what lets int4 matvec run at memory speed (docs/FORMAT.md).
    /// int8 experts keep f32 activations: there it doubles the (small) divergence.
    SubByte,
    /// For every quantized routed expert, int8 too.
    All,
}

// 0 = not yet read from the environment, else 1 + the mode's index.
static INT8_ACT: AtomicU8 = AtomicU8::new(0);

/// The int8-activation policy: `COLIBRI_INT8_ACT=0|1|subbyte` (off, all, the default) or
/// [`set_int8_activations`]. Read when a model is loaded; attention is never affected.
pub fn int8_act_mode() -> Int8Act {
    let modes = [Int8Act::Off, Int8Act::SubByte, Int8Act::All];
    match INT8_ACT.load(Ordering::Relaxed) {
        0 => {
            let m = match std::env::var("COLIBRI_INT8_ACT").as_deref() {
                Ok("0") | Ok("off") | Ok("false") => Int8Act::Off,
                Ok("1") | Ok("all") | Ok("true") => Int8Act::All,
                _ => Int8Act::SubByte,
            };
            set_int8_act_mode(m);
            m
        }
        v => modes[(v - 1) as usize],
    }
}

pub fn set_int8_act_mode(m: Int8Act) {
    let v = match m {
        Int8Act::Off => 1,
        Int8Act::SubByte => 2,
        Int8Act::All => 3,
    };
    INT8_ACT.store(v, Ordering::Relaxed);
}

/// `true`: int8 activations for every quantized routed expert; `false`: none.
pub fn set_int8_activations(on: bool) {
    set_int8_act_mode(if on { Int8Act::All } else { Int8Act::Off });
}

/// Whether a routed expert stored in `format` gets int8 activations under the policy.
pub fn int8_act_for(format: WeightFormat) -> bool {
    match int8_act_mode() {
        Int8Act::Off => false,
        Int8Act::All => format.is_quantized(),
        Int8Act::SubByte => matches!(
            format,
            WeightFormat::I4 { .. }
                | WeightFormat::I2 { .. }
                | WeightFormat::I3G64
                | WeightFormat::I2Plain
        ),
    }
}

/// Whether int8 activations can be used with `format` on rows of `cols`: quantized weights
/// whose scale groups are whole 32-element blocks (or one group per row).
pub fn q8_supported(format: WeightFormat, cols: usize) -> bool {
    format.is_quantized()
        && format
            .group_len(cols)
            .is_some_and(|g| g % QBLOCK == 0 || g >= cols)
}

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
    /// (int3-g64 and int2-plain have their own order, see `lowbit::order_q8`).
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

/// Quantizes `x` per 32-element block, symmetric, round to nearest.
pub fn quantize_act(x: &[f32], with_int4_order: bool) -> Q8Act {
    let nb = x.len().div_ceil(QBLOCK);
    let mut a = Q8Act {
        q: vec![0; x.len()],
        d: vec![0.0; nb],
        qsum: vec![0; nb],
        ..Default::default()
    };
    for b in 0..nb {
        let r = block_range(b, x.len());
        let amax = x[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut s = 0i32;
        for j in r {
            let q = (x[j] * inv).round().clamp(-127.0, 127.0) as i8;
            a.q[j] = q;
            s += q as i32;
        }
        a.d[b] = d;
        a.qsum[b] = s;
    }
    if with_int4_order {
        let pairs = x.len() / QBLOCK / 2;
        a.qp = vec![0; pairs * 64];
        a.d8 = vec![0.0; pairs * 8];
        a.corr8 = vec![0; pairs * 8];
        for p in 0..pairs {
            for k in 0..4 {
                a.d8[p * 8 + k] = a.d[2 * p];
                a.d8[p * 8 + 4 + k] = a.d[2 * p + 1];
            }
            a.corr8[p * 8] = 8 * a.qsum[2 * p];
            a.corr8[p * 8 + 4] = 8 * a.qsum[2 * p + 1];
            let out = &mut a.qp[p * 64..(p + 1) * 64];
            for (h, blk) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                let q = &a.q[blk * QBLOCK..(blk + 1) * QBLOCK];
                for k in 0..16 {
                    out[h * 16 + k] = q[2 * k];
                    out[32 + h * 16 + k] = q[2 * k + 1];
                }
            }
        }
    }
    a
}

/// Prepares one activation row for `format`. `int8` asks for quantized activations; it is
/// honoured only where [`q8_supported`].
pub fn prepare(format: WeightFormat, x: &[f32], int8: bool) -> Act {
    let cols = x.len();
    let full = cols / QBLOCK;
    let mut act = Act {
        x: x.to_vec(),
        ..Default::default()
    };
    if int8 && q8_supported(format, cols) {
        let mut q = quantize_act(x, matches!(format, WeightFormat::I4 { .. }));
        if matches!(format, WeightFormat::I3G64 | WeightFormat::I2Plain) {
            lowbit::order_q8(format, &mut q);
        }
        act.q8 = Some(q);
        return act;
    }
    if matches!(
        format,
        WeightFormat::I4 { .. }
            | WeightFormat::I2 { .. }
            | WeightFormat::I3G64
            | WeightFormat::I2Plain
    ) {
        act.bsum = (0..full)
            .map(|b| x[b * QBLOCK..(b + 1) * QBLOCK].iter().sum())
            .collect();
    }
    if matches!(format, WeightFormat::I4 { .. }) {
        act.xp = vec![0.0; full * QBLOCK];
        for b in 0..full {
            let src = &x[b * QBLOCK..(b + 1) * QBLOCK];
            let dst = &mut act.xp[b * QBLOCK..(b + 1) * QBLOCK];
            for half in 0..2 {
                for k in 0..8 {
                    dst[half * 16 + k] = src[half * 16 + 2 * k];
                    dst[half * 16 + 8 + k] = src[half * 16 + 2 * k + 1];
                }
            }
        }
    }
    act
}

/// `dot(row, act)` for one weight row in `format` with its scales, on the fastest path.
#[inline]
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    if matches!(format, WeightFormat::I3G64 | WeightFormat::I2Plain) {
        return lowbit::dot_act(format, w, scales, act);
    }
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: Level::Avx2 is only chosen when avx2, fma and f16c are detected.
        Level::Avx2 => unsafe { avx2::dot_act(format, w, scales, act) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: Level::Neon is only chosen when neon is detected.
        Level::Neon => unsafe { neon::dot_act(format, w, scales, act) },
        _ => scalar::dot_act(format, w, scales, act),
    }
}

/// `dot(a, b)` of two f32 vectors on the fastest path.
#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_act`.
        Level::Avx2 => unsafe { avx2::dot_f32(a, b) },
        _ => scalar::dot_f32(a, b),
    }
}

/// `dot(row, x)` with f32 activations (prepares `x` on every call: for one-off dots).
pub fn dot(format: WeightFormat, w: &[u8], scales: &[u8], x: &[f32]) -> f32 {
    dot_act(format, w, scales, &prepare(format, x, false))
}

/// Decodes (dequantizes) one row into `out` (length = cols).
pub fn decode_row(format: WeightFormat, w: &[u8], scales: &[u8], out: &mut [f32]) {
    scalar::decode_row(format, w, scales, out)
}

/// Sums a buffer with several AVX2 accumulators: the memory read bandwidth yardstick the
/// kernel benchmarks compare against (a naive sum is compute-bound far below bandwidth).
pub fn sum_bytes_as_f32(buf: &[u8]) -> f32 {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `dot_act`.
        Level::Avx2 => unsafe { avx2::sum_f32(buf) },
        _ => {
            let mut acc = [0f32; 16];
            for c in buf.chunks_exact(64) {
                for (i, a) in acc.iter_mut().enumerate() {
                    *a += f32::from_le_bytes([c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]]);
                }
            }
            acc.iter().sum()
        }
    }
}

#[cfg(test)]
mod tests;
