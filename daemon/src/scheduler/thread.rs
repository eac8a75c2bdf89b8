//! The engine thread itself: its state, its loop (jobs between steps, admission, one
//! step), and what it publishes after every iteration.

use super::jobs::{EngineConfig, EngineShared, Job, Published};
use super::rows::{session_info, Outcome, PerplexityRow, Row, ScoreRow, Session};
use crate::pacer::PrefillPacer;
use crate::prefix::PrefixCache;
use crate::state::StateDir;
use crate::wire::{self, status_from_engine};
use colibri_engine::experts::StoreStats;
use colibri_engine::perplexity::{self, Perplexity};
use colibri_engine::structured::GrammarCompiler;
use colibri_engine::{FinishReason, KvCache, Model};
use colibri_proto::v1 as pb;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub struct EngineThread {
    pub(super) id: String,
    pub(super) model: Arc<Model>,
    pub(super) rx: Receiver<Job>,
    pub(super) shared: Arc<EngineShared>,
    pub(super) state: StateDir,
    pub(super) cfg: EngineConfig,
    pub(super) sessions: HashMap<String, Session>,
    pub(super) active: Vec<Row>,
    pub(super) waiting: VecDeque<Row>,
    pub(super) steps: u64,
    pub(super) tokens_generated: u64,
    pub(super) tokens_prefilled: u64,
    /// Time spent in `Model::forward`.
    pub(super) forward_time: Duration,
    /// The prompt chunk while others decode, from measured step times.
    pub(super) pacer: PrefillPacer,
    pub(super) idle_since: Option<Instant>,
    /// KV of finished requests, reused by later ones with the same prefix.
    pub(super) prefix: PrefixCache<KvCache>,
    /// Structured output's grammar compiler (indexes the vocabulary once, on first use).
    pub(super) grammar: Option<Result<Arc<GrammarCompiler>, String>>,
    /// Tool call ids: per-engine counter.
    pub(super) calls_made: u64,
    /// When busy stepping, the last look for idle sessions to snapshot.
    pub(super) last_save_look: Instant,
    /// Test hook (`COLIBRI_STEP_PAUSE_MS`): a pause after every step, so that a browser
    /// test can watch a tiny fixture's reply stream and stop it midway.
    pub(super) step_pause: Option<Duration>,
}

/// How often an idle engine thread wakes up to snapshot idle sessions.
const IDLE_TICK: Duration = Duration::from_millis(500);

impl EngineThread {
    pub fn new(
        id: String,
        model: Arc<Model>,
        rx: Receiver<Job>,
        shared: Arc<EngineShared>,
        state: StateDir,
        cfg: EngineConfig,
    ) -> EngineThread {
        EngineThread {
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
    pub(super) fn handle(&mut self, job: Job) -> Option<oneshot::Sender<pb::UnloadModelResponse>> {
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

    /// Finishes rows whose client went away or that were cancelled.
    pub(super) fn drop_abandoned(&mut self) {
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

    pub(super) fn admit(&mut self) {
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

    /// The model's expert cache statistics; None when experts are not streamed.
    pub(super) fn store_stats(&self) -> Option<StoreStats> {
        colibri_engine::experts::stream::streaming_of(&self.model.net).map(|s| s.stats())
    }

    pub(super) fn publish(&self) {
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
