//! `coli trace`: runs a greedy generation in this process, records which experts every layer
//! routed each token to (a routing trace for `coli simulate`), and reports speed, memory and,
//! with `--stream`, the expert cache's statistics next to Belady's optimum on the same trace.
//! It is also how streaming is benchmarked (docs/STREAMING.md).

use crate::args::Global;
use crate::args::PromptSpec;
use crate::local;
use crate::output::fmt_bytes;
use anyhow::Context;
use clap::Args;
use colibri_engine::arch::Ffn;
use colibri_engine::experts::hooks::RouteSource;
use colibri_engine::experts::sim::belady;
use colibri_engine::experts::stream::{self, StreamOptions};
use colibri_engine::experts::trace::{Recorder, ReplayRouting, ZipfRouting};
use colibri_engine::experts::{policy, RoutingObserver, StoreStats, Trace};
use colibri_engine::{GenerateRequest, Generation, LogitsWanted, SamplingParams, SeqStep};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct TraceArgs {
    /// Model folder (Hub checkpoint or colibri container).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Prompt text (chat template applied unless --raw).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present_any = ["prompt_ids", "replay_routing"]
    )]
    pub prompt: Option<String>,
    /// Prompt as token ids, comma separated.
    #[arg(long, value_delimiter = ',', value_name = "IDS")]
    pub prompt_ids: Option<Vec<u32>>,
    /// Encode the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Tokens to generate (greedy; end-of-sequence tokens do not stop it).
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Prompt tokens per prefill step.
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Where to write the routing trace (JSON).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Serve the routed experts from the budgeted expert cache instead of the memory map.
    #[arg(long)]
    pub stream: bool,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Benchmarks only (changes outputs): replace the router's choices by Zipf-like routing
    /// "S,STICKINESS[,SEED]" (exponent over each layer's expert ranks, chance a slot keeps
    /// the previous token's expert; the seed changes the draws, not which experts are
    /// popular), e.g. 0.6,0.3. For random-weight models, whose own routing
    /// is degenerate. Turn prefetch off with it: the router's prediction no longer applies.
    #[arg(long, value_name = "S,STICKINESS[,SEED]")]
    pub synthetic_routing: Option<String>,
    /// Benchmarks: feed the ids in FILE (comma or space separated; e.g. from
    /// tools/streaming/text_ids.py) as the decode steps' inputs, one per step, in place of
    /// the generated tokens. A random-weight model then routes a real text (its own
    /// generations are noise). At most --max-tokens of them are fed.
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic_routing")]
    pub follow_ids: Option<PathBuf>,
    /// Benchmarks only (changes outputs): force the routing recorded in a trace (`coli
    /// trace --output`, or a converted real one) into this model, row by row and layer by
    /// layer, so the expert cache sees a trained model's routing. The model needs the same
    /// expert topology (`coli synth --like-trace TRACE`). Without a prompt, the prompt is the
    /// trace's first step's rows; generation stops at the trace's last row. Prefetch is off
    /// (the model's own router no longer predicts anything).
    #[arg(long, value_name = "TRACE", conflicts_with_all = ["synthetic_routing", "follow_ids"])]
    pub replay_routing: Option<PathBuf>,
    /// Print the statistics as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The expert cache's options (with `--stream`).
#[derive(Args, Debug, Clone)]
pub struct CacheArgs {
    /// Expert cache budget in MiB [default: MemAvailable (or the cgroup's room) minus the
    /// resident part minus a safety margin; see `coli plan`].
    #[arg(long, value_name = "MB")]
    pub expert_cache: Option<u64>,
    /// Replacement policy: lru, lfu, lfu-admit, lrfu[:HALF_LIFE_TOKENS], arc, or
    /// pinned-<policy>.
    #[arg(long, default_value = policy::DEFAULT_POLICY)]
    pub policy: String,
    /// Share of the cache given to pins by a pinned policy.
    #[arg(long, default_value_t = 0.5)]
    pub pin_share: f64,
    /// Reader threads (reads in flight).
    #[arg(long, default_value_t = 4)]
    pub readers: usize,
    /// Buffered reads (with page-cache eviction) instead of O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Do not read the next layer's predicted experts ahead.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Neither load nor save the usage history (a cold start every time).
    #[arg(long)]
    pub no_history: bool,
    /// LOSSY: keep each token's experts, heaviest first, until their routing weight reaches
    /// this share of the total (e.g. 0.9). Off by default.
    #[arg(long, value_name = "P")]
    pub expert_topp: Option<f32>,
}

impl CacheArgs {
    pub fn options(&self, state_dir: Option<PathBuf>) -> StreamOptions {
        StreamOptions {
            budget: self.expert_cache.map(|mb| mb << 20),
            policy: self.policy.clone(),
            pin_share: self.pin_share,
            readers: self.readers,
            direct: !self.buffered,
            prefetch: !self.no_prefetch,
            state_dir,
            persist: !self.no_history,
            preload: !self.no_history,
            pins: Vec::new(),
        }
    }
}

pub fn trace(global: &Global, a: TraceArgs) -> anyhow::Result<()> {
    if let Some(p) = a.cache.expert_topp {
        if !(p > 0.0 && p <= 1.0) {
            anyhow::bail!("--expert-topp must be in (0, 1], got {p}");
        }
        eprintln!("note: --expert-topp {p} is lossy: outputs differ from the full model");
    }
    let (mut model, load_s) = local::load_model_with(&a.model, a.stream)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let replay = match &a.replay_routing {
        Some(p) => Some(Arc::new(replay_source(&model, p)?)),
        None => None,
    };
    let streaming = if a.stream {
        let mut opts = a.cache.options(global.state_dir.clone());
        if replay.is_some() && opts.prefetch {
            eprintln!("note: prefetch is off while replaying a trace's routing (the model's router does not predict it)");
            opts.prefetch = false;
        }
        let s = stream::enable(&mut model.net, &model.info.dir, &opts)?;
        for w in &s.warnings {
            eprintln!("warning: {w}");
        }
        Some(s)
    } else {
        None
    };
    let (n_layers, n_experts, top_k) = moe_shape(&model)?;
    let expert_bytes = match &streaming {
        Some(s) => s.store.expert_bytes(),
        None => stream::model_bytes(&model.net).expert_size,
    };
    let rec = Arc::new(Recorder::new(Trace::new(
        a.model.display().to_string(),
        n_layers,
        n_experts,
        top_k,
        expert_bytes,
    )));
    let obs: Arc<dyn RoutingObserver> = rec.clone();
    let source: Option<Arc<dyn RouteSource>> = match &a.synthetic_routing {
        Some(spec) => {
            let v: Vec<f64> = spec
                .split(',')
                .map(|x| x.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .with_context(|| format!("--synthetic-routing '{spec}'"))?;
            let (s, stick, seed) = match v[..] {
                [s, stick] => (s, stick, 1),
                [s, stick, seed] => (s, stick, seed as u64),
                _ => anyhow::bail!("--synthetic-routing wants S,STICKINESS[,SEED], got '{spec}'"),
            };
            eprintln!(
                "note: synthetic routing (zipf s={s}, stickiness={stick}, seed {seed}): outputs are not the model's"
            );
            // The ranking of the experts (the "model") stays; the seed changes the draws.
            let z = ZipfRouting::new(n_layers, n_experts, top_k, s, stick, 1).with_draw_seed(seed);
            Some(Arc::new(z))
        }
        None => replay.clone().map(|r| r as Arc<dyn RouteSource>),
    };
    for (li, l) in model.net.layers.iter_mut().enumerate() {
        if let Ffn::Moe(m) = &mut l.ffn {
            m.hooks.layer = li;
            m.hooks.observer = Some(obs.clone());
            m.hooks.top_p = a.cache.expert_topp;
            m.hooks.route_source = source.clone();
        }
    }

    let spec = match (&a.prompt_ids, &a.prompt, &replay) {
        (Some(ids), _, _) => PromptSpec::Ids(ids.clone()),
        (None, Some(t), _) => PromptSpec::Text {
            text: t.clone(),
            system: None,
            raw: a.raw,
        },
        // The trace's prompt rows (the tokens do not matter: the routing is replayed).
        (None, None, Some(r)) => PromptSpec::Ids(vec![1; r.first_step_rows()]),
        (None, None, None) => anyhow::bail!("give --prompt or --prompt-ids"),
    };
    let prompt = local::prompt_ids(&model, &spec)?;
    let follow = match &a.follow_ids {
        Some(p) => Some(read_ids(p, model.info.vocab_size)?),
        None => None,
    };
    let mut max_tokens = follow
        .as_ref()
        .map_or(a.max_tokens, |f| f.len().min(a.max_tokens));
    if let Some(r) = &replay {
        let left = r.rows().saturating_sub(prompt.len()).max(1);
        if max_tokens > left {
            eprintln!(
                "note: the trace has {} rows: generating {left} tokens after the {}-token prompt",
                r.rows(),
                prompt.len()
            );
            max_tokens = left;
        }
    }
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        },
        stop_strings: Vec::new(),
        ignore_eos: true,
        ..Default::default()
    };
    let mut g = Generation::new(&model, model.new_cache(), req)?;
    let (mut prefill_s, mut decode_s, mut decoded) = (0.0f64, 0.0f64, 0usize);
    let mut stats_after_prefill = None;
    let mut stats_after_first = None;
    let mut prefill_steps = 0;
    while g.finished().is_none() {
        let (tokens, want) = g.next_input(a.prefill_chunk);
        let tokens = tokens.to_vec();
        let prefill = g.prompt_pending() > 0;
        rec.begin_step(tokens.len());
        let t = Instant::now();
        let mut b = [SeqStep {
            cache: &mut g.cache,
            tokens: &tokens,
            logits: want,
        }];
        let out = model.forward(&mut b)?;
        let logits = (want != LogitsWanted::None).then(|| out[0].as_slice());
        match (&follow, logits) {
            // The next input is the text's next id, not the model's choice.
            (Some(f), Some(_)) => {
                g.accept(&model, tokens.len(), None)?;
                g.push_token(&model, f[g.generated().len()])?;
            }
            _ => {
                g.accept(&model, tokens.len(), logits)?;
            }
        }
        let dt = t.elapsed().as_secs_f64();
        if prefill {
            prefill_s += dt;
            prefill_steps += 1;
            if g.prompt_pending() == 0 {
                stats_after_prefill = streaming.as_ref().map(|s| s.stats());
            }
        } else {
            decode_s += dt;
            decoded += tokens.len();
            if decoded == FIRST_TOKENS {
                stats_after_first = streaming.as_ref().map(|s| s.stats());
            }
        }
    }
    let trace = rec.trace();
    if let Some(p) = &a.output {
        trace
            .save(p)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let rss = peak_rss();
    let mut report = serde_json::json!({
        "model": a.model.display().to_string(),
        "load_seconds": load_s,
        "prompt_tokens": prompt.len(),
        "generated_tokens": g.generated().len(),
        "prefill_tokens_per_second": prompt.len() as f64 / prefill_s.max(1e-9),
        "decode_tokens_per_second": decoded as f64 / decode_s.max(1e-9),
        "peak_rss_bytes": rss,
        "expert_top_p": a.cache.expert_topp,
        "synthetic_routing": a.synthetic_routing,
        "follow_ids": a.follow_ids.as_ref().map(|p| p.display().to_string()),
        "replay_routing": a.replay_routing.as_ref().map(|p| p.display().to_string()),
    });
    if let Some(s) = &streaming {
        let st = s.stats();
        // Decode only: what the generation costs once the prompt is in.
        let pre = stats_after_prefill.unwrap_or_default();
        let d_req = st.requests - pre.requests;
        let d_bytes = (st.bytes_read - st.preload_bytes) - (pre.bytes_read - pre.preload_bytes);
        // Belady over the whole run (prefill included, as the live cache saw it), counting
        // the decode steps' misses.
        let opt = belady(&trace, st.capacity_experts);
        let (mut o_req, mut o_hit) = (0u64, 0u64);
        for (step, &(rows, req, hit)) in trace.steps.iter().zip(&opt.per_step).skip(prefill_steps) {
            debug_assert_eq!(step.rows, rows);
            o_req += req as u64;
            o_hit += hit as u64;
        }
        let opt_decode_bytes = (o_req - o_hit) * trace.expert_bytes;
        report["store"] = serde_json::to_value(&st)?;
        report["plan"] = serde_json::json!({
            "resident_bytes": s.plan.model.resident,
            "expert_bytes_total": s.plan.model.experts,
            "available_bytes": s.plan.available(),
            "budget_bytes": s.plan.budget,
        });
        report["decode"] = serde_json::json!({
            "requests": d_req,
            "hit_rate": hit_rate_between(&pre, &st),
            // Background preloads are a start-up cost, reported apart.
            "bytes_read_per_token": d_bytes as f64 / decoded.max(1) as f64,
            "preload_bytes": st.preload_bytes,
            "belady_bytes_per_token": opt_decode_bytes as f64 / decoded.max(1) as f64,
            "belady_hit_rate": o_hit as f64 / o_req.max(1) as f64,
            "first_32_tokens_hit_rate": stats_after_first.as_ref().map(|f| hit_rate_between(&pre, f)),
            "after_32_tokens_hit_rate": stats_after_first.as_ref().map(|f| hit_rate_between(f, &st)),
        });
        report["belady_whole_run"] = serde_json::json!({
            "hit_rate": opt.hit_rate(),
            "bytes_per_token": opt.bytes_per_token(),
        });
        s.save_histogram()?;
    }
    if a.json {
        crate::output::print_json(&report)?;
    } else {
        print_report(&report);
        if let Some(s) = &streaming {
            eprint!("{}", s.stats());
        }
    }
    Ok(())
}

/// The routing of the trace at `path`, to be forced into `model`: same experts per layer,
/// every traced layer a MoE layer of the model.
fn replay_source(
    model: &colibri_engine::Model,
    path: &std::path::Path,
) -> anyhow::Result<ReplayRouting> {
    let t = Trace::load(path).with_context(|| format!("reading {}", path.display()))?;
    let moe: Vec<(usize, usize, usize)> = model
        .net
        .layers
        .iter()
        .enumerate()
        .filter_map(|(i, l)| match &l.ffn {
            Ffn::Moe(m) => Some((i, m.experts.len(), m.top_k)),
            Ffn::Dense(_) => None,
        })
        .collect();
    let Some(&(first, _, _)) = moe.first() else {
        anyhow::bail!("{} has no routed experts", model.info.dir.display());
    };
    let mut traced: Vec<usize> = t
        .steps
        .iter()
        .flat_map(|s| s.layers.iter().map(|l| l.layer))
        .collect();
    traced.sort_unstable();
    traced.dedup();
    for l in traced {
        match moe.iter().find(|m| m.0 == l) {
            Some(&(_, e, _)) if e == t.n_experts => {}
            Some(&(_, e, _)) => anyhow::bail!(
                "{}: layer {l} routes over {} experts, the model's over {e}; make a model with `coli synth --like-trace {}`",
                path.display(), t.n_experts, path.display()
            ),
            None => anyhow::bail!(
                "{}: layer {l} is not a MoE layer of {}; make a model with `coli synth --like-trace {}`",
                path.display(), model.info.dir.display(), path.display()
            ),
        }
    }
    if let Some(&(_, _, k)) = moe.iter().find(|m| m.2 != t.top_k) {
        eprintln!(
            "note: the model routes top-{k}, the trace top-{}: the trace's experts are used",
            t.top_k
        );
    }
    eprintln!(
        "note: replaying the routing of {} ({}): outputs are not the model's",
        path.display(),
        t.model
    );
    Ok(ReplayRouting::new(t, first)?)
}

/// Token ids from a file (comma or white-space separated), each below `vocab`.
fn read_ids(path: &std::path::Path, vocab: usize) -> anyhow::Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let ids = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| match w.parse::<u32>() {
            Ok(id) if (id as usize) < vocab => Ok(id),
            _ => Err(anyhow::anyhow!(
                "{}: '{w}' is not a token id below the vocabulary size {vocab}",
                path.display()
            )),
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    if ids.is_empty() {
        anyhow::bail!("{} holds no token ids", path.display());
    }
    Ok(ids)
}

/// Decode tokens over which the start-up hit rate is measured (the rest is "warm").
const FIRST_TOKENS: usize = 32;

/// The store's hit rate over the requests between two snapshots.
fn hit_rate_between(a: &StoreStats, b: &StoreStats) -> f64 {
    let req = b.requests - a.requests;
    let hit = (b.hits + b.inflight_hits) - (a.hits + a.inflight_hits);
    hit as f64 / req.max(1) as f64
}

fn print_report(r: &serde_json::Value) {
    let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
    eprintln!(
        "{} prompt tokens at {:.1} tok/s, {} generated at {:.2} tok/s; load {:.1} s; peak RSS {}",
        r["prompt_tokens"],
        f("prefill_tokens_per_second"),
        r["generated_tokens"],
        f("decode_tokens_per_second"),
        f("load_seconds"),
        fmt_bytes(r["peak_rss_bytes"].as_u64().unwrap_or(0))
    );
    if let Some(d) = r.get("decode") {
        let g = |k: &str| d[k].as_f64().unwrap_or(0.0);
        eprintln!(
            "decode: hit rate {:.1}%, {} read per token; Belady at the same capacity: {:.1}%, {} per token ({:.2}×)",
            100.0 * g("hit_rate"),
            fmt_bytes(g("bytes_read_per_token") as u64),
            100.0 * g("belady_hit_rate"),
            fmt_bytes(g("belady_bytes_per_token") as u64),
            g("bytes_read_per_token") / g("belady_bytes_per_token").max(1.0)
        );
        if let (Some(a), Some(b)) = (
            d["first_32_tokens_hit_rate"].as_f64(),
            d["after_32_tokens_hit_rate"].as_f64(),
        ) {
            eprintln!(
                "decode hit rate: first 32 tokens {:.1}%, after them {:.1}%",
                100.0 * a,
                100.0 * b
            );
        }
    }
}

/// Layers, experts per layer and top-k of the model's MoE blocks.
fn moe_shape(model: &colibri_engine::Model) -> anyhow::Result<(usize, usize, usize)> {
    let mut experts = 0;
    let mut top_k = 0;
    for l in &model.net.layers {
        if let Ffn::Moe(m) = &l.ffn {
            experts = experts.max(m.experts.len());
            top_k = top_k.max(m.top_k);
        }
    }
    if experts == 0 {
        anyhow::bail!("{} has no routed experts", model.info.dir.display());
    }
    Ok((model.net.layers.len(), experts, top_k))
}

/// Peak resident set of this process (VmHWM), 0 where unknown.
fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
