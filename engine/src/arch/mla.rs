//! Multi-head latent attention (DeepSeek-V2/V3, GLM-5) over a latent KV cache.
//!
//! Per position the cache keeps only `[c ‖ k_rope]`: the normalised KV latent `c`
//! (`kv_lora_rank` floats) and the RoPE'd key part shared by every head (`qk_rope_head_dim`).
//! Head `h` would see key `[W_uk[h]·c ‖ k_rope]` and value `W_uv[h]·c`, where `kv_b_proj`
//! stacks `[W_uk[h]; W_uv[h]]` per head. Two ways to attend, equal up to rounding:
//! - absorbed (decode): `q_lat = W_uk[h]ᵀ·q_nope`, score `= [q_lat ‖ q_rope]·[c ‖ k_rope]`,
//!   attend in latent space, then `W_uv[h]` once per query: cost independent of expanding
//!   the whole context;
//! - expanded (long prefill): expand K/V for the context once per head and attend as MHA,
//!   exactly what transformers computes.
//!
//! Each sequence of a batch takes whichever is cheaper for its rows and context.

use super::blocks::{row_block, Loader, RmsNorm, Rope};
use super::config::Cfg;
use super::dsa::{DsaIndexer, Selection};
use super::exec;
use super::profile::{self, Phase};
use super::simd::{axpy, softmax_fast};
use super::step::BatchRows;
use crate::error::Result;
use crate::kernels::dot_f32;
use crate::kv::KvCache;
use crate::tensor::{Linear, Matrix};
use rayon::prelude::*;

/// How the queries are projected.
#[derive(Clone, Debug)]
pub enum MlaQuery {
    /// `q_b_proj(q_a_layernorm(q_a_proj(x)))` (`q_lora_rank` set).
    LowRank { a: Linear, norm: RmsNorm, b: Matrix },
    /// `q_proj(x)` (`q_lora_rank: null`, e.g. DeepSeek-V2-Lite).
    Full(Matrix),
}

/// Which attention formulation to use (see the module docs); `Auto` picks per sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaPath {
    Auto,
    Absorbed,
    Expanded,
}

/// MLA dimensions from the config. transformers-5 configs save `head_dim` =
/// `qk_rope_head_dim`, so the head sizes come from the qk_nope/qk_rope/v keys only.
#[derive(Clone, Debug)]
pub struct MlaDims {
    pub hidden: usize,
    pub n_heads: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub nope: usize,
    pub rope: usize,
    pub v: usize,
    pub bias: bool,
}

impl MlaDims {
    pub fn read(cfg: &Cfg) -> Result<MlaDims> {
        let d = MlaDims {
            hidden: cfg.dim("hidden_size")?,
            n_heads: cfg.dim("num_attention_heads")?,
            q_lora_rank: match cfg.opt_usize("q_lora_rank")? {
                Some(0) | None => None,
                Some(r) => Some(r),
            },
            kv_lora_rank: cfg.dim("kv_lora_rank")?,
            nope: cfg.dim("qk_nope_head_dim")?,
            rope: cfg.dim("qk_rope_head_dim")?,
            v: cfg.dim("v_head_dim")?,
            bias: cfg.bool_or("attention_bias", false)?,
        };
        if !d.rope.is_multiple_of(2) {
            return Err(cfg.err(format!("qk_rope_head_dim {} must be even for RoPE", d.rope)));
        }
        Ok(d)
    }

    pub fn qk_head_dim(&self) -> usize {
        self.nope + self.rope
    }
}

#[derive(Clone, Debug)]
pub struct MlaAttention {
    pub q: MlaQuery,
    /// `kv_a_proj_with_mqa`: `[kv_lora_rank + qk_rope_head_dim, hidden]`.
    pub kv_a: Linear,
    pub kv_a_norm: RmsNorm,
    /// `kv_b_proj` split per head: latent → key (`[nope, kv_lora_rank]`) ...
    pub w_uk: Vec<Matrix>,
    /// ... and latent → value (`[v, kv_lora_rank]`), sharing the checkpoint's bytes.
    pub w_uv: Vec<Matrix>,
    pub o_proj: Linear,
    pub n_heads: usize,
    pub nope: usize,
    pub rope_dim: usize,
    pub v_dim: usize,
    pub kv_rank: usize,
    pub rope: Rope,
    pub scale: f32,
    /// The DSA indexer (GLM-5's "full" layers).
    pub indexer: Option<DsaIndexer>,
    /// Reuse the previous layer's DSA selection (GLM-5's "shared" layers).
    pub shares_selection: bool,
    pub path: MlaPath,
}

impl MlaAttention {
    /// Loads `{prefix}.{q_a_proj,q_a_layernorm,q_b_proj | q_proj}`, `kv_a_proj_with_mqa`,
    /// `kv_a_layernorm`, `kv_b_proj`, `o_proj`.
    pub fn load(
        ld: &Loader,
        prefix: &str,
        d: &MlaDims,
        rope: Rope,
        scale: f32,
    ) -> Result<MlaAttention> {
        let qw = d.n_heads * d.qk_head_dim();
        // The two latent norms are built with transformers' default eps (1e-6), not rms_norm_eps.
        let q = match d.q_lora_rank {
            Some(r) => MlaQuery::LowRank {
                a: ld.linear(&format!("{prefix}.q_a_proj"), r, d.hidden, d.bias)?,
                norm: ld.norm(&format!("{prefix}.q_a_layernorm.weight"), r, 1e-6)?,
                b: ld.matrix(&format!("{prefix}.q_b_proj.weight"), qw, r)?,
            },
            None => MlaQuery::Full(ld.matrix(&format!("{prefix}.q_proj.weight"), qw, d.hidden)?),
        };
        let per_head = d.nope + d.v;
        let kv_b = ld.matrix(
            &format!("{prefix}.kv_b_proj.weight"),
            d.n_heads * per_head,
            d.kv_lora_rank,
        )?;
        let w_uk = (0..d.n_heads)
            .map(|h| row_block(&kv_b, h * per_head, h * per_head + d.nope))
            .collect();
        let w_uv = (0..d.n_heads)
            .map(|h| row_block(&kv_b, h * per_head + d.nope, (h + 1) * per_head))
            .collect();
        Ok(MlaAttention {
            q,
            kv_a: ld.linear(
                &format!("{prefix}.kv_a_proj_with_mqa"),
                d.kv_lora_rank + d.rope,
                d.hidden,
                d.bias,
            )?,
            kv_a_norm: ld.norm(
                &format!("{prefix}.kv_a_layernorm.weight"),
                d.kv_lora_rank,
                1e-6,
            )?,
            w_uk,
            w_uv,
            o_proj: ld.linear(
                &format!("{prefix}.o_proj"),
                d.hidden,
                d.n_heads * d.v,
                d.bias,
            )?,
            n_heads: d.n_heads,
            nope: d.nope,
            rope_dim: d.rope,
            v_dim: d.v,
            kv_rank: d.kv_lora_rank,
            rope,
            scale,
            indexer: None,
            shares_selection: false,
            path: MlaPath::Auto,
        })
    }

    /// Cache floats per position: `(k, v)` = `(kv_lora_rank + qk_rope_head_dim, 0)`.
    pub fn kv_widths(&self) -> (usize, usize) {
        (self.kv_rank + self.rope_dim, 0)
    }

    /// Side-data floats per position: the DSA indexer's key.
    pub fn extra_width(&self) -> usize {
        self.indexer.as_ref().map_or(0, |i| i.head_dim)
    }

    /// Floats per position a full K/V cache of this layer would hold instead.
    pub fn expanded_kv_width(&self) -> usize {
        self.n_heads * (self.nope + self.rope_dim + self.v_dim)
    }

    pub fn size_bytes(&self) -> usize {
        let q = match &self.q {
            MlaQuery::LowRank { a, b, .. } => a.weight.size_bytes() + b.size_bytes(),
            MlaQuery::Full(m) => m.size_bytes(),
        };
        q + self.kv_a.weight.size_bytes()
            + self
                .w_uk
                .iter()
                .chain(&self.w_uv)
                .map(|m| m.size_bytes())
                .sum::<usize>()
            + self.o_proj.weight.size_bytes()
            + self.indexer.as_ref().map_or(0, |i| i.size_bytes())
    }

    /// Attention for all rows of the batch at cache layer `layer`. `sel` carries the DSA
    /// selection between layers: an indexer layer sets it, a sharing layer reads it.
    pub fn forward(
        &self,
        h: &[f32],
        rows: &BatchRows,
        caches: &mut [&mut KvCache],
        layer: usize,
        sel: &mut Option<Selection>,
    ) -> Vec<f32> {
        let n = rows.len();
        let (nh, qk, lr, rd) = (
            self.n_heads,
            self.nope + self.rope_dim,
            self.kv_rank,
            self.rope_dim,
        );
        let qw = nh * qk;
        let kw = lr + rd;
        let proj = profile::span(Phase::AttnProj);
        // The query's first projection and kv_a read the same input: one parallel region.
        let mut kv = vec![0f32; n * kw];
        let (mut q, q_resid) = match &self.q {
            MlaQuery::LowRank { a, norm, b } => {
                let mut r = vec![0f32; n * a.out_features()];
                exec::products(
                    h,
                    n,
                    &[&a.weight, &self.kv_a.weight],
                    &mut [&mut r, &mut kv],
                );
                a.add_bias(&mut r);
                self.kv_a.add_bias(&mut kv);
                norm.apply_chunks(&mut r);
                let mut q = vec![0f32; n * qw];
                b.matmul(&r, n, &mut q);
                (q, Some(r))
            }
            MlaQuery::Full(p) => {
                let mut q = vec![0f32; n * qw];
                exec::products(h, n, &[p, &self.kv_a.weight], &mut [&mut q, &mut kv]);
                self.kv_a.add_bias(&mut kv);
                (q, None)
            }
        };
        let mut angles = Vec::with_capacity(n);
        for i in 0..n {
            let (cos, sin) = self.rope.cos_sin(rows.pos[i]);
            let row = &mut kv[i * kw..(i + 1) * kw];
            self.kv_a_norm.apply(&mut row[..lr]);
            self.rope.rotate(&mut row[lr..], rd, &cos, &sin);
            for head in 0..nh {
                let o = i * qw + head * qk + self.nope;
                self.rope.rotate(&mut q[o..o + rd], rd, &cos, &sin);
            }
            angles.push((cos, sin));
        }
        if let Some(ix) = &self.indexer {
            let qr = q_resid
                .as_deref()
                .expect("the DSA indexer is only loaded with q_lora_rank");
            *sel = Some(ix.select(h, qr, rows, caches, layer, &self.rope, &angles));
        }
        for (s, cache) in caches.iter_mut().enumerate() {
            let r = rows.seq_range(s);
            cache.layers[layer]
                .k
                .extend_from_f32(&kv[r.start * kw..r.end * kw]);
        }
        let sparse = if self.indexer.is_some() || self.shares_selection {
            sel.as_ref()
        } else {
            None
        };
        let positions: Vec<Attended> = (0..n)
            .map(|i| match sparse.and_then(|s| s[i].as_deref()) {
                Some(p) => Attended::Picked(p),
                None => Attended::Causal(rows.pos[i] + 1),
            })
            .collect();
        drop(proj);
        let core = profile::span(Phase::AttnCore);
        let caches: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        let mut out = vec![0f32; n * nh * self.v_dim];
        let mut absorbed_rows = Vec::new();
        for (s, cache) in caches.iter().enumerate() {
            let r = rows.seq_range(s);
            if r.is_empty() {
                continue;
            }
            let context = rows.pos[r.end - 1] + 1;
            let pairs: usize = r.clone().map(|i| positions[i].len()).sum();
            if self.absorbed_is_cheaper(r.len(), context, pairs) {
                absorbed_rows.extend(r);
            } else {
                self.attend_expanded(&q, rows, s, cache, layer, &positions, &mut out);
            }
        }
        if !absorbed_rows.is_empty() {
            self.attend_absorbed(
                &q,
                rows,
                &absorbed_rows,
                &caches,
                layer,
                &positions,
                &mut out,
            );
        }
        drop(core);
        let _out = profile::span(Phase::AttnOut);
        self.o_proj.forward(&out, n)
    }

    /// Multiply-adds of each formulation for `q_rows` queries over a context of `context`
    /// positions, attending `pairs` (query, position) pairs in all (fewer under DSA).
    fn absorbed_is_cheaper(&self, q_rows: usize, context: usize, pairs: usize) -> bool {
        match self.path {
            MlaPath::Absorbed => true,
            MlaPath::Expanded => false,
            MlaPath::Auto => {
                let (q, t, a) = (q_rows as f64, context as f64, pairs as f64);
                let (h, n, r, v, l) = (
                    self.n_heads as f64,
                    self.nope as f64,
                    self.rope_dim as f64,
                    self.v_dim as f64,
                    self.kv_rank as f64,
                );
                let expanded = t * h * (n + v) * l + a * h * (n + r + v);
                let absorbed = q * h * n * l + a * h * (2.0 * l + r) + q * h * l * v;
                absorbed <= expanded
            }
        }
    }

    /// Attention in latent space for the rows `ar` (weight absorption).
    #[allow(clippy::too_many_arguments)]
    fn attend_absorbed(
        &self,
        q: &[f32],
        rows: &BatchRows,
        ar: &[usize],
        caches: &[&KvCache],
        layer: usize,
        positions: &[Attended],
        out: &mut [f32],
    ) {
        let (nh, qk, lr, rd, vd) = (
            self.n_heads,
            self.nope + self.rope_dim,
            self.kv_rank,
            self.rope_dim,
            self.v_dim,
        );
        let m = ar.len();
        let aw = lr + rd;
        // Absorbed queries, head-major: [head][row][q_lat ‖ q_rope].
        let mut q_abs = vec![0f32; nh * m * aw];
        crate::kernels::team::par_chunks_mut(&mut q_abs, m * aw, &|head, qa| {
            // q_lat = W_ukᵀ·q_nope: one decoded weight row at a time, applied to every row.
            let mut w = vec![0f32; lr];
            for j in 0..self.nope {
                self.w_uk[head].row_to_f32(j, &mut w);
                for (a, &i) in ar.iter().enumerate() {
                    let x = q[i * nh * qk + head * qk + j];
                    axpy(&mut qa[a * aw..a * aw + lr], x, &w);
                }
            }
            for (a, &i) in ar.iter().enumerate() {
                let o = i * nh * qk + head * qk + self.nope;
                qa[a * aw + lr..(a + 1) * aw].copy_from_slice(&q[o..o + rd]);
            }
        });
        // Softmax over [c ‖ k_rope] rows, output in latent space: [head][row][latent].
        let mut o_lat = vec![0f32; nh * m * lr];
        crate::kernels::team::par_chunks_mut(&mut o_lat, lr, &|idx, o| {
            let (head, a) = (idx / m, idx % m);
            let i = ar[a];
            let keys = &caches[rows.seq[i]].layers[layer].k;
            let qv = &q_abs[(head * m + a) * aw..(head * m + a + 1) * aw];
            let pos = positions[i];
            let mut scores: Vec<f32> = pos
                .iter()
                .map(|t| keys.row(t * aw, aw).dot(qv) * self.scale)
                .collect();
            softmax_fast(&mut scores);
            o.fill(0.0);
            for (wt, t) in scores.iter().zip(pos.iter()) {
                keys.row(t * aw, lr).axpy_to(o, *wt);
            }
        });
        // Values: W_uv[h]·o_lat per head.
        let per_head: Vec<Vec<f32>> = (0..nh)
            .into_par_iter()
            .map(|head| {
                let mut y = vec![0f32; m * vd];
                self.w_uv[head].matmul(&o_lat[head * m * lr..(head + 1) * m * lr], m, &mut y);
                y
            })
            .collect();
        for (head, y) in per_head.iter().enumerate() {
            for (a, &i) in ar.iter().enumerate() {
                out[i * nh * vd + head * vd..i * nh * vd + (head + 1) * vd]
                    .copy_from_slice(&y[a * vd..(a + 1) * vd]);
            }
        }
    }

    /// Standard attention for sequence `s`: K/V of its whole context expanded per head.
    #[allow(clippy::too_many_arguments)]
    fn attend_expanded(
        &self,
        q: &[f32],
        rows: &BatchRows,
        s: usize,
        cache: &KvCache,
        layer: usize,
        positions: &[Attended],
        out: &mut [f32],
    ) {
        let (nh, qk, lr, rd, vd, nope) = (
            self.n_heads,
            self.nope + self.rope_dim,
            self.kv_rank,
            self.rope_dim,
            self.v_dim,
            self.nope,
        );
        let r = rows.seq_range(s);
        let keys = &cache.layers[layer].k;
        let aw = lr + rd;
        let context = rows.pos[r.end - 1] + 1;
        let mut lat = vec![0f32; context * lr];
        for (t, l) in lat.chunks_exact_mut(lr.max(1)).enumerate() {
            keys.row(t * aw, lr).to_f32(l);
        }
        let per_head: Vec<Vec<f32>> = (0..nh)
            .into_par_iter()
            .map(|head| {
                let mut k_nope = vec![0f32; context * nope];
                self.w_uk[head].matmul(&lat, context, &mut k_nope);
                let mut v = vec![0f32; context * vd];
                self.w_uv[head].matmul(&lat, context, &mut v);
                let mut y = vec![0f32; r.len() * vd];
                for (a, i) in r.clone().enumerate() {
                    let qo = i * nh * qk + head * qk;
                    let (qn, qr) = (&q[qo..qo + nope], &q[qo + nope..qo + qk]);
                    let pos = positions[i];
                    let mut scores: Vec<f32> = pos
                        .iter()
                        .map(|t| {
                            let kr = keys.row(t * aw + lr, rd);
                            (dot_f32(qn, &k_nope[t * nope..(t + 1) * nope]) + kr.dot(qr))
                                * self.scale
                        })
                        .collect();
                    softmax_fast(&mut scores);
                    let o = &mut y[a * vd..(a + 1) * vd];
                    for (wt, t) in scores.iter().zip(pos.iter()) {
                        axpy(o, *wt, &v[t * vd..(t + 1) * vd]);
                    }
                }
                y
            })
            .collect();
        for (head, y) in per_head.iter().enumerate() {
            for (a, i) in r.clone().enumerate() {
                out[i * nh * vd + head * vd..i * nh * vd + (head + 1) * vd]
                    .copy_from_slice(&y[a * vd..(a + 1) * vd]);
            }
        }
    }
}

/// The cache positions one query attends to, ascending.
#[derive(Clone, Copy, Debug)]
enum Attended<'a> {
    /// Every position before it and itself: `0..n`.
    Causal(usize),
    /// The DSA indexer's choice.
    Picked(&'a [u32]),
}

impl<'a> Attended<'a> {
    fn len(&self) -> usize {
        match self {
            Attended::Causal(n) => *n,
            Attended::Picked(p) => p.len(),
        }
    }

    fn iter(self) -> impl Iterator<Item = usize> + 'a {
        let (n, picked) = match self {
            Attended::Causal(n) => (n, None),
            Attended::Picked(p) => (p.len(), Some(p)),
        };
        (0..n).map(move |j| picked.map_or(j, |p| p[j] as usize))
    }
}
