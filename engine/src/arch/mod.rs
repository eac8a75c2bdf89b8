//! Model families and the decoder they share.
//!
//! Each family file (`olmoe.rs`, `qwen3_moe.rs`, `mixtral.rs`, ...) reads its config keys and
//! weight names and assembles a [`Network`] from the shared blocks; the forward pass over a
//! batch of rows is written once, in [`network`] (each decoder layer in [`layer`]). This file
//! only dispatches on `model_type` ([`build`]) and re-exports the shared types.

pub mod attention;
pub mod blocks;
pub mod census;
pub mod config;
pub mod deepseek_v3;
pub mod deepseek_v32;
pub mod dsa;
pub mod exec;
pub mod glm4_moe;
pub mod glm_moe_dsa;
pub mod glu;
pub mod gpt_oss;
pub mod kimi_k25;
pub mod layer;
pub mod load;
pub mod mixtral;
pub mod mla;
pub mod moe;
pub mod mtp;
pub mod network;
pub mod olmoe;
pub mod profile;
pub mod qwen3_moe;
pub mod simd;
pub mod step;

pub use config::CommonDims;
pub use layer::{Attention, Ffn, Layer};
pub use load::LoadHook;
pub use network::Network;
pub use step::BatchRows;

use crate::container::Checkpoint;
use crate::error::{Error, Result};
use config::Cfg;

/// `model_type` values this engine runs, with the builder for each.
/// Builds a family's network from its checkpoint and config.
type Builder = fn(&Checkpoint, &Cfg, &LoadHook) -> Result<Network>;

const FAMILIES: &[(&str, Builder)] = &[
    ("olmoe", olmoe::build),
    ("qwen3_moe", qwen3_moe::build),
    ("mixtral", mixtral::build),
    ("deepseek_v3", deepseek_v3::build),
    ("deepseek_v32", deepseek_v32::build),
    ("glm4_moe", glm4_moe::build),
    ("glm_moe_dsa", glm_moe_dsa::build),
    ("gpt_oss", gpt_oss::build),
    ("kimi_k25", kimi_k25::build),
];

pub fn supported_model_types() -> Vec<String> {
    FAMILIES.iter().map(|(n, _)| n.to_string()).collect()
}

/// Builds the network for a checkpoint, dispatching on `model_type`.
pub fn build(ckpt: &Checkpoint) -> Result<Network> {
    build_with_progress(ckpt, &LoadHook::new(ckpt, &|_| {}))
}

/// [`build`], telling `hook` as each decoder layer is loaded.
pub fn build_with_progress(ckpt: &Checkpoint, hook: &LoadHook) -> Result<Network> {
    let cfg = Cfg::new(&ckpt.config, &ckpt.config_path);
    let model_type = cfg
        .get("model_type")
        .and_then(|v| v.as_str())
        .ok_or_else(|| cfg.err("missing 'model_type'"))?;
    let (_, builder) = FAMILIES
        .iter()
        .find(|(n, _)| *n == model_type)
        .ok_or_else(|| Error::UnsupportedModelType {
            got: model_type.to_string(),
            supported: supported_model_types(),
        })?;
    builder(ckpt, &cfg, hook)
}
