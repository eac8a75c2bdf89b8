//! `coli synth`: a random-weight model with the full shape of a real architecture, written
//! straight into the container format. It is how benchmarks (and users without a download)
//! measure speed and memory: the bytes and the routing are realistic, the text is not.
//!
//! Routers are random and read a residual stream led by the token's embedding (see
//! `EMBED_STD`), so routing depends on the tokens fed, as a trained model's does. Quantized
//! experts are random codes with scales chosen for the wanted standard deviation, generated
//! directly in their packed form (no quantizer in the loop: gigabytes per second).

use crate::convert::{write_atomic, write_part, Item, Progress};
use crate::error::{Error, Result};
use crate::format::WeightFormat;
use serde_json::json;
use std::path::PathBuf;

mod hf;
mod weights;
pub use hf::tokenizer_json;
use weights::{random_item, tensors};

/// Architectures `--like` knows, with their published configuration.
pub fn known_models() -> Vec<&'static str> {
    vec!["olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b"]
}

fn config_for(like: &str) -> Result<serde_json::Value> {
    Ok(match like {
        "olmoe-1b-7b" => json!({
            "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe",
            "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
            "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64,
            "num_experts_per_tok": 8, "vocab_size": 50304, "max_position_embeddings": 4096,
            "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "clip_qkv": null, "norm_topk_prob": false,
            "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
            "bos_token_id": null, "eos_token_id": 50279, "pad_token_id": 1, "torch_dtype": "bfloat16"
        }),
        "qwen3-30b-a3b" => json!({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
            "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
            "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "tie_word_embeddings": false, "hidden_act": "silu", "attention_bias": false,
            "use_sliding_window": false, "bos_token_id": 151643, "eos_token_id": 151645,
            "torch_dtype": "bfloat16"
        }),
        "mixtral-8x7b" => json!({
            "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
            "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "sliding_window": null,
            "tie_word_embeddings": false, "hidden_act": "silu", "bos_token_id": 1,
            "eos_token_id": 2, "torch_dtype": "bfloat16"
        }),
        o => {
            return Err(Error::invalid(
                "like",
                format!("unknown model '{o}'; known: {}", known_models().join(", ")),
            ))
        }
    })
}

/// What `coli synth` writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SynthFormat {
    /// A colibri container in `experts` / `dense` formats, routed experts laid out for
    /// streaming.
    #[default]
    Container,
    /// A Hub checkpoint: every matrix bf16, sharded safetensors, tokenizer files
    /// (`experts` / `dense` are not used). What another engine's converter reads.
    Hf,
}

#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub like: String,
    pub output: PathBuf,
    pub format: SynthFormat,
    pub experts: WeightFormat,
    pub dense: WeightFormat,
    /// Override the number of layers (smaller models for quick checks).
    pub layers: Option<usize>,
    pub seed: u64,
    /// The expert topology of a routing trace instead of `like`'s (`coli synth
    /// --like-trace`): [`config_for_topology`].
    pub topology: Option<Topology>,
}

/// Layers × experts, top-k and the size of one expert: what a routing trace needs of a model
/// to be replayed on it (`coli trace --replay-routing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub layers: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Bytes of one routed expert in the traced model (the synth model's experts are sized
    /// to about this many bytes in their own format).
    pub expert_bytes: u64,
}

impl Topology {
    pub fn of_trace(t: &crate::experts::Trace) -> Topology {
        Topology {
            layers: t.n_layers,
            experts: t.n_experts,
            top_k: t.top_k,
            expert_bytes: t.expert_bytes,
        }
    }
}

/// A configuration with `t`'s expert topology: a known architecture with the same layers ×
/// experts (Qwen3-30B-A3B for its own trace) with the trace's top-k, else Qwen3-MoE's
/// layout with the trace's layers, experts and top-k and each expert's intermediate size
/// chosen so that one expert in `experts` format is about the trace's `expert_bytes`.
/// Returns the configuration and the known architecture it was based on, if any.
pub fn config_for_topology(
    t: &Topology,
    experts: WeightFormat,
) -> Result<(serde_json::Value, Option<&'static str>)> {
    if t.layers == 0 || t.experts == 0 || t.top_k == 0 || t.top_k > t.experts {
        return Err(Error::invalid(
            "like-trace",
            format!(
                "{} layers x {} experts, top-{} is no MoE model",
                t.layers, t.experts, t.top_k
            ),
        ));
    }
    for like in known_models() {
        let mut cfg = config_for(like)?;
        let e = cfg["num_experts"]
            .as_u64()
            .or(cfg["num_local_experts"].as_u64());
        if cfg["num_hidden_layers"].as_u64() == Some(t.layers as u64) && e == Some(t.experts as u64)
        {
            cfg["num_experts_per_tok"] = json!(t.top_k);
            return Ok((cfg, Some(like)));
        }
    }
    let mut cfg = config_for("qwen3-30b-a3b")?;
    let hidden = cfg["hidden_size"].as_u64().unwrap_or(2048) as usize;
    // Bytes per parameter of the expert format, scales included.
    let per_param = (experts.row_bytes(hidden)
        + experts.groups_per_row(hidden) * experts.scale_type().map_or(0, |s| s.size()))
        as f64
        / hidden as f64;
    let inter =
        (t.expert_bytes as f64 / (3.0 * hidden as f64 * per_param) / 128.0).round() as usize * 128;
    cfg["num_hidden_layers"] = json!(t.layers);
    cfg["num_experts"] = json!(t.experts);
    cfg["num_experts_per_tok"] = json!(t.top_k);
    cfg["moe_intermediate_size"] = json!(inter.max(128));
    Ok((cfg, None))
}

/// Writes the synthetic model; returns its size in bytes.
pub fn synth(opts: &SynthOptions, progress: &dyn Progress) -> Result<u64> {
    let mut cfg = match &opts.topology {
        Some(t) => config_for_topology(t, opts.experts)?.0,
        None => config_for(&opts.like)?,
    };
    if let Some(n) = opts.layers {
        if n == 0 {
            return Err(Error::invalid("layers", "must be at least 1"));
        }
        cfg["num_hidden_layers"] = json!(n);
    }
    std::fs::create_dir_all(&opts.output).map_err(|e| Error::io(&opts.output, e))?;
    if opts.format == SynthFormat::Hf {
        return hf::write(&cfg, &opts.output, opts.seed, progress);
    }
    let hidden = cfg["hidden_size"].as_u64().unwrap_or(1) as f32;
    let mut dense: Vec<Item> = Vec::new();
    let mut experts: std::collections::BTreeMap<usize, Vec<Item>> = Default::default();
    for (name, shape) in tensors(&cfg)? {
        let is_expert = crate::container::is_routed_expert(&name).is_some();
        let item = random_item(
            name.clone(),
            shape,
            opts.seed,
            opts.experts,
            opts.dense,
            hidden,
        );
        match (
            is_expert,
            name.split(".layers.")
                .nth(1)
                .and_then(|r| r.split('.').next()?.parse::<usize>().ok()),
        ) {
            (true, Some(l)) => experts.entry(l).or_default().push(item),
            _ => dense.push(item),
        }
    }
    let mut parts: Vec<(String, Vec<Item>)> =
        vec![("dense-00001-of-00001.safetensors".into(), dense)];
    for (l, items) in experts {
        parts.push((format!("experts-layer{l:05}.safetensors"), items));
    }
    let mut total = 0u64;
    let mut lays = Vec::new();
    for (_, items) in &parts {
        let lay = crate::convert::layout(items)?;
        total += lay.file_len;
        lays.push(lay.file_len);
    }
    progress.begin(total, parts.len(), 0);
    let mut weight_map = std::collections::BTreeMap::new();
    for (file, items) in &parts {
        progress.message(file);
        write_part(&opts.output.join(file), items, &|b| progress.advance(b))?;
        for it in items {
            weight_map.insert(it.name.clone(), file.clone());
            if it.format.is_quantized() {
                weight_map.insert(
                    format!("{}{}", it.name, crate::container::SCALES_SUFFIX),
                    file.clone(),
                );
            }
        }
    }
    let index = json!({"metadata": {"format": "colibri", "synthetic_like": opts.like, "total_size": total}, "weight_map": weight_map});
    write_atomic(
        &opts.output.join("model.safetensors.index.json"),
        &serde_json::to_vec_pretty(&index).expect("json"),
    )?;
    write_atomic(
        &opts.output.join("config.json"),
        &serde_json::to_vec_pretty(&cfg).expect("json"),
    )?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ScaleType;

    #[test]
    fn a_traces_topology_picks_a_known_shape_or_sizes_its_experts() {
        let int4 = WeightFormat::I4 {
            group: 64,
            scale: ScaleType::F16,
        };
        // Qwen3-30B-A3B's own trace (run with 6 experts per token): its architecture.
        let qwen = Topology {
            layers: 48,
            experts: 128,
            top_k: 6,
            expert_bytes: 3_059_712,
        };
        let (cfg, base) = config_for_topology(&qwen, int4).unwrap();
        assert_eq!(base, Some("qwen3-30b-a3b"));
        assert_eq!(cfg["num_experts_per_tok"], 6);
        assert_eq!(cfg["moe_intermediate_size"], 768);
        // granite's shape is no known one: Qwen3's layout, experts sized to ~3 MiB.
        let granite = Topology {
            layers: 24,
            experts: 32,
            top_k: 8,
            expert_bytes: 3 << 20,
        };
        let (cfg, base) = config_for_topology(&granite, int4).unwrap();
        assert_eq!(base, None);
        assert_eq!(
            (
                cfg["num_hidden_layers"].as_u64(),
                cfg["num_experts"].as_u64()
            ),
            (Some(24), Some(32))
        );
        assert_eq!(cfg["num_experts_per_tok"], 8);
        let inter = cfg["moe_intermediate_size"].as_u64().unwrap() as f64;
        let bytes = 3.0 * 2048.0 * inter * (0.5 + 2.0 / 64.0);
        assert!((bytes / (3u64 << 20) as f64 - 1.0).abs() < 0.1, "{inter}");
        assert!(tensors(&cfg).is_ok());
        let bad = Topology {
            top_k: 40,
            ..granite
        };
        assert!(config_for_topology(&bad, int4).is_err());
    }
}
