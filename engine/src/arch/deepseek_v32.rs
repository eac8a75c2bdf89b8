//! DeepSeek-V3.2 / V3.2-Exp / V3.2-Speciale (`DeepseekV32ForCausalLM`): DeepSeek-V3's network
//! (MLA with interleaved RoPE, sigmoid group-limited MoE with shared experts, MTP) plus
//! DeepSeek Sparse Attention in every layer: a lightning indexer per layer picks the
//! `index_topk` positions each query attends to. Unlike GLM-5's (`glm_moe_dsa.rs`), the
//! indexer rotates its rope dims in halves, and no layer shares another's selection.

use super::blocks::RopeLayout;
use super::config::Cfg;
use super::deepseek_v3::{build_mla_family, mlp_layer_types, DsaSpec, MlaFamily};
use super::load::LoadHook;
use super::network::Network;
use crate::container::Checkpoint;
use crate::error::Result;

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let n_layers = cfg.dim("num_hidden_layers")?;
    let dsa = DsaSpec {
        // DeepseekV32Config's defaults, which the published configs also write.
        n_heads: cfg.usize_or("index_n_heads", 64)?,
        head_dim: cfg.usize_or("index_head_dim", 128)?,
        topk: cfg.usize_or("index_topk", 2048)?,
        rope_layout: RopeLayout::HalfSplit,
        full: vec![true; n_layers],
    };
    if dsa.n_heads == 0 {
        return Err(cfg.err("index_n_heads must be positive"));
    }
    build_mla_family(
        ckpt,
        cfg,
        progress,
        MlaFamily {
            name: "deepseek_v32",
            // transformers' DeepseekV32 always interleaves in MLA (it has no rope_interleave).
            rope_layout: RopeLayout::Interleaved,
            dsa: Some(dsa),
            sparse: mlp_layer_types(cfg, n_layers)?,
            first_k_dense_replace: cfg.usize_or("first_k_dense_replace", 3)?,
        },
    )
}
