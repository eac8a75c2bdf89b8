//! Which storage formats a loaded model's matrices use, per tensor class (attention, routed
//! experts, embeddings, ...): a mixed-precision container (attention int8, experts int4 or
//! int3, ...) is just another container, and `coli plan` / `coli doctor` / `coli status`
//! say what it holds. Recorded by the loader as each matrix is loaded, classified by name.

use crate::container::is_routed_expert;
use crate::tensor::{Matrix, WeightFormat};
use std::collections::BTreeMap;

/// Matrices of one class stored in one format.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct WeightClass {
    /// "attention", "routed experts", "shared experts", "dense MLP", "routers",
    /// "embeddings", "lm_head", "DSA indexer", "MTP layers" or "other".
    pub class: String,
    /// [`WeightFormat::name`](crate::tensor::WeightFormat::name), e.g. "int4-g128".
    pub format: String,
    pub tensors: usize,
    /// Bytes of weights and scales.
    pub bytes: u64,
}

/// The class of a weight tensor, by its Hub name. `decoder_layers` tells MTP layers
/// (stored after the last decoder layer) apart.
pub fn class_of(name: &str, decoder_layers: Option<usize>) -> &'static str {
    let layer = name
        .strip_prefix("model.layers.")
        .and_then(|r| r.split('.').next())
        .and_then(|l| l.parse::<usize>().ok());
    if matches!((layer, decoder_layers), (Some(l), Some(n)) if l >= n) {
        "MTP layers"
    } else if name.contains(".indexer.") {
        "DSA indexer"
    } else if is_routed_expert(name).is_some() {
        "routed experts"
    } else if name.contains("shared_expert") {
        "shared experts"
    } else if name.ends_with(".gate.weight") || name.ends_with(".router.weight") {
        "routers"
    } else if name.contains("self_attn") {
        "attention"
    } else if name.contains(".mlp.") || name.contains("block_sparse_moe") {
        "dense MLP"
    } else if name.contains("embed_tokens") {
        "embeddings"
    } else if name.contains("lm_head") {
        "lm_head"
    } else {
        "other"
    }
}

/// Tally of the matrices loaded so far.
#[derive(Default)]
pub struct Census {
    /// (class, format) → (tensors, bytes)
    by: BTreeMap<(&'static str, String), (usize, u64)>,
}

impl Census {
    pub fn record(
        &mut self,
        name: &str,
        m: &Matrix,
        format: WeightFormat,
        decoder_layers: Option<usize>,
    ) {
        let e = self
            .by
            .entry((class_of(name, decoder_layers), format.name()))
            .or_default();
        e.0 += 1;
        e.1 += m.size_bytes() as u64;
    }

    /// Classes in a fixed order (as a reader scans a model top to bottom), formats by bytes.
    pub fn classes(&self) -> Vec<WeightClass> {
        const ORDER: [&str; 10] = [
            "embeddings",
            "attention",
            "DSA indexer",
            "dense MLP",
            "routers",
            "shared experts",
            "routed experts",
            "MTP layers",
            "lm_head",
            "other",
        ];
        let mut v: Vec<WeightClass> = self
            .by
            .iter()
            .map(|((c, f), (n, b))| WeightClass {
                class: c.to_string(),
                format: f.clone(),
                tensors: *n,
                bytes: *b,
            })
            .collect();
        let rank = |c: &str| ORDER.iter().position(|o| *o == c).unwrap_or(ORDER.len());
        v.sort_by(|a, b| {
            rank(&a.class)
                .cmp(&rank(&b.class))
                .then(b.bytes.cmp(&a.bytes))
        });
        v
    }
}

/// One line per class: `attention int8 (12 tensors, 1.2 GB)`, several formats of a class
/// joined with `+`.
pub fn summary(classes: &[WeightClass]) -> Vec<String> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for c in classes {
        let part = format!(
            "{} ({} tensor{}, {})",
            c.format,
            c.tensors,
            if c.tensors == 1 { "" } else { "s" },
            human_bytes(c.bytes)
        );
        match out.last_mut() {
            Some((class, parts)) if *class == c.class => parts.push(part),
            _ => out.push((c.class.clone(), vec![part])),
        }
    }
    out.into_iter()
        .map(|(class, parts)| format!("{class}: {}", parts.join(" + ")))
        .collect()
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} KiB", b as f64 / 1024.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_are_classified_by_name() {
        let n = Some(3);
        for (name, class) in [
            ("model.embed_tokens.weight", "embeddings"),
            ("lm_head.weight", "lm_head"),
            ("model.layers.0.self_attn.q_a_proj.weight", "attention"),
            (
                "model.layers.1.self_attn.indexer.wq_b.weight",
                "DSA indexer",
            ),
            ("model.layers.0.mlp.gate_proj.weight", "dense MLP"),
            ("model.layers.1.mlp.gate.weight", "routers"),
            (
                "model.layers.1.mlp.shared_experts.up_proj.weight",
                "shared experts",
            ),
            (
                "model.layers.1.mlp.experts.7.down_proj.weight",
                "routed experts",
            ),
            (
                "model.layers.1.mlp.experts.7.merged_weight",
                "routed experts",
            ),
            (
                "model.layers.0.block_sparse_moe.experts.2.w1.weight",
                "routed experts",
            ),
            ("model.layers.0.block_sparse_moe.gate.weight", "routers"),
            ("model.layers.3.eh_proj.weight", "MTP layers"),
            ("model.layers.3.mlp.experts.0.up_proj.weight", "MTP layers"),
        ] {
            assert_eq!(class_of(name, n), class, "{name}");
        }
    }
}
