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

mod finish;
mod jobs;
mod prepare;
mod rows;
mod sessions;
mod step;
mod thread;

pub use jobs::{
    EngineConfig, EngineShared, EventSender, GenExtras, GenInput, GenJob, Job, PerplexityJob,
    PerplexitySender, Published, ScoreJob,
};
pub use thread::EngineThread;
