//! compressed-tensors `pack-quantized` int4 ([`WeightFormat::I4Ct`], docs/FORMAT.md): the
//! value of an element. compressed-tensors dequantizes `q.to(scale.dtype) * scale` in the
//! scale's dtype, so the weight transformers computes with is the product rounded to that
//! dtype; this is that rounding, the one definition every kernel path keeps.
//!
//! The product of a code (`|q| ≤ 8`, 4 bits) and a bf16 or f16 scale (8 or 11 significant bits)
//! is exact in f32, so one f32 multiply followed by a round to the scale's dtype (to nearest,
//! ties to even, as torch rounds) gives compressed-tensors' value bit for bit.

use super::{ScaleType, WeightFormat};

/// The value of code `c` (the stored nibble, `q + 8`) under a group scale `s` stored as `st`.
#[inline(always)]
pub fn value(c: u8, s: f32, st: ScaleType) -> f32 {
    let p = (c as i32 - 8) as f32 * s;
    round_to(p, st)
}

/// `x` rounded to the precision of `st` (bf16, f16) and back; f32 and E8M0 scales leave an
/// f32 product as it is (E8M0 products are exact).
#[inline(always)]
pub fn round_to(x: f32, st: ScaleType) -> f32 {
    match st {
        ScaleType::BF16 => half::bf16::from_f32(x).to_f32(),
        ScaleType::F16 => half::f16::from_f32(x).to_f32(),
        ScaleType::F32 | ScaleType::E8M0 => x,
    }
}

/// The 16 values of a group's codes `0..16` (for the row kernels).
#[inline(always)]
pub fn table(s: f32, st: ScaleType) -> [f32; 16] {
    std::array::from_fn(|c| value(c as u8, s, st))
}

/// Whether `format` is compressed-tensors int4.
pub fn is(format: WeightFormat) -> bool {
    matches!(format, WeightFormat::I4Ct { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_products_round_as_torch_does() {
        // 1.0078125 = 1 + 2^-7 (8 significant bits); × 3 = 3.0234375 needs 9 bits.
        let s = 1.0078125f32;
        assert_eq!(value(8 + 3, s, ScaleType::BF16), 3.03125);
        assert_eq!(value(8 + 1, s, ScaleType::BF16), s);
        assert_eq!(value(0, s, ScaleType::BF16), -8.0625);
        assert_eq!(value(8 + 3, s, ScaleType::F32), 3.0234375);
        // A tie (…1 followed by 1000…) rounds to even: 1.0234375 × 3 = 3.0703125 = 0x4044_8000.
        assert_eq!(
            value(8 + 3, 1.0234375, ScaleType::BF16).to_bits(),
            0x4044_0000
        );
    }
}
