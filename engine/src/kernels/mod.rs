//! Compute kernels: matrix products of weight rows in every storage format against
//! activation rows.
//!
//! Every format has a scalar reference ([`scalar`]) that defines the result. The SIMD level
//! is chosen once at run time ([`level`], `COLIBRI_ISA`), and every SIMD kernel is tested
//! against the reference (`tests.rs`).
//!
//! Activations are prepared once per input ([`Input`]) and shared by every matrix that reads
//! that input (q/k/v, gate/up): quantized to int8 per 32-element block for the integer
//! kernels, or permuted to match the int4 packing, lazily, the first time a matrix needs it.
//!
//! A product runs as register tiles of `R` weight rows × `T` activation rows ([`matmul`]):
//! each weight row is loaded and unpacked once per tile and applied to all `T` tokens. Every
//! (row, token) pair has its own accumulator and visits the row in the same order whatever
//! the tile shape, so a token's result does not depend on how many tokens were batched with
//! it (decode is the `T = 1` case of the same kernel).

pub mod ct_int4;
pub mod int5;
pub mod lowbit;
pub mod mxfp4;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_row;
#[cfg(target_arch = "x86_64")]
mod avx2_rows8;
#[cfg(target_arch = "x86_64")]
pub mod avx512_bf16;
#[cfg(target_arch = "aarch64")]
mod neon;

mod dot;
mod input;
mod isa;
mod matmul;
mod policy;
mod prepare;
pub mod team;
mod weights;

// The module's door: everything above is reached through these paths.
pub use crate::format::{block_range, QBLOCK};
pub use dot::{decode_row, dot, dot_act, dot_f32, sum_bytes_as_f32};
pub use input::{
    Act, ActRow, F32Panel, Input, Packing, Q8Act, Q8I4Panel, Q8Panel, Q8Row, Q8Rows, Q8View, TILE,
};
pub use isa::{avx2, bf16_act, bf16_act_supported, cpu_features, detect, isa_report, level, Level};
pub use matmul::{matmul, matmul_each, matmul_many};
pub use policy::{
    int4_rows8, int8_act_for, int8_act_mode, q8_supported, set_int8_act_mode, set_int8_activations,
    Int8Act,
};
pub use prepare::{prepare, quantize_act, quantize_row};
pub use scalar::dot_f32 as dot_f32_scalar;
pub use weights::Weights;

#[cfg(test)]
mod tests;
