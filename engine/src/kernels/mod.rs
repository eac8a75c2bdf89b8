//! Compute kernels: dot products and row decoding per weight format.
//!
//! These are written so the compiler vectorises them (several independent accumulators,
//! fixed-size chunks); hand-written SIMD paths come with the quantised formats.

use crate::tensor::WeightFormat;

/// Lanes of independent accumulators: breaks the add dependency chain so the loop
/// vectorises and pipelines (8 lanes × 4 = one 256-bit register per accumulator group).
const LANES: usize = 32;

#[inline]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let ca = a.chunks_exact(LANES);
    let cb = b.chunks_exact(LANES);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let mut s = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        s = x.mul_add(*y, s);
    }
    s + acc.iter().sum::<f32>()
}

#[inline(always)]
fn bf16_to_f32(lo: u8, hi: u8) -> f32 {
    f32::from_bits(((hi as u32) << 24) | ((lo as u32) << 16))
}

#[inline]
fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), 2 * x.len());
    let mut acc = [0f32; LANES];
    let cw = w.chunks_exact(2 * LANES);
    let cx = x.chunks_exact(LANES);
    let (rw, rx) = (cw.remainder(), cx.remainder());
    for (wc, xc) in cw.zip(cx) {
        for i in 0..LANES {
            acc[i] = bf16_to_f32(wc[2 * i], wc[2 * i + 1]).mul_add(xc[i], acc[i]);
        }
    }
    let mut s = 0f32;
    for (i, xv) in rx.iter().enumerate() {
        s = bf16_to_f32(rw[2 * i], rw[2 * i + 1]).mul_add(*xv, s);
    }
    s + acc.iter().sum::<f32>()
}

#[inline]
fn dot_via_decode(format: WeightFormat, w: &[u8], x: &[f32]) -> f32 {
    let mut tmp = vec![0f32; x.len()];
    decode_row(format, w, &mut tmp);
    dot_f32(&tmp, x)
}

/// `dot(w, x)` where `w` holds `x.len()` elements in `format`.
#[inline]
pub fn dot(format: WeightFormat, w: &[u8], x: &[f32]) -> f32 {
    match format {
        WeightFormat::BF16 => dot_bf16(w, x),
        WeightFormat::F32 => match bytemuck::try_cast_slice::<u8, f32>(w) {
            Ok(wf) => dot_f32(wf, x),
            Err(_) => dot_via_decode(format, w, x),
        },
        WeightFormat::F16 => dot_via_decode(format, w, x),
    }
}

/// Decodes one row of `format` elements into f32.
pub fn decode_row(format: WeightFormat, w: &[u8], out: &mut [f32]) {
    match format {
        WeightFormat::F32 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::BF16 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(2)) {
                *o = bf16_to_f32(c[0], c[1]);
            }
        }
        WeightFormat::F16 => {
            for (o, c) in out.iter_mut().zip(w.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_agree_with_naive_sums() {
        let n = 77;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
        let naive: f64 = x.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((dot_f32(&w, &x) as f64 - naive).abs() < 1e-4);
        let wb: Vec<u8> = w
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let naive_b: f64 = w
            .iter()
            .zip(&x)
            .map(|(a, b)| half::bf16::from_f32(*a).to_f64() * *b as f64)
            .sum();
        assert!((dot(WeightFormat::BF16, &wb, &x) as f64 - naive_b).abs() < 1e-4);
        let wh: Vec<u8> = w
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let naive_h: f64 = w
            .iter()
            .zip(&x)
            .map(|(a, b)| half::f16::from_f32(*a).to_f64() * *b as f64)
            .sum();
        assert!((dot(WeightFormat::F16, &wh, &x) as f64 - naive_h).abs() < 1e-4);
    }
}
