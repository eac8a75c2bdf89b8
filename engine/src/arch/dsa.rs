//! DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2 `deepseek_v32`, GLM-5
//! `glm_moe_dsa`): a cheap multi-head
//! scorer that picks, for every query, the `index_topk` earlier positions the main (MLA)
//! attention may look at. Its single-head keys live in the KV cache's per-layer side data
//! (`LayerKv::extra`), one `index_head_dim` row per position.

use super::blocks::{LayerNorm, Loader, Rope, RopeLayout};
use super::step::BatchRows;
use crate::error::Result;
use crate::kv::KvCache;
use crate::tensor::Matrix;
use rayon::prelude::*;

/// Per row of a batched step, the cache positions its attention may use, ascending; `None`
/// means every causal position (the context is not longer than `index_topk` yet).
pub type Selection = Vec<Option<Vec<u32>>>;

#[derive(Clone, Debug)]
pub struct DsaIndexer {
    /// `[n_heads × head_dim, q_lora_rank]`, applied to MLA's normalised q latent.
    pub wq_b: Matrix,
    /// `[head_dim, hidden]`.
    pub wk: Matrix,
    pub k_norm: LayerNorm,
    /// `[n_heads, hidden]`: per-head weights of the score sum.
    pub weights_proj: Matrix,
    pub n_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each head that are rotated (MLA's `qk_rope_head_dim`).
    pub rope_dim: usize,
    /// How those dims pair up: GLM-5 interleaves them like its MLA, DeepSeek-V3.2 splits
    /// them in halves (its MLA interleaves).
    pub rope_layout: RopeLayout,
    pub topk: usize,
}

impl DsaIndexer {
    /// Loads `{prefix}.{wq_b,wk,k_norm,weights_proj}`.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        ld: &Loader,
        prefix: &str,
        hidden: usize,
        q_lora_rank: usize,
        n_heads: usize,
        head_dim: usize,
        rope_dim: usize,
        rope_layout: RopeLayout,
        topk: usize,
    ) -> Result<DsaIndexer> {
        Ok(DsaIndexer {
            wq_b: ld.matrix(
                &format!("{prefix}.wq_b.weight"),
                n_heads * head_dim,
                q_lora_rank,
            )?,
            wk: ld.matrix(&format!("{prefix}.wk.weight"), head_dim, hidden)?,
            // transformers builds it as nn.LayerNorm(head_dim, eps=1e-6), whatever the config says.
            k_norm: ld.layer_norm(&format!("{prefix}.k_norm"), head_dim, 1e-6)?,
            weights_proj: ld.matrix(&format!("{prefix}.weights_proj.weight"), n_heads, hidden)?,
            n_heads,
            head_dim,
            rope_dim,
            rope_layout,
            topk,
        })
    }

    pub fn size_bytes(&self) -> usize {
        self.wq_b.size_bytes()
            + self.wk.size_bytes()
            + self.weights_proj.size_bytes()
            + self.k_norm.weight.len() * 8
    }

    /// Computes this step's indexer keys (appending them to each sequence's cache side data
    /// at `layer`) and the positions every row attends to. `h` are the input-normed hidden
    /// rows, `q_resid` MLA's `q_a_layernorm(q_a_proj(h))`, `angles` each row's RoPE cos/sin.
    /// Follows transformers' `GlmMoeDsaIndexer` / `DeepseekV32Indexer`: rope part first in
    /// each head, rotated in [`rope_layout`](Self::rope_layout),
    /// `score[t] = Σ_h w_h·relu(q_h·k_t / √d)` with `w = weights_proj(h) / √heads`.
    #[allow(clippy::too_many_arguments)]
    pub fn select(
        &self,
        h: &[f32],
        q_resid: &[f32],
        rows: &BatchRows,
        caches: &mut [&mut KvCache],
        layer: usize,
        rope: &Rope,
        angles: &[(Vec<f32>, Vec<f32>)],
    ) -> Selection {
        let n = rows.len();
        let (nh, d, rd) = (self.n_heads, self.head_dim, self.rope_dim);
        let mut q = vec![0f32; n * nh * d];
        self.wq_b.matmul(q_resid, n, &mut q);
        let mut k = vec![0f32; n * d];
        self.wk.matmul(h, n, &mut k);
        self.k_norm.apply_chunks(&mut k);
        let mut w = vec![0f32; n * nh];
        self.weights_proj.matmul(h, n, &mut w);
        // Python scalars, computed in f64 and applied as f32 (as torch does).
        let head_weight = (nh as f64).powf(-0.5) as f32;
        let scale = (d as f64).powf(-0.5) as f32;
        for x in w.iter_mut() {
            *x *= head_weight;
        }
        for i in 0..n {
            let (cos, sin) = &angles[i];
            let layout = self.rope_layout;
            rope.rotate_as(layout, &mut k[i * d..i * d + rd], rd, cos, sin);
            for head in 0..nh {
                let o = (i * nh + head) * d;
                rope.rotate_as(layout, &mut q[o..o + rd], rd, cos, sin);
            }
        }
        for (s, cache) in caches.iter_mut().enumerate() {
            let r = rows.seq_range(s);
            cache.layers[layer]
                .extra
                .extend_from_slice(&k[r.start * d..r.end * d]);
        }
        let caches: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        (0..n)
            .into_par_iter()
            .map(|i| {
                let p = rows.pos[i];
                if p < self.topk {
                    return None; // all p + 1 causal positions fit
                }
                let keys = &caches[rows.seq[i]].layers[layer].extra;
                let qi = &q[i * nh * d..(i + 1) * nh * d];
                let wi = &w[i * nh..(i + 1) * nh];
                let mut scored: Vec<(f32, u32)> = (0..=p)
                    .map(|t| {
                        let kt = &keys[t * d..(t + 1) * d];
                        let s = qi
                            .chunks(d)
                            .zip(wi)
                            .map(|(qh, wh)| wh * (crate::kernels::dot_f32(qh, kt) * scale).max(0.0))
                            .sum::<f32>();
                        (s, t as u32)
                    })
                    .collect();
                // Highest scores first; the earlier position wins a tie.
                let by_rank =
                    |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
                scored.select_nth_unstable_by(self.topk - 1, by_rank);
                let mut keep: Vec<u32> = scored[..self.topk].iter().map(|x| x.1).collect();
                keep.sort_unstable();
                Some(keep)
            })
            .collect()
    }
}
