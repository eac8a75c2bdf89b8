//! MXFP4 rows ([`WeightFormat::Mxfp4`](super::WeightFormat::Mxfp4)), as OpenAI's gpt-oss
//! checkpoints publish their routed experts (`*_blocks` + `*_scales`, read as they lie, no
//! conversion): the codes and scales the kernels (`kernels/mxfp4.rs`) read and the
//! quantizer writes.
//!
//! A row is blocks of 32 elements: 16 bytes of FP4 (e2m1) codes, element `2k` of the block in
//! the low nibble of byte `k` and element `2k + 1` in its high nibble, and one E8M0 scale
//! byte per block, `2^(e - 127)`. Code `c` means [`VALUES`]`[c]` (bit 3 the sign, then two
//! exponent bits and one mantissa bit): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
//! Twice a value is an integer of at most 12 ([`DOUBLED`]), so with int8 activations a
//! block's sum is exact in integers. A row's last block may be partial (its unused nibbles
//! are ignored).

use super::{block_range, QBLOCK};

/// FP4 e2m1 values by code, as transformers' `FP4_VALUES`.
pub const VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Twice [`VALUES`]: the integers the int8 paths multiply.
pub const DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Bytes of codes per block of 32.
pub const BLOCK_BYTES: usize = QBLOCK / 2;

/// The code (0..16) of element `j` of a row.
#[inline(always)]
pub fn code(w: &[u8], j: usize) -> u8 {
    (w[j / 2] >> ((j & 1) * 4)) & 0x0F
}

/// An E8M0 scale byte as f32: `2^(e - 127)` (255, NaN in the OCP spec, reads as 2^128 = inf).
#[inline(always)]
pub fn scale(e: u8) -> f32 {
    if e == 0 {
        f32::from_bits(1 << 22) // 2^-127, a subnormal
    } else {
        f32::from_bits((e as u32) << 23)
    }
}

/// Nearest E8M0 scale and FP4 codes for values (tests and synthetic weights): per block the
/// scale `2^(floor(log2(amax)) - 2)` (so the largest magnitude lands in 4..8 of the code
/// range), each value rounded to the nearest code. Appends `cols.div_ceil(32) * 16` code
/// bytes to `codes` and one scale byte per block to `scales`.
pub fn quantize_row(x: &[f32], codes: &mut Vec<u8>, scales: &mut Vec<u8>) {
    for b in 0..x.len().div_ceil(QBLOCK) {
        let r = block_range(b, x.len());
        let amax = x[r.clone()].iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() as i32 - 2 + 127).clamp(1, 254) as u8
        } else {
            127
        };
        let s = scale(e);
        scales.push(e);
        let mut block = [0u8; BLOCK_BYTES];
        for (k, &v) in x[r].iter().enumerate() {
            let c = nearest_code(v / s);
            block[k / 2] |= c << ((k & 1) * 4);
        }
        codes.extend_from_slice(&block);
    }
}

/// The code whose value is nearest `v` (ties to the lower magnitude).
fn nearest_code(v: f32) -> u8 {
    let mut best = 0u8;
    for c in 0..8u8 {
        if (VALUES[c as usize] - v.abs()).abs() < (VALUES[best as usize] - v.abs()).abs() {
            best = c;
        }
    }
    if v < 0.0 && best != 0 {
        best | 8
    } else {
        best
    }
}
