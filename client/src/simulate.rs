//! `coli simulate`: replays routing traces against the cache policies and Belady's optimum at
//! the same capacities, and prints the table that chooses the shipped policy.

use crate::output::{print_json, print_table};
use anyhow::Context;
use clap::Args;
use colibri_engine::experts::book;
use colibri_engine::experts::policy;
use colibri_engine::experts::sim::{belady, simulate_with, PrefetchModel, SimOptions, SimResult};
use colibri_engine::experts::Trace;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// A routing trace written by `coli trace`.
    #[arg(long, value_name = "FILE", required_unless_present = "synthetic")]
    pub trace: Option<PathBuf>,
    /// Instead of a trace file: Zipf-like routing, "LAYERS,EXPERTS,TOP_K,TOKENS,S,STICKINESS"
    /// (e.g. 16,64,8,512,1.0,0.3).
    #[arg(long, value_name = "SPEC", conflicts_with = "trace")]
    pub synthetic: Option<String>,
    /// Cache sizes in experts, comma separated; a value ending in % is a share of all experts.
    #[arg(long, value_delimiter = ',', default_value = "25%,50%")]
    pub capacity: Vec<String>,
    /// Policies to compare (each may be prefixed with "pinned-"). The default policy (the
    /// one the store runs unless told otherwise) is always among them, marked.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lrfu-auto,lru,lfu,lfu-admit,lrfu:4,lrfu:16,lrfu:64,arc"
    )]
    pub policies: Vec<String>,
    /// Share of the capacity given to pins by pinned policies.
    #[arg(long, default_value_t = 0.5)]
    pub pin_share: f64,
    /// Simulate a second start: the histogram of this trace (a previous run) seeds the
    /// policies and picks the pins, and the hottest experts are resident at the first token.
    #[arg(long, value_name = "FILE")]
    pub warm_from: Option<PathBuf>,
    /// Model the store's prefetch with a predictor that names this share of the next layer's
    /// routed experts (the store reports its own as "prediction recall"; a trace records
    /// what the routers chose, so the guesses are made from it). Off by default.
    #[arg(long, value_name = "RECALL")]
    pub prefetch_recall: Option<f64>,
    /// Prefetch slots taken from the capacity with --prefetch-recall [default: two layers'
    /// top-k, as the store takes].
    #[arg(long, value_name = "N", requires = "prefetch_recall")]
    pub prefetch_slots: Option<usize>,
    /// Split the trace's many-row (prompt) steps into steps of at most N rows, as a store
    /// running prompts in chunks of N sees them.
    #[arg(long, value_name = "N")]
    pub prefill_chunk: Option<usize>,
    /// Bytes of one expert [default: the trace's `expert_bytes`]: the same routing priced
    /// for another model's experts.
    #[arg(long, value_name = "BYTES")]
    pub expert_bytes: Option<u64>,
    /// Also report the hit rate over the first N tokens and after them.
    #[arg(long, default_value_t = 32)]
    pub first_tokens: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn simulate_cmd(a: SimulateArgs) -> anyhow::Result<()> {
    let mut trace = match (&a.trace, &a.synthetic) {
        (Some(p), _) => Trace::load(p).with_context(|| format!("reading {}", p.display()))?,
        (None, Some(spec)) => synthetic(spec)?,
        (None, None) => anyhow::bail!("give --trace or --synthetic"),
    };
    if let Some(n) = a.prefill_chunk {
        if n == 0 {
            anyhow::bail!("--prefill-chunk must be at least 1");
        }
        trace = trace.chunked(n);
    }
    if let Some(b) = a.expert_bytes {
        trace.expert_bytes = b;
    }
    if let Some(r) = a.prefetch_recall {
        if !(0.0..=1.0).contains(&r) {
            anyhow::bail!("--prefetch-recall must be in [0, 1], got {r}");
        }
    }
    let mut policies = a.policies.clone();
    if !policies.iter().any(|p| p == policy::DEFAULT_POLICY) {
        policies.insert(0, policy::DEFAULT_POLICY.to_string());
    }
    let warm = match &a.warm_from {
        Some(p) => {
            let w = Trace::load(p).with_context(|| format!("reading {}", p.display()))?;
            if (w.n_layers, w.n_experts) != (trace.n_layers, trace.n_experts) {
                anyhow::bail!("{} is a trace of another model shape", p.display());
            }
            Some(w.histogram().nonzero())
        }
        None => None,
    };
    let total_experts = {
        let mut layers: Vec<u32> = trace.requests().iter().map(|r| r.key.layer).collect();
        layers.sort_unstable();
        layers.dedup();
        layers.len() * trace.n_experts
    };
    // Expert requests per decode token, LRFU's unit of time.
    let per_token = (total_experts / trace.n_experts.max(1)) * trace.top_k;
    let mut caps = Vec::new();
    for c in &a.capacity {
        let n = match c.strip_suffix('%') {
            Some(p) => {
                let p: f64 = p
                    .trim()
                    .parse()
                    .with_context(|| format!("capacity '{c}'"))?;
                (total_experts as f64 * p / 100.0).round() as usize
            }
            None => c
                .trim()
                .parse()
                .with_context(|| format!("capacity '{c}'"))?,
        };
        caps.push(n);
    }
    let mut results: Vec<(SimResult, f64, bool)> = Vec::new();
    for &cap in &caps {
        let opt = belady(&trace, cap);
        let opt_reads = opt.reads().max(1) as f64;
        let slots = a.prefetch_recall.map_or(0, |_| {
            book::prefetch_slots(
                cap,
                total_experts,
                a.prefetch_slots.unwrap_or(2 * trace.top_k),
            )
        });
        for name in &policies {
            let p = policy::build(name, cap - slots, warm.as_deref(), a.pin_share, per_token)?;
            let opts = SimOptions {
                prefetch: a.prefetch_recall.map(|recall| PrefetchModel {
                    recall,
                    slots,
                    seed: 1,
                }),
                // What the store does at start with a history: the hottest experts are read
                // in the background. The simulator assumes they are in before the first token.
                preload: warm
                    .as_ref()
                    .map(|c| policy::hottest(c, cap - slots))
                    .unwrap_or_default(),
            };
            let r = simulate_with(&trace, p, &opts);
            let ratio = r.reads() as f64 / opt_reads;
            results.push((r, ratio, name == policy::DEFAULT_POLICY));
        }
        results.push((opt, 1.0, false));
    }
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(r, ratio, default)| {
                let mut row = serde_json::json!({
                    "policy": r.policy,
                    "capacity": r.capacity,
                    "requests": r.requests,
                    "hits": r.hits,
                    "hit_rate": r.hit_rate(),
                    "reads_per_token": r.reads_per_token(),
                    "prefetch_reads": r.prefetch_reads,
                    "prefetch_used": r.prefetch_used,
                    "bytes_per_token": r.bytes_per_token(),
                    "vs_belady": ratio,
                    "first_tokens_hit_rate": r.hit_rate_first_tokens(a.first_tokens),
                    "after_first_tokens_hit_rate": r.hit_rate_after_tokens(a.first_tokens),
                });
                if *default {
                    row["default"] = true.into();
                }
                row
            })
            .collect();
        return print_json(&serde_json::json!({
            "trace": trace.model,
            "tokens": trace.tokens(),
            "total_experts": total_experts,
            "expert_bytes": trace.expert_bytes,
            "default_policy": policy::DEFAULT_POLICY,
            "prefetch_recall": a.prefetch_recall,
            "results": rows,
        }));
    }
    println!(
        "trace: {} — {} tokens, {} steps, {} expert requests; {} routed experts of {}",
        trace.model,
        trace.tokens(),
        trace.steps.len(),
        trace.requests().len(),
        total_experts,
        crate::output::fmt_bytes(trace.expert_bytes)
    );
    let n = a.first_tokens;
    let header = [
        "policy".to_string(),
        "capacity".into(),
        "hit rate".into(),
        "reads/token".into(),
        "MiB/token".into(),
        "× Belady".into(),
        format!("hit rate first {n}"),
        format!("after {n}"),
    ];
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|(r, ratio, default)| {
            vec![
                if *default {
                    format!("{} (default)", r.policy)
                } else {
                    r.policy.clone()
                },
                format!(
                    "{} ({:.0}%)",
                    r.capacity,
                    100.0 * r.capacity as f64 / total_experts.max(1) as f64
                ),
                format!("{:.1}%", 100.0 * r.hit_rate()),
                format!("{:.1}", r.reads_per_token()),
                format!("{:.1}", r.bytes_per_token() / (1u64 << 20) as f64),
                format!("{ratio:.2}"),
                format!("{:.1}%", 100.0 * r.hit_rate_first_tokens(n)),
                format!("{:.1}%", 100.0 * r.hit_rate_after_tokens(n)),
            ]
        })
        .collect();
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    print_table(&header, &rows)?;
    Ok(())
}

fn synthetic(spec: &str) -> anyhow::Result<Trace> {
    let v: Vec<&str> = spec.split(',').map(str::trim).collect();
    if v.len() != 6 {
        anyhow::bail!("--synthetic wants LAYERS,EXPERTS,TOP_K,TOKENS,S,STICKINESS, got '{spec}'");
    }
    let u = |i: usize| {
        v[i].parse::<usize>()
            .with_context(|| format!("'{}' in --synthetic", v[i]))
    };
    let f = |i: usize| {
        v[i].parse::<f64>()
            .with_context(|| format!("'{}' in --synthetic", v[i]))
    };
    let (layers, experts, k, tokens) = (u(0)?, u(1)?, u(2)?, u(3)?);
    if experts == 0 || k == 0 || k > experts || layers == 0 {
        anyhow::bail!("--synthetic: need 0 < TOP_K <= EXPERTS and LAYERS > 0");
    }
    let mut t = Trace::synthetic(layers, experts, k, tokens, f(4)?, f(5)?, 1);
    t.expert_bytes = 1 << 20;
    Ok(t)
}
