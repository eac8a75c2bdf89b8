//! Grouped-query attention with a standard KV cache (OLMoE, Qwen3-MoE, Mixtral, GLM-4.5).

use super::blocks::{axpy, softmax, RmsNorm, Rope};
use super::BatchRows;
use crate::kv::KvCache;
use crate::tensor::Linear;
use rayon::prelude::*;

/// Where q/k normalisation happens, if anywhere.
#[derive(Clone, Debug)]
pub enum QkNorm {
    None,
    /// RMSNorm over the whole projected q (and k) vector (OLMoE).
    Whole {
        q: RmsNorm,
        k: RmsNorm,
    },
    /// RMSNorm over each head separately (Qwen3, GLM-4.5).
    PerHead {
        q: RmsNorm,
        k: RmsNorm,
    },
}

#[derive(Clone, Debug)]
pub struct GqaAttention {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    pub o_proj: Linear,
    pub qk_norm: QkNorm,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rope: Rope,
    /// Attend only to the last `window` positions (Mixtral's sliding window).
    pub sliding_window: Option<usize>,
    /// Clamp q, k, v to ±clip (OLMoE's `clip_qkv`).
    pub clip_qkv: Option<f32>,
    pub scale: f32,
}

impl GqaAttention {
    /// Attention for all rows of the batch at layer `layer`: projects, normalises, rotates,
    /// appends k/v to each sequence's cache, attends causally, projects out.
    pub fn forward(
        &self,
        h: &[f32],
        rows: &BatchRows,
        caches: &mut [&mut KvCache],
        layer: usize,
    ) -> Vec<f32> {
        let n = rows.len();
        let mut q = self.q_proj.forward(h, n);
        let mut k = self.k_proj.forward(h, n);
        let mut v = self.v_proj.forward(h, n);
        let (qw, kw) = (
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        match &self.qk_norm {
            QkNorm::None => {}
            // The norm's width says which: a whole row, or one head at a time.
            QkNorm::Whole { q: nq, k: nk } | QkNorm::PerHead { q: nq, k: nk } => {
                nq.apply_chunks(&mut q);
                nk.apply_chunks(&mut k);
            }
        }
        // OLMoE clamps after the q/k norm.
        if let Some(c) = self.clip_qkv {
            for x in q.iter_mut().chain(k.iter_mut()).chain(v.iter_mut()) {
                *x = x.clamp(-c, c);
            }
        }
        for i in 0..n {
            let p = rows.pos[i];
            self.rope
                .apply(&mut q[i * qw..(i + 1) * qw], self.head_dim, p);
            self.rope
                .apply(&mut k[i * kw..(i + 1) * kw], self.head_dim, p);
        }
        // Append this step's keys and values to each sequence's cache.
        for (s, cache) in caches.iter_mut().enumerate() {
            let r = rows.seq_range(s);
            let l = &mut cache.layers[layer];
            l.k.extend_from_slice(&k[r.start * kw..r.end * kw]);
            l.v.extend_from_slice(&v[r.start * kw..r.end * kw]);
        }
        let mut out = vec![0f32; n * qw];
        let group = self.n_heads / self.n_kv_heads;
        let hd = self.head_dim;
        let caches: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
            let (i, head) = (idx / self.n_heads, idx % self.n_heads);
            let s = rows.seq[i];
            let p = rows.pos[i];
            let kv = &caches[s].layers[layer];
            let kvh = head / group;
            let first = match self.sliding_window {
                Some(w) if p + 1 > w => p + 1 - w,
                _ => 0,
            };
            let qh = &q[i * qw + head * hd..i * qw + (head + 1) * hd];
            let mut scores: Vec<f32> = (first..=p)
                .map(|t| {
                    let kh = &kv.k[t * kw + kvh * hd..t * kw + (kvh + 1) * hd];
                    crate::kernels::dot_f32(qh, kh) * self.scale
                })
                .collect();
            softmax(&mut scores);
            o.fill(0.0);
            for (j, w) in scores.iter().enumerate() {
                let t = first + j;
                let vh = &kv.v[t * kw + kvh * hd..t * kw + (kvh + 1) * hd];
                axpy(o, *w, vh);
            }
        });
        self.o_proj.forward(&out, n)
    }

    pub fn kv_widths(&self) -> (usize, usize) {
        (
            self.n_kv_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        )
    }

    pub fn size_bytes(&self) -> usize {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
            .iter()
            .map(|l| l.weight.size_bytes())
            .sum()
    }
}

/// How a family spells its q/k normalisation in the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNormKind {
    None,
    Whole,
    PerHead,
}

impl GqaAttention {
    /// Loads `{prefix}.{q,k,v,o}_proj` (with biases when `bias`) and, per `qk`,
    /// `{prefix}.q_norm` / `{prefix}.k_norm`.
    pub fn load(
        ld: &super::blocks::Loader,
        prefix: &str,
        d: &super::CommonDims,
        qk: QkNormKind,
        bias: bool,
        rope: Rope,
    ) -> crate::error::Result<GqaAttention> {
        let (qw, kw) = (d.n_heads * d.head_dim, d.n_kv_heads * d.head_dim);
        let qk_norm = match qk {
            QkNormKind::None => QkNorm::None,
            QkNormKind::Whole => QkNorm::Whole {
                q: ld.norm(&format!("{prefix}.q_norm.weight"), qw, d.eps)?,
                k: ld.norm(&format!("{prefix}.k_norm.weight"), kw, d.eps)?,
            },
            QkNormKind::PerHead => QkNorm::PerHead {
                q: ld.norm(&format!("{prefix}.q_norm.weight"), d.head_dim, d.eps)?,
                k: ld.norm(&format!("{prefix}.k_norm.weight"), d.head_dim, d.eps)?,
            },
        };
        Ok(GqaAttention {
            q_proj: ld.linear(&format!("{prefix}.q_proj"), qw, d.hidden, bias)?,
            k_proj: ld.linear(&format!("{prefix}.k_proj"), kw, d.hidden, bias)?,
            v_proj: ld.linear(&format!("{prefix}.v_proj"), kw, d.hidden, bias)?,
            o_proj: ld.linear(&format!("{prefix}.o_proj"), d.hidden, qw, false)?,
            qk_norm,
            n_heads: d.n_heads,
            n_kv_heads: d.n_kv_heads,
            head_dim: d.head_dim,
            rope,
            sliding_window: None,
            clip_qkv: None,
            scale: 1.0 / (d.head_dim as f32).sqrt(),
        })
    }
}
