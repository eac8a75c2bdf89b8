//! Cache replacement policies for routed experts, behind one trait so the simulator and the
//! live [`super::ExpertStore`] run exactly the same code.
//!
//! Capacities are counted in experts: every routed expert of a model has the same shape, so
//! a byte budget is `capacity × expert bytes`.
//!
//! Why several: a decode step visits layer 0, 1, ..., L-1 and then starts again, a loop over a
//! working set larger than the cache. Plain LRU is the worst case for loops (the least
//! recently used expert is the one of the layer about to come back); frequency-based policies
//! keep the experts the router prefers. Which wins is a matter of measurement on traces
//! (`coli simulate`, docs/STREAMING.md), not taste.

mod arc;
mod base;
mod by_name;
mod lfu;
mod lrfu;
mod lrfu_auto;
mod lru;
mod pinned;
mod recency;
#[cfg(test)]
mod tests;

pub use arc::ArcCache;
pub use base::{Access, Policy};
pub use by_name::{build, hottest, DEFAULT_LRFU_HALF_LIFE_TOKENS, DEFAULT_POLICY, POLICY_NAMES};
pub use lfu::Lfu;
pub use lrfu::Lrfu;
pub use lrfu_auto::{AdaptiveLrfu, ADAPTIVE_HALF_LIVES_TOKENS, ADAPTIVE_WINDOW_TOKENS};
pub use lru::Lru;
pub use pinned::Pinned;
pub use recency::RecencyList;
