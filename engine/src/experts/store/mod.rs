//! [`ExpertStore`]: routed experts read from disk into a cache bounded by a byte budget.
//!
//! - A request for a resident expert returns its buffer at once; a miss queues a read and
//!   returns a [`Ticket`] to wait on, so a caller can issue every miss of a layer before
//!   waiting for the first (several reads in flight: an NVMe drive needs queue depth > 1).
//! - Reads are `pread`s by a pool of reader threads into page-aligned buffers, with O_DIRECT
//!   (no page cache: the cache is ours) or buffered reads followed by
//!   `posix_fadvise(DONTNEED)` so the page cache does not hold a second copy. Buffered file
//!   handles are opened with `POSIX_FADV_RANDOM`: the kernel's read-ahead (8 MB on the
//!   benchmark machine) would otherwise pull in neighbouring experts nobody asked for.
//! - Three queues: demand reads first, then predicted (prefetch) reads, then background
//!   preloads of pinned experts, so neither prediction nor preloading delays a token.
//! - Which experts stay is the [`Policy`]'s decision (the same code the simulator replays);
//!   the store mirrors it. An evicted expert still in use by the forward pass lives until the
//!   pass drops it, so the memory bound is the budget plus the experts of one layer in use.

mod cache;
mod config;
mod direct_io;
mod readers;
mod reads;
mod shared;
mod stats;
#[cfg(test)]
mod tests;

pub use cache::{ExpertStore, PendingHandle, Ticket};
pub use config::{ExpertSpec, Extent, StoreConfig};
pub use stats::{ExpertCounts, StoreStats};
