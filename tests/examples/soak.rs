//! A soak test anyone can run against the real `colibrid`: mixed traffic at 16-way
//! concurrency for a bounded time, a SIGKILL of the daemon in the middle, and a report.
//!
//! ```text
//! cargo run --release --example soak -- --minutes 5
//! cargo run --release --example soak -- --seconds 40 --concurrency 8     # what CI runs
//! cargo run --release --example soak -- --burst-only                     # RSS and refusal figures
//! ```
//!
//! Options: `--minutes M` / `--seconds S` (default 5 minutes), `--concurrency N` (16),
//! `--model DIR` (the olmoe fixture), `--no-kill`, `--no-oversize`, `--burst-only`. `colibrid` is built
//! for this profile, or taken from `COLIBRID_BIN`.
//!
//! 1. **Warm-up**: every kind of request once, then idle: the steady-state RSS.
//! 2. **Burst**: a 4 MB prompt refused 20 times (time to refuse), then a 4 MB prompt and an
//!    8 MB Tokenize; RSS after 2 s idle against the steady state (target: within 64 MiB).
//! 3. **Traffic**: workers loop over normal generations (greedy and sampled), generations
//!    cancelled by Cancel or by dropping the stream, oversize inputs (4 MB prompt, 8 MB
//!    Tokenize, 4 MB chat message), session turns, small Tokenize/Score; a controller loads and
//!    unloads a second model and, now and then, the main one. Witness sessions are made and
//!    left to be snapshotted; at half time the daemon is killed with SIGKILL and restarted on
//!    the same socket and state, and each witness must come back (ResumeSession) and continue
//!    exactly as a fresh prompt of its whole history does.
//! 4. **Report**: requests, errors by code (expected ones apart), p50/p99 latency per kind,
//!    RSS over time, and a verdict. The exit status is non-zero when anything unexpected
//!    happened: an error a request should not get, a witness not back or continuing
//!    differently, RSS after the traffic not back within 64 MiB of the steady state.

use colibri_proto::v1 as pb;
use colibri_tests::daemon::Daemon;
use colibri_tests::fixture;
use pb::colibri_client::ColibriClient;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

#[allow(dead_code)]
fn main() {
    let opts = Opts::from_args();
    let report = run(&opts);
    report.print();
    if !report.failures.is_empty() {
        std::process::exit(1);
    }
}

#[derive(Clone, Debug)]
pub struct Opts {
    pub duration: Duration,
    pub concurrency: usize,
    pub model: PathBuf,
    pub second_model: PathBuf,
    pub kill: bool,
    pub burst_only: bool,
    /// Leave the oversize inputs out of the traffic (to see what they cost the rest).
    pub oversize: bool,
}

impl Opts {
    pub fn new(duration: Duration) -> Opts {
        Opts {
            duration,
            concurrency: 16,
            model: fixture("olmoe"),
            second_model: fixture("qwen3_moe"),
            kill: true,
            burst_only: false,
            oversize: true,
        }
    }

    fn from_args() -> Opts {
        let mut o = Opts::new(Duration::from_secs(300));
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut i = 0;
        while i < args.len() {
            let v = || args.get(i + 1).cloned().unwrap_or_default();
            let mut flag = true;
            match args[i].as_str() {
                "--minutes" => {
                    o.duration =
                        Duration::from_secs_f64(v().parse::<f64>().expect("--minutes M") * 60.0)
                }
                "--seconds" => {
                    o.duration = Duration::from_secs_f64(v().parse().expect("--seconds S"))
                }
                "--concurrency" => o.concurrency = v().parse().expect("--concurrency N"),
                "--model" => o.model = PathBuf::from(v()),
                "--no-kill" => {
                    o.kill = false;
                    flag = false;
                }
                "--no-oversize" => {
                    o.oversize = false;
                    flag = false;
                }
                "--burst-only" => {
                    o.burst_only = true;
                    flag = false;
                }
                other => panic!(
                    "unknown argument {other}; see the doc comment of tests/examples/soak.rs"
                ),
            }
            i += if flag { 2 } else { 1 };
        }
        o
    }
}

/// One kind of request the workers send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Generate,
    Cancelled,
    Oversize,
    SessionTurn,
    Small,
    LoadUnload,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Generate => "generate",
            Kind::Cancelled => "cancelled",
            Kind::Oversize => "oversize",
            Kind::SessionTurn => "session turn",
            Kind::Small => "tokenize/score",
            Kind::LoadUnload => "load/unload",
        }
    }

    /// Codes a request of this kind may get without anything being wrong: the model is being
    /// unloaded or reloaded (NOT_FOUND, UNAVAILABLE), the daemon is restarting (UNAVAILABLE),
    /// it is busy (RESOURCE_EXHAUSTED); oversize inputs must get INVALID_ARGUMENT.
    fn expected(self, code: Code) -> bool {
        match code {
            // Cancelled: an unload cancels what is running (Score answers CANCELLED).
            Code::NotFound | Code::Unavailable | Code::ResourceExhausted | Code::Cancelled => true,
            // A session whose model is being loaded again by another worker.
            Code::FailedPrecondition => self == Kind::SessionTurn,
            Code::InvalidArgument => self == Kind::Oversize,
            _ => false,
        }
    }
}

#[derive(Default)]
struct Stats {
    latencies: BTreeMap<Kind, Vec<f64>>,
    errors: BTreeMap<(Kind, String), u64>,
    unexpected: Vec<String>,
}

impl Stats {
    fn ok(&mut self, k: Kind, t: Instant) {
        self.latencies
            .entry(k)
            .or_default()
            .push(t.elapsed().as_secs_f64() * 1e3);
    }
    fn err(&mut self, k: Kind, code: Code, msg: &str, down: bool) {
        *self.errors.entry((k, format!("{code:?}"))).or_default() += 1;
        // While the daemon is down anything transport-like is expected.
        let transport = matches!(code, Code::Unknown | Code::Internal)
            && [
                "transport",
                "connect",
                "h2 protocol",
                "broken pipe",
                "without Finished",
            ]
            .iter()
            .any(|m| msg.contains(m));
        if !(k.expected(code) || (down && transport)) && self.unexpected.len() < 50 {
            self.unexpected
                .push(format!("{}: {code:?}: {msg}", k.name()));
        }
    }
}

pub struct Report {
    pub opts: Opts,
    pub elapsed: f64,
    pub requests: u64,
    stats: Stats,
    pub refuse_ms: Vec<f64>,
    pub rss_steady: u64,
    pub rss_after_burst: u64,
    pub rss_burst_peak: u64,
    pub rss_after_traffic: Option<u64>,
    pub rss_series: Vec<(f64, u64)>,
    pub witnesses: Vec<String>,
    pub killed_at: Option<f64>,
    pub failures: Vec<String>,
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

impl Report {
    pub fn print(&self) {
        let o = &self.opts;
        println!(
            "soak: {:.0} s, {} workers, model {}",
            self.elapsed,
            o.concurrency,
            o.model.display()
        );
        let mut r = self.refuse_ms.clone();
        println!(
            "burst: time to refuse a 4 MB prompt: median {:.1} ms, max {:.1} ms ({} tries)",
            pct(&mut r, 0.5),
            r.last().copied().unwrap_or(0.0),
            r.len()
        );
        println!(
            "burst: RSS steady {:.1} MiB, peak during the 4 MB + 8 MB requests {:.1} MiB, after 2 s idle {:.1} MiB ({:+.1} MiB)",
            mib(self.rss_steady),
            mib(self.rss_burst_peak),
            mib(self.rss_after_burst),
            mib(self.rss_after_burst) - mib(self.rss_steady)
        );
        if o.burst_only {
            return;
        }
        println!(
            "requests: {} ({:.1}/s)",
            self.requests,
            self.requests as f64 / self.elapsed.max(1e-9)
        );
        println!(
            "{:<16} {:>7} {:>9} {:>9}  errors by code",
            "kind", "ok", "p50 ms", "p99 ms"
        );
        let kinds = [
            Kind::Generate,
            Kind::Cancelled,
            Kind::Oversize,
            Kind::SessionTurn,
            Kind::Small,
            Kind::LoadUnload,
        ];
        for k in kinds {
            let mut l = self.stats.latencies.get(&k).cloned().unwrap_or_default();
            let errs: Vec<String> = self
                .stats
                .errors
                .iter()
                .filter(|((kk, _), _)| *kk == k)
                .map(|((_, c), n)| format!("{c} {n}"))
                .collect();
            println!(
                "{:<16} {:>7} {:>9.1} {:>9.1}  {}",
                k.name(),
                l.len(),
                pct(&mut l, 0.5),
                pct(&mut l, 0.99),
                if errs.is_empty() {
                    "-".into()
                } else {
                    errs.join(", ")
                }
            );
        }
        if let Some(t) = self.killed_at {
            println!("SIGKILL at {t:.0} s, restarted on the same socket and state");
        }
        for w in &self.witnesses {
            println!("witness {w}");
        }
        let series: Vec<String> = self
            .rss_series
            .iter()
            .map(|(t, b)| format!("{t:.0}s {:.0}", mib(*b)))
            .collect();
        println!("RSS over time (MiB): {}", series.join(" | "));
        if let Some(a) = self.rss_after_traffic {
            println!(
                "RSS after the traffic and 2 s idle: {:.1} MiB ({:+.1} MiB against the steady state)",
                mib(a),
                mib(a) - mib(self.rss_steady)
            );
        }
        for u in &self.stats.unexpected {
            println!("unexpected: {u}");
        }
        if self.failures.is_empty() {
            println!("soak: PASS");
        } else {
            for f in &self.failures {
                println!("FAIL: {f}");
            }
        }
    }
}

#[cfg(target_os = "linux")]
fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

#[cfg(not(target_os = "linux"))]
fn rss_of(_: u32) -> u64 {
    0
}

fn options(max_tokens: u32, temperature: f32, seed: u64) -> Option<pb::GenerationOptions> {
    Some(pb::GenerationOptions {
        max_tokens,
        ignore_eos: true,
        sampling: Some(pb::SamplingParams {
            temperature: Some(temperature),
            seed: Some(seed),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// xorshift: the traffic is reproducible per worker.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
    fn ids(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| 3 + self.below(500) as u32).collect()
    }
}

/// What every worker shares.
struct Shared {
    socket: PathBuf,
    model: String,
    second: String,
    stop: AtomicBool,
    /// The daemon is being killed and restarted.
    down: AtomicBool,
    pid: AtomicU32,
    stats: Mutex<Stats>,
    big: Arc<String>,
    oversize: bool,
}

async fn connect(socket: &Path) -> Option<ColibriClient<Channel>> {
    colibri_proto::connect::client(socket).await.ok()
}

async fn load(c: &mut ColibriClient<Channel>, model: &str) -> Result<String, tonic::Status> {
    let mut s = c
        .load_model(pb::LoadModelRequest {
            model: model.to_string(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut id = String::new();
    while let Some(p) = s.message().await? {
        if let Some(info) = p.info {
            id = info.id;
        }
    }
    Ok(id)
}

async fn generate(
    c: &mut ColibriClient<Channel>,
    req: pb::GenerateRequest,
) -> Result<(Vec<u32>, i32), tonic::Status> {
    let mut s = c.generate(req).await?.into_inner();
    let (mut ids, mut reason) = (Vec::new(), 0);
    while let Some(ev) = s.message().await? {
        match ev.event {
            Some(pb::generate_event::Event::Tokens(t)) => ids.extend(t.ids),
            Some(pb::generate_event::Event::Finished(f)) => reason = f.reason,
            _ => {}
        }
    }
    Ok((ids, reason))
}

/// A stream that ended without its Finished event: only a connection lost (the daemon
/// killed) may do that.
fn no_finished() -> tonic::Status {
    tonic::Status::internal("the stream ended without Finished (transport lost?)")
}

/// One worker's session: its id and how many tokens it holds.
struct WorkerSession {
    id: String,
    tokens: usize,
    exists: bool,
}

async fn worker(sh: Arc<Shared>, n: usize) -> u64 {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (n as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut c: Option<ColibriClient<Channel>> = None;
    let mut session = WorkerSession {
        id: format!("soak-w{n}"),
        tokens: 0,
        exists: false,
    };
    let mut requests = 0;
    let mut round = 0u64;
    while !sh.stop.load(Ordering::Relaxed) {
        let Some(client) = (match c.take() {
            Some(x) => Some(x),
            None => connect(&sh.socket).await,
        }) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut client = client;
        let down = sh.down.load(Ordering::Relaxed);
        let roll = rng.below(100);
        let kind = match roll {
            0..=29 => Kind::Generate,
            30..=39 => Kind::Cancelled,
            40..=44 if sh.oversize => Kind::Oversize,
            40..=44 => Kind::Small,
            45..=74 => Kind::SessionTurn,
            _ => Kind::Small,
        };
        round += 1;
        let t = Instant::now();
        let res = one_request(&sh, &mut client, &mut rng, &mut session, kind, round).await;
        requests += 1;
        match res {
            Ok(()) => sh.stats.lock().unwrap().ok(kind, t),
            Err(e) => {
                let down = down || sh.down.load(Ordering::Relaxed);
                sh.stats
                    .lock()
                    .unwrap()
                    .err(kind, e.code(), e.message(), down);
                if matches!(e.code(), Code::NotFound) && e.message().contains("not loaded") {
                    // The controller unloaded the model: load it again (idempotent).
                    let _ = load(&mut client, &sh.model).await;
                }
                if matches!(
                    e.code(),
                    Code::Unavailable | Code::Unknown | Code::Internal | Code::Cancelled
                ) {
                    // Maybe the daemon went away: reconnect next round.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        c = Some(client);
    }
    requests
}

async fn one_request(
    sh: &Shared,
    c: &mut ColibriClient<Channel>,
    rng: &mut Rng,
    session: &mut WorkerSession,
    kind: Kind,
    round: u64,
) -> Result<(), tonic::Status> {
    let model = sh.model.clone();
    match kind {
        Kind::Generate => {
            let len = 4 + rng.below(28) as usize;
            let prompt = rng.ids(len);
            let n = 4 + rng.below(28) as u32;
            let temp = if rng.below(2) == 0 { 0.0 } else { 0.8 };
            let (ids, reason) = generate(
                c,
                pb::GenerateRequest {
                    model,
                    prompt_ids: prompt,
                    options: options(n, temp, round),
                    ..Default::default()
                },
            )
            .await?;
            let (ids, reason) = (ids, reason);
            if reason == 0 {
                return Err(no_finished());
            }
            // A generation cut by an unload ends early (CANCELLED); otherwise all n tokens.
            if ids.len() > n as usize
                || (reason != pb::FinishReason::Cancelled as i32 && ids.len() != n as usize)
            {
                return Err(tonic::Status::internal(format!(
                    "{} tokens for max_tokens {n}",
                    ids.len()
                )));
            }
        }
        Kind::Cancelled => {
            let rid = format!("soak-{round}-{}", rng.below(1 << 30));
            let mut o = options(200, 0.0, 0);
            o.as_mut().unwrap().request_id = rid.clone();
            let mut s = c
                .generate(pb::GenerateRequest {
                    model,
                    prompt_ids: rng.ids(8),
                    options: o,
                    ..Default::default()
                })
                .await?
                .into_inner();
            // Started, then a token (or already Finished: an unload cancelled it).
            let mut reason = 0;
            for _ in 0..2 {
                if let Some(pb::GenerateEvent {
                    event: Some(pb::generate_event::Event::Finished(f)),
                }) = s.message().await?
                {
                    reason = f.reason;
                }
            }
            if rng.below(2) == 0 {
                // The client vanishes mid-stream.
                drop(s);
            } else {
                c.cancel(pb::CancelRequest {
                    request_id: rid,
                    ..Default::default()
                })
                .await?;
                while let Some(ev) = s.message().await? {
                    if let Some(pb::generate_event::Event::Finished(f)) = ev.event {
                        reason = f.reason;
                    }
                }
                if reason == 0 {
                    return Err(no_finished());
                }
                if reason != pb::FinishReason::Cancelled as i32
                    && reason != pb::FinishReason::Length as i32
                {
                    return Err(tonic::Status::internal(format!(
                        "cancelled generation finished with reason {reason}"
                    )));
                }
            }
        }
        Kind::Oversize => {
            let big = sh.big.as_str();
            let r = match round % 3 {
                0 => c
                    .generate(pb::GenerateRequest {
                        model,
                        prompt_text: big.to_string(),
                        options: options(4, 0.0, 0),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
                1 => c
                    .tokenize(pb::TokenizeRequest {
                        model,
                        text: big.repeat(2),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
                _ => c
                    .chat(pb::ChatRequest {
                        model,
                        messages: vec![pb::ChatMessage {
                            role: "user".into(),
                            content: big.to_string(),
                            ..Default::default()
                        }],
                        options: options(4, 0.0, 0),
                        ..Default::default()
                    })
                    .await
                    .map(|_| ()),
            };
            match r {
                Ok(()) => return Err(tonic::Status::internal("an oversize input was accepted")),
                Err(e) => return Err(e),
            }
        }
        Kind::SessionTurn => {
            let len = 2 + rng.below(8) as usize;
            let prompt = rng.ids(len);
            let n = 2 + rng.below(8) as u32;
            if session.exists && session.tokens + prompt.len() + n as usize > 240 {
                match c
                    .delete_session(pb::DeleteSessionRequest {
                        id: session.id.clone(),
                    })
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code() == Code::NotFound => {}
                    Err(e) => return Err(e),
                }
                session.exists = false;
            }
            if !session.exists {
                match c
                    .create_session(pb::CreateSessionRequest {
                        model: model.clone(),
                        id: session.id.clone(),
                    })
                    .await
                {
                    Ok(_) => {}
                    // It came back from a snapshot: start over with it.
                    Err(e) if e.code() == Code::AlreadyExists => {
                        c.delete_session(pb::DeleteSessionRequest {
                            id: session.id.clone(),
                        })
                        .await?;
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
                session.exists = true;
                session.tokens = 0;
            }
            let r = generate(
                c,
                pb::GenerateRequest {
                    model: model.clone(),
                    session_id: session.id.clone(),
                    prompt_ids: prompt.clone(),
                    options: options(n, 0.0, 0),
                    ..Default::default()
                },
            )
            .await;
            match r {
                Ok((ids, _)) => session.tokens += prompt.len() + ids.len(),
                Err(e) => {
                    // Lost in the crash (not yet snapshotted): start a new one next time.
                    if e.code() == Code::NotFound && e.message().contains("no session") {
                        session.exists = false;
                    }
                    return Err(e);
                }
            }
        }
        Kind::Small => {
            if rng.below(2) == 0 {
                let r = c
                    .tokenize(pb::TokenizeRequest {
                        model,
                        text: "The sea is blue and the sky is grey.".into(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                if r.ids.is_empty() {
                    return Err(tonic::Status::internal("empty tokenization"));
                }
            } else {
                let ids = rng.ids(16);
                let r = c
                    .score(pb::ScoreRequest {
                        model,
                        ids,
                        argmax_only: rng.below(2) == 0,
                    })
                    .await?
                    .into_inner();
                if r.positions != 16 {
                    return Err(tonic::Status::internal("wrong score size"));
                }
            }
        }
        Kind::LoadUnload => unreachable!("the controller's"),
    }
    Ok(())
}

/// A session made and left idle to be snapshotted; after the restart it must continue
/// exactly as a fresh prompt of its history.
struct Witness {
    id: String,
    history: Vec<u32>,
    next: Vec<u32>,
    expected: Vec<u32>,
}

async fn make_witnesses(c: &mut ColibriClient<Channel>, model: &str, n: usize) -> Vec<Witness> {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut out = Vec::new();
    for i in 0..n {
        let id = format!("soak-witness-{i}");
        let _ = c
            .delete_session(pb::DeleteSessionRequest { id: id.clone() })
            .await;
        c.create_session(pb::CreateSessionRequest {
            model: model.to_string(),
            id: id.clone(),
        })
        .await
        .expect("create witness session");
        let mut history = Vec::new();
        for _ in 0..2 {
            let p = rng.ids(6);
            let (ids, _) = generate(
                c,
                pb::GenerateRequest {
                    model: model.to_string(),
                    session_id: id.clone(),
                    prompt_ids: p.clone(),
                    options: options(5, 0.0, 0),
                    ..Default::default()
                },
            )
            .await
            .expect("witness turn");
            history.extend(p);
            history.extend(ids);
        }
        let next = rng.ids(3);
        let full = [&history[..], &next[..]].concat();
        let (expected, _) = generate(
            c,
            pb::GenerateRequest {
                model: model.to_string(),
                prompt_ids: full,
                options: options(6, 0.0, 0),
                ..Default::default()
            },
        )
        .await
        .expect("witness reference");
        out.push(Witness {
            id,
            history,
            next,
            expected,
        });
    }
    out
}

/// Waits until every witness is snapshotted (the daemon saves idle sessions after 1 s).
async fn wait_persisted(c: &mut ColibriClient<Channel>, ws: &[Witness]) -> bool {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(r) = c.list_sessions(pb::ListSessionsRequest::default()).await {
            let list = r.into_inner().sessions;
            if ws
                .iter()
                .all(|w| list.iter().any(|s| s.id == w.id && s.persisted))
            {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// [`check_one_witness`], tried again when the model was being unloaded meanwhile.
async fn check_witness(c: &mut ColibriClient<Channel>, w: &Witness) -> Result<String, String> {
    let mut last = String::new();
    for _ in 0..5 {
        match check_one_witness(c, w).await {
            Ok(s) => return Ok(s),
            Err((true, e)) => last = e,
            Err((false, e)) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(last)
}

/// Err((transient, why)).
async fn check_one_witness(
    c: &mut ColibriClient<Channel>,
    w: &Witness,
) -> Result<String, (bool, String)> {
    let transient = |e: &tonic::Status| {
        matches!(
            e.code(),
            Code::NotFound | Code::Unavailable | Code::Cancelled
        ) && !e.message().contains("no session")
    };
    let r = c
        .resume_session(pb::ResumeSessionRequest {
            id: w.id.clone(),
            load_model: true,
        })
        .await
        .map_err(|e| (transient(&e), format!("ResumeSession: {e:?}")))?
        .into_inner();
    let info = r.session.unwrap_or_default();
    if info.history_tokens as usize != w.history.len() {
        return Err((
            false,
            format!(
                "{} tokens back, {} before",
                info.history_tokens,
                w.history.len()
            ),
        ));
    }
    let (ids, reason) = generate(
        c,
        pb::GenerateRequest {
            session_id: w.id.clone(),
            prompt_ids: w.next.clone(),
            options: options(6, 0.0, 0),
            ..Default::default()
        },
    )
    .await
    .map_err(|e| (transient(&e), format!("continuing: {e:?}")))?;
    if reason == pb::FinishReason::Cancelled as i32 {
        return Err((false, "the continuation was cancelled by an unload".into()));
    }
    if ids != w.expected {
        return Err((
            false,
            format!(
                "continued with {ids:?}, a fresh prompt gives {:?}",
                w.expected
            ),
        ));
    }
    Ok(format!(
        "{}: back ({} tokens, restored from disk: {}), continues identically",
        w.id, info.history_tokens, r.restored_from_disk
    ))
}

fn start_daemon(socket: &Path, state: &Path) -> Daemon {
    Daemon::start(socket, state, &["--session-save-after", "1"])
}

pub fn run(opts: &Opts) -> Report {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(run_async(opts.clone()))
}

async fn idle_rss(pid: u32) -> u64 {
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss_of(pid)
}

async fn run_async(opts: Opts) -> Report {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("run").join("colibrid.sock");
    let state = dir.path().join("state");
    let mut daemon = start_daemon(&socket, &state);
    let pid = daemon.child.id();
    let mut c = connect(&socket).await.expect("connect");
    let model = load(&mut c, &opts.model.display().to_string())
        .await
        .expect("load the model");
    let second = opts.second_model.display().to_string();
    let big = Arc::new("The sea is blue. ".repeat((4 << 20) / 17));
    let mut failures = Vec::new();

    // 1. Warm-up: every kind a few times.
    {
        let sh = Shared {
            socket: socket.clone(),
            model: model.clone(),
            second: second.clone(),
            stop: AtomicBool::new(false),
            down: AtomicBool::new(false),
            pid: AtomicU32::new(pid),
            stats: Mutex::new(Stats::default()),
            big: Arc::clone(&big),
            oversize: true,
        };
        let mut rng = Rng(7);
        let mut s = WorkerSession {
            id: "soak-warmup".into(),
            tokens: 0,
            exists: false,
        };
        for round in 0..12 {
            for k in [
                Kind::Generate,
                Kind::SessionTurn,
                Kind::Small,
                Kind::Cancelled,
            ] {
                if let Err(e) = one_request(&sh, &mut c, &mut rng, &mut s, k, round).await {
                    failures.push(format!("warm-up {}: {e:?}", k.name()));
                }
            }
        }
        let _ = c
            .delete_session(pb::DeleteSessionRequest { id: s.id })
            .await;
    }
    let rss_steady = idle_rss(pid).await;

    // 2. Burst: time to refuse, then RSS after 4 MB + 8 MB.
    let mut refuse_ms = Vec::new();
    for _ in 0..20 {
        let req = pb::GenerateRequest {
            model: model.clone(),
            prompt_text: big.to_string(),
            options: options(4, 0.0, 0),
            ..Default::default()
        };
        let t = Instant::now();
        let r = c.generate(req).await;
        refuse_ms.push(t.elapsed().as_secs_f64() * 1e3);
        match r {
            Err(e) if e.code() == Code::InvalidArgument => {}
            other => failures.push(format!("4 MB prompt: {:?}", other.map(|_| ()))),
        }
    }
    let peak = Arc::new(AtomicU32::new(0));
    let sampler = {
        let peak = Arc::clone(&peak);
        tokio::spawn(async move {
            loop {
                let kib = (rss_of(pid) >> 10) as u32;
                peak.fetch_max(kib, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let r1 = c
        .generate(pb::GenerateRequest {
            model: model.clone(),
            prompt_text: big.to_string(),
            options: options(4, 0.0, 0),
            ..Default::default()
        })
        .await;
    let r2 = c
        .tokenize(pb::TokenizeRequest {
            model: model.clone(),
            text: big.repeat(2),
            ..Default::default()
        })
        .await;
    sampler.abort();
    for (what, r) in [
        ("4 MB prompt", r1.map(|_| ())),
        ("8 MB Tokenize", r2.map(|_| ())),
    ] {
        if !matches!(&r, Err(e) if e.code() == Code::InvalidArgument) {
            failures.push(format!("{what}: {:?}", r.err()));
        }
    }
    let rss_burst_peak = (peak.load(Ordering::Relaxed) as u64) << 10;
    let rss_after_burst = idle_rss(pid).await;
    if rss_after_burst > rss_steady + (64 << 20) {
        failures.push(format!(
            "RSS after the burst {:.1} MiB is not within 64 MiB of the steady {:.1} MiB",
            mib(rss_after_burst),
            mib(rss_steady)
        ));
    }
    let mut report = Report {
        opts: opts.clone(),
        elapsed: 0.0,
        requests: 0,
        stats: Stats::default(),
        refuse_ms,
        rss_steady,
        rss_after_burst,
        rss_burst_peak,
        rss_after_traffic: None,
        rss_series: Vec::new(),
        witnesses: Vec::new(),
        killed_at: None,
        failures: Vec::new(),
    };
    if opts.burst_only {
        report.failures = failures;
        return report;
    }

    // 3. Traffic.
    let witnesses = make_witnesses(&mut c, &model, 4).await;
    let sh = Arc::new(Shared {
        socket: socket.clone(),
        model: model.clone(),
        second,
        stop: AtomicBool::new(false),
        down: AtomicBool::new(false),
        pid: AtomicU32::new(pid),
        stats: Mutex::new(Stats::default()),
        big,
        oversize: opts.oversize,
    });
    let start = Instant::now();
    let series = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (sh, series) = (Arc::clone(&sh), Arc::clone(&series));
        let every = (opts.duration.as_secs_f64() / 30.0).max(1.0);
        tokio::spawn(async move {
            loop {
                let rss = rss_of(sh.pid.load(Ordering::Relaxed));
                series
                    .lock()
                    .unwrap()
                    .push((start.elapsed().as_secs_f64(), rss));
                tokio::time::sleep(Duration::from_secs_f64(every)).await;
            }
        })
    };
    let workers: Vec<_> = (0..opts.concurrency)
        .map(|n| tokio::spawn(worker(Arc::clone(&sh), n)))
        .collect();
    let controller = tokio::spawn(controller(Arc::clone(&sh), opts.duration));

    // The kill, at half time, once the witnesses are on disk.
    let mut killed_at = None;
    if opts.kill {
        let persisted = wait_persisted(&mut c, &witnesses).await;
        if !persisted {
            failures.push("the witness sessions were not snapshotted within 30 s".into());
        }
        let half = opts.duration / 2;
        if let Some(left) = half.checked_sub(start.elapsed()) {
            tokio::time::sleep(left).await;
        }
        sh.down.store(true, Ordering::Relaxed);
        killed_at = Some(start.elapsed().as_secs_f64());
        daemon.kill();
        daemon = tokio::task::spawn_blocking({
            let (socket, state) = (socket.clone(), state.clone());
            move || start_daemon(&socket, &state)
        })
        .await
        .expect("restart");
        sh.pid.store(daemon.child.id(), Ordering::Relaxed);
        c = connect(&socket).await.expect("reconnect");
        let _ = load(&mut c, &model).await;
        for w in &witnesses {
            match check_witness(&mut c, w).await {
                Ok(s) => report.witnesses.push(s),
                Err(e) => failures.push(format!("witness {}: {e}", w.id)),
            }
        }
        // Workers' errors while the daemon was down are expected for a moment more.
        tokio::time::sleep(Duration::from_secs(2)).await;
        sh.down.store(false, Ordering::Relaxed);
    }
    if let Some(left) = opts.duration.checked_sub(start.elapsed()) {
        tokio::time::sleep(left).await;
    }
    sh.stop.store(true, Ordering::Relaxed);
    let mut requests = 0;
    for w in workers {
        requests += w.await.unwrap_or(0);
    }
    requests += controller.await.unwrap_or(0);
    report.elapsed = start.elapsed().as_secs_f64();
    sampler.abort();
    let pid = sh.pid.load(Ordering::Relaxed);
    let after = idle_rss(pid).await;
    report.rss_series = series.lock().unwrap().clone();
    report
        .rss_series
        .push((start.elapsed().as_secs_f64(), after));
    report.rss_after_traffic = Some(after);
    if after > rss_steady + (64 << 20) {
        failures.push(format!(
            "RSS after the traffic {:.1} MiB is not within 64 MiB of the steady {:.1} MiB",
            mib(after),
            mib(rss_steady)
        ));
    }
    report.requests = requests;
    report.killed_at = killed_at;
    report.stats = std::mem::take(&mut *sh.stats.lock().unwrap());
    if !report.stats.unexpected.is_empty() {
        failures.push(format!(
            "{} unexpected errors (listed above)",
            report.stats.unexpected.len()
        ));
    }
    let ok: usize = report.stats.latencies.values().map(Vec::len).sum();
    if ok == 0 {
        failures.push("no request succeeded".into());
    }
    report.failures = failures;
    // An orderly stop: sessions saved, socket removed.
    let st = daemon.terminate();
    if !st.success() {
        report
            .failures
            .push(format!("colibrid exited with {st} on SIGTERM"));
    }
    report
}

/// Loads and unloads a second model all along, and now and then the main one.
async fn controller(sh: Arc<Shared>, duration: Duration) -> u64 {
    let mut requests = 0;
    let mut round = 0u64;
    let every = Duration::from_secs_f64((duration.as_secs_f64() / 12.0).clamp(2.0, 10.0));
    while !sh.stop.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        round += 1;
        let Some(mut c) = connect(&sh.socket).await else {
            continue;
        };
        let down = sh.down.load(Ordering::Relaxed);
        let t = Instant::now();
        // The main model stays loaded while the witnesses are checked after the restart.
        let target = if round.is_multiple_of(4) && !down {
            sh.model.clone()
        } else {
            sh.second.clone()
        };
        let r: Result<(), tonic::Status> = async {
            let id = load(&mut c, &target).await?;
            if target == sh.second {
                generate(
                    &mut c,
                    pb::GenerateRequest {
                        model: id.clone(),
                        prompt_ids: vec![1, 2, 3],
                        options: options(4, 0.0, 0),
                        ..Default::default()
                    },
                )
                .await?;
            }
            c.unload_model(pb::UnloadModelRequest { model: id.clone() })
                .await?;
            if target == sh.model {
                load(&mut c, &target).await?;
            }
            Ok(())
        }
        .await;
        requests += 1;
        let mut st = sh.stats.lock().unwrap();
        match r {
            Ok(()) => st.ok(Kind::LoadUnload, t),
            Err(e) => st.err(Kind::LoadUnload, e.code(), e.message(), down),
        }
    }
    requests
}
