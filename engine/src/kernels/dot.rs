//! One row at a time on this level's kernels: dot products and decoding, for the per-row
//! paths, the reference fallback and one-off dots.

use super::input::Act;
use super::isa::{level, Level};
#[cfg(target_arch = "aarch64")]
use super::neon;
use super::prepare::prepare;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx2_row};
use super::{int5, lowbit, scalar};
use crate::format::WeightFormat;

/// `dot(row, act)` for one weight row in `format` with its scales, on the per-row kernels
/// of this level (AVX2, NEON, else the reference).
pub fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    if matches!(format, WeightFormat::I3G64 | WeightFormat::I2Plain) {
        return lowbit::dot_act(format, w, scales, act);
    }
    if matches!(format, WeightFormat::I5 { .. }) {
        return int5::dot_act(format, w, scales, act);
    }
    if crate::format::ct_int4::is(format) {
        return super::ct_int4::dot_act(format, w, scales, act);
    }
    if format == WeightFormat::Mxfp4 {
        return super::mxfp4::dot_act(format, w, scales, act);
    }
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        Level::Avx2 | Level::Avx512Vnni => unsafe { avx2_row::dot_act(format, w, scales, act) },
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
        // SAFETY: as in `quantize_row`.
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
        // SAFETY: as in `quantize_row`.
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
