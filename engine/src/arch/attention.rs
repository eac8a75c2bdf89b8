//! Grouped-query attention with a standard KV cache (OLMoE, Qwen3-MoE, Mixtral, GLM-4.5).

use super::blocks::{RmsNorm, Rope};
use super::exec;
use super::profile::{self, Phase};
use super::simd::softmax_fast_with_sink;
use super::step::BatchRows;
use crate::kv::{ops as kv_ops, KvBuf, KvCache};
use crate::tensor::Linear;

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
    /// Attention sinks (gpt-oss's `self_attn.sinks`): one learned logit per query head in
    /// its softmax's denominator, attending to nothing.
    pub sinks: Option<Vec<f32>>,
    pub scale: f32,
}

impl GqaAttention {
    /// Attention for all rows of the batch at layer `layer`: projects (q, k and v in one
    /// parallel region over one prepared input), normalises, rotates, appends k/v to each
    /// sequence's cache, attends causally, projects out.
    pub fn forward(
        &self,
        h: &[f32],
        rows: &BatchRows,
        caches: &mut [&mut KvCache],
        layer: usize,
    ) -> Vec<f32> {
        let n = rows.len();
        let (qw, kw) = (
            self.n_heads * self.head_dim,
            self.n_kv_heads * self.head_dim,
        );
        let proj = profile::span(Phase::AttnProj);
        let (mut q, mut k, mut v) = (vec![0f32; n * qw], vec![0f32; n * kw], vec![0f32; n * kw]);
        exec::products(
            h,
            n,
            &[
                &self.q_proj.weight,
                &self.k_proj.weight,
                &self.v_proj.weight,
            ],
            &mut [&mut q, &mut k, &mut v],
        );
        for (lin, y) in [
            (&self.q_proj, &mut q),
            (&self.k_proj, &mut k),
            (&self.v_proj, &mut v),
        ] {
            lin.add_bias(y);
        }
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
        let half = self.rope.rotary_dim / 2;
        let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
        for i in 0..n {
            self.rope.cos_sin_into(rows.pos[i], &mut cos, &mut sin);
            self.rope
                .rotate(&mut q[i * qw..(i + 1) * qw], self.head_dim, &cos, &sin);
            self.rope
                .rotate(&mut k[i * kw..(i + 1) * kw], self.head_dim, &cos, &sin);
        }
        // Append this step's keys and values to each sequence's cache.
        for (s, cache) in caches.iter_mut().enumerate() {
            let r = rows.seq_range(s);
            let l = &mut cache.layers[layer];
            l.k.extend_from_f32(&k[r.start * kw..r.end * kw]);
            l.v.extend_from_f32(&v[r.start * kw..r.end * kw]);
        }
        drop(proj);
        let core = profile::span(Phase::AttnCore);
        let mut out = vec![0f32; n * qw];
        let group = self.n_heads / self.n_kv_heads;
        let hd = self.head_dim;
        let caches: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        // One task per (block of rows of one sequence, kv head): the block's query heads
        // read each cached key and value once, each row up to its own causal end. Blocks
        // of several rows only in a prefill without a sliding window (every row starts at
        // position 0); a row's sums are the same operations whatever shares its task.
        let block = if n > 1 && self.sliding_window.is_none() {
            8
        } else {
            1
        };
        let mut tasks: Vec<(usize, usize)> = Vec::new(); // (first row, rows)
        for s in 0..caches.len() {
            let r = rows.seq_range(s);
            let mut i = r.start;
            while i < r.end {
                let b = (r.end - i).min(block);
                tasks.push((i, b));
                i += b;
            }
        }
        // Each task writes only its own rows' slices of its own kv head.
        let out_ptr = crate::kernels::team::SharedMut::new(&mut out);
        let nkv = self.n_kv_heads;
        crate::kernels::team::par_for(tasks.len() * nkv, &|idx| {
            let ((i0, b), kvh) = (tasks[idx / nkv], idx % nkv);
            let gw = group * hd;
            let (mut last, mut first) = (0, usize::MAX);
            let mut ends = Vec::with_capacity(b * group);
            for i in i0..i0 + b {
                let p = rows.pos[i];
                first = first.min(match self.sliding_window {
                    Some(w) if p + 1 > w => p + 1 - w,
                    _ => 0,
                });
                last = last.max(p + 1);
                ends.extend(std::iter::repeat_n(p + 1, group));
            }
            for e in ends.iter_mut() {
                *e -= first;
            }
            let kv = &caches[rows.seq[i0]].layers[layer];
            let heads = HeadGroup {
                k: &kv.k,
                v: &kv.v,
                width: kw,
                offset: kvh * hd,
                head_dim: hd,
                scale: self.scale,
                sinks: self
                    .sinks
                    .as_ref()
                    .map(|s| &s[kvh * group..(kvh + 1) * group]),
            };
            let at = |i: usize| i * qw + kvh * gw;
            if b == 1 {
                // SAFETY: row i0's slice of kv head kvh, written by this task only.
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.ptr().add(at(i0)), gw) };
                heads.attend(&q[at(i0)..at(i0) + gw], &ends, first..last, o);
                return;
            }
            let mut qs = Vec::with_capacity(b * gw);
            for i in i0..i0 + b {
                qs.extend_from_slice(&q[at(i)..at(i) + gw]);
            }
            let mut o = vec![0f32; b * gw];
            heads.attend(&qs, &ends, first..last, &mut o);
            for (k, i) in (i0..i0 + b).enumerate() {
                // SAFETY: as above, for each row of the block.
                let dst = unsafe { std::slice::from_raw_parts_mut(out_ptr.ptr().add(at(i)), gw) };
                dst.copy_from_slice(&o[k * gw..(k + 1) * gw]);
            }
        });
        drop(core);
        let _out = profile::span(Phase::AttnOut);
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
        d: &super::config::CommonDims,
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
            // o_proj's bias where the checkpoint has one (gpt-oss; GLM-4.5 biases q/k/v only).
            o_proj: ld.linear(
                &format!("{prefix}.o_proj"),
                d.hidden,
                qw,
                bias && ld.ckpt.get(&format!("{prefix}.o_proj.bias")).is_some(),
            )?,
            qk_norm,
            n_heads: d.n_heads,
            n_kv_heads: d.n_kv_heads,
            head_dim: d.head_dim,
            rope,
            sliding_window: None,
            clip_qkv: None,
            sinks: None,
            scale: 1.0 / (d.head_dim as f32).sqrt(),
        })
    }
}

/// The cached keys and values of one kv head: `head_dim` elements at `offset` of every
/// `width`-element position.
pub struct HeadGroup<'a> {
    pub k: &'a KvBuf,
    pub v: &'a KvBuf,
    pub width: usize,
    pub offset: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// The sink logit of each query head of the group ([`GqaAttention::sinks`]); the heads
    /// of a call are rows after rows of these.
    pub sinks: Option<&'a [f32]>,
}

impl HeadGroup<'_> {
    /// Causal attention of the query heads `qs` (`g × head_dim`, all sharing this kv head)
    /// over the cached positions `span`, head `h` over its first `ends[h]` of them, into `o`
    /// (`g × head_dim`). A head's scores, softmax and weighted sum do not depend on the
    /// other heads of the call.
    pub fn attend(&self, qs: &[f32], ends: &[usize], span: std::ops::Range<usize>, o: &mut [f32]) {
        let hd = self.head_dim;
        let g = qs.len() / hd;
        let len = span.len();
        exec::with_scratch(g * len, |scores| {
            kv_ops::group_scores(
                self.k,
                self.width,
                self.offset,
                hd,
                span.start,
                qs,
                ends,
                self.scale,
                scores,
            );
            for (h, (sc, &e)) in scores.chunks_exact_mut(len).zip(ends).enumerate() {
                let sink = self.sinks.map(|s| s[h % s.len()]);
                softmax_fast_with_sink(&mut sc[..e], sink);
                sc[e..].fill(0.0);
            }
            o.fill(0.0);
            kv_ops::group_values(
                self.v,
                self.width,
                self.offset,
                hd,
                span.start,
                scores,
                ends,
                o,
            );
        });
    }
}
