//! Quantizers for the colibri C engine's int3-g64 and plain int2 formats
//! ([`WeightFormat::I3G64`], [`WeightFormat::I2Plain`]), with the C converter's arithmetic:
//! `scale = max(amax / qmax, 1e-8)` in f32 per group (int3: 64 elements, qmax 3) or per row
//! (int2: qmax 1), codes `clamp(round_half_even(v / scale), -qmax - 1, qmax) + qmax + 1`.
//! A row quantized here has exactly the bytes the C converter writes for it
//! (`tools/c_containers/cformats.py` is the reference these are tested against).

use crate::format::lowbit::{pack_i3, pack_plain2, I3_GROUP};

fn scale_of(v: &[f32], qmax: f32) -> f32 {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    (amax / qmax).max(1e-8)
}

/// One row of int3-g64: codes and one f32 scale per 64-element group (appending).
pub fn quantize_row_i3(row: &[f32], data: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let mut codes = Vec::with_capacity(row.len());
    for group in row.chunks(I3_GROUP) {
        let s = scale_of(group, 3.0);
        codes.extend(
            group
                .iter()
                .map(|v| ((v / s).round_ties_even().clamp(-4.0, 3.0) + 4.0) as u8),
        );
        scales.extend_from_slice(&s.to_le_bytes());
    }
    pack_i3(&codes, data);
}

/// One row of plain int2: codes and one f32 scale (appending).
pub fn quantize_row_i2_plain(row: &[f32], data: &mut Vec<u8>, scales: &mut Vec<u8>) {
    let s = scale_of(row, 1.0);
    let codes: Vec<u8> = row
        .iter()
        .map(|v| ((v / s).round_ties_even().clamp(-2.0, 1.0) + 2.0) as u8)
        .collect();
    pack_plain2(&codes, data);
    scales.extend_from_slice(&s.to_le_bytes());
}
