//! Model families and the decoder they share.
//!
//! Each family file (`olmoe.rs`, `qwen3_moe.rs`, `mixtral.rs`, ...) reads its config keys and
//! weight names and assembles a [`Network`] from the shared blocks; the forward pass over a
//! batch of rows is written once, here.

pub mod attention;
pub mod blocks;
pub mod config;
pub mod mixtral;
pub mod moe;
pub mod olmoe;
pub mod qwen3_moe;

use crate::container::Checkpoint;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{LogitsWanted, SeqStep};
use crate::tensor::Matrix;
use attention::GqaAttention;
use blocks::{Mlp, RmsNorm};
use config::Cfg;
use moe::Moe;

/// `model_type` values this engine runs, with the builder for each.
const FAMILIES: &[(&str, fn(&Checkpoint, &Cfg) -> Result<Network>)] = &[
    ("olmoe", olmoe::build),
    ("qwen3_moe", qwen3_moe::build),
    ("mixtral", mixtral::build),
];

pub fn supported_model_types() -> Vec<String> {
    FAMILIES.iter().map(|(n, _)| n.to_string()).collect()
}

/// Builds the network for a checkpoint, dispatching on `model_type`.
pub fn build(ckpt: &Checkpoint) -> Result<Network> {
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
    builder(ckpt, &cfg)
}

#[derive(Clone, Debug)]
pub enum Attention {
    Gqa(GqaAttention),
}

#[derive(Clone, Debug)]
pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: RmsNorm,
    pub attn: Attention,
    pub ffn_norm: RmsNorm,
    pub ffn: Ffn,
}

/// A decoder-only transformer as every supported family instantiates it.
pub struct Network {
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub max_context: usize,
    /// `[vocab, hidden]`.
    pub embed: Matrix,
    pub layers: Vec<Layer>,
    pub final_norm: RmsNorm,
    /// `[vocab, hidden]` (the embedding again when tied).
    pub lm_head: Matrix,
}

/// Which sequence and position each row of a batched step belongs to.
pub struct BatchRows {
    pub seq: Vec<usize>,
    pub pos: Vec<usize>,
    /// Row offset of each sequence's first row; `starts[s]..starts[s+1]`.
    pub starts: Vec<usize>,
}

impl BatchRows {
    pub fn len(&self) -> usize {
        self.seq.len()
    }
    pub fn is_empty(&self) -> bool {
        self.seq.is_empty()
    }
    pub fn seq_range(&self, s: usize) -> std::ops::Range<usize> {
        self.starts[s]..self.starts[s + 1]
    }
}

impl Network {
    pub fn new_cache(&self) -> KvCache {
        let widths: Vec<(usize, usize)> = self
            .layers
            .iter()
            .map(|l| match &l.attn {
                Attention::Gqa(a) => a.kv_widths(),
            })
            .collect();
        KvCache::new(&widths, self.max_context)
    }

    pub fn weight_bytes(&self) -> usize {
        let mut b = self.embed.size_bytes() + self.final_norm.width() * 4;
        if !std::ptr::eq(&self.embed, &self.lm_head) {
            b += self.lm_head.size_bytes();
        }
        for l in &self.layers {
            b += match &l.attn {
                Attention::Gqa(a) => a.size_bytes(),
            };
            b += match &l.ffn {
                Ffn::Dense(m) => m.size_bytes(),
                Ffn::Moe(m) => m.size_bytes(),
            };
        }
        b
    }

    /// The batched forward pass. Caller has validated ids and context room.
    pub fn forward(&self, batch: &mut [SeqStep<'_>]) -> Vec<Vec<f32>> {
        let hidden = self.hidden_size;
        let mut rows = BatchRows {
            seq: Vec::new(),
            pos: Vec::new(),
            starts: vec![0],
        };
        for (s, step) in batch.iter().enumerate() {
            for (j, _) in step.tokens.iter().enumerate() {
                rows.seq.push(s);
                rows.pos.push(step.cache.len + j);
            }
            rows.starts.push(rows.seq.len());
        }
        let n = rows.len();
        let mut x = vec![0f32; n * hidden];
        let mut i = 0;
        for step in batch.iter() {
            for &t in step.tokens {
                self.embed
                    .row_to_f32(t as usize, &mut x[i * hidden..(i + 1) * hidden]);
                i += 1;
            }
        }
        let mut caches: Vec<&mut KvCache> = batch.iter_mut().map(|s| &mut *s.cache).collect();
        for (li, layer) in self.layers.iter().enumerate() {
            let h = layer.attn_norm.forward(&x);
            let a = match &layer.attn {
                Attention::Gqa(att) => att.forward(&h, &rows, &mut caches, li),
            };
            add_into(&mut x, &a);
            let h = layer.ffn_norm.forward(&x);
            let f = match &layer.ffn {
                Ffn::Dense(m) => m.forward(&h, n),
                Ffn::Moe(m) => m.forward(&h, n),
            };
            add_into(&mut x, &f);
        }
        for step in batch.iter_mut() {
            step.cache.len += step.tokens.len();
        }

        // Final norm and lm_head only on the rows whose logits are wanted.
        let mut wanted: Vec<usize> = Vec::new();
        for (s, step) in batch.iter().enumerate() {
            let r = rows.seq_range(s);
            match step.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => {
                    if !r.is_empty() {
                        wanted.push(r.end - 1)
                    }
                }
                LogitsWanted::All => wanted.extend(r),
            }
        }
        let mut hs = Vec::with_capacity(wanted.len() * hidden);
        for &r in &wanted {
            hs.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
        }
        self.final_norm.apply_chunks(&mut hs);
        let v = self.vocab_size;
        let mut logits = vec![0f32; wanted.len() * v];
        self.lm_head.matmul(&hs, wanted.len(), &mut logits);
        let mut out = Vec::with_capacity(batch.len());
        let mut k = 0;
        for step in batch.iter() {
            let m = match step.logits {
                LogitsWanted::None => 0,
                LogitsWanted::Last => usize::from(!step.tokens.is_empty()),
                LogitsWanted::All => step.tokens.len(),
            };
            out.push(logits[k * v..(k + m) * v].to_vec());
            k += m;
        }
        out
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Dimensions every GQA family reads the same way.
pub struct CommonDims {
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub max_context: usize,
    pub eps: f32,
    pub tie_embeddings: bool,
}

impl CommonDims {
    pub fn read(cfg: &Cfg) -> Result<CommonDims> {
        let hidden = cfg.dim("hidden_size")?;
        let n_heads = cfg.dim("num_attention_heads")?;
        let n_kv_heads = match cfg.opt_usize("num_key_value_heads")? {
            Some(k) => k,
            None => n_heads,
        };
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(cfg.err(format!(
                "num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv_heads})"
            )));
        }
        let head_dim = match cfg.opt_usize("head_dim")? {
            Some(d) if d > 0 => d,
            _ => {
                if hidden % n_heads != 0 {
                    return Err(cfg.err("hidden_size is not a multiple of num_attention_heads and no head_dim is given"));
                }
                hidden / n_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(cfg.err(format!("head_dim {head_dim} must be even for RoPE")));
        }
        let act = cfg.str_or("hidden_act", "silu")?;
        if act != "silu" {
            return Err(cfg.err(format!("hidden_act '{act}' is not supported (silu is)")));
        }
        Ok(CommonDims {
            hidden,
            n_layers: cfg.dim("num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab: cfg.dim("vocab_size")?,
            max_context: cfg.dim("max_position_embeddings")?,
            eps: cfg.f64_or("rms_norm_eps", 1e-6)? as f32,
            tie_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        })
    }

    /// Embedding, final norm and lm_head under the usual Hub names.
    pub fn embeddings(&self, ld: &blocks::Loader) -> Result<(Matrix, RmsNorm, Matrix)> {
        let embed = ld.matrix("model.embed_tokens.weight", self.vocab, self.hidden)?;
        let norm = ld.norm("model.norm.weight", self.hidden, self.eps)?;
        let lm_head = if self.tie_embeddings && ld.ckpt.get("lm_head.weight").is_none() {
            embed.clone()
        } else {
            ld.matrix("lm_head.weight", self.vocab, self.hidden)?
        };
        Ok((embed, norm, lm_head))
    }
}
