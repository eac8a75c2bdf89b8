//! What the store is built from: where each expert's bytes are ([`ExpertSpec`]) and its
//! settings ([`StoreConfig`]).

use crate::experts::policy;
use crate::experts::Key;

/// A byte range of one of the store's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Index into the file list given to [`ExpertStore::new`].
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

/// Where one expert's bytes are: its parts (e.g. gate, gate scales, up, ..., in the order
/// the caller wants them back in [`ExpertBuf::parts`]). Parts close together in one file are
/// read with one request; a container expert (one aligned extent) is one read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertSpec {
    pub parts: Vec<Extent>,
}

#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Bytes the cache may hold.
    pub budget_bytes: u64,
    /// A [`policy::build`] name.
    pub policy: String,
    /// Share of the capacity given to pins when the policy is `pinned-*`.
    pub pin_share: f64,
    pub readers: usize,
    /// O_DIRECT (F_NOCACHE on macOS) when the file system allows it; else buffered.
    pub direct: bool,
    /// Expert requests one decode token makes (MoE layers × top-k): the unit of LRFU's
    /// half-life.
    pub requests_per_token: usize,
    /// Experts pinned by the user (`coli pin`): never evicted once loaded, whatever the
    /// policy, and preloaded at start. Unknown keys are ignored.
    pub pins: Vec<Key>,
    /// Experts of the budget set aside for prefetches (a layer ahead's predictions): they
    /// wait there, outside the policy, until the forward pass asks for them, and the oldest
    /// unused one goes when a new one comes. 0: prefetched experts enter the policy at once.
    ///
    /// Why: a frequency policy ranks a just-prefetched expert (no use yet) lowest, so the
    /// next miss evicted it before its layer came: measured with a 64-token LRFU on the
    /// synth model, 15 367 of 15 657 prefetches were wasted, +17% bytes per token.
    pub prefetch_slots: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            budget_bytes: 0,
            policy: policy::DEFAULT_POLICY.into(),
            pin_share: 0.5,
            readers: 4,
            direct: true,
            requests_per_token: 1,
            pins: Vec::new(),
            prefetch_slots: 0,
        }
    }
}
