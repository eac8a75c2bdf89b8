//! Mixture-of-experts feed-forward: the router and the routed (and shared) experts.
//!
//! Batch-union: the rows of a step (prefill positions, or decode rows of several sessions)
//! are grouped by expert, so each selected expert's weights are read once per step and
//! applied to every row routed to it.

use super::blocks::{softmax, Mlp};
use crate::tensor::Matrix;
use rayon::prelude::*;

/// How router logits become expert choices and weights.
#[derive(Clone, Debug)]
pub enum Routing {
    /// softmax over all experts, top-k; renormalise the k weights when `norm_topk_prob`
    /// (OLMoE, Qwen3-MoE; Mixtral always renormalises).
    SoftmaxTopK { norm_topk_prob: bool },
}

#[derive(Clone, Debug)]
pub struct Moe {
    /// `[n_experts, hidden]`.
    pub router: Matrix,
    pub routing: Routing,
    pub top_k: usize,
    pub experts: Vec<Mlp>,
}

/// One row's routing decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Indices of the `k` largest values, largest first; the lower index wins ties.
pub fn top_k_indices(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

impl Moe {
    pub fn n_experts(&self) -> usize {
        self.router.rows
    }

    /// Routing decisions for `n` rows of normed hidden states.
    pub fn route(&self, h: &[f32], n: usize) -> Vec<Route> {
        let e = self.n_experts();
        let mut logits = vec![0f32; n * e];
        self.router.matmul(h, n, &mut logits);
        logits
            .chunks_mut(e)
            .map(|row| match self.routing {
                Routing::SoftmaxTopK { norm_topk_prob } => {
                    softmax(row);
                    let experts = top_k_indices(row, self.top_k);
                    let mut weights: Vec<f32> = experts.iter().map(|&i| row[i]).collect();
                    if norm_topk_prob {
                        let s: f32 = weights.iter().sum();
                        weights.iter_mut().for_each(|w| *w /= s);
                    }
                    Route { experts, weights }
                }
            })
            .collect()
    }

    /// The MoE output for `n` rows.
    pub fn forward(&self, h: &[f32], n: usize) -> Vec<f32> {
        let hidden = self.router.cols;
        let routes = self.route(h, n);
        // expert -> [(row, weight)]
        let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.n_experts()];
        for (row, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                by_expert[e].push((row, w));
            }
        }
        let mut out = vec![0f32; n * hidden];
        // With one row per expert (decode) the matmuls parallelise inside; with many rows
        // (prefill) run experts side by side as well.
        let partials: Vec<(usize, Vec<f32>)> = by_expert
            .par_iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, rows)| {
                let mut x = Vec::with_capacity(rows.len() * hidden);
                for &(r, _) in rows {
                    x.extend_from_slice(&h[r * hidden..(r + 1) * hidden]);
                }
                (e, self.experts[e].forward(&x, rows.len()))
            })
            .collect();
        for (e, y) in partials {
            for (j, &(r, w)) in by_expert[e].iter().enumerate() {
                for (o, v) in out[r * hidden..(r + 1) * hidden]
                    .iter_mut()
                    .zip(&y[j * hidden..(j + 1) * hidden])
                {
                    *o = w.mul_add(*v, *o);
                }
            }
        }
        out
    }

    pub fn size_bytes(&self) -> usize {
        self.router.size_bytes() + self.experts.iter().map(|m| m.size_bytes()).sum::<usize>()
    }
}
