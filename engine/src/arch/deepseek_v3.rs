//! DeepSeek-V3 / R1 (`DeepseekV3ForCausalLM`): multi-head latent attention with a latent KV
//! cache (YaRN-scaled RoPE on the rope dims only, interleaved when `rope_interleave`), dense
//! MLP in the first `first_k_dense_replace` layers, then MoE layers with the sigmoid
//! group-limited router and shared experts; MTP layers after the last decoder layer.
//!
//! GLM-5 (`glm_moe_dsa`) is the same network plus the DSA indexer, so its builder reuses
//! [`build_mla_family`].

use super::blocks::{Loader, RopeLayout};
use super::config::{Cfg, CommonDims, RopeParams};
use super::dsa::DsaIndexer;
use super::layer::{Attention, Ffn, Layer};
use super::load::LoadHook;
use super::mla::{MlaAttention, MlaDims};
use super::moe::SigmoidMoeSpec;
use super::mtp;
use super::network::Network;
use crate::container::Checkpoint;
use crate::error::Result;
use serde_json::Value;

/// The DSA indexer settings of a GLM-5 style config.
#[derive(Clone, Debug)]
pub struct DsaSpec {
    pub n_heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    /// How the indexer pairs its rope dims ([`DsaIndexer::rope_layout`]).
    pub rope_layout: RopeLayout,
    /// Per decoder layer: runs its own indexer (`true`, "full") or reuses the previous
    /// layer's selection ("shared"). Layers past the list (MTP) run their own.
    pub full: Vec<bool>,
}

/// What distinguishes the MLA families from one another.
pub struct MlaFamily {
    pub name: &'static str,
    pub rope_layout: RopeLayout,
    pub dsa: Option<DsaSpec>,
    /// Per decoder layer: MoE (`true`) or dense; layers past the list use
    /// `first_k_dense_replace`.
    pub sparse: Vec<bool>,
    pub first_k_dense_replace: usize,
}

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let interleave = cfg.bool_or("rope_interleave", true)?;
    build_mla_family(
        ckpt,
        cfg,
        progress,
        MlaFamily {
            name: "deepseek_v3",
            rope_layout: if interleave {
                RopeLayout::Interleaved
            } else {
                RopeLayout::HalfSplit
            },
            dsa: None,
            sparse: Vec::new(),
            first_k_dense_replace: cfg.usize_or("first_k_dense_replace", 3)?,
        },
    )
}

pub fn build_mla_family(
    ckpt: &Checkpoint,
    cfg: &Cfg,
    progress: &LoadHook,
    fam: MlaFamily,
) -> Result<Network> {
    let d = CommonDims::read_shared(cfg)?;
    let md = MlaDims::read(cfg)?;
    let rope_params = RopeParams::read(cfg, 10000.0)?;
    let rope = rope_params.rope(cfg, md.rope, fam.rope_layout, d.max_context)?;
    let scale = ((md.qk_head_dim() as f64).powf(-0.5)
        * rope_params.mla_softmax_mscale(cfg, d.max_context)?) as f32;
    let moe = SigmoidMoeSpec::read(cfg)?;
    let dense_inter = cfg.dim("intermediate_size")?;
    if let Some(dsa) = &fam.dsa {
        if md.q_lora_rank.is_none() {
            return Err(cfg.err("the DSA indexer needs q_lora_rank (it reads the q latent)"));
        }
        if dsa.head_dim < md.rope || dsa.topk == 0 {
            return Err(cfg.err(format!(
                "index_head_dim ({}) must be at least qk_rope_head_dim ({}) and index_topk positive",
                dsa.head_dim, md.rope
            )));
        }
        if dsa.full.first() == Some(&false) {
            return Err(cfg.err("indexer_types[0] is 'shared' but no earlier layer has an indexer"));
        }
    }
    let ld = Loader {
        ckpt,
        family: fam.name,
        progress,
    };
    let has_indexer = |i: usize| {
        ckpt.get(&format!("model.layers.{i}.self_attn.indexer.wq_b.weight"))
            .is_some()
    };
    // Converters may leave the DSA indexer out (the C converter's main pass does; its
    // `--indexer` pass adds it). Without it every layer attends to all causal positions,
    // which is what the indexer selects anyway while a sequence is within `index_topk`.
    // Partly present is a damaged checkpoint: the first missing tensor is named.
    let dsa = match fam.dsa {
        Some(dsa) if !(0..d.n_layers).any(has_indexer) => {
            progress.note(format!(
                "DSA indexer absent: dense attention; outputs differ from the reference beyond \
                 index_topk ({}) tokens",
                dsa.topk
            ));
            None
        }
        other => other,
    };
    let names = ["gate_proj", "up_proj", "down_proj"];
    let layer = |i: usize, p: &str| -> Result<Layer> {
        let mut attn =
            MlaAttention::load(&ld, &format!("{p}.self_attn"), &md, rope.clone(), scale)?;
        if let Some(dsa) = &dsa {
            let own = dsa.full.get(i).copied().unwrap_or(true);
            if own && i >= d.n_layers && !has_indexer(i) {
                // An MTP layer converted without its indexer drafts with dense attention;
                // verification keeps the output exact.
                progress.note("MTP layer without its DSA indexer: its drafts use dense attention");
            } else if own {
                attn.indexer = Some(DsaIndexer::load(
                    &ld,
                    &format!("{p}.self_attn.indexer"),
                    d.hidden,
                    md.q_lora_rank.unwrap_or_default(),
                    dsa.n_heads,
                    dsa.head_dim,
                    md.rope,
                    dsa.rope_layout,
                    dsa.topk,
                )?);
            } else {
                attn.shares_selection = true;
            }
        }
        let sparse = fam
            .sparse
            .get(i)
            .copied()
            .unwrap_or(i >= fam.first_k_dense_replace);
        let ffn = if sparse {
            Ffn::Moe(moe.load(&ld, &format!("{p}.mlp"), d.hidden)?)
        } else {
            Ffn::Dense(ld.mlp(&format!("{p}.mlp"), names, d.hidden, dense_inter)?)
        };
        Layer::load(&ld, p, &d, Attention::Mla(attn), ffn)
    };
    let layers = (0..d.n_layers)
        .map(|i| layer(i, &format!("model.layers.{i}")))
        .collect::<Result<Vec<_>>>()?;
    let mtp = mtp::load(&ld, cfg, &d, &layer)?;
    Network::decoder(fam.name, &d, &ld, layers, mtp)
}

/// Per decoder layer, MoE (`true`) or dense, from `mlp_layer_types` ("sparse" / "dense", as
/// DeepSeek-V3.2's and GLM-5's configs may list them); empty when the config leaves it to
/// `first_k_dense_replace`.
pub fn mlp_layer_types(cfg: &Cfg, n_layers: usize) -> Result<Vec<bool>> {
    let sparse = match cfg.get("mlp_layer_types") {
        None => Vec::new(),
        Some(v) => strings(cfg, "mlp_layer_types", v)?
            .iter()
            .map(|t| match t.as_str() {
                "sparse" => Ok(true),
                "dense" => Ok(false),
                other => Err(cfg.err(format!(
                    "mlp_layer_types: unknown type '{other}' (dense, sparse)"
                ))),
            })
            .collect::<Result<Vec<_>>>()?,
    };
    if !sparse.is_empty() && sparse.len() != n_layers {
        return Err(cfg.err(format!(
            "mlp_layer_types has {} entries for {n_layers} layers",
            sparse.len()
        )));
    }
    Ok(sparse)
}

/// A config value that must be a list of strings.
pub fn strings(cfg: &Cfg, key: &str, v: &Value) -> Result<Vec<String>> {
    v.as_array()
        .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect())
        .ok_or_else(|| cfg.err(format!("'{key}' must be a list of strings")))
}
