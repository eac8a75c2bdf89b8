//! Routed experts streamed from the disk into a budgeted RAM cache.
//!
//! A MoE model's dense part (attention, norms, routers, embeddings, shared experts) stays
//! resident; its routed experts are read on demand by the [`ExpertStore`] into aligned
//! buffers, kept under a byte budget by a replacement [`policy`], read ahead by a router-based
//! predictor, and counted in a persisted usage [`hist`]ogram whose hottest experts are pinned
//! at the next start. The only code that touches the disk on the hot path lives here.
//!
//! - [`policy`]: cache replacement policies (LRU, LFU, LRFU, ARC, pinned) behind one trait.
//! - [`sim`] and [`trace`]: routing traces and the simulator that replays them against the
//!   policies and against Belady's offline optimum, which is how the shipped policy is chosen.
//! - [`book`]: which experts the cache holds and why (policy plus prefetch slots), shared by
//!   the store and the simulator.
//! - [`store`]: the cache itself, its reader threads and statistics.
//! - [`hist`]: the per-model usage histogram (atomic writes, validated reads).
//! - [`plan`]: where a model's bytes go and the default budget.
//! - [`hooks`], [`streaming`] and [`stream`]: what a MoE block consults (routing observer,
//!   expert top-p, streamed experts, next-layer predictor), the streaming state its blocks
//!   share, and [`stream::enable`], which installs them in a network's MoE blocks.
//!
//! Invariant: nothing here changes what the model computes. Budget, policy, prefetch and
//! reader count change only when bytes arrive; the bytes handed to the kernels are the ones
//! in the file. (Expert top-p, which does change outputs, is an explicit lossy option.)

pub mod book;
pub mod buf;
pub mod hist;
pub mod hooks;
mod key;
pub mod plan;
pub mod policy;
mod route;
pub mod sim;
pub mod store;
pub mod stream;
pub mod streaming;
pub mod trace;

pub use buf::{AlignedBuf, ExpertBuf};
pub use hist::UsageHistogram;
pub use hooks::{MoeHooks, RoutingObserver};
pub use key::Key;
pub use plan::MemoryPlan;
pub use policy::{Access, Policy};
pub use route::Route;
pub use store::{ExpertSpec, ExpertStore, Extent, StoreConfig, StoreStats, Ticket};
pub use stream::StreamOptions;
pub use streaming::Streaming;
pub use trace::Trace;
