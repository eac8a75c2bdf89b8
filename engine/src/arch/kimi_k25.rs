//! Kimi-K2.5 (`kimi_k25`, `KimiK25ForConditionalGeneration`), text part, read as Moonshot
//! publishes it: a multimodal wrapper whose language model is DeepSeek-V3's network (MLA with a
//! q latent, YaRN, the sigmoid group-limited router with its correction bias, a shared expert,
//! dense first layers) — built by [`build_mla_family`], not copied.
//!
//! What the wrapper changes: the language model's config is nested in `text_config` (its
//! `model_type` `kimi_k2`, the legacy `rope_theta` / `rope_scaling` keys, and the
//! compressed-tensors `quantization_config` of the int4 experts, read by
//! `container::compressed`); its tensors lie under `language_model.model.*` and
//! `language_model.lm_head.weight`; `vision_tower.*` and `mm_projector.*` are the image side,
//! which a text-only engine leaves unread (image inputs are refused before they reach a
//! model: `text::template`, the HTTP door).

use super::blocks::RopeLayout;
use super::config::Cfg;
use super::deepseek_v3::{build_mla_family, MlaFamily};
use super::{LoadHook, Network};
use crate::container::Checkpoint;
use crate::error::Result;
use serde_json::Value;

pub const FAMILY: &str = "kimi_k25";

/// `text_config.model_type` values whose network this is (transformers maps `kimi_k2` to
/// `deepseek_v3`).
const TEXT_MODEL_TYPES: [&str; 2] = ["kimi_k2", "deepseek_v3"];

/// Where the wrapper keeps the language model's tensors: `(read as, published as)`.
pub const TEXT_PREFIXES: [(&str, &str); 2] = [
    ("model.", "language_model.model."),
    ("lm_head.", "language_model.lm_head."),
];

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let text = text_config(cfg)?;
    let tcfg = Cfg::new(&text, cfg.file);
    let view = ckpt.renamed(&TEXT_PREFIXES);
    if view.is_empty() {
        return Err(cfg.err(
            "kimi_k25: no language_model.* tensors (the wrapper keeps the language model under \
             language_model.model.* and language_model.lm_head.weight)",
        ));
    }
    let interleave = tcfg.bool_or("rope_interleave", true)?;
    build_mla_family(
        &view,
        &tcfg,
        progress,
        MlaFamily {
            name: FAMILY,
            rope_layout: if interleave {
                RopeLayout::Interleaved
            } else {
                RopeLayout::HalfSplit
            },
            dsa: None,
            sparse: Vec::new(),
            first_k_dense_replace: tcfg.usize_or("first_k_dense_replace", 3)?,
        },
    )
}

/// The language model's config: `text_config`, with the wrapper's `tie_word_embeddings`
/// (the head is the wrapper's; transformers' `Kimi_K25Config` defaults it to true) where the
/// wrapper says it.
pub fn text_config(cfg: &Cfg) -> Result<Value> {
    let mut text = cfg
        .get("text_config")
        .filter(|t| t.is_object())
        .cloned()
        .ok_or_else(|| {
            cfg.err("kimi_k25: missing 'text_config' (the language model's configuration)")
        })?;
    let inner = text
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("deepseek_v3");
    if !TEXT_MODEL_TYPES.contains(&inner) {
        return Err(cfg.err(format!(
            "kimi_k25: text_config.model_type '{inner}' is not a DeepSeek-V3 language model \
             (kimi_k2 or deepseek_v3)"
        )));
    }
    let tie = cfg
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .or_else(|| text.get("tie_word_embeddings").and_then(Value::as_bool))
        .unwrap_or(true);
    text["tie_word_embeddings"] = Value::Bool(tie);
    Ok(text)
}
