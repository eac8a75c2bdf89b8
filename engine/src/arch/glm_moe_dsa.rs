//! GLM-5.x (`GlmMoeDsaForCausalLM`): DeepSeek-V3's network (MLA with interleaved RoPE,
//! sigmoid group-limited MoE with shared experts, MTP) plus DeepSeek Sparse Attention: a
//! lightning indexer per layer picks the `index_topk` positions each query attends to, or a
//! "shared" layer reuses the previous layer's choice (`indexer_types`).

use super::blocks::RopeLayout;
use super::config::Cfg;
use super::deepseek_v3::{build_mla_family, mlp_layer_types, strings, DsaSpec, MlaFamily};
use super::load::LoadHook;
use super::network::Network;
use crate::container::Checkpoint;
use crate::error::Result;
use serde_json::Value;

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let n_layers = cfg.dim("num_hidden_layers")?;
    let first_k_dense_replace = cfg.usize_or("first_k_dense_replace", 3)?;
    let sparse = mlp_layer_types(cfg, n_layers)?;
    let dsa = DsaSpec {
        n_heads: cfg.usize_or("index_n_heads", 32)?,
        head_dim: cfg.usize_or("index_head_dim", 128)?,
        topk: cfg.usize_or("index_topk", 2048)?,
        // transformers' GlmMoeDsa always rotates interleaved pairs, in MLA and indexer.
        rope_layout: RopeLayout::Interleaved,
        full: indexer_types(cfg, n_layers)?,
    };
    if dsa.n_heads == 0 {
        return Err(cfg.err("index_n_heads must be positive"));
    }
    build_mla_family(
        ckpt,
        cfg,
        progress,
        MlaFamily {
            name: "glm_moe_dsa",
            // transformers' GlmMoeDsa always rotates interleaved pairs, in MLA and indexer.
            rope_layout: RopeLayout::Interleaved,
            dsa: Some(dsa),
            sparse,
            first_k_dense_replace,
        },
    )
}

/// Which layers run their own indexer, as `GlmMoeDsaConfig.__post_init__` decides:
/// `indexer_types`, else `index_topk_pattern` ("F"/"S" per layer), else every
/// `index_topk_freq`-th layer counted from `index_skip_topk_offset`.
fn indexer_types(cfg: &Cfg, n_layers: usize) -> Result<Vec<bool>> {
    let parse = |t: &str| match t {
        "full" | "F" => Ok(true),
        "shared" | "S" => Ok(false),
        other => Err(cfg.err(format!("unknown indexer type '{other}' (full, shared)"))),
    };
    let full: Vec<bool> = if let Some(v) = cfg.get("indexer_types") {
        strings(cfg, "indexer_types", v)?
            .iter()
            .map(|t| parse(t))
            .collect::<Result<_>>()?
    } else if let Some(v) = cfg.get("index_topk_pattern") {
        match v {
            Value::String(s) => s
                .chars()
                .map(|c| parse(&c.to_string()))
                .collect::<Result<_>>()?,
            _ => strings(cfg, "index_topk_pattern", v)?
                .iter()
                .map(|t| parse(t))
                .collect::<Result<_>>()?,
        }
    } else {
        let freq = cfg.usize_or("index_topk_freq", 1)?.max(1);
        let offset = cfg.usize_or("index_skip_topk_offset", 2)?;
        (0..n_layers)
            .map(|i| (i + 1).saturating_sub(offset) % freq == 0)
            .collect()
    };
    if full.len() != n_layers {
        return Err(cfg.err(format!(
            "indexer_types has {} entries for {n_layers} layers",
            full.len()
        )));
    }
    Ok(full)
}
