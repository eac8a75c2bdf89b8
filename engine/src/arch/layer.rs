//! One decoder layer as every family instantiates it: its attention ([`Attention`]: GQA or
//! MLA) and feed-forward ([`Ffn`]: dense MLP or MoE) around two RMSNorms, loaded under the
//! Hub's shared names and run over a batch of rows.

use super::attention::GqaAttention;
use super::blocks::{self, Mlp, RmsNorm};
use super::config::CommonDims;
use super::dsa::Selection;
use super::mla::MlaAttention;
use super::moe::Moe;
use super::profile;
use super::step::BatchRows;
use crate::error::Result;
use crate::kv::{KvCache, KvDtype};

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

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
