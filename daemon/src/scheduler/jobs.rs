//! What the async side hands an engine thread (jobs, their reply channels, its settings)
//! and what the thread publishes back (`Published`, the shared admission count, pins).

use crate::prefix::Policy;
use colibri_engine::structured::OutputFormat;
use colibri_engine::text::{ChatMessage, ToolChoice, ToolSpec};
use colibri_engine::SamplingParams;
use colibri_proto::v1 as pb;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::Mutex;
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
