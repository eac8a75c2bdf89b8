//! What an engine thread keeps per request and per session: the rows it steps, a row's
//! part of one step, how a row ends.

use super::jobs::{EventSender, PerplexitySender};
use colibri_engine::experts::StoreStats;
use colibri_engine::perplexity::Perplexity;
use colibri_engine::structured::Constraint;
use colibri_engine::text::ChatMessage;
use colibri_engine::{
    FinishReason, GenerateRequest, Generation, KvCache, LogitsWanted, Model, Speculator, StepPlan,
};
use colibri_proto::v1 as pb;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tonic::Status;

pub(super) struct Session {
    pub(super) id: String,
    pub(super) tokens: Vec<u32>,
    /// None while a generation holds it.
    pub(super) cache: Option<KvCache>,
    /// The MTP layer's cache of the same positions, left by the last generation that drafted
    /// (lets the next turn draft too); not part of snapshots.
    pub(super) mtp: Option<KvCache>,
    /// `cache.len` while the cache is lent out (for listings).
    pub(super) cached_len: usize,
    pub(super) kv_bytes: usize,
    pub(super) messages: Vec<ChatMessage>,
    pub(super) created_ms: i64,
    pub(super) last_used_ms: i64,
    pub(super) last_used: Instant,
    /// Request id of the generation using the session.
    pub(super) busy: Option<String>,
    /// The snapshot on disk is current.
    pub(super) persisted: bool,
}

pub(super) struct GenRow {
    pub(super) gen: Generation,
    /// Drafts for `gen` with the model's MTP layers (a plain decoder when drafting is off).
    pub(super) spec: Speculator,
    /// Drafting was asked for or automatic (the Finished stats then say how it went).
    pub(super) spec_wanted: bool,
    pub(super) request_id: String,
    pub(super) session: Option<String>,
    /// The sequence before generation: cached prefix plus everything fed this request.
    pub(super) full: Vec<u32>,
    pub(super) prompt_left: usize,
    pub(super) events: EventSender,
    pub(super) return_logits: bool,
    /// The whole conversation for a Chat request (the session's messages plus this turn's).
    pub(super) chat: Option<Vec<ChatMessage>>,
    pub(super) reply_text: String,
    pub(super) reasoning_text: String,
    pub(super) prompt_tokens: usize,
    pub(super) cached_tokens: usize,
    pub(super) arrived: Instant,
    pub(super) admitted: Option<Instant>,
    pub(super) first_token: Option<Instant>,
    /// The expert cache's statistics and the engine's forward time when the row was
    /// admitted (None when experts are not streamed): its Finished stats are the change.
    pub(super) cache_at_admission: Option<(StoreStats, Duration)>,
}

pub(super) struct ScoreRow {
    pub(super) cache: KvCache,
    pub(super) ids: Vec<u32>,
    pub(super) fed: usize,
    pub(super) logits: Vec<f32>,
    pub(super) argmax_only: bool,
    pub(super) reply: Option<oneshot::Sender<Result<pb::ScoreResponse, Status>>>,
}

/// A Perplexity request in progress: window `window`, of which `fed` positions are in
/// `cache` (reset between windows).
pub(super) struct PerplexityRow {
    pub(super) cache: KvCache,
    pub(super) ids: Vec<u32>,
    pub(super) ctx: usize,
    pub(super) windows: usize,
    pub(super) window: usize,
    pub(super) fed: usize,
    pub(super) acc: Perplexity,
    pub(super) events: PerplexitySender,
}

impl PerplexityRow {
    pub(super) fn progress(&self, done: bool) -> pb::PerplexityProgress {
        pb::PerplexityProgress {
            windows_done: self.acc.windows as u32,
            windows_total: self.windows as u32,
            tokens_scored: self.acc.tokens_scored,
            nll_sum: self.acc.nll_sum,
            done,
        }
    }
}

pub(super) enum Row {
    Gen(Box<GenRow>),
    Score(ScoreRow),
    Perplexity(Box<PerplexityRow>),
}

impl Row {
    /// The row's cache, and its grammar when it has one.
    pub(super) fn cache_and_constraint(&mut self) -> (&mut KvCache, Option<&mut Constraint>) {
        match self {
            Row::Gen(g) => g.gen.cache_and_constraint(),
            Row::Score(s) => (&mut s.cache, None),
            Row::Perplexity(p) => (&mut p.cache, None),
        }
    }
    pub(super) fn is_decode(&self) -> bool {
        matches!(self, Row::Gen(g) if g.prompt_left == 0)
    }
}

/// A row's part of one step.
pub(super) struct Picked {
    /// Index in `active`.
    pub(super) i: usize,
    pub(super) tokens: Vec<u32>,
    pub(super) logits: LogitsWanted,
    /// Final hidden states wanted (the MTP layer's input while drafting).
    pub(super) hidden: LogitsWanted,
    /// A generation's plan, handed back to its speculator with the outputs.
    pub(super) plan: Option<StepPlan>,
}

pub(super) enum Outcome {
    Continue,
    Finished(FinishReason),
    Failed(Status),
}

pub(super) fn session_info(model_id: &str, s: &Session) -> pb::SessionInfo {
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
pub(super) fn checked_generation(
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
