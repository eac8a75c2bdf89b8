//! Model families and the decoder they share.
//!
//! Each family file (`olmoe.rs`, `qwen3_moe.rs`, `mixtral.rs`, ...) reads its config keys and
//! weight names and assembles a [`Network`] from the shared blocks; the forward pass over a
//! batch of rows is written once, here.

pub mod attention;
pub mod blocks;
pub mod census;
pub mod config;
pub mod deepseek_v3;
pub mod dsa;
pub mod exec;
pub mod glm4_moe;
pub mod glm_moe_dsa;
pub mod load;
pub mod mixtral;
pub mod mla;
pub mod moe;
pub mod mtp;
pub mod olmoe;
pub mod profile;
pub mod qwen3_moe;
pub mod simd;
pub mod step;

pub use load::LoadHook;
pub use step::BatchRows;

use crate::container::Checkpoint;
use crate::error::{Error, Result};
use crate::kv::{KvCache, KvDtype};
use crate::tensor::Matrix;
use attention::GqaAttention;
use blocks::{Mlp, RmsNorm};
use config::Cfg;
use dsa::Selection;
use mla::MlaAttention;
use moe::Moe;
use mtp::MtpLayer;
use step::{LogitsWanted, SeqStep};

/// `model_type` values this engine runs, with the builder for each.
/// Builds a family's network from its checkpoint and config.
type Builder = fn(&Checkpoint, &Cfg, &LoadHook) -> Result<Network>;

const FAMILIES: &[(&str, Builder)] = &[
    ("olmoe", olmoe::build),
    ("qwen3_moe", qwen3_moe::build),
    ("mixtral", mixtral::build),
    ("deepseek_v3", deepseek_v3::build),
    ("glm4_moe", glm4_moe::build),
    ("glm_moe_dsa", glm_moe_dsa::build),
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

// One per layer, never in a hot collection: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Attention {
    Gqa(GqaAttention),
    Mla(MlaAttention),
}

impl Attention {
    /// Cache floats per position `(k, v)` and of side data.
    pub fn cache_widths(&self) -> (usize, usize, usize) {
        match self {
            Attention::Gqa(a) => {
                let (k, v) = a.kv_widths();
                (k, v, 0)
            }
            Attention::Mla(a) => {
                let (k, v) = a.kv_widths();
                (k, v, a.extra_width())
            }
        }
    }

    /// The KV dtype of this attention kind unless one is forced (see [`crate::kv`]): f16 for
    /// GQA keys and values, f32 for MLA's latent.
    pub fn default_kv_dtype(&self) -> KvDtype {
        match self {
            Attention::Gqa(_) => KvDtype::F16,
            Attention::Mla(_) => KvDtype::F32,
        }
    }

    /// Floats per position a plain per-head K/V cache would need for this layer.
    pub fn full_kv_width(&self) -> usize {
        match self {
            Attention::Gqa(a) => {
                let (k, v) = a.kv_widths();
                k + v
            }
            Attention::Mla(a) => a.expanded_kv_width(),
        }
    }

    pub fn size_bytes(&self) -> usize {
        match self {
            Attention::Gqa(a) => a.size_bytes(),
            Attention::Mla(a) => a.size_bytes(),
        }
    }
}

#[allow(clippy::large_enum_variant)]
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

impl Layer {
    /// A pre-norm decoder layer under the Hub's names shared by every family:
    /// `{prefix}.input_layernorm` before the attention, `{prefix}.post_attention_layernorm`
    /// before the feed-forward.
    pub fn load(
        ld: &blocks::Loader,
        prefix: &str,
        d: &CommonDims,
        attn: Attention,
        ffn: Ffn,
    ) -> Result<Layer> {
        let layer = Layer {
            attn_norm: ld.norm(&format!("{prefix}.input_layernorm.weight"), d.hidden, d.eps)?,
            attn,
            ffn_norm: ld.norm(
                &format!("{prefix}.post_attention_layernorm.weight"),
                d.hidden,
                d.eps,
            )?,
            ffn,
        };
        // Every family finishes a decoder layer here: the one place progress is told.
        ld.progress.layer_loaded(prefix);
        Ok(layer)
    }

    /// One pre-norm decoder layer over the rows `x` (updated in place), using cache layer
    /// `cache_layer` of every sequence. `sel` carries the DSA selection between layers.
    pub fn forward(
        &self,
        x: &mut [f32],
        rows: &BatchRows,
        caches: &mut [&mut KvCache],
        cache_layer: usize,
        sel: &mut Option<Selection>,
    ) {
        let n = rows.len();
        let h = self.attn_norm.forward(x);
        let a = match &self.attn {
            Attention::Gqa(att) => att.forward(&h, rows, caches, cache_layer),
            Attention::Mla(att) => att.forward(&h, rows, caches, cache_layer, sel),
        };
        add_into(x, &a);
        if let Ffn::Moe(m) = &self.ffn {
            m.hooks.after_attention(x, n);
        }
        let h = self.ffn_norm.forward(x);
        let f = match &self.ffn {
            Ffn::Dense(m) => {
                let _dense = profile::span(profile::Phase::Experts);
                m.forward(&h, n)
            }
            Ffn::Moe(m) => m.forward(&h, n),
        };
        add_into(x, &f);
    }

    pub fn size_bytes(&self) -> usize {
        self.attn.size_bytes()
            + match &self.ffn {
                Ffn::Dense(m) => m.size_bytes(),
                Ffn::Moe(m) => m.size_bytes(),
            }
    }
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
    /// Multi-token-prediction layers (`num_nextn_predict_layers`), drafting for speculative
    /// decoding; empty when the checkpoint carries none.
    pub mtp: Vec<MtpLayer>,
}

/// Builds the rows of a batched step: sequence and position of each.
fn batch_rows(batch: &[SeqStep<'_>]) -> BatchRows {
    let mut rows = BatchRows {
        seq: Vec::new(),
        pos: Vec::new(),
        starts: vec![0],
    };
    for (s, step) in batch.iter().enumerate() {
        for j in 0..step.tokens.len() {
            rows.seq.push(s);
            rows.pos.push(step.cache.len + j);
        }
        rows.starts.push(rows.seq.len());
    }
    rows
}

/// The rows of `range` that `want` selects.
fn wanted_rows(want: LogitsWanted, range: std::ops::Range<usize>) -> std::ops::Range<usize> {
    match want {
        LogitsWanted::None => range.start..range.start,
        LogitsWanted::Last if range.is_empty() => range,
        LogitsWanted::Last => range.end - 1..range.end,
        LogitsWanted::All => range,
    }
}

/// A cache with one layer per entry of `layers`, sized for `capacity` positions.
/// `dtype` forces every layer's dtype; `None`: each layer's attention default.
fn cache_for<'a>(
    layers: impl Iterator<Item = &'a Layer>,
    capacity: usize,
    dtype: Option<KvDtype>,
) -> KvCache {
    let layers: Vec<&Layer> = layers.collect();
    let widths: Vec<(usize, usize, usize)> = layers.iter().map(|l| l.attn.cache_widths()).collect();
    let kv: Vec<(usize, usize)> = widths.iter().map(|&(k, v, _)| (k, v)).collect();
    let mut cache = KvCache::new(&kv, capacity);
    for ((l, &(_, _, extra)), layer) in cache.layers.iter_mut().zip(&widths).zip(&layers) {
        l.extra_width = extra;
        let d = dtype.unwrap_or_else(|| layer.attn.default_kv_dtype());
        l.k = crate::kv::KvBuf::new(d);
        l.v = crate::kv::KvBuf::new(d);
    }
    cache
}

impl Network {
    /// A cache in each layer's default dtype (f16 keys and values for GQA, f32 latents for
    /// MLA) unless `COLIBRI_KV` forces one (see [`crate::kv`]).
    pub fn new_cache(&self) -> KvCache {
        cache_for(self.layers.iter(), self.max_context, KvDtype::from_env())
    }

    /// A cache with every layer in `dtype`.
    pub fn new_cache_with(&self, dtype: KvDtype) -> KvCache {
        cache_for(self.layers.iter(), self.max_context, Some(dtype))
    }

    /// Bytes per position a new cache holds, and what a plain per-head K/V cache of the same
    /// layers would hold in the same dtype: MLA keeps a latent instead of expanded keys and
    /// values.
    pub fn kv_bytes_per_token(&self) -> (usize, usize) {
        let forced = KvDtype::from_env();
        let (mut held, mut full) = (0, 0);
        for l in &self.layers {
            let e = forced.unwrap_or_else(|| l.attn.default_kv_dtype()).size();
            let (k, v, x) = l.attn.cache_widths();
            held += (k + v) * e + x * 4;
            full += l.attn.full_kv_width() * e;
        }
        (held, full)
    }

    pub fn weight_bytes(&self) -> usize {
        let mut b = self.embed.size_bytes() + self.final_norm.width() * 4;
        if !std::ptr::eq(&self.embed, &self.lm_head) {
            b += self.lm_head.size_bytes();
        }
        b + self.layers.iter().map(|l| l.size_bytes()).sum::<usize>()
    }

    /// Bytes of the MTP layers (not in [`weight_bytes`](Self::weight_bytes): decoding
    /// without drafts never reads them).
    pub fn mtp_weight_bytes(&self) -> usize {
        self.mtp.iter().map(|m| m.size_bytes()).sum()
    }

    /// The batched forward pass. Caller has validated ids and context room.
    pub fn forward(&self, batch: &mut [SeqStep<'_>]) -> Vec<Vec<f32>> {
        self.forward_with_hidden(batch, &[]).0
    }

    /// The batched forward pass, also returning the final-normed hidden states of the rows
    /// `hidden[s]` selects for sequence `s` (missing entries mean none): what the MTP layers
    /// take as their input. Returns (logits per sequence, hidden rows per sequence).
    pub fn forward_with_hidden(
        &self,
        batch: &mut [SeqStep<'_>],
        hidden: &[LogitsWanted],
    ) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let width = self.hidden_size;
        let rows = batch_rows(batch);
        let n = rows.len();
        let mut x = vec![0f32; n * width];
        let mut i = 0;
        for step in batch.iter() {
            for &t in step.tokens {
                self.embed
                    .row_to_f32(t as usize, &mut x[i * width..(i + 1) * width]);
                i += 1;
            }
        }
        let mut caches: Vec<&mut KvCache> = batch.iter_mut().map(|s| &mut *s.cache).collect();
        let mut sel = None;
        for (li, layer) in self.layers.iter().enumerate() {
            layer.forward(&mut x, &rows, &mut caches, li, &mut sel);
        }
        for step in batch.iter_mut() {
            step.cache.len += step.tokens.len();
        }

        // Final norm on the rows whose logits or hidden states are wanted, lm_head only on
        // the former.
        let mut normed: Vec<usize> = Vec::new();
        let mut logit_rows: Vec<usize> = Vec::new();
        for (s, step) in batch.iter().enumerate() {
            let r = rows.seq_range(s);
            let lr = wanted_rows(step.logits, r.clone());
            let hr = wanted_rows(
                hidden.get(s).copied().unwrap_or(LogitsWanted::None),
                r.clone(),
            );
            logit_rows.extend(lr.clone());
            normed.extend(r.filter(|i| lr.contains(i) || hr.contains(i)));
        }
        let _head = profile::span(profile::Phase::LmHead);
        let mut hs = Vec::with_capacity(normed.len() * width);
        for &r in &normed {
            hs.extend_from_slice(&x[r * width..(r + 1) * width]);
        }
        self.final_norm.apply_chunks(&mut hs);
        let normed_row = |r: usize| {
            let k = normed.binary_search(&r).expect("wanted rows are normed");
            &hs[k * width..(k + 1) * width]
        };
        let mut head_in = Vec::with_capacity(logit_rows.len() * width);
        for &r in &logit_rows {
            head_in.extend_from_slice(normed_row(r));
        }
        let v = self.vocab_size;
        let mut logits = vec![0f32; logit_rows.len() * v];
        self.lm_head.matmul(&head_in, logit_rows.len(), &mut logits);
        let mut out = Vec::with_capacity(batch.len());
        let mut out_hidden = Vec::with_capacity(batch.len());
        let mut k = 0;
        for (s, step) in batch.iter().enumerate() {
            let r = rows.seq_range(s);
            let m = wanted_rows(step.logits, r.clone()).len();
            out.push(logits[k * v..(k + m) * v].to_vec());
            k += m;
            let hr = wanted_rows(hidden.get(s).copied().unwrap_or(LogitsWanted::None), r);
            let mut h = Vec::with_capacity(hr.len() * width);
            for row in hr {
                h.extend_from_slice(normed_row(row));
            }
            out_hidden.push(h);
        }
        (out, out_hidden)
    }

    /// A cache for MTP layer `k` (one layer; the same capacity as the main cache).
    pub fn new_mtp_cache(&self, k: usize) -> KvCache {
        cache_for(
            std::iter::once(&self.mtp[k].layer),
            self.max_context,
            KvDtype::from_env(),
        )
    }

    /// Runs MTP layer `k` on one sequence: row `j` combines `tokens[j]` (the token at
    /// position `cache.len + j + 1`) with `prev` row `j` (the hidden state the previous
    /// stage produced at position `cache.len + j`) and predicts the token after `tokens[j]`.
    /// Returns the logits of the rows `want` selects and every row's output hidden state
    /// (the input of a further chained MTP step). The caller checks ids and room.
    pub fn mtp_forward(
        &self,
        k: usize,
        cache: &mut KvCache,
        tokens: &[u32],
        prev: &[f32],
        want: LogitsWanted,
    ) -> (Vec<f32>, Vec<f32>) {
        let m = &self.mtp[k];
        let width = self.hidden_size;
        let n = tokens.len();
        let start = cache.len;
        let embed = m.embed.as_ref().unwrap_or(&self.embed);
        let mut joined = vec![0f32; n * 2 * width];
        for (j, &t) in tokens.iter().enumerate() {
            let row = &mut joined[j * 2 * width..(j + 1) * 2 * width];
            // vLLM zeroes the embedding at position 0 ("not needed by MTP").
            if start + j > 0 {
                embed.row_to_f32(t as usize, &mut row[..width]);
                m.enorm.apply(&mut row[..width]);
            }
            row[width..].copy_from_slice(&prev[j * width..(j + 1) * width]);
            m.hnorm.apply(&mut row[width..]);
        }
        let mut x = vec![0f32; n * width];
        m.eh_proj.matmul(&joined, n, &mut x);
        let rows = BatchRows {
            seq: vec![0; n],
            pos: (start..start + n).collect(),
            starts: vec![0, n],
        };
        let mut sel = None;
        m.layer
            .forward(&mut x, &rows, &mut [&mut *cache], 0, &mut sel);
        cache.len += n;
        let lr = wanted_rows(want, 0..n);
        let mut hs = x[lr.start * width..lr.end * width].to_vec();
        m.norm.apply_chunks(&mut hs);
        let head = m.head.as_ref().unwrap_or(&self.lm_head);
        let mut logits = vec![0f32; lr.len() * self.vocab_size];
        head.matmul(&hs, lr.len(), &mut logits);
        (logits, x)
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
        let mut d = Self::read_shared(cfg)?;
        let n_heads = d.n_heads;
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
            Some(h) if h > 0 => h,
            _ => {
                if d.hidden % n_heads != 0 {
                    return Err(cfg.err("hidden_size is not a multiple of num_attention_heads and no head_dim is given"));
                }
                d.hidden / n_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(cfg.err(format!("head_dim {head_dim} must be even for RoPE")));
        }
        d.n_kv_heads = n_kv_heads;
        d.head_dim = head_dim;
        Ok(d)
    }

    /// Everything but the GQA head layout (`n_kv_heads` = `n_heads`, `head_dim` = 0): MLA
    /// families size their heads from their own keys (see [`mla::MlaDims`]).
    pub fn read_shared(cfg: &Cfg) -> Result<CommonDims> {
        let act = cfg.str_or("hidden_act", "silu")?;
        if act != "silu" {
            return Err(cfg.err(format!("hidden_act '{act}' is not supported (silu is)")));
        }
        let n_heads = cfg.dim("num_attention_heads")?;
        Ok(CommonDims {
            hidden: cfg.dim("hidden_size")?,
            n_layers: cfg.dim("num_hidden_layers")?,
            n_heads,
            n_kv_heads: n_heads,
            head_dim: 0,
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
