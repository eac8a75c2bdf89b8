//! Mixture-of-experts feed-forward: the router and the routed (and shared) experts.
//!
//! Batch-union: the rows of a step (prefill positions, or decode rows of several sessions)
//! are grouped by expert, so each selected expert's weights are read once per step and
//! applied to every row routed to it.

use super::blocks::{softmax, Mlp};
use super::exec;
use super::profile::{self, Phase};
use super::simd::axpy;
use crate::tensor::Matrix;

/// How router logits become expert choices and weights.
#[derive(Clone, Debug)]
pub enum Routing {
    /// softmax over all experts, top-k; renormalise the k weights when `norm_topk_prob`
    /// (OLMoE, Qwen3-MoE; Mixtral always renormalises).
    SoftmaxTopK { norm_topk_prob: bool },
    /// gpt-oss (`GptOssTopKRouter`): the router's bias added to its logits, the top-k of
    /// those, and the weights a softmax over the k chosen logits alone.
    TopKSoftmax {
        /// `router.bias`, one per expert.
        bias: Vec<f32>,
    },
    /// DeepSeek-V3 / GLM "noaux_tc": sigmoid scores; the choice uses scores plus
    /// `e_score_correction_bias`, restricted to the `topk_group` groups (of `n_group`) whose
    /// two best biased scores sum highest; the weights are the unbiased scores of the chosen
    /// experts, renormalised when `norm_topk_prob`, times `routed_scaling_factor`.
    SigmoidGroupLimited {
        /// `e_score_correction_bias`, one f32 per expert.
        bias: Vec<f32>,
        n_group: usize,
        topk_group: usize,
        norm_topk_prob: bool,
        routed_scaling_factor: f32,
    },
}

#[derive(Clone, Debug)]
pub struct Moe {
    /// `[n_experts, hidden]`.
    pub router: Matrix,
    pub routing: Routing,
    pub top_k: usize,
    pub experts: Vec<Mlp>,
    /// Experts every row goes through, added unweighted (DeepSeek-V3, GLM).
    pub shared: Option<Mlp>,
    /// Routing observer, expert top-p, streamed experts, next-layer prediction (all off by
    /// default; see `crate::experts::hooks`).
    pub hooks: crate::experts::MoeHooks,
}

// One row's routing decision: defined beside the hooks that see it (`crate::experts` sits
// below this block), named here too where the router makes it.
pub use crate::experts::Route;

/// Indices of the `k` largest values, largest first; the lower index wins ties.
pub fn top_k_indices(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| {
        v[b].partial_cmp(&v[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
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
            .map(|row| match &self.routing {
                Routing::SoftmaxTopK { norm_topk_prob } => {
                    softmax(row);
                    let experts = top_k_indices(row, self.top_k);
                    let mut weights: Vec<f32> = experts.iter().map(|&i| row[i]).collect();
                    if *norm_topk_prob {
                        let s: f32 = weights.iter().sum();
                        weights.iter_mut().for_each(|w| *w /= s);
                    }
                    Route { experts, weights }
                }
                Routing::TopKSoftmax { bias } => {
                    for (l, b) in row.iter_mut().zip(bias) {
                        *l += b;
                    }
                    let experts = top_k_indices(row, self.top_k);
                    let mut weights: Vec<f32> = experts.iter().map(|&i| row[i]).collect();
                    softmax(&mut weights);
                    Route { experts, weights }
                }
                Routing::SigmoidGroupLimited {
                    bias,
                    n_group,
                    topk_group,
                    norm_topk_prob,
                    routed_scaling_factor,
                } => sigmoid_group_limited(
                    row,
                    bias,
                    *n_group,
                    *topk_group,
                    self.top_k,
                    *norm_topk_prob,
                    *routed_scaling_factor,
                ),
            })
            .collect()
    }

    /// The MoE output for `n` rows.
    pub fn forward(&self, h: &[f32], n: usize) -> Vec<f32> {
        let hidden = self.router.cols;
        let mut routes = {
            let _router = profile::span(Phase::Router);
            self.route(h, n)
        };
        self.hooks.routed(&mut routes);
        let _experts = profile::span(Phase::Experts);
        // expert -> [(row, weight)]
        let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); self.n_experts()];
        for (row, r) in routes.iter().enumerate() {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                by_expert[e].push((row, w));
            }
        }
        let mut out = vec![0f32; n * hidden];
        if let Some(s) = &self.hooks.stream {
            // Streamed experts arrive one by one; each is applied as it comes (same kernels
            // and order of accumulation as below, so the same bits).
            let partials = s.expert_outputs(self.hooks.layer, &self.experts, &by_expert, h, hidden);
            for (e, y) in partials {
                for (j, &(r, w)) in by_expert[e].iter().enumerate() {
                    axpy(
                        &mut out[r * hidden..(r + 1) * hidden],
                        w,
                        &y[j * hidden..(j + 1) * hidden],
                    );
                }
            }
            if let Some(shared) = &self.shared {
                add_into(&mut out, &shared.forward(h, n));
            }
            return out;
        }
        // Resident: every selected expert and the shared one in two parallel regions, the
        // weighted sum built into the down projections (experts in ascending order, the
        // shared expert last with weight 1).
        let all: Vec<(usize, f32)> = match &self.shared {
            Some(_) => (0..n).map(|i| (i, 1.0)).collect(),
            None => Vec::new(),
        };
        let mut terms: Vec<(&Mlp, &[(usize, f32)])> = by_expert
            .iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, rows)| (&self.experts[e], &rows[..]))
            .collect();
        if let Some(shared) = &self.shared {
            terms.push((shared, &all));
        }
        exec::mlps(&terms, h, n, &mut out);
        out
    }

    pub fn size_bytes(&self) -> usize {
        self.router.size_bytes()
            + self.experts.iter().map(|m| m.size_bytes()).sum::<usize>()
            + self.shared.as_ref().map_or(0, |m| m.size_bytes())
    }
}

fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// One row of [`Routing::SigmoidGroupLimited`], step for step as transformers'
/// `DeepseekV3TopkRouter` (f32 throughout).
pub fn sigmoid_group_limited(
    logits: &[f32],
    bias: &[f32],
    n_group: usize,
    topk_group: usize,
    top_k: usize,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
) -> Route {
    let scores: Vec<f32> = logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
    let mut choice: Vec<f32> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
    if n_group > 1 {
        let size = choice.len() / n_group;
        let group_scores: Vec<f32> = choice
            .chunks(size)
            .map(|g| top_k_indices(g, 2).iter().map(|&i| g[i]).sum())
            .collect();
        let keep = top_k_indices(&group_scores, topk_group);
        for (g, chunk) in choice.chunks_mut(size).enumerate() {
            if !keep.contains(&g) {
                chunk.fill(f32::NEG_INFINITY);
            }
        }
    }
    let experts = top_k_indices(&choice, top_k);
    let mut weights: Vec<f32> = experts.iter().map(|&e| scores[e]).collect();
    if norm_topk_prob {
        let denominator = weights.iter().sum::<f32>() + 1e-20;
        weights.iter_mut().for_each(|w| *w /= denominator);
    }
    weights.iter_mut().for_each(|w| *w *= routed_scaling_factor);
    Route { experts, weights }
}

/// The MoE block of DeepSeek-V3 and the GLM families as their configs describe it:
/// `n_routed_experts` experts of `moe_intermediate_size`, `n_shared_experts` shared ones
/// (one MLP of `moe_intermediate_size × n_shared_experts`), the sigmoid group-limited router.
#[derive(Clone, Debug)]
pub struct SigmoidMoeSpec {
    pub n_experts: usize,
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f32,
    pub inter: usize,
    pub n_shared: usize,
}

impl SigmoidMoeSpec {
    /// Reads and checks the router keys (defaults as transformers' DeepseekV3Config).
    pub fn read(cfg: &super::config::Cfg) -> crate::error::Result<SigmoidMoeSpec> {
        let n_experts = match cfg.opt_usize("n_routed_experts")? {
            Some(n) => n,
            None => cfg.dim("num_local_experts")?,
        };
        let top_k = cfg.dim("num_experts_per_tok")?;
        let n_group = cfg.usize_or("n_group", 1)?.max(1);
        let topk_group = cfg.usize_or("topk_group", 1)?.max(1);
        if n_experts == 0 || n_experts % n_group != 0 {
            return Err(cfg.err(format!(
                "n_routed_experts ({n_experts}) must be a positive multiple of n_group ({n_group})"
            )));
        }
        if topk_group > n_group {
            return Err(cfg.err(format!(
                "topk_group ({topk_group}) exceeds n_group ({n_group})"
            )));
        }
        if top_k > topk_group * (n_experts / n_group) {
            return Err(cfg.err(format!(
                "num_experts_per_tok ({top_k}) exceeds the experts of the {topk_group} selected groups"
            )));
        }
        if let Some(f) = cfg.get("scoring_func").and_then(|v| v.as_str()) {
            if f != "sigmoid" {
                return Err(cfg.err(format!("scoring_func '{f}' is not supported (sigmoid is)")));
            }
        }
        Ok(SigmoidMoeSpec {
            n_experts,
            top_k,
            n_group,
            topk_group,
            norm_topk_prob: cfg.bool_or("norm_topk_prob", true)?,
            routed_scaling_factor: cfg.f64_or("routed_scaling_factor", 1.0)? as f32,
            inter: cfg.dim("moe_intermediate_size")?,
            n_shared: cfg.usize_or("n_shared_experts", 0)?,
        })
    }

    /// Loads `{prefix}.gate.weight`, `{prefix}.gate.e_score_correction_bias`,
    /// `{prefix}.experts.{e}.{gate,up,down}_proj` and `{prefix}.shared_experts.*`.
    pub fn load(
        &self,
        ld: &super::blocks::Loader,
        prefix: &str,
        hidden: usize,
    ) -> crate::error::Result<Moe> {
        let names = ["gate_proj", "up_proj", "down_proj"];
        let experts = (0..self.n_experts)
            .map(|e| ld.mlp(&format!("{prefix}.experts.{e}"), names, hidden, self.inter))
            .collect::<crate::error::Result<Vec<_>>>()?;
        let shared = if self.n_shared > 0 {
            Some(ld.mlp(
                &format!("{prefix}.shared_experts"),
                names,
                hidden,
                self.inter * self.n_shared,
            )?)
        } else {
            None
        };
        Ok(Moe {
            router: ld.matrix(&format!("{prefix}.gate.weight"), self.n_experts, hidden)?,
            routing: Routing::SigmoidGroupLimited {
                bias: ld.vector(
                    &format!("{prefix}.gate.e_score_correction_bias"),
                    self.n_experts,
                )?,
                n_group: self.n_group,
                topk_group: self.topk_group,
                norm_topk_prob: self.norm_topk_prob,
                routed_scaling_factor: self.routed_scaling_factor,
            },
            top_k: self.top_k,
            experts,
            shared,
            hooks: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_limit_excludes_the_best_expert_of_a_losing_group() {
        // 4 groups of 2. Group 3 holds the single best expert (logit 5) but its partner is
        // weak; groups 0 and 1 have two good experts each and win with topk_group = 2.
        let logits = [2.0, 2.0, 1.9, 1.9, -3.0, -3.0, 5.0, -6.0];
        let bias = [0.0; 8];
        let r = sigmoid_group_limited(&logits, &bias, 4, 2, 2, true, 2.5);
        assert_eq!(r.experts, vec![0, 1]);
        assert!((r.weights[0] - 1.25).abs() < 1e-6 && (r.weights[1] - 1.25).abs() < 1e-6);
        // Without the group limit expert 6 wins.
        let r = sigmoid_group_limited(&logits, &bias, 1, 1, 2, true, 2.5);
        assert_eq!(r.experts, vec![6, 0]);
    }

    /// gpt-oss's router: the bias is added to the logits, the top-k of those chosen, and their
    /// weights a softmax over the k biased logits alone.
    #[test]
    fn top_k_softmax_weighs_the_chosen_biased_logits_only() {
        let moe = Moe {
            router: Matrix::from_f32(4, 2, &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, -1.0, 0.0]),
            routing: Routing::TopKSoftmax {
                bias: vec![0.0, 0.5, -2.5, 0.0],
            },
            top_k: 2,
            experts: Vec::new(),
            shared: None,
            hooks: Default::default(),
        };
        // Logits [1, 0.2, 1.2, -1] + bias = [1, 0.7, -1.3, -1]: experts 0 and 1, though 2 has
        // the largest logit before its bias.
        let r = moe.route(&[1.0, 0.2], 1).remove(0);
        assert_eq!(r.experts, vec![0, 1]);
        let e = (0.7f32 - 1.0).exp();
        assert!((r.weights[0] - 1.0 / (1.0 + e)).abs() < 1e-6);
        assert!((r.weights[1] - e / (1.0 + e)).abs() < 1e-6);
    }

    #[test]
    fn bias_chooses_but_does_not_weigh() {
        let logits = [0.0, 1.0, 0.5];
        // A large bias on expert 0 makes it chosen; its weight is still sigmoid(0) = 0.5.
        let r = sigmoid_group_limited(&logits, &[10.0, 0.0, 0.0], 1, 1, 2, false, 1.0);
        assert_eq!(r.experts, vec![0, 1]);
        assert!((r.weights[0] - 0.5).abs() < 1e-6);
        assert!((r.weights[1] - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);
    }
}
