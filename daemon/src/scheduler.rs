//! The engine thread: one per loaded model, the only place the daemon runs model code.
//!
//! gRPC handlers send [`Job`]s over a channel. Each iteration the thread takes the jobs that
//! arrived (control jobs are answered at once, between steps), then builds ONE batch:
//! the decode row of every live generation plus at most one prefill chunk (a new prompt, a
//! session's pending tokens, or a Score request), and runs `Model::forward` once for all of
//! them, so experts are fetched once per step for everybody and a long prompt never stalls
//! the others for more than one chunk. Results go back through per-request channels; a
//! request whose channel closed (client gone) is cancelled before the next step.
//!
//! Sessions (KV cache + token history + chat messages) live here too. Invariant of a
//! session: `tokens[..cache.len]` are exactly the positions in its cache; tokens after that
//! (the last sampled token, or a prompt cut short by a cancel) are fed first next turn.

use crate::limits;
use crate::pacer::PrefillPacer;
use crate::prefix::{Policy, PrefixCache};
use crate::snapshot::{self, SessionMeta, SnapshotError, SnapshotMessage};
use crate::state::{self, StateDir};
use crate::wire::{self, now_unix_ms, status_from_engine};
use colibri_engine::experts::StoreStats;
use colibri_engine::perplexity::{self, Perplexity};
use colibri_engine::structured::{Constraint, GrammarCompiler, OutputFormat};
use colibri_engine::text::{ChatMessage, ToolCall, ToolChoice, ToolSpec};
use colibri_engine::{
    DraftMode, FinishReason, GenerateRequest, Generation, KvCache, LogitsWanted, Model,
    SamplingParams, SeqStep, Speculator, StepEvent, StepPlan,
};
use colibri_proto::v1 as pb;
use pb::generate_event::{Event, Finished, Started, Tokens};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

pub type EventSender = mpsc::UnboundedSender<Result<pb::GenerateEvent, Status>>;

pub enum GenInput {
    Ids(Vec<u32>),
    /// Raw text; `add_special` absent = add the tokenizer's special tokens only when the
    /// sequence is empty.
    Text {
        text: String,
        add_special: Option<bool>,
    },
    /// Chat messages (with a session: this turn's new messages).
    Chat(Vec<ChatMessage>),
}

pub struct GenJob {
    pub request_id: String,
    pub session_id: Option<String>,
    pub input: GenInput,
    pub max_tokens: usize,
    /// Reduce `max_tokens` to the room left in the context (0 = all of it) instead of
    /// refusing it (`GenerationOptions.clamp_max_tokens`).
    pub clamp_max_tokens: bool,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub return_logits: bool,
    /// Drafts per step with the model's MTP layers (`GenerationOptions.draft_tokens`; None:
    /// automatic for greedy decoding).
    pub draft: Option<usize>,
    pub events: EventSender,
    pub arrived: Instant,
    pub extras: GenExtras,
}

/// The chat-API parts of a request: tools, template variables, logprobs, structured
/// output. Default = none of them.
#[derive(Clone, Debug, Default)]
pub struct GenExtras {
    /// Tools offered (Chat only).
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    /// Several calls allowed in one reply.
    pub parallel_tool_calls: bool,
    /// Extra chat-template variables (e.g. enable_thinking).
    pub template_vars: serde_json::Map<String, serde_json::Value>,
    /// Report logprobs with this many alternatives.
    pub logprobs: Option<usize>,
    pub response_format: Option<OutputFormat>,
}

pub struct ScoreJob {
    pub ids: Vec<u32>,
    pub argmax_only: bool,
    pub reply: oneshot::Sender<Result<pb::ScoreResponse, Status>>,
}

pub type PerplexitySender = mpsc::UnboundedSender<Result<pb::PerplexityProgress, Status>>;

/// A Perplexity request: its windows are fed like a prompt, one chunk per step.
pub struct PerplexityJob {
    pub ids: Vec<u32>,
    pub ctx: usize,
    pub events: PerplexitySender,
}

// Jobs pass through a channel one at a time; most are generations, so boxing them would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Job {
    Generate(GenJob),
    Score(ScoreJob),
    Perplexity(PerplexityJob),
    CreateSession {
        id: String,
        reply: oneshot::Sender<Result<pb::SessionInfo, Status>>,
    },
    ResumeSession {
        id: String,
        reply: oneshot::Sender<Result<pb::ResumeSessionResponse, Status>>,
    },
    DeleteSession {
        id: String,
        reply: oneshot::Sender<Result<(), Status>>,
    },
    Cancel {
        request_id: String,
        session_id: String,
        reply: oneshot::Sender<u32>,
    },
    /// Cancel everything, snapshot every session, save pins, stop the thread.
    Unload {
        reply: oneshot::Sender<pb::UnloadModelResponse>,
    },
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Generations stepped together at most; more wait in the queue.
    pub max_batch: usize,
    /// Prompt tokens per step while other sequences are decoding, at most.
    pub prefill_chunk: usize,
    /// While others decode, a step with a prompt chunk may take this many times a
    /// decode-only step (the chunk is sized from measured step times; 0 = always
    /// `prefill_chunk`). See [`crate::pacer`].
    pub prefill_pace: f64,
    /// Prompt tokens per step when nothing else is decoding.
    pub solo_prefill_chunk: usize,
    /// A session idle this long is snapshotted to disk.
    pub session_save_after: Duration,
    /// Bytes of KV the prefix cache may keep (0 = off), and its eviction order.
    pub prefix_cache_bytes: usize,
    pub prefix_cache_policy: Policy,
}

/// What the engine thread publishes for Status/ListSessions after every iteration, so the
/// async side never waits for a step to finish.
#[derive(Clone, Debug, Default)]
pub struct Published {
    pub active: u32,
    pub queued: u32,
    pub sessions: Vec<pb::SessionInfo>,
    pub kv_bytes: u64,
    pub steps: u64,
    pub tokens_generated: u64,
    pub tokens_prefilled: u64,
    /// Seconds spent in `Model::forward` since load.
    pub forward_seconds: f64,
    /// The prefix cache: bytes held, entries, prompt tokens it saved from prefill.
    pub prefix_cache_bytes: u64,
    pub prefix_cache_entries: u32,
    pub prefix_cache_reused_tokens: u64,
    /// Since when nothing has run (None while busy).
    pub idle_since: Option<Instant>,
}

/// State shared between a model's engine thread and the async side.
pub struct EngineShared {
    /// Generate/Chat/Score jobs accepted and not finished (admission control).
    pub outstanding: AtomicUsize,
    pub published: Mutex<Published>,
    /// Pinned experts (layer, expert); persisted on unload.
    pub pins: Mutex<BTreeSet<(u32, u32)>>,
}

impl EngineShared {
    pub fn new(pins: impl IntoIterator<Item = (u32, u32)>) -> EngineShared {
        EngineShared {
            outstanding: AtomicUsize::new(0),
            published: Mutex::new(Published {
                idle_since: Some(Instant::now()),
                ..Default::default()
            }),
            pins: Mutex::new(pins.into_iter().collect()),
        }
    }
}

struct Session {
    id: String,
    tokens: Vec<u32>,
    /// None while a generation holds it.
    cache: Option<KvCache>,
    /// The MTP layer's cache of the same positions, left by the last generation that drafted
    /// (lets the next turn draft too); not part of snapshots.
    mtp: Option<KvCache>,
    /// `cache.len` while the cache is lent out (for listings).
    cached_len: usize,
    kv_bytes: usize,
    messages: Vec<ChatMessage>,
    created_ms: i64,
    last_used_ms: i64,
    last_used: Instant,
    /// Request id of the generation using the session.
    busy: Option<String>,
    /// The snapshot on disk is current.
    persisted: bool,
}

struct GenRow {
    gen: Generation,
    /// Drafts for `gen` with the model's MTP layers (a plain decoder when drafting is off).
    spec: Speculator,
    /// Drafting was asked for or automatic (the Finished stats then say how it went).
    spec_wanted: bool,
    request_id: String,
    session: Option<String>,
    /// The sequence before generation: cached prefix plus everything fed this request.
    full: Vec<u32>,
    prompt_left: usize,
    events: EventSender,
    return_logits: bool,
    /// The whole conversation for a Chat request (the session's messages plus this turn's).
    chat: Option<Vec<ChatMessage>>,
    reply_text: String,
    reasoning_text: String,
    prompt_tokens: usize,
    cached_tokens: usize,
    arrived: Instant,
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    /// The expert cache's statistics and the engine's forward time when the row was
    /// admitted (None when experts are not streamed): its Finished stats are the change.
    cache_at_admission: Option<(StoreStats, Duration)>,
}

struct ScoreRow {
    cache: KvCache,
    ids: Vec<u32>,
    fed: usize,
    logits: Vec<f32>,
    argmax_only: bool,
    reply: Option<oneshot::Sender<Result<pb::ScoreResponse, Status>>>,
}

/// A Perplexity request in progress: window `window`, of which `fed` positions are in
/// `cache` (reset between windows).
struct PerplexityRow {
    cache: KvCache,
    ids: Vec<u32>,
    ctx: usize,
    windows: usize,
    window: usize,
    fed: usize,
    acc: Perplexity,
    events: PerplexitySender,
}

impl PerplexityRow {
    fn progress(&self, done: bool) -> pb::PerplexityProgress {
        pb::PerplexityProgress {
            windows_done: self.acc.windows as u32,
            windows_total: self.windows as u32,
            tokens_scored: self.acc.tokens_scored,
            nll_sum: self.acc.nll_sum,
            done,
        }
    }
}

enum Row {
    Gen(Box<GenRow>),
    Score(ScoreRow),
    Perplexity(Box<PerplexityRow>),
}

impl Row {
    /// The row's cache, and its grammar when it has one.
    fn cache_and_constraint(&mut self) -> (&mut KvCache, Option<&mut Constraint>) {
        match self {
            Row::Gen(g) => g.gen.cache_and_constraint(),
            Row::Score(s) => (&mut s.cache, None),
            Row::Perplexity(p) => (&mut p.cache, None),
        }
    }
    fn is_decode(&self) -> bool {
        matches!(self, Row::Gen(g) if g.prompt_left == 0)
    }
}

/// A row's part of one step.
struct Picked {
    /// Index in `active`.
    i: usize,
    tokens: Vec<u32>,
    logits: LogitsWanted,
    /// Final hidden states wanted (the MTP layer's input while drafting).
    hidden: LogitsWanted,
    /// A generation's plan, handed back to its speculator with the outputs.
    plan: Option<StepPlan>,
}

enum Outcome {
    Continue,
    Finished(FinishReason),
    Failed(Status),
}

pub struct Engine {
    id: String,
    model: Arc<Model>,
    rx: Receiver<Job>,
    shared: Arc<EngineShared>,
    state: StateDir,
    cfg: EngineConfig,
    sessions: HashMap<String, Session>,
    active: Vec<Row>,
    waiting: VecDeque<Row>,
    steps: u64,
    tokens_generated: u64,
    tokens_prefilled: u64,
    /// Time spent in `Model::forward`.
    forward_time: Duration,
    /// The prompt chunk while others decode, from measured step times.
    pacer: PrefillPacer,
    idle_since: Option<Instant>,
    /// KV of finished requests, reused by later ones with the same prefix.
    prefix: PrefixCache<KvCache>,
    /// Structured output's grammar compiler (indexes the vocabulary once, on first use).
    grammar: Option<Result<Arc<GrammarCompiler>, String>>,
    /// Tool call ids: per-engine counter.
    calls_made: u64,
    /// When busy stepping, the last look for idle sessions to snapshot.
    last_save_look: Instant,
    /// Test hook (`COLIBRI_STEP_PAUSE_MS`): a pause after every step, so that a browser
    /// test can watch a tiny fixture's reply stream and stop it midway.
    step_pause: Option<Duration>,
}

/// How often an idle engine thread wakes up to snapshot idle sessions.
const IDLE_TICK: Duration = Duration::from_millis(500);

impl Engine {
    pub fn new(
        id: String,
        model: Arc<Model>,
        rx: Receiver<Job>,
        shared: Arc<EngineShared>,
        state: StateDir,
        cfg: EngineConfig,
    ) -> Engine {
        Engine {
            id,
            model,
            rx,
            shared,
            state,
            sessions: HashMap::new(),
            active: Vec::new(),
            waiting: VecDeque::new(),
            steps: 0,
            tokens_generated: 0,
            tokens_prefilled: 0,
            forward_time: Duration::ZERO,
            pacer: PrefillPacer::new(cfg.prefill_chunk, cfg.prefill_pace),
            idle_since: Some(Instant::now()),
            prefix: PrefixCache::new(cfg.prefix_cache_bytes, cfg.prefix_cache_policy),
            grammar: None,
            calls_made: 0,
            last_save_look: Instant::now(),
            step_pause: std::env::var("COLIBRI_STEP_PAUSE_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
            cfg,
        }
    }

    /// The thread's body: runs until an Unload job or until every job sender is gone.
    pub fn run(mut self) {
        let mut unload_reply = None;
        'outer: loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                match self.rx.recv_timeout(IDLE_TICK) {
                    Ok(job) => {
                        if let Some(r) = self.handle(job) {
                            unload_reply = Some(r);
                            break 'outer;
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        self.save_idle_sessions();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break 'outer,
                }
            }
            while let Ok(job) = self.rx.try_recv() {
                if let Some(r) = self.handle(job) {
                    unload_reply = Some(r);
                    break 'outer;
                }
            }
            self.drop_abandoned();
            self.admit();
            if !self.active.is_empty() {
                self.idle_since = None;
                self.step();
                // Sessions left idle are snapshotted under constant traffic too, or a crash
                // would lose them (found by the soak test); at most one look a second.
                if self.last_save_look.elapsed() >= Duration::from_secs(1) {
                    self.last_save_look = Instant::now();
                    self.save_idle_sessions();
                }
                if let Some(d) = self.step_pause {
                    std::thread::sleep(d);
                }
            } else if self.idle_since.is_none() {
                self.idle_since = Some(Instant::now());
            }
            self.publish();
        }
        let resp = self.unload();
        if let Some(r) = unload_reply {
            let _ = r.send(resp);
        }
    }

    /// Handles one job; returns the reply channel of an Unload job.
    fn handle(&mut self, job: Job) -> Option<oneshot::Sender<pb::UnloadModelResponse>> {
        match job {
            Job::Generate(g) => {
                let events = g.events.clone();
                match self.prepare(g) {
                    Ok(row) => self.waiting.push_back(Row::Gen(Box::new(row))),
                    Err(st) => {
                        let _ = events.send(Err(st));
                        self.shared.outstanding.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            Job::Score(s) => {
                let check = if s.ids.is_empty() {
                    Err(wire::invalid("ids", "is empty"))
                } else {
                    self.model
                        .check_tokens(0, &s.ids, "ids")
                        .map_err(|e| status_from_engine(&e))
                };
                match check {
                    Ok(()) => self.waiting.push_back(Row::Score(ScoreRow {
                        cache: self.model.new_cache(),
                        ids: s.ids,
                        fed: 0,
                        logits: Vec::new(),
                        argmax_only: s.argmax_only,
                        reply: Some(s.reply),
                    })),
                    Err(st) => {
                        let _ = s.reply.send(Err(st));
                        self.shared.outstanding.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            Job::Perplexity(p) => {
                let info = &self.model.info;
                let check = perplexity::window_count(p.ids.len(), p.ctx, info.max_context)
                    .and_then(|n| {
                        match self.model.check_tokens(0, &p.ids, "ids") {
                            // Only each window must fit the context.
                            Ok(()) | Err(colibri_engine::Error::ContextOverflow { .. }) => Ok(n),
                            Err(e) => Err(e),
                        }
                    })
                    .map_err(|e| status_from_engine(&e));
                match check {
                    Ok(windows) => {
                        let row = PerplexityRow {
                            cache: self.model.new_cache(),
                            ids: p.ids,
                            ctx: p.ctx,
                            windows,
                            window: 0,
                            fed: 0,
                            acc: Perplexity::default(),
                            events: p.events,
                        };
                        let _ = row.events.send(Ok(row.progress(false)));
                        self.waiting.push_back(Row::Perplexity(Box::new(row)));
                    }
                    Err(st) => {
                        let _ = p.events.send(Err(st));
                        self.shared.outstanding.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }
            Job::CreateSession { id, reply } => {
                let _ = reply.send(self.create_session(id));
            }
            Job::ResumeSession { id, reply } => {
                let model_id = self.id.clone();
                let r = self
                    .session(&id)
                    .map(|(s, from_disk)| pb::ResumeSessionResponse {
                        session: Some(session_info(&model_id, s)),
                        messages: wire::pb_messages(&s.messages),
                        restored_from_disk: from_disk,
                    });
                let _ = reply.send(r);
            }
            Job::DeleteSession { id, reply } => {
                let _ = reply.send(self.delete_session(&id));
            }
            Job::Cancel {
                request_id,
                session_id,
                reply,
            } => {
                let mut n = 0;
                for row in self.active.iter_mut().chain(self.waiting.iter_mut()) {
                    if let Row::Gen(g) = row {
                        let hit = (!request_id.is_empty() && g.request_id == request_id)
                            || (!session_id.is_empty()
                                && g.session.as_deref() == Some(&session_id));
                        if hit && g.gen.finished().is_none() {
                            g.gen.cancel();
                            n += 1;
                        }
                    }
                }
                // Cancelled rows are finished by the next `drop_abandoned`.
                let _ = reply.send(n);
            }
            Job::Unload { reply } => return Some(reply),
        }
        None
    }

    fn create_session(&mut self, id: String) -> Result<pb::SessionInfo, Status> {
        if self.sessions.contains_key(&id) || self.state.session_path(&id).exists() {
            return Err(Status::already_exists(format!(
                "session '{id}' already exists"
            )));
        }
        let now = now_unix_ms();
        let s = Session {
            id: id.clone(),
            tokens: Vec::new(),
            cache: Some(self.model.new_cache()),
            mtp: None,
            cached_len: 0,
            kv_bytes: 0,
            messages: Vec::new(),
            created_ms: now,
            last_used_ms: now,
            last_used: Instant::now(),
            busy: None,
            persisted: false,
        };
        let info = session_info(&self.id, &s);
        self.sessions.insert(id, s);
        Ok(info)
    }

    fn delete_session(&mut self, id: &str) -> Result<(), Status> {
        if let Some(s) = self.sessions.get(id) {
            if let Some(r) = &s.busy {
                return Err(Status::failed_precondition(format!(
                    "session '{id}' is generating (request {r}); cancel it first"
                )));
            }
        }
        let live = self.sessions.remove(id).is_some();
        let path = self.state.session_path(id);
        let on_disk = match std::fs::remove_file(&path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(Status::internal(format!("{}: {e}", path.display()))),
        };
        if live || on_disk {
            Ok(())
        } else {
            Err(Status::not_found(format!("no session '{id}'")))
        }
    }

    /// A live session, restored from its snapshot when needed. The bool says whether it
    /// came from disk just now.
    fn session(&mut self, id: &str) -> Result<(&mut Session, bool), Status> {
        let mut from_disk = false;
        if !self.sessions.contains_key(id) {
            let path = self.state.session_path(id);
            if !path.exists() {
                return Err(Status::not_found(format!("no session '{id}'")));
            }
            match snapshot::load(&path, &self.id, &self.model.new_cache()) {
                Ok((meta, kv)) => {
                    if meta.vocab_size != self.model.info.vocab_size {
                        return Err(
                            self.damaged(&path, "vocabulary size differs from the model's".into())
                        );
                    }
                    let s = Session {
                        id: id.to_string(),
                        cached_len: kv.len,
                        kv_bytes: kv.size_bytes(),
                        tokens: meta.tokens,
                        cache: Some(kv),
                        mtp: None,
                        messages: meta
                            .messages
                            .into_iter()
                            .map(|m| ChatMessage {
                                role: m.role,
                                content: m.content,
                                ..Default::default()
                            })
                            .collect(),
                        created_ms: meta.created_unix_ms,
                        last_used_ms: meta.last_used_unix_ms,
                        last_used: Instant::now(),
                        busy: None,
                        persisted: true,
                    };
                    tracing::info!(
                        "session {id}: restored {} cached positions from {}",
                        s.cached_len,
                        path.display()
                    );
                    self.sessions.insert(id.to_string(), s);
                    from_disk = true;
                }
                Err(SnapshotError::Damaged(msg)) => return Err(self.damaged(&path, msg)),
                Err(SnapshotError::Io(e)) => {
                    return Err(Status::unavailable(format!("{}: {e}", path.display())))
                }
            }
        }
        Ok((
            self.sessions.get_mut(id).expect("inserted above"),
            from_disk,
        ))
    }

    /// Sets a damaged snapshot aside and describes it for the client.
    fn damaged(&self, path: &std::path::Path, msg: String) -> Status {
        let aside = state::set_aside(path)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|e| format!("(could not move it aside: {e})"));
        tracing::warn!("{}: {msg}; moved to {aside}", path.display());
        Status::data_loss(format!(
            "the snapshot of this session is damaged ({msg}); it was moved aside to {aside}"
        ))
    }

    /// Validates a Generate/Chat job and turns it into a row; sends Started on success.
    fn prepare(&mut self, job: GenJob) -> Result<GenRow, Status> {
        let model = Arc::clone(&self.model);
        let max_context = model.info.max_context;
        let model_id = self.id.clone();
        let text = || {
            model.text.as_ref().ok_or_else(|| {
                Status::failed_precondition(format!(
                    "model {model_id} has no tokenizer.json: send token ids (prompt_ids) instead"
                ))
            })
        };
        let x = &job.extras;
        let chat_input = matches!(job.input, GenInput::Chat(_));
        if !chat_input && !x.tools.is_empty() {
            return Err(wire::invalid("tools", "are only for Chat requests"));
        }
        // Tools the model is shown (tool_choice none: not offered) and a forced call.
        let offered: &[ToolSpec] = if x.tool_choice == ToolChoice::None {
            &[]
        } else {
            &x.tools
        };
        let forced = match &x.tool_choice {
            ToolChoice::Required | ToolChoice::Named(_) if x.tools.is_empty() => {
                return Err(wire::invalid(
                    "tool_choice",
                    "requires a call but no tools were given",
                ))
            }
            ToolChoice::Named(n) => {
                let t = x.tools.iter().find(|t| &t.name == n).ok_or_else(|| {
                    wire::invalid("tool_choice.name", format!("no tool named '{n}'"))
                })?;
                Some(vec![t.clone()])
            }
            ToolChoice::Required => Some(x.tools.clone()),
            _ => None,
        };
        if forced.is_some() && x.response_format.is_some() {
            return Err(wire::invalid(
                "response_format",
                "cannot be combined with a required or named tool_choice",
            ));
        }
        if !offered.is_empty() {
            let t = text()?;
            if t.tool_format().is_none() {
                return Err(wire::invalid(
                    "tools",
                    format!(
                        "model {model_id} (model_type {}) has no tool-call syntax in its chat template, so it cannot be given tools",
                        self.model.info.model_type
                    ),
                ));
            }
        }
        let constrained = forced.is_some() || x.response_format.is_some();
        // A chat prompt: rendered with the tools and variables; with a constraint, an open
        // think block is closed first (the grammar covers the answer).
        let render = |msgs: &[ChatMessage]| -> Result<(Vec<u32>, String), Status> {
            if msgs.is_empty() {
                return Err(wire::invalid("messages", "is empty"));
            }
            let t = text()?;
            let mut rendered = t
                .render_chat_with(msgs, true, offered, &x.template_vars)
                .map_err(|e| status_from_engine(&e))?;
            if constrained
                && t.has_think_tags()
                && colibri_engine::text::prompt_opens_think(&rendered)
            {
                rendered.push_str("</think>\n\n");
            }
            // The template wrote the special tokens itself.
            let ids = limits::encode_text(t, &rendered, false, max_context, "messages")?;
            Ok((ids, rendered))
        };
        let mut rendered_prompt = None;
        // Automatic drafting only for greedy decoding: with sampling, speculation keeps the
        // distribution but its acceptance is lower (as `coli run --local` does).
        let mode = match job.draft {
            Some(0) => DraftMode::Off,
            Some(n) => DraftMode::Tokens(n),
            None if job.sampling.temperature > 0.0 => DraftMode::Off,
            // Logprobs are reported per sampled token, from that token's own logits row.
            None if job.extras.logprobs.is_some() => DraftMode::Off,
            None => DraftMode::Auto,
        };
        let mut mtp = None;
        let (cache, base_len, full, chat) = match &job.session_id {
            None => {
                let feed = match &job.input {
                    GenInput::Ids(v) => v.clone(),
                    GenInput::Text {
                        text: t,
                        add_special,
                    } => limits::encode_text(
                        text()?,
                        t,
                        add_special.unwrap_or(true),
                        max_context,
                        "prompt",
                    )?,
                    GenInput::Chat(msgs) => {
                        let (ids, r) = render(msgs)?;
                        rendered_prompt = Some(r);
                        ids
                    }
                };
                let chat = match &job.input {
                    GenInput::Chat(m) => Some(m.clone()),
                    _ => None,
                };
                // The longest prefix an earlier request left in the prefix cache. Not when
                // the request asks for MTP drafts: the prefix cache keeps no MTP cache, and a
                // continued cache cannot be drafted for. Automatic drafting takes the prefix
                // (the skipped prefill is worth more) and decodes without drafts.
                let drafts = matches!(mode, DraftMode::Tokens(_)) && !self.model.net.mtp.is_empty();
                match (!drafts).then(|| self.prefix.lookup(&feed)).flatten() {
                    Some((cache, n)) => (cache, n, feed, chat),
                    None => (self.model.new_cache(), 0, feed, chat),
                }
            }
            Some(sid) => {
                let (s, _) = self.session(sid)?;
                if let Some(r) = &s.busy {
                    return Err(Status::failed_precondition(format!(
                        "session '{sid}' is already generating (request {r}); cancel it or wait"
                    )));
                }
                let mut cache = s.cache.take().expect("an idle session holds its cache");
                mtp = s.mtp.take().filter(|_| mode != DraftMode::Off);
                let result = (|| match &job.input {
                    GenInput::Ids(v) => Ok((cache.len, [&s.tokens[..], v].concat(), None, None)),
                    GenInput::Text {
                        text: t,
                        add_special,
                    } => {
                        let room = max_context.saturating_sub(s.tokens.len());
                        let ids = limits::encode_text(
                            text()?,
                            t,
                            add_special.unwrap_or(s.tokens.is_empty()),
                            room,
                            "prompt",
                        )?;
                        Ok((cache.len, [&s.tokens[..], &ids].concat(), None, None))
                    }
                    GenInput::Chat(new) => {
                        let all: Vec<ChatMessage> = s.messages.iter().chain(new).cloned().collect();
                        let (ids, r) = render(&all)?;
                        // Reuse the cached prefix the re-rendered conversation shares with
                        // the history; at least one token must be fed to get logits.
                        let agree = s
                            .tokens
                            .iter()
                            .zip(&ids)
                            .take_while(|(a, b)| a == b)
                            .count();
                        let mut common = agree.min(cache.len).min(ids.len().saturating_sub(1));
                        if let Some(m) = &mut mtp {
                            // MTP position j was built with the token at j + 1: it stays
                            // valid while that token does. The main cache goes back as far
                            // (a token or so more to feed) so that the two keep in step.
                            common = common.min(m.len().min(agree.saturating_sub(1)));
                            m.truncate(common);
                        }
                        cache.truncate(common);
                        Ok((common, ids, Some(all), Some(r)))
                    }
                })();
                match result {
                    Ok((base_len, full, chat, r)) => {
                        s.cached_len = cache.len;
                        rendered_prompt = r;
                        (cache, base_len, full, chat)
                    }
                    Err(e) => {
                        s.cache = Some(cache);
                        s.mtp = mtp;
                        return Err(e);
                    }
                }
            }
        };
        let feed = full[base_len..].to_vec();
        if feed.is_empty() {
            self.give_back(&job.session_id, cache, mtp);
            return Err(wire::invalid(
                "prompt",
                "is empty (and the session has no pending token to continue from)",
            ));
        }
        // How the reply is split (chat only): reasoning, tool calls with fresh ids.
        let reply = match (&rendered_prompt, &model.text) {
            (Some(r), Some(t)) => {
                self.calls_made += 1;
                let prefix = format!(
                    "call_{:x}{:04x}_",
                    now_unix_ms() & 0xffff_ffff,
                    self.calls_made & 0xffff
                );
                t.reply_config(r, offered, &prefix)
            }
            _ => Default::default(),
        };
        let mut max_tokens = job.max_tokens;
        if job.clamp_max_tokens {
            let room = self
                .model
                .info
                .max_context
                .saturating_sub(base_len + feed.len());
            if room == 0 {
                self.give_back(&job.session_id, cache, mtp);
                // Nothing can be generated: refused like a prompt past the context.
                let (n, max) = (base_len + feed.len(), self.model.info.max_context);
                return Err(wire::context_exceeded(if n > max {
                    format!("prompt of {n} tokens does not fit the context of {max} tokens")
                } else {
                    format!("prompt of {n} tokens leaves no room to generate in the context of {max} tokens")
                }));
            }
            max_tokens = if max_tokens == 0 {
                room
            } else {
                max_tokens.min(room)
            };
        }
        let req = GenerateRequest {
            prompt: feed.clone(),
            max_tokens,
            sampling: job.sampling.clone(),
            stop_strings: job.stop.clone(),
            ignore_eos: job.ignore_eos,
            logprobs: x.logprobs,
            reply,
        };
        let format = match (&forced, &x.response_format) {
            (Some(tools), _) => Some(OutputFormat::ToolCalls {
                format: model
                    .text
                    .as_ref()
                    .and_then(|t| t.tool_format())
                    .expect("checked with the tools above"),
                tools: tools.clone(),
                parallel: x.parallel_tool_calls,
            }),
            (None, Some(f)) => Some(f.clone()),
            _ => None,
        };
        let constraint = match format {
            None => None,
            Some(f) => match self.grammar().and_then(|g| {
                g.constraint(text()?, &f)
                    .map_err(|e| status_from_engine(&e))
            }) {
                Ok(c) => Some(c),
                Err(e) => {
                    self.give_back(&job.session_id, cache, mtp);
                    return Err(e);
                }
            },
        };
        let mut gen = match checked_generation(&self.model, cache, req) {
            Ok(g) => g,
            Err((e, cache)) => {
                self.give_back(&job.session_id, cache, mtp);
                return Err(status_from_engine(&e));
            }
        };
        // The constraint first: a constrained generation is not drafted.
        if let Some(c) = constraint {
            gen.set_constraint(c);
        }
        let spec = match Speculator::new(&self.model, &gen, &job.sampling, mode, mtp) {
            Ok(s) => s,
            Err(e) => {
                self.give_back(&job.session_id, gen.into_cache(), None);
                return Err(status_from_engine(&e));
            }
        };
        if let Some(sid) = &job.session_id {
            let s = self.sessions.get_mut(sid).expect("looked up above");
            s.busy = Some(job.request_id.clone());
        }
        let started = pb::GenerateEvent {
            event: Some(Event::Started(Started {
                request_id: job.request_id.clone(),
                model: self.id.clone(),
                session_id: job.session_id.clone().unwrap_or_default(),
                prompt_tokens: feed.len() as u32,
            })),
        };
        let _ = job.events.send(Ok(started));
        Ok(GenRow {
            gen,
            spec,
            spec_wanted: mode != DraftMode::Off,
            request_id: job.request_id,
            session: job.session_id,
            prompt_left: feed.len(),
            prompt_tokens: feed.len(),
            cached_tokens: base_len,
            full,
            events: job.events,
            return_logits: job.return_logits,
            chat,
            reply_text: String::new(),
            reasoning_text: String::new(),
            arrived: job.arrived,
            admitted: None,
            first_token: None,
            cache_at_admission: None,
        })
    }

    /// The grammar compiler, built on first use (it indexes the whole vocabulary).
    fn grammar(&mut self) -> Result<Arc<GrammarCompiler>, Status> {
        if self.grammar.is_none() {
            let t = Instant::now();
            let r = match &self.model.text {
                None => Err("the model has no tokenizer.json".to_string()),
                Some(text) => {
                    GrammarCompiler::new(text, self.model.info.vocab_size, &self.model.info.eos_ids)
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                }
            };
            tracing::info!(
                "model {}: structured output ready in {:.0} ms",
                self.id,
                t.elapsed().as_secs_f64() * 1e3
            );
            self.grammar = Some(r);
        }
        match self.grammar.as_ref().expect("set above") {
            Ok(g) => Ok(Arc::clone(g)),
            Err(e) => Err(Status::failed_precondition(format!(
                "structured output is not available for model {}: {e}",
                self.id
            ))),
        }
    }

    fn give_back(&mut self, session: &Option<String>, cache: KvCache, mtp: Option<KvCache>) {
        if let Some(s) = session.as_ref().and_then(|id| self.sessions.get_mut(id)) {
            s.cached_len = cache.len;
            s.cache = Some(cache);
            s.mtp = mtp;
        }
    }

    /// Finishes rows whose client went away or that were cancelled.
    fn drop_abandoned(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            let gone = match &mut self.active[i] {
                Row::Gen(g) => {
                    if g.events.is_closed() {
                        g.gen.cancel();
                    }
                    g.gen.finished().is_some()
                }
                Row::Score(s) => s.reply.as_ref().is_none_or(|r| r.is_closed()),
                Row::Perplexity(p) => p.events.is_closed(),
            };
            if gone {
                let row = self.active.remove(i);
                self.finish_row(row, Outcome::Finished(FinishReason::Cancelled));
            } else {
                i += 1;
            }
        }
        let mut j = 0;
        while j < self.waiting.len() {
            let gone = match &mut self.waiting[j] {
                Row::Gen(g) => g.events.is_closed() || g.gen.finished().is_some(),
                Row::Score(s) => s.reply.as_ref().is_none_or(|r| r.is_closed()),
                Row::Perplexity(p) => p.events.is_closed(),
            };
            if gone {
                let row = self.waiting.remove(j).expect("index checked");
                self.finish_row(row, Outcome::Finished(FinishReason::Cancelled));
            } else {
                j += 1;
            }
        }
    }

    fn admit(&mut self) {
        while self.active.len() < self.cfg.max_batch.max(1) {
            let Some(mut row) = self.waiting.pop_front() else {
                break;
            };
            if let Row::Gen(g) = &mut row {
                g.admitted = Some(Instant::now());
                g.cache_at_admission = self.store_stats().map(|st| (st, self.forward_time));
            }
            self.active.push(row);
        }
    }

    /// One batched forward step over the active rows.
    fn step(&mut self) {
        let decoding = self.active.iter().any(Row::is_decode);
        let chunk = if decoding {
            self.pacer.chunk()
        } else {
            self.cfg.solo_prefill_chunk.max(1)
        };
        let model = Arc::clone(&self.model);
        // Every decode row (its pending token, with drafts after it when drafting), plus
        // prompt rows in arrival order while the step's prompt budget (`chunk` tokens) lasts:
        // prompts that arrive together start together (one step, one TTFT) instead of one
        // step after another, and their sessions then decode in the same steps.
        let mut picked: Vec<Picked> = Vec::new();
        let mut failed: Vec<(usize, Status)> = Vec::new();
        // Prompt tokens this step may still carry; a chunk of 0: the pacer wants a
        // decode-only step (no prompt this time).
        let mut budget = chunk;
        for (i, row) in self.active.iter_mut().enumerate() {
            match row {
                Row::Gen(g) if g.prompt_left == 0 || budget > 0 => {
                    let prompt = g.prompt_left > 0;
                    // (A decode row's plan takes no prompt tokens whatever the budget.)
                    match g.spec.plan(&model, &mut g.gen, budget) {
                        Ok(plan) => {
                            if prompt {
                                budget = budget.saturating_sub(plan.tokens.len());
                            }
                            picked.push(Picked {
                                i,
                                tokens: plan.tokens.clone(),
                                logits: plan.logits,
                                hidden: plan.hidden,
                                plan: Some(plan),
                            })
                        }
                        Err(e) => failed.push((i, status_from_engine(&e))),
                    }
                }
                // Scoring and perplexity rows take a whole chunk, alone among prompts.
                Row::Score(s) if budget == chunk && budget > 0 => {
                    budget = 0;
                    let n = chunk.min(s.ids.len() - s.fed);
                    picked.push(Picked {
                        i,
                        tokens: s.ids[s.fed..s.fed + n].to_vec(),
                        logits: LogitsWanted::All,
                        hidden: LogitsWanted::None,
                        plan: None,
                    });
                }
                Row::Perplexity(p) if budget == chunk && budget > 0 => {
                    budget = 0;
                    let scored = chunk.min(perplexity::rows_per_chunk(self.model.info.vocab_size));
                    let (s, e, want) = perplexity::next_chunk(p.ctx, p.fed, chunk, scored)
                        .expect("a finished window is moved on right after its last chunk");
                    let base = p.window * p.ctx;
                    picked.push(Picked {
                        i,
                        tokens: p.ids[base + s..base + e].to_vec(),
                        logits: want,
                        hidden: LogitsWanted::None,
                        plan: None,
                    });
                }
                _ => {}
            }
        }
        // Remove from the back so earlier indices stay valid (picked ones too).
        for (i, st) in failed.into_iter().rev() {
            let row = self.active.remove(i);
            self.finish_row(row, Outcome::Failed(st));
            for p in picked.iter_mut().filter(|p| p.i > i) {
                p.i -= 1;
            }
        }
        if picked.is_empty() {
            return;
        }
        let with_hidden = picked.iter().any(|p| p.hidden != LogitsWanted::None);
        let prompt_tokens: usize = picked
            .iter()
            .filter(|p| !self.active[p.i].is_decode())
            .map(|p| p.tokens.len())
            .sum();
        let t = Instant::now();
        let result = {
            let mut steps = Vec::with_capacity(picked.len());
            // Grammars of rows that sample this step: their masks are computed while the
            // forward pass runs (they depend only on the tokens sampled so far).
            let mut grammars = Vec::new();
            let mut want = picked.iter().peekable();
            for (i, row) in self.active.iter_mut().enumerate() {
                if let Some(p) = want.peek() {
                    if p.i == i {
                        let (cache, c) = row.cache_and_constraint();
                        if p.logits != LogitsWanted::None {
                            grammars.extend(c);
                        }
                        steps.push(SeqStep {
                            cache,
                            tokens: &p.tokens,
                            logits: p.logits,
                        });
                        want.next();
                    }
                }
            }
            let hidden: Vec<LogitsWanted> = picked.iter().map(|p| p.hidden).collect();
            // A bug in a kernel must not take the daemon down: the rows of this batch fail,
            // everyone else carries on.
            std::thread::scope(|s| {
                if !grammars.is_empty() {
                    // A failed mask is reported again (and fails its row) when applied.
                    s.spawn(move || {
                        for c in grammars {
                            let _ = c.prepare_mask();
                        }
                    });
                }
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if with_hidden {
                        model.forward_with_hidden(&mut steps, &hidden)
                    } else {
                        model.forward(&mut steps).map(|out| (out, Vec::new()))
                    }
                }))
            })
        };
        let seconds = t.elapsed();
        self.forward_time += seconds;
        self.pacer.record(seconds, decoding, prompt_tokens);
        self.steps += 1;
        let (out, hidden) = match result {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return self.fail_rows(&picked, status_from_engine(&e)),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!("model {}: forward step panicked: {msg}", self.id);
                return self.fail_rows(&picked, Status::internal(format!("engine failure: {msg}")));
            }
        };
        let mut hidden = hidden.into_iter();
        let vocab = model.info.vocab_size;
        let mut outcomes: Vec<(usize, Outcome)> = Vec::new();
        for (p, logits) in picked.iter_mut().zip(out) {
            let h = hidden.next().unwrap_or_default();
            let outcome = match &mut self.active[p.i] {
                Row::Gen(g) => {
                    if g.prompt_left > 0 {
                        g.prompt_left -= p.tokens.len().min(g.prompt_left);
                        self.tokens_prefilled += p.tokens.len() as u64;
                    }
                    let plan = p.plan.take().expect("generation rows are planned");
                    // A verifying step emits up to drafts + 1 tokens, the one before the
                    // first rejected draft last: token j came from logits row j.
                    let mut events: Vec<StepEvent> = Vec::new();
                    let done = g.spec.finish(
                        &model,
                        &mut g.gen,
                        plan,
                        &logits,
                        h,
                        seconds.as_secs_f64(),
                        &mut |ev| events.push(ev.clone()),
                    );
                    match done {
                        Err(e) => Outcome::Failed(status_from_engine(&e)),
                        Ok(()) => {
                            let ids: Vec<u32> = events.iter().filter_map(|e| e.token).collect();
                            if !ids.is_empty() {
                                self.tokens_generated += ids.len() as u64;
                                g.first_token.get_or_insert_with(Instant::now);
                                let text: String = events.iter().map(|e| e.text.as_str()).collect();
                                let reasoning: String =
                                    events.iter().map(|e| e.reasoning.as_str()).collect();
                                g.reply_text.push_str(&text);
                                g.reasoning_text.push_str(&reasoning);
                                let logits = if g.return_logits {
                                    logits[..(ids.len() * vocab).min(logits.len())].to_vec()
                                } else {
                                    Vec::new()
                                };
                                let logprobs = match &model.text {
                                    Some(t) => events
                                        .iter()
                                        .filter_map(|e| e.logprob.as_ref())
                                        .map(|lp| wire::token_logprob(t, lp))
                                        .collect(),
                                    None => Vec::new(),
                                };
                                let tool_calls = events
                                    .iter_mut()
                                    .flat_map(|e| std::mem::take(&mut e.tool_calls))
                                    .map(|d| pb::ToolCallDelta {
                                        index: d.index as u32,
                                        id: d.id,
                                        name: d.name,
                                        arguments: d.arguments,
                                    })
                                    .collect();
                                let msg = pb::GenerateEvent {
                                    event: Some(Event::Tokens(Tokens {
                                        ids,
                                        text,
                                        logits,
                                        logprobs,
                                        reasoning,
                                        tool_calls,
                                    })),
                                };
                                if g.events.send(Ok(msg)).is_err() {
                                    g.gen.cancel();
                                }
                            }
                            let finished = events.iter().rev().find_map(|e| e.finished);
                            match finished.or(g.gen.finished()) {
                                Some(r) => Outcome::Finished(r),
                                None => Outcome::Continue,
                            }
                        }
                    }
                }
                Row::Score(s) => {
                    s.fed += p.tokens.len();
                    s.logits.extend_from_slice(&logits);
                    self.tokens_prefilled += p.tokens.len() as u64;
                    if s.fed == s.ids.len() {
                        Outcome::Finished(FinishReason::Length)
                    } else {
                        Outcome::Continue
                    }
                }
                Row::Perplexity(w) => {
                    let base = w.window * w.ctx;
                    if p.logits == LogitsWanted::All {
                        let window = &w.ids[base..base + w.ctx];
                        let vocab = model.info.vocab_size;
                        w.acc.score_rows(window, w.fed, vocab, &logits, None);
                    }
                    w.fed += p.tokens.len();
                    self.tokens_prefilled += p.tokens.len() as u64;
                    if perplexity::next_chunk(w.ctx, w.fed, 1, 1).is_some() {
                        Outcome::Continue
                    } else {
                        // The window is done: the next one starts from an empty cache.
                        w.acc.windows += 1;
                        w.window += 1;
                        w.fed = 0;
                        w.cache.truncate(0);
                        if w.window == w.windows {
                            Outcome::Finished(FinishReason::Length)
                        } else {
                            // A client that went away is dropped before the next step.
                            let _ = w.events.send(Ok(w.progress(false)));
                            Outcome::Continue
                        }
                    }
                }
            };
            if !matches!(outcome, Outcome::Continue) {
                outcomes.push((p.i, outcome));
            }
        }
        // Remove from the back so earlier indices stay valid.
        for (i, outcome) in outcomes.into_iter().rev() {
            let row = self.active.remove(i);
            self.finish_row(row, outcome);
        }
    }

    fn fail_rows(&mut self, picked: &[Picked], st: Status) {
        for p in picked.iter().rev() {
            let row = self.active.remove(p.i);
            self.finish_row(row, Outcome::Failed(st.clone()));
        }
    }

    /// Sends a row's last message and returns its cache to its session.
    fn finish_row(&mut self, row: Row, outcome: Outcome) {
        self.shared.outstanding.fetch_sub(1, Ordering::SeqCst);
        match row {
            Row::Perplexity(p) => {
                let msg = match outcome {
                    Outcome::Failed(st) => Err(st),
                    Outcome::Finished(FinishReason::Cancelled) => {
                        Err(Status::cancelled("perplexity request cancelled"))
                    }
                    _ => Ok(p.progress(true)),
                };
                let _ = p.events.send(msg);
            }
            Row::Score(mut s) => {
                let Some(reply) = s.reply.take() else { return };
                let r = match outcome {
                    Outcome::Failed(st) => Err(st),
                    Outcome::Finished(FinishReason::Cancelled) => {
                        Err(Status::cancelled("score request cancelled"))
                    }
                    _ => {
                        let vocab = self.model.info.vocab_size;
                        let argmax = s
                            .logits
                            .chunks(vocab)
                            .map(colibri_engine::sample::argmax)
                            .collect();
                        Ok(pb::ScoreResponse {
                            positions: s.ids.len() as u32,
                            vocab_size: vocab as u32,
                            argmax,
                            logits: if s.argmax_only { Vec::new() } else { s.logits },
                        })
                    }
                };
                let _ = reply.send(r);
            }
            Row::Gen(g) => {
                let g = *g;
                let now = Instant::now();
                let generated = g.gen.generated().to_vec();
                let reason = match &outcome {
                    Outcome::Finished(r) => Some(*r),
                    Outcome::Failed(st) => {
                        let _ = g.events.send(Err(st.clone()));
                        None
                    }
                    Outcome::Continue => unreachable!("finish_row is called for finished rows"),
                };
                if let Some(reason) = reason {
                    let ms = |d: Duration| d.as_secs_f64() * 1e3;
                    let per_s = |n: usize, d: Duration| {
                        if d.is_zero() {
                            0.0
                        } else {
                            n as f64 / d.as_secs_f64()
                        }
                    };
                    let admitted = g.admitted.unwrap_or(now);
                    let first = g.first_token;
                    let expert_cache = match (&g.cache_at_admission, self.store_stats()) {
                        (Some((before, t0)), Some(after)) => {
                            let forward = self.forward_time.saturating_sub(*t0);
                            Some(Box::new(wire::expert_cache_stats(
                                &after.since(before),
                                forward.as_secs_f64(),
                            )))
                        }
                        _ => None,
                    };
                    let stats = pb::GenerationStats {
                        prompt_tokens: g.prompt_tokens as u32,
                        cached_tokens: g.cached_tokens as u32,
                        generated_tokens: generated.len() as u32,
                        prefill_tokens_per_second: first
                            .map(|f| per_s(g.prompt_tokens, f - admitted))
                            .unwrap_or(0.0),
                        decode_tokens_per_second: first
                            .map(|f| per_s(generated.len().saturating_sub(1), now - f))
                            .unwrap_or(0.0),
                        time_to_first_token_ms: first.map(|f| ms(f - g.arrived)).unwrap_or(0.0),
                        queue_ms: ms(admitted.saturating_duration_since(g.arrived)),
                        total_ms: ms(now - g.arrived),
                        // The cache is shared: lookups of rows batched with this one count too.
                        expert_cache_hit_rate: expert_cache
                            .as_ref()
                            .map(|c| c.hit_rate)
                            .unwrap_or(0.0),
                        expert_cache,
                        speculation: g.spec_wanted.then(|| {
                            let st = g.spec.stats();
                            pb::SpeculationStats {
                                drafted: st.drafted as u32,
                                accepted: st.accepted as u32,
                                steps: st.spec_steps as u32,
                                off_reason: st.disabled.clone().unwrap_or_default(),
                            }
                        }),
                    };
                    let summary = g.gen.reply_summary().cloned().unwrap_or_default();
                    let mut reason = wire::finish_reason(reason);
                    if reason == pb::FinishReason::Eos && !summary.tool_calls.is_empty() {
                        reason = pb::FinishReason::ToolCalls;
                    }
                    let _ = g.events.send(Ok(pb::GenerateEvent {
                        event: Some(Event::Finished(Finished {
                            reason: reason as i32,
                            stats: Some(stats),
                            session_id: g.session.clone().unwrap_or_default(),
                            tool_calls: wire::pb_tool_calls(&summary.tool_calls),
                            tool_call_incomplete: summary.incomplete_call,
                            stop_sequence: g.gen.matched_stop().unwrap_or_default().to_string(),
                        })),
                    }));
                }
                let tool_calls: Vec<ToolCall> = g
                    .gen
                    .reply_summary()
                    .map(|s| s.tool_calls.clone())
                    .unwrap_or_default();
                let Some(sid) = g.session else {
                    // Keep the KV for later requests with the same prefix (not a failed
                    // step's: its cache may hold half-written positions).
                    if reason.is_some() && self.cfg.prefix_cache_bytes > 0 {
                        let cache = g.gen.into_cache();
                        let mut tokens = g.full;
                        tokens.extend_from_slice(&generated);
                        if cache.len <= tokens.len() {
                            tokens.truncate(cache.len);
                            self.prefix.insert(tokens, cache);
                        }
                    }
                    return;
                };
                let Some(s) = self.sessions.get_mut(&sid) else {
                    return;
                };
                let mut tokens = g.full;
                tokens.extend_from_slice(&generated);
                // After a failed step the caches may not agree: the MTP one goes.
                let mtp = if matches!(outcome, Outcome::Failed(_)) {
                    None
                } else {
                    g.spec.into_mtp_cache(&self.model, &g.gen)
                };
                let cache = g.gen.into_cache();
                s.cached_len = cache.len;
                s.kv_bytes = cache.size_bytes() + mtp.as_ref().map_or(0, KvCache::size_bytes);
                s.cache = Some(cache);
                s.mtp = mtp;
                s.tokens = tokens;
                if let Some(mut msgs) = g.chat {
                    msgs.push(ChatMessage {
                        role: "assistant".into(),
                        content: g.reply_text,
                        tool_calls,
                        reasoning_content: (!g.reasoning_text.is_empty())
                            .then_some(g.reasoning_text),
                        ..Default::default()
                    });
                    s.messages = msgs;
                }
                s.busy = None;
                s.persisted = false;
                s.last_used = now;
                s.last_used_ms = now_unix_ms();
            }
        }
    }

    /// The model's expert cache statistics; None when experts are not streamed.
    fn store_stats(&self) -> Option<StoreStats> {
        colibri_engine::experts::stream::streaming_of(&self.model.net).map(|s| s.stats())
    }

    fn save_session(&mut self, id: &str) {
        let Some(s) = self.sessions.get_mut(id) else {
            return;
        };
        let Some(cache) = &s.cache else { return };
        let meta = SessionMeta {
            id: s.id.clone(),
            model: self.id.clone(),
            model_type: self.model.info.model_type.clone(),
            vocab_size: self.model.info.vocab_size,
            created_unix_ms: s.created_ms,
            last_used_unix_ms: s.last_used_ms,
            tokens: s.tokens.clone(),
            messages: s
                .messages
                .iter()
                .map(|m| SnapshotMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect(),
        };
        let path = self.state.session_path(id);
        let t = Instant::now();
        match snapshot::save(&path, &meta, cache) {
            Ok(()) => {
                s.persisted = true;
                tracing::info!(
                    "session {id}: saved {} positions ({} bytes of KV) in {:.1} ms",
                    cache.len,
                    cache.size_bytes(),
                    t.elapsed().as_secs_f64() * 1e3
                );
            }
            Err(e) => tracing::error!("session {id}: cannot save {}: {e}", path.display()),
        }
    }

    fn save_idle_sessions(&mut self) {
        let due: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                !s.persisted
                    && s.busy.is_none()
                    && s.last_used.elapsed() >= self.cfg.session_save_after
            })
            .map(|s| s.id.clone())
            .collect();
        for id in due {
            self.save_session(&id);
        }
    }

    /// Cancels every row, saves sessions and pins.
    fn unload(&mut self) -> pb::UnloadModelResponse {
        for row in std::mem::take(&mut self.active)
            .into_iter()
            .chain(std::mem::take(&mut self.waiting))
        {
            self.finish_row(row, Outcome::Finished(FinishReason::Cancelled));
        }
        let ids: Vec<String> = self.sessions.keys().cloned().collect();
        let mut saved = 0;
        for id in &ids {
            if !self.sessions[id].persisted {
                self.save_session(id);
            }
            if self.sessions[id].persisted {
                saved += 1;
            }
        }
        // The usage history feeds the next start's preload and pins.
        if let Some(s) = colibri_engine::experts::stream::streaming_of(&self.model.net) {
            if let Err(e) = s.save_histogram() {
                tracing::error!(
                    "model {}: cannot save the expert usage history: {e}",
                    self.id
                );
            }
        }
        let pins: Vec<(u32, u32)> = self
            .shared
            .pins
            .lock()
            .expect("pins lock")
            .iter()
            .copied()
            .collect();
        if let Err(e) = self.state.save_pins(&self.id, &pins) {
            tracing::error!("model {}: cannot save pins: {e}", self.id);
        }
        self.publish();
        pb::UnloadModelResponse {
            model: self.id.clone(),
            sessions_saved: saved,
        }
    }

    fn publish(&self) {
        let mut kv = 0u64;
        for r in &self.active {
            if let Row::Gen(g) = r {
                kv += g.gen.cache.size_bytes() as u64;
            }
        }
        let mut idle_kv = 0u64;
        let mut sessions: Vec<pb::SessionInfo> = self
            .sessions
            .values()
            .map(|s| {
                if s.busy.is_none() {
                    idle_kv += s.kv_bytes as u64;
                }
                session_info(&self.id, s)
            })
            .collect();
        // The prefix cache's KV is idle KV too.
        idle_kv += self.prefix.bytes() as u64;
        kv += idle_kv;
        // Idle sessions' caches stay in RAM: a streamed model's expert cache makes room for
        // them (the stepped ones are reported by each forward pass).
        if let Some(st) = colibri_engine::experts::stream::streaming_of(&self.model.net) {
            st.set_idle_kv_bytes(idle_kv);
        }
        sessions.sort_by_key(|s| std::cmp::Reverse(s.last_used_unix_ms));
        let p = Published {
            active: self.active.len() as u32,
            queued: self.waiting.len() as u32,
            sessions,
            kv_bytes: kv,
            steps: self.steps,
            tokens_generated: self.tokens_generated,
            tokens_prefilled: self.tokens_prefilled,
            forward_seconds: self.forward_time.as_secs_f64(),
            idle_since: self.idle_since,
            prefix_cache_bytes: self.prefix.bytes() as u64,
            prefix_cache_entries: self.prefix.len() as u32,
            prefix_cache_reused_tokens: self.prefix.stats.reused_tokens,
        };
        *self.shared.published.lock().expect("published lock") = p;
    }
}

fn session_info(model_id: &str, s: &Session) -> pb::SessionInfo {
    let (cached, kv) = match &s.cache {
        Some(c) => (c.len, c.size_bytes()),
        None => (s.cached_len, s.kv_bytes),
    };
    pb::SessionInfo {
        id: s.id.clone(),
        model: model_id.to_string(),
        cached_tokens: cached as u32,
        history_tokens: s.tokens.len() as u32,
        kv_bytes: kv as u64,
        state: if s.busy.is_some() {
            "generating"
        } else {
            "live"
        }
        .into(),
        created_unix_ms: s.created_ms,
        last_used_unix_ms: s.last_used_ms,
        persisted: s.persisted,
        messages: s.messages.len() as u32,
    }
}

/// `Generation::new` validates a request against `cache.len()` but consumes the cache,
/// which a session must get back when the request is refused. So the request is validated
/// against an empty stand-in of the same length, and the real cache is moved in after.
fn checked_generation(
    model: &Model,
    cache: KvCache,
    req: GenerateRequest,
) -> Result<Generation, (colibri_engine::Error, KvCache)> {
    let stand_in = KvCache {
        layers: Vec::new(),
        len: cache.len,
        capacity: cache.capacity,
    };
    match Generation::new(model, stand_in, req) {
        Ok(mut g) => {
            g.cache = cache;
            Ok(g)
        }
        Err(e) => Err((e, cache)),
    }
}
