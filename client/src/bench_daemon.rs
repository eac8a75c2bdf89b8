//! `coli bench --daemon`: many sessions on one warm colibrid. Starts a private daemon
//! (its own socket and state folder, so nothing else shares its engine or cache), loads the
//! model, and measures N concurrent generations for each N of `--sessions`, in rounds that
//! alternate the session counts so that load from elsewhere on the machine hits them alike:
//! aggregate and per-session tok/s, time to first token, inter-token latency, the engine's
//! rows per step, and for a streamed model the expert cache's hit rate and MB read per
//! token. With `--prefill-during P`, it also measures the inter-token latency of running
//! sessions while another session's P-token prompt is prefilled.
//!
//! Run it inside a memory cgroup (tools/bench/sessions.sh) and the daemon, its child, is
//! inside the limit too.

use crate::daemon_discovery::{self, Client};
use anyhow::{anyhow, bail, Context};
use clap::Args;
use colibri_proto::v1 as pb;
use pb::generate_event::Event;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args, Debug, Clone)]
pub struct DaemonBenchArgs {
    /// Measure concurrent sessions through a private colibrid (with --model DIR).
    #[arg(long, help_heading = "Daemon benchmark")]
    pub daemon: bool,
    /// Session counts to measure, e.g. 1,2,4,8.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8",
        help_heading = "Daemon benchmark"
    )]
    pub sessions: Vec<usize>,
    /// Rounds over the session counts (each round measures every count once).
    #[arg(long, default_value_t = 2, help_heading = "Daemon benchmark")]
    pub rounds: usize,
    /// Stream the routed experts through a cache of this many MiB (default: memory map).
    #[arg(long, value_name = "MIB", help_heading = "Daemon benchmark")]
    pub expert_cache: Option<u64>,
    /// The prompts are cut from this text (tokenized by the model's tokenizer), each
    /// session from another place; default: pseudo-random token ids.
    #[arg(long, value_name = "FILE", help_heading = "Daemon benchmark")]
    pub text: Option<PathBuf>,
    /// Also measure the inter-token latency of --itl-sessions decoding sessions while a
    /// prompt of this many tokens is prefilled (0 = skip).
    #[arg(
        long,
        value_name = "TOKENS",
        default_value_t = 0,
        help_heading = "Daemon benchmark"
    )]
    pub prefill_during: usize,
    /// Decoding sessions of the --prefill-during measurement.
    #[arg(long, default_value_t = 3, help_heading = "Daemon benchmark")]
    pub itl_sessions: usize,
    /// Tokens generated before the measurements (warms the code and, when streamed, the
    /// expert cache).
    #[arg(long, default_value_t = 32, help_heading = "Daemon benchmark")]
    pub warmup: usize,
    /// Extra colibrid arguments, e.g. --daemon-arg=--prefill-chunk=32 (repeatable).
    #[arg(
        long = "daemon-arg",
        value_name = "ARG",
        allow_hyphen_values = true,
        help_heading = "Daemon benchmark"
    )]
    pub daemon_args: Vec<String>,
    /// Print the results as JSON.
    #[arg(long, help_heading = "Daemon benchmark")]
    pub json: bool,
}

/// One generation as the client saw it.
#[derive(Clone, Debug, Default)]
struct Trace {
    sent: Option<Instant>,
    /// Arrival time of every generated token (several per event when drafts are accepted).
    tokens: Vec<Instant>,
    stats: Option<pb::GenerationStats>,
}

impl Trace {
    fn first(&self) -> Option<Instant> {
        self.tokens.first().copied()
    }
    fn last(&self) -> Option<Instant> {
        self.tokens.last().copied()
    }
    fn ttft_ms(&self) -> f64 {
        match (self.sent, self.first()) {
            (Some(s), Some(f)) => ms(f - s),
            _ => 0.0,
        }
    }
    fn decode_rate(&self) -> f64 {
        match (self.first(), self.last()) {
            (Some(f), Some(l)) if l > f => (self.tokens.len() - 1) as f64 / (l - f).as_secs_f64(),
            _ => 0.0,
        }
    }
    /// Gaps between consecutive tokens, ms.
    fn gaps(&self) -> Vec<(Instant, f64)> {
        self.tokens
            .windows(2)
            .map(|w| (w[1], ms(w[1] - w[0])))
            .collect()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The value at quantile `q` (nearest rank) of `v`; 0 when empty.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1;
    s[i]
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

/// What one measurement of N concurrent sessions gave.
#[derive(Clone, Debug, Default, Serialize)]
struct Phase {
    sessions: usize,
    round: usize,
    /// Tokens per second of all sessions together while every one of them was decoding.
    aggregate_tok_s: f64,
    /// All generated tokens after each session's first, over the whole phase.
    overall_tok_s: f64,
    per_session_tok_s: Vec<f64>,
    ttft_ms: Vec<f64>,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
    /// Engine steps and token rows per step (decode rows and prompt tokens).
    steps: u64,
    rows_per_step: f64,
    /// Streamed experts: demand lookups served from the cache, MiB read per generated
    /// token, expert lookups (unique experts per layer) per step.
    hit_rate: Option<f64>,
    mib_read_per_token: Option<f64>,
    experts_per_step: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
struct PrefillPhase {
    prompt_tokens: usize,
    decoding_sessions: usize,
    /// Inter-token latency of the decoding sessions before the prompt arrived.
    alone_p50_ms: f64,
    alone_p99_ms: f64,
    /// ... and of the gaps that overlap its prefill.
    during_p50_ms: f64,
    during_p99_ms: f64,
    during_max_ms: f64,
    during_gaps: usize,
    /// The prompt's time to first token and prefill rate.
    ttft_ms: f64,
    prefill_tok_s: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
struct Report {
    model: String,
    streamed: bool,
    expert_cache_mib: Option<u64>,
    prompt_tokens: usize,
    generated_tokens: usize,
    phases: Vec<Phase>,
    /// Per session count: median aggregate tok/s and median ratio to one session (ratios
    /// taken within each round).
    summary: Vec<SummaryRow>,
    prefill: Option<PrefillPhase>,
    daemon_peak_rss_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
struct SummaryRow {
    sessions: usize,
    aggregate_tok_s: f64,
    ratio_to_one: Option<f64>,
    per_session_tok_s: f64,
    ttft_ms: f64,
    itl_p50_ms: f64,
    itl_p99_ms: f64,
    rows_per_step: f64,
    hit_rate: Option<f64>,
    mib_read_per_token: Option<f64>,
}

/// The private daemon: killed if the benchmark fails before shutting it down.
struct Daemon {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    fn start(a: &DaemonBenchArgs, threads: Option<usize>) -> anyhow::Result<Daemon> {
        let dir = std::env::temp_dir().join(format!("coli-bench-daemon-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        colibri_daemon::state::create_private_dir(&dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let socket = dir.join("colibrid.sock");
        let log = std::fs::File::create(dir.join("colibrid.log"))?;
        let mut cmd = Command::new(daemon_discovery::daemon_binary());
        cmd.arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(&a.daemon_args)
            .env("COLIBRID_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(t) = threads {
            cmd.env("RAYON_NUM_THREADS", t.to_string());
        }
        if let Some(mib) = a.expert_cache {
            cmd.arg("--expert-cache").arg(mib.to_string());
        }
        let child = cmd
            .spawn()
            .context("starting colibrid (is it built next to coli?)")?;
        Ok(Daemon { child, dir, socket })
    }

    async fn connect(&mut self) -> anyhow::Result<Client> {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait()? {
                let log =
                    std::fs::read_to_string(self.dir.join("colibrid.log")).unwrap_or_default();
                bail!("colibrid exited ({st}): {log}");
            }
            if let Ok(ch) = daemon_discovery::connect(&self.socket).await {
                return Ok(daemon_discovery::client(ch));
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("colibrid did not answer on {}", self.socket.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Peak resident memory of the daemon so far (Linux).
    fn peak_rss(&self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
}

/// Prompts: one distinct slice of `pool` per index.
struct Prompts {
    pool: Vec<u32>,
    vocab: u32,
}

impl Prompts {
    fn get(&self, index: usize, len: usize) -> Vec<u32> {
        if self.pool.len() > len {
            // Slices spread over the text, wrapping around.
            let span = self.pool.len() - len;
            let start = (index * 7919 * len) % span.max(1);
            return self.pool[start..start + len].to_vec();
        }
        // Pseudo-random ids (an LCG per index), never special low ids.
        let mut x = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                100 + ((x >> 33) as u32) % (self.vocab.saturating_sub(100).max(1))
            })
            .collect()
    }
}

/// Runs one generation, recording token arrival times. `stop_after`: drop the stream after
/// this many tokens (the daemon cancels the request).
async fn generate(
    mut c: Client,
    model: String,
    ids: Vec<u32>,
    max_tokens: usize,
    stop_after: Option<tokio::sync::watch::Receiver<bool>>,
) -> anyhow::Result<Trace> {
    let req = pb::GenerateRequest {
        model,
        prompt_ids: ids,
        options: Some(pb::GenerationOptions {
            max_tokens: max_tokens as u32,
            ignore_eos: true,
            sampling: Some(pb::SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut trace = Trace {
        sent: Some(Instant::now()),
        ..Default::default()
    };
    let mut s = c
        .generate(req)
        .await
        .map_err(daemon_discovery::status_error)?
        .into_inner();
    loop {
        if let Some(stop) = &stop_after {
            if *stop.borrow() {
                break;
            }
        }
        let Some(ev) = s.message().await.map_err(daemon_discovery::status_error)? else {
            break;
        };
        match ev.event {
            Some(Event::Tokens(t)) => {
                let now = Instant::now();
                trace.tokens.extend(t.ids.iter().map(|_| now));
            }
            Some(Event::Finished(f)) => trace.stats = f.stats,
            _ => {}
        }
    }
    Ok(trace)
}

async fn model_status(c: &mut Client) -> anyhow::Result<pb::ModelStatus> {
    let st = c
        .status(pb::StatusRequest::default())
        .await
        .map_err(daemon_discovery::status_error)?
        .into_inner();
    st.models
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("the daemon has no model loaded"))
}

async fn phase(
    c: &mut Client,
    model: &str,
    prompts: &Prompts,
    n: usize,
    round: usize,
    prompt: usize,
    tokens: usize,
) -> anyhow::Result<Phase> {
    let before = model_status(c).await?;
    let tasks: Vec<_> = (0..n)
        .map(|k| {
            // A prompt of its own for every (round, session count, session): a prompt seen
            // before would be served from the daemon's prefix cache, and the TTFT of a phase
            // would depend on the phases run before it.
            let ids = prompts.get(1 + (round * 64 + n) * 64 + k, prompt);
            tokio::spawn(generate(c.clone(), model.to_string(), ids, tokens, None))
        })
        .collect();
    let mut traces = Vec::with_capacity(n);
    for t in tasks {
        traces.push(t.await??);
    }
    let after = model_status(c).await?;
    let firsts: Vec<Instant> = traces.iter().filter_map(Trace::first).collect();
    let lasts: Vec<Instant> = traces.iter().filter_map(Trace::last).collect();
    if firsts.len() != n {
        bail!("a session produced no token");
    }
    // Every session decoding: from the last first token to the first last token.
    let (w0, w1) = (
        *firsts.iter().max().expect("n > 0"),
        *lasts.iter().min().expect("n > 0"),
    );
    let in_window: usize = traces
        .iter()
        .map(|t| t.tokens.iter().filter(|&&x| x > w0 && x <= w1).count())
        .sum();
    let (s0, s1) = (
        *firsts.iter().min().expect("n > 0"),
        *lasts.iter().max().expect("n > 0"),
    );
    let total: usize = traces.iter().map(|t| t.tokens.len() - 1).sum();
    let overall = total as f64 / (s1 - s0).as_secs_f64().max(1e-9);
    let aggregate = if w1 > w0 && in_window >= 2 * n {
        in_window as f64 / (w1 - w0).as_secs_f64()
    } else {
        overall
    };
    let gaps: Vec<f64> = traces
        .iter()
        .flat_map(|t| t.gaps().into_iter().map(|g| g.1))
        .collect();
    let steps = after.steps.saturating_sub(before.steps);
    let rows = (after.tokens_generated + after.tokens_prefilled)
        .saturating_sub(before.tokens_generated + before.tokens_prefilled);
    let generated = after
        .tokens_generated
        .saturating_sub(before.tokens_generated);
    let (hit_rate, mib, experts) = match (&before.expert_cache, &after.expert_cache) {
        (Some(b), Some(x)) if x.streamed => {
            let hits = x.hits.saturating_sub(b.hits);
            let misses = x.misses.saturating_sub(b.misses);
            let read = x.bytes_read.saturating_sub(b.bytes_read);
            let requests = x.requests.saturating_sub(b.requests);
            (
                Some(hits as f64 / (hits + misses).max(1) as f64),
                Some(read as f64 / (1u64 << 20) as f64 / generated.max(1) as f64),
                Some(requests as f64 / steps.max(1) as f64),
            )
        }
        _ => (None, None, None),
    };
    Ok(Phase {
        sessions: n,
        round,
        aggregate_tok_s: aggregate,
        overall_tok_s: overall,
        per_session_tok_s: traces.iter().map(Trace::decode_rate).collect(),
        ttft_ms: traces.iter().map(Trace::ttft_ms).collect(),
        itl_p50_ms: quantile(&gaps, 0.5),
        itl_p99_ms: quantile(&gaps, 0.99),
        steps,
        rows_per_step: rows as f64 / steps.max(1) as f64,
        hit_rate,
        mib_read_per_token: mib,
        experts_per_step: experts,
    })
}

/// Decoding sessions, then a long prompt arrives: their gaps before it and during its
/// prefill.
async fn prefill_phase(
    c: &mut Client,
    model: &str,
    prompts: &Prompts,
    a: &DaemonBenchArgs,
    prompt: usize,
    max_context: usize,
) -> anyhow::Result<PrefillPhase> {
    let n = a.itl_sessions.max(1);
    let long = a.prefill_during;
    // Decoding sessions run until told to stop (their streams are dropped: cancelled).
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let room = max_context.saturating_sub(prompt + 1).max(1);
    let status0 = model_status(c).await?;
    let tasks: Vec<_> = (0..n)
        .map(|k| {
            let ids = prompts.get(500 + k, prompt);
            tokio::spawn(generate(
                c.clone(),
                model.to_string(),
                ids,
                room,
                Some(stop_rx.clone()),
            ))
        })
        .collect();
    // Let them reach a steady cadence (every prompt fed, then a few tokens each), then send
    // the prompt.
    let settle = Instant::now();
    let mut fed_at: Option<u64> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let st = model_status(c).await?;
        if fed_at.is_none() && st.tokens_prefilled >= status0.tokens_prefilled + (n * prompt) as u64
        {
            fed_at = Some(st.tokens_generated);
        }
        let steady = fed_at.is_some_and(|g| st.tokens_generated >= g + (16 * n) as u64);
        if steady || settle.elapsed() > Duration::from_secs(120) {
            break;
        }
    }
    let sent = Instant::now();
    let long_ids = prompts.get(999, long);
    let t = generate(c.clone(), model.to_string(), long_ids, 1, None).await?;
    let first = t
        .first()
        .ok_or_else(|| anyhow!("the long prompt produced no token"))?;
    // A few more tokens after it, then stop the others.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send_replace(true);
    let mut traces = Vec::new();
    for task in tasks {
        // A stream dropped mid-way still returns what it saw.
        traces.push(task.await??);
    }
    // Gaps count as "alone" once every decoding session has its first token (before that,
    // the others' prompts were being prefilled).
    let all_started = traces
        .iter()
        .filter_map(Trace::first)
        .max()
        .ok_or_else(|| anyhow!("no decoding session produced a token"))?;
    let mut alone = Vec::new();
    let mut during = Vec::new();
    for tr in &traces {
        for w in tr.tokens.windows(2) {
            let gap = ms(w[1] - w[0]);
            if w[1] <= sent {
                if w[0] >= all_started {
                    alone.push(gap);
                }
            } else if w[0] < first {
                during.push(gap);
            }
        }
    }
    let ttft = ms(first - sent);
    Ok(PrefillPhase {
        prompt_tokens: long,
        decoding_sessions: n,
        alone_p50_ms: quantile(&alone, 0.5),
        alone_p99_ms: quantile(&alone, 0.99),
        during_p50_ms: quantile(&during, 0.5),
        during_p99_ms: quantile(&during, 0.99),
        during_max_ms: during.iter().copied().fold(0.0, f64::max),
        during_gaps: during.len(),
        ttft_ms: ttft,
        prefill_tok_s: long as f64 / (ttft / 1e3).max(1e-9),
    })
}

pub fn run(
    a: &DaemonBenchArgs,
    model_dir: &Path,
    threads: Option<usize>,
    prompt: usize,
    tokens: usize,
) -> anyhow::Result<()> {
    if a.sessions.is_empty() || a.sessions.contains(&0) {
        bail!("--sessions needs counts of at least 1");
    }
    if tokens < 2 {
        bail!("--tokens must be at least 2 (inter-token latency needs two tokens)");
    }
    let model = crate::remote::model_id(model_dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut daemon = Daemon::start(a, threads)?;
    let report = rt.block_on(async {
        let mut c = daemon.connect().await?;
        let info = crate::remote::load_model(&mut c, &model, None).await?;
        let vocab = info.vocab_size;
        let max_context = info.max_context as usize;
        let pool = match &a.text {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                // In pieces: the daemon refuses a text longer than the context.
                let mut ids = Vec::new();
                for piece in pieces(&text, 4000) {
                    ids.extend(
                        c.tokenize(pb::TokenizeRequest {
                            model: model.clone(),
                            text: piece.to_string(),
                            add_special_tokens: Some(false),
                            ..Default::default()
                        })
                        .await
                        .map_err(daemon_discovery::status_error)?
                        .into_inner()
                        .ids,
                    );
                }
                ids
            }
            None => Vec::new(),
        };
        let prompts = Prompts { pool, vocab };
        if a.warmup > 0 {
            generate(c.clone(), model.clone(), prompts.get(0, prompt), a.warmup, None).await?;
        }
        let mut report = Report {
            model: model.clone(),
            streamed: a.expert_cache.is_some(),
            expert_cache_mib: a.expert_cache,
            prompt_tokens: prompt,
            generated_tokens: tokens,
            ..Default::default()
        };
        for round in 0..a.rounds.max(1) {
            for &n in &a.sessions {
                let p = phase(&mut c, &model, &prompts, n, round, prompt, tokens).await?;
                if !a.json {
                    eprintln!(
                        "round {round}: {n} sessions: {:.2} tok/s aggregate, TTFT {:.0} ms, ITL p50 {:.1} ms p99 {:.1} ms, {:.2} rows/step{}",
                        p.aggregate_tok_s,
                        median(&p.ttft_ms),
                        p.itl_p50_ms,
                        p.itl_p99_ms,
                        p.rows_per_step,
                        p.hit_rate
                            .map(|h| format!(", hit {:.1}%, {:.1} MiB/token", h * 100.0, p.mib_read_per_token.unwrap_or(0.0)))
                            .unwrap_or_default()
                    );
                }
                report.phases.push(p);
            }
        }
        if a.prefill_during > 0 {
            if prompt + a.prefill_during + 2 > max_context {
                bail!(
                    "--prefill-during {} does not fit the context of {max_context}",
                    a.prefill_during
                );
            }
            report.prefill = Some(prefill_phase(&mut c, &model, &prompts, a, prompt, max_context).await?);
        }
        report.daemon_peak_rss_bytes = daemon.peak_rss();
        let _ = c.shutdown(pb::ShutdownRequest {}).await;
        anyhow::Ok(report)
    })?;
    let _ = daemon.child.wait();
    let mut report = report;
    report.summary = summarize(&report.phases, &a.sessions);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

/// `text` cut after whitespace into pieces of at most about `max` bytes.
fn pieces(text: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if rest.len() <= max {
            out.push(rest);
            break;
        }
        let mut cut = max;
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let cut = rest[..cut]
            .rfind(char::is_whitespace)
            .map(|i| i + 1)
            .filter(|&i| i > 0)
            .unwrap_or(cut);
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out
}

fn summarize(phases: &[Phase], sessions: &[usize]) -> Vec<SummaryRow> {
    let rounds: Vec<usize> = {
        let mut r: Vec<usize> = phases.iter().map(|p| p.round).collect();
        r.dedup();
        r
    };
    sessions
        .iter()
        .map(|&n| {
            let mine: Vec<&Phase> = phases.iter().filter(|p| p.sessions == n).collect();
            let ratios: Vec<f64> = rounds
                .iter()
                .filter_map(|&r| {
                    let one = phases.iter().find(|p| p.round == r && p.sessions == 1)?;
                    let me = phases.iter().find(|p| p.round == r && p.sessions == n)?;
                    Some(me.aggregate_tok_s / one.aggregate_tok_s)
                })
                .collect();
            let opt = |f: &dyn Fn(&Phase) -> Option<f64>| {
                let v: Vec<f64> = mine.iter().filter_map(|p| f(p)).collect();
                (!v.is_empty()).then(|| median(&v))
            };
            SummaryRow {
                sessions: n,
                aggregate_tok_s: median(
                    &mine.iter().map(|p| p.aggregate_tok_s).collect::<Vec<_>>(),
                ),
                ratio_to_one: (!ratios.is_empty()).then(|| median(&ratios)),
                per_session_tok_s: median(
                    &mine
                        .iter()
                        .flat_map(|p| p.per_session_tok_s.iter().copied())
                        .collect::<Vec<_>>(),
                ),
                ttft_ms: median(
                    &mine
                        .iter()
                        .flat_map(|p| p.ttft_ms.iter().copied())
                        .collect::<Vec<_>>(),
                ),
                itl_p50_ms: median(&mine.iter().map(|p| p.itl_p50_ms).collect::<Vec<_>>()),
                itl_p99_ms: median(&mine.iter().map(|p| p.itl_p99_ms).collect::<Vec<_>>()),
                rows_per_step: median(&mine.iter().map(|p| p.rows_per_step).collect::<Vec<_>>()),
                hit_rate: opt(&|p| p.hit_rate),
                mib_read_per_token: opt(&|p| p.mib_read_per_token),
            }
        })
        .collect()
}

fn print_report(r: &Report) {
    println!(
        "model {} ({}), {} prompt tokens, {} generated per session",
        r.model,
        match r.expert_cache_mib {
            Some(m) => format!("experts streamed through a {m} MiB cache"),
            None => "resident".into(),
        },
        r.prompt_tokens,
        r.generated_tokens
    );
    println!(
        "sessions  aggregate tok/s  vs 1   per session  TTFT ms  ITL p50 ms  ITL p99 ms  rows/step{}",
        if r.streamed { "  hit rate  MiB read/token" } else { "" }
    );
    for s in &r.summary {
        print!(
            "{:8}  {:15.2}  {:5}  {:11.2}  {:7.0}  {:10.1}  {:10.1}  {:9.2}",
            s.sessions,
            s.aggregate_tok_s,
            s.ratio_to_one
                .map(|x| format!("{x:.2}x"))
                .unwrap_or("-".into()),
            s.per_session_tok_s,
            s.ttft_ms,
            s.itl_p50_ms,
            s.itl_p99_ms,
            s.rows_per_step
        );
        if let (Some(h), Some(m)) = (s.hit_rate, s.mib_read_per_token) {
            print!("  {:7.1}%  {:14.1}", h * 100.0, m);
        }
        println!();
    }
    if let Some(p) = &r.prefill {
        println!(
            "{} sessions decoding while a {}-token prompt is prefilled: ITL alone p50 {:.1} ms p99 {:.1} ms; during the prefill p50 {:.1} ms p99 {:.1} ms max {:.1} ms ({} gaps, p99/p50 alone {:.2}); its TTFT {:.0} ms ({:.1} tok/s)",
            p.decoding_sessions,
            p.prompt_tokens,
            p.alone_p50_ms,
            p.alone_p99_ms,
            p.during_p50_ms,
            p.during_p99_ms,
            p.during_max_ms,
            p.during_gaps,
            p.during_p99_ms / p.alone_p50_ms.max(1e-9),
            p.ttft_ms,
            p.prefill_tok_s
        );
    }
    if let Some(b) = r.daemon_peak_rss_bytes {
        println!("daemon peak RSS {:.0} MiB", b as f64 / (1u64 << 20) as f64);
    }
}
