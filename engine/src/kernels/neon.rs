//! NEON kernels (aarch64). f32, bf16 and int8 rows have SIMD paths; the other formats use
//! the scalar reference until they get their own.

use super::{scalar, Act};
use crate::format::{ScaleType, WeightFormat};
use std::arch::aarch64::*;

#[target_feature(enable = "neon")]
pub unsafe fn dot_act(format: WeightFormat, w: &[u8], scales: &[u8], act: &Act) -> f32 {
    if act.q8.is_some() {
        return scalar::dot_act(format, w, scales, act);
    }
    match format {
        WeightFormat::F32 => match bytemuck::try_cast_slice::<u8, f32>(w) {
            Ok(wf) => dot_f32(wf, &act.x),
            Err(_) => scalar::dot(format, w, scales, &act.x),
        },
        WeightFormat::BF16 => dot_bf16(w, &act.x),
        WeightFormat::I8Row => dot_i8(w, &act.x) * scalar::scale_at(ScaleType::F32, scales, 0),
        _ => scalar::dot(format, w, scales, &act.x),
    }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = vdupq_n_f32(0.0);
    let mut acc1 = vdupq_n_f32(0.0);
    let mut i = 0;
    while i + 8 <= n {
        acc0 = vfmaq_f32(acc0, vld1q_f32(pa.add(i)), vld1q_f32(pb.add(i)));
        acc1 = vfmaq_f32(acc1, vld1q_f32(pa.add(i + 4)), vld1q_f32(pb.add(i + 4)));
        i += 8;
    }
    let mut s = vaddvq_f32(vaddq_f32(acc0, acc1));
    while i < n {
        s = a[i].mul_add(b[i], s);
        i += 1;
    }
    s
}

#[target_feature(enable = "neon")]
unsafe fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (pw, px) = (w.as_ptr() as *const u16, x.as_ptr());
    let mut acc0 = vdupq_n_f32(0.0);
    let mut acc1 = vdupq_n_f32(0.0);
    let mut i = 0;
    while i + 8 <= n {
        let v = vld1q_u16(pw.add(i));
        let lo = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v)));
        let hi = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_high_u16(v)));
        acc0 = vfmaq_f32(acc0, lo, vld1q_f32(px.add(i)));
        acc1 = vfmaq_f32(acc1, hi, vld1q_f32(px.add(i + 4)));
        i += 8;
    }
    let mut s = vaddvq_f32(vaddq_f32(acc0, acc1));
    while i < n {
        s = scalar::bf16_to_f32(w[2 * i], w[2 * i + 1]).mul_add(x[i], s);
        i += 1;
    }
    s
}

#[target_feature(enable = "neon")]
unsafe fn dot_i8(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let (pw, px) = (w.as_ptr() as *const i8, x.as_ptr());
    let mut acc0 = vdupq_n_f32(0.0);
    let mut acc1 = vdupq_n_f32(0.0);
    let mut i = 0;
    while i + 8 <= n {
        let v = vmovl_s8(vld1_s8(pw.add(i)));
        let lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(v)));
        let hi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(v)));
        acc0 = vfmaq_f32(acc0, lo, vld1q_f32(px.add(i)));
        acc1 = vfmaq_f32(acc1, hi, vld1q_f32(px.add(i + 4)));
        i += 8;
    }
    let mut s = vaddvq_f32(vaddq_f32(acc0, acc1));
    while i < n {
        s = (w[i] as i8 as f32).mul_add(x[i], s);
        i += 1;
    }
    s
}
