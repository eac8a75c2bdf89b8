//! colibri's inference engine as a plain library: no async runtime, no gRPC.
//!
//! Map (see ARCHITECTURE.md for more):
//! - [`container`]: opening Hub checkpoint folders; safetensors header/index validation.
//! - [`format`]: the weight formats and their byte layouts, the ground floor below everything.
//! - [`tensor`] and [`kernels`]: weight matrices and the dot/matmul kernels over them.
//! - [`arch`]: one file per model family plus the shared blocks (norms, RoPE, attention, MoE).
//! - [`kv`]: per-sequence KV caches.
//! - [`experts`]: routed experts streamed from disk into a budgeted cache.
//! - [`model`]: [`Model`], the loaded network with its text assets; the batched forward.
//! - [`text`]: tokenizer, chat template, incremental detokenization, stop strings.
//! - [`sample`] — samplers.
//! - [`generate`]: the step-by-step generation state machine shared by CLI and daemon.
//! - [`speculative`]: speculative decoding with the model's MTP layers.
//! - [`perplexity`]: llama-perplexity's windowed perplexity (and KL against a reference).

pub mod arch;
pub mod bench;
pub mod container;
pub mod convert;
pub mod error;
pub mod experts;
pub mod format;
pub mod generate;
pub mod kernels;
pub mod kv;
pub mod model;
pub mod perplexity;
pub mod quant;
pub mod sample;
pub mod speculative;
pub mod structured;
pub mod synth;
pub mod tensor;
pub mod text;

pub use error::{Error, Result};
// The int4-rows8 layout's old path (it lives with the other formats now).
pub use format::rows8;
pub use generate::{FinishReason, GenerateRequest, Generation, StepEvent};
pub use kv::KvCache;
pub use model::{LogitsWanted, Model, ModelInfo, SeqStep};
pub use sample::{Sampler, SamplingParams};
pub use speculative::{DraftMode, SpecStats, SpeculativeGeneration, Speculator, StepPlan};
