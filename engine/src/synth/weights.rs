//! The weights of a synth model: every tensor's name and shape per family, and random values
//! (or random codes and scales, straight in their packed form) that depend only on the name
//! and the seed. Both writers (the container and `--format hf`) take them from here.

use crate::convert::{Item, Source};
use crate::error::{Error, Result};
use crate::format::{ScaleType, WeightFormat};
use crate::quant::Packed;

#[derive(Clone, Copy)]
enum Kind {
    /// Norm weights.
    Ones,
    /// Every value the same (attention's query/key norms).
    Const(f32),
    /// Uniform values with this standard deviation.
    Random(f32),
}

struct RandomSource {
    seed: u64,
    kind: Kind,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

impl RandomSource {
    fn row_seed(&self, r: usize) -> u64 {
        (self.seed ^ (r as u64).wrapping_mul(0x9E3779B97F4A7C15)).wrapping_mul(0xD6E8FEB86659FD93)
            | 1
    }
}

impl Source for RandomSource {
    fn row(&self, r: usize, out: &mut [f32]) {
        match self.kind {
            Kind::Ones => out.iter_mut().for_each(|o| *o = 1.0),
            Kind::Const(v) => out.iter_mut().for_each(|o| *o = v),
            Kind::Random(std) => {
                let a = std * 3f32.sqrt();
                let mut s = self.row_seed(r);
                for o in out.iter_mut() {
                    let u = (xorshift(&mut s) >> 40) as f32 / (1u64 << 24) as f32;
                    *o = (2.0 * u - 1.0) * a;
                }
            }
        }
    }

    fn packed(&self, format: WeightFormat, rows: usize, cols: usize) -> Option<Packed> {
        let Kind::Random(std) = self.kind else {
            return None;
        };
        if format == WeightFormat::BF16 {
            // Uniform values, truncated to bf16, generated in parallel straight into bytes.
            use rayon::prelude::*;
            let a = std * 3f32.sqrt();
            let mut data = vec![0u8; rows * cols * 2];
            data.par_chunks_mut(1 << 16).enumerate().for_each(|(i, c)| {
                let mut s = self.row_seed(i);
                for e in c.chunks_exact_mut(2) {
                    let u = (xorshift(&mut s) >> 40) as f32 / (1u64 << 24) as f32;
                    let v = (2.0 * u - 1.0) * a;
                    e.copy_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
                }
            });
            return Some(Packed {
                data,
                scales: Vec::new(),
            });
        }
        // Standard deviation of the codes of each format when uniformly random.
        let code_std = match format {
            WeightFormat::I8Row | WeightFormat::I8 { .. } => 73.9,
            WeightFormat::I4 { .. } => 4.61,
            WeightFormat::I5 { .. } => 9.23,
            WeightFormat::I2 { .. } => 1.118,
            _ => return None,
        };
        let data = crate::bench::random_bytes(rows * format.row_bytes(cols), self.seed);
        let n = rows * format.groups_per_row(cols);
        let st = format.scale_type().unwrap_or(ScaleType::F32);
        let mut scales = Vec::with_capacity(n * st.size());
        let mut s = self.seed | 1;
        for _ in 0..n {
            // ±10% around the target so groups differ.
            let jitter = 0.9 + 0.2 * ((xorshift(&mut s) >> 40) as f32 / (1u64 << 24) as f32);
            let v = std / code_std * jitter;
            match st {
                ScaleType::F32 => scales.extend_from_slice(&v.to_le_bytes()),
                ScaleType::F16 => scales.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
                // The nearest power of two.
                ScaleType::E8M0 => scales.push((v.log2().round() as i32 + 127).clamp(1, 254) as u8),
                ScaleType::BF16 => scales.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            }
        }
        Some(Packed { data, scales })
    }
}

/// Tensor names and shapes of `cfg`'s family, in the Hub's naming.
pub(super) fn tensors(cfg: &serde_json::Value) -> Result<Vec<(String, Vec<usize>)>> {
    let u = |k: &str| {
        cfg[k]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| Error::invalid("like", format!("config lacks {k}")))
    };
    let (h, nl, nh, nkv, v) = (
        u("hidden_size")?,
        u("num_hidden_layers")?,
        u("num_attention_heads")?,
        u("num_key_value_heads")?,
        u("vocab_size")?,
    );
    let hd = cfg["head_dim"]
        .as_u64()
        .map(|v| v as usize)
        .unwrap_or(h / nh);
    let mt = cfg["model_type"].as_str().unwrap_or("");
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
        ("lm_head.weight".to_string(), vec![v, h]),
    ];
    for i in 0..nl {
        let p = format!("model.layers.{i}");
        t.push((format!("{p}.input_layernorm.weight"), vec![h]));
        t.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
        t.push((format!("{p}.self_attn.q_proj.weight"), vec![nh * hd, h]));
        t.push((format!("{p}.self_attn.k_proj.weight"), vec![nkv * hd, h]));
        t.push((format!("{p}.self_attn.v_proj.weight"), vec![nkv * hd, h]));
        t.push((format!("{p}.self_attn.o_proj.weight"), vec![h, nh * hd]));
        match mt {
            "olmoe" => {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![nh * hd]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![nkv * hd]));
            }
            "qwen3_moe" => {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![hd]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![hd]));
            }
            _ => {}
        }
        let (moe, e, inter, names) = match mt {
            "mixtral" => (
                "block_sparse_moe",
                u("num_local_experts")?,
                u("intermediate_size")?,
                ["w1", "w3", "w2"],
            ),
            "qwen3_moe" => (
                "mlp",
                u("num_experts")?,
                u("moe_intermediate_size")?,
                ["gate_proj", "up_proj", "down_proj"],
            ),
            _ => (
                "mlp",
                u("num_experts")?,
                u("intermediate_size")?,
                ["gate_proj", "up_proj", "down_proj"],
            ),
        };
        t.push((format!("{p}.{moe}.gate.weight"), vec![e, h]));
        for x in 0..e {
            t.push((
                format!("{p}.{moe}.experts.{x}.{}.weight", names[0]),
                vec![inter, h],
            ));
            t.push((
                format!("{p}.{moe}.experts.{x}.{}.weight", names[1]),
                vec![inter, h],
            ));
            t.push((
                format!("{p}.{moe}.experts.{x}.{}.weight", names[2]),
                vec![h, inter],
            ));
        }
    }
    Ok(t)
}

/// How the random weights are scaled so that a random model routes like a trained one.
///
/// With every matrix at the usual 0.02, attention is nearly uniform and each layer's output
/// (about 0.8 RMS, against embeddings of 0.02) is an average over the context, nearly the
/// same vector for every token: after a few layers every router picked the same 8 experts
/// for every token (measured on the olmoe shape), which makes any cache look perfect.
/// Trained routers choose by the token and its context (OLMoE's paper reports strong
/// token-id specialisation). So: embeddings lead the residual stream (`EMBED_STD`), the
/// weights writing into it are scaled down (`BRANCH_SCALE`), and attention is sharp
/// (`QK_GAIN` on the query/key projections and their norms) so that what a layer adds comes
/// from a few other positions rather than from all of them. Fed a real text
/// (tools/streaming/text_ids.py), the olmoe shape then gives the same token the same expert
/// 91% of the time in layer 0 and 80–85% in the deep layers, uses all 64 experts of every
/// layer with a mild skew (the most used in about 27% of tokens, against 12.5% for an even
/// spread), and consecutive tokens share 12–17% of their experts (chance: 12.5%). The scales
/// change nothing a benchmark measures except which experts are read.
const EMBED_STD: f32 = 1.0;
const BRANCH_SCALE: f32 = 0.1;
const QK_GAIN: f32 = 3.0;

/// Weights whose output is added to the residual stream.
fn is_branch_output(name: &str) -> bool {
    [".o_proj.weight", ".down_proj.weight", ".w2.weight"]
        .iter()
        .any(|s| name.ends_with(s))
}

/// The random weight `name` of a synth model: its values (see the scales above) and its
/// format, `experts` for routed experts, `dense` for the other matrices, bf16 for vectors,
/// routers and the attention's q/k norms. The values depend only on the name and the seed.
pub(super) fn random_item(
    name: String,
    shape: Vec<usize>,
    seed: u64,
    experts: WeightFormat,
    dense: WeightFormat,
    hidden: f32,
) -> Item<'static> {
    let seed = crate::convert::fnv64(name.as_bytes()) ^ seed;
    let is_expert = crate::container::is_routed_expert(&name).is_some();
    let (format, kind) = if name.ends_with("_norm.weight") && name.contains(".self_attn.") {
        (WeightFormat::BF16, Kind::Const(QK_GAIN))
    } else if shape.len() == 1 {
        (WeightFormat::BF16, Kind::Ones)
    } else if name.ends_with(".gate.weight") {
        // Router: logits of standard deviation ~1.5 on unit-RMS inputs.
        (WeightFormat::BF16, Kind::Random(1.5 / hidden.sqrt()))
    } else if name == "model.embed_tokens.weight" {
        (dense, Kind::Random(EMBED_STD))
    } else if is_expert {
        let std = if is_branch_output(&name) {
            0.02 * BRANCH_SCALE
        } else {
            0.02
        };
        (experts, Kind::Random(std))
    } else {
        let std = if is_branch_output(&name) {
            0.02 * BRANCH_SCALE
        } else if name.ends_with(".q_proj.weight") || name.ends_with(".k_proj.weight") {
            0.02 * QK_GAIN
        } else {
            0.02
        };
        (dense, Kind::Random(std))
    };
    Item {
        name,
        shape,
        format,
        source: Box::new(RandomSource { seed, kind }),
    }
}
