//! Per-sequence KV caches. One [`KvCache`] holds every layer's keys and values for the
//! positions a sequence has seen so far; the forward pass appends to it.
//!
//! Keys and values of grouped-query attention are stored in f16 by default ([`KvDtype`]):
//! half the memory and half the bytes attention reads per decoded token, as llama.cpp's
//! default cache; it moves the fixtures' logits by at most 1.4e-3 (tolerance 2e-3). MLA's
//! latent cache (already 4–8× smaller than expanded keys and values) stays f32: in f16 it
//! moves two MLA fixtures' logits past the tolerance (2.2e-3 and 2.8e-3). `COLIBRI_KV=f32|f16` forces
//! one dtype for every layer. Values beyond f16's range are clamped to ±65504 rather than
//! stored as infinities. The attention kernels over stored rows ([`KvRow::dot`], [`KvRow::axpy_to`])
//! convert on the fly (F16C on x86-64) and are tested against a scalar reference.

mod cache;
pub mod ops;
mod snapshot;

pub use cache::{KvBuf, KvCache, KvDtype, LayerKv};
pub use ops::KvRow;
