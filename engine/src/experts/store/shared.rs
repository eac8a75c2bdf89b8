//! What the store and its reader threads share: the cache's state under one lock, the job
//! queues and reads in flight, the counters.

use super::reads::ReadPlan;
use super::stats::ExpertCounts;
use crate::experts::book::{CacheBook, Held};
use crate::experts::buf::ExpertBuf;
use crate::experts::hist::UsageHistogram;
use crate::experts::Key;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

pub(super) struct DiskFile {
    pub(super) path: PathBuf,
    pub(super) buffered: File,
    pub(super) direct: Option<File>,
    /// Cleared when a direct read is refused (some file systems accept the flag at open and
    /// fail the read); later reads of this file are buffered.
    pub(super) direct_ok: AtomicBool,
}

pub(super) type ReadResult =
    std::result::Result<Arc<ExpertBuf>, (PathBuf, std::io::ErrorKind, String)>;

/// A read in flight; waiters block on it.
pub(super) struct Pending {
    pub(super) result: Mutex<Option<ReadResult>>,
    pub(super) cv: Condvar,
}

impl Pending {
    pub(super) fn new() -> Arc<Pending> {
        Arc::new(Pending {
            result: Mutex::new(None),
            cv: Condvar::new(),
        })
    }
    pub(super) fn complete(&self, r: ReadResult) {
        *lock(&self.result) = Some(r);
        self.cv.notify_all();
    }
    pub(super) fn wait(&self) -> ReadResult {
        let mut g = lock(&self.result);
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

pub(super) enum Slot {
    Loading(Arc<Pending>),
    Ready(Arc<ExpertBuf>),
}

pub(super) struct State {
    /// Which experts are held and why (the decisions; the simulator runs the same code).
    pub(super) book: CacheBook,
    /// The buffers of the keys the book holds (always the same keys).
    pub(super) slots: HashMap<Key, Slot>,
    /// Budget lent to the KV caches ([`ExpertStore::lend`]).
    pub(super) lent_bytes: u64,
    pub(super) resident_bytes: u64,
    pub(super) hist: UsageHistogram,
    /// `[layer][expert]` outcomes of demand requests since the store started (counted under
    /// the state lock `request` already holds, so they cost no extra synchronisation).
    pub(super) per_expert: Vec<Vec<ExpertCounts>>,
}

impl State {
    /// Frees the buffers of keys the book no longer holds (a read still queued is skipped),
    /// counting evictions and prefetches that were never used.
    pub(super) fn drop_slots(&mut self, dropped: &[(Key, Held)], c: &Counters) {
        for (v, h) in dropped {
            if let Some(slot) = self.slots.remove(v) {
                // A staged prefetch pushed out by a newer one was never in the policy.
                if !h.staged {
                    c.evictions.fetch_add(1, Ordering::Relaxed);
                }
                if h.speculative {
                    c.prefetch_wasted.fetch_add(1, Ordering::Relaxed);
                }
                if let Slot::Ready(b) = &slot {
                    self.resident_bytes -= b.size_bytes() as u64;
                }
            }
        }
    }

    /// The counters of a key [`ExpertStore::check_key`] accepted.
    pub(super) fn counts_mut(&mut self, key: Key) -> &mut ExpertCounts {
        &mut self.per_expert[key.layer as usize][key.expert as usize]
    }
}

pub(super) struct Job {
    pub(super) key: Key,
    pub(super) pending: Arc<Pending>,
    /// A background preload (its bytes are a start-up cost, counted apart).
    pub(super) preload: bool,
}

#[derive(Default)]
pub(super) struct Jobs {
    pub(super) demand: VecDeque<Job>,
    pub(super) prefetch: VecDeque<Job>,
    pub(super) background: VecDeque<Job>,
    pub(super) shutdown: bool,
}

impl Jobs {
    pub(super) fn pop(&mut self) -> Option<Job> {
        self.demand
            .pop_front()
            .or_else(|| self.prefetch.pop_front())
            .or_else(|| self.background.pop_front())
    }
    /// Moves a queued speculative read to the demand queue (someone now waits for it).
    pub(super) fn promote(&mut self, p: &Arc<Pending>) {
        for q in [&mut self.prefetch, &mut self.background] {
            if let Some(i) = q.iter().position(|j| Arc::ptr_eq(&j.pending, p)) {
                let mut j = q.remove(i).expect("index from position");
                j.preload = false;
                self.demand.push_back(j);
                return;
            }
        }
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) requests: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) inflight_hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) reads: AtomicU64,
    pub(super) read_ns: AtomicU64,
    pub(super) wait_ns: AtomicU64,
    pub(super) prefetch_issued: AtomicU64,
    pub(super) prefetch_used: AtomicU64,
    pub(super) prefetch_wasted: AtomicU64,
    pub(super) preload_issued: AtomicU64,
    pub(super) preload_bytes: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) tokens: AtomicU64,
    pub(super) direct_reads: AtomicU64,
    pub(super) predicted: AtomicU64,
    pub(super) predicted_correct: AtomicU64,
    pub(super) predicted_actual: AtomicU64,
    pub(super) read_errors: AtomicU64,
}

/// Time during which at least one read was in flight, for the disk's throughput.
#[derive(Default)]
pub(super) struct Busy {
    pub(super) active: usize,
    pub(super) since: Option<Instant>,
    pub(super) ns: u64,
}

pub(super) struct Shared {
    pub(super) files: Vec<DiskFile>,
    /// `[layer][expert]`; empty rows for layers without routed experts.
    pub(super) plans: Vec<Vec<Option<ReadPlan>>>,
    pub(super) state: Mutex<State>,
    pub(super) jobs: Mutex<Jobs>,
    pub(super) jobs_cv: Condvar,
    pub(super) c: Counters,
    pub(super) busy: Mutex<Busy>,
    pub(super) expert_bytes: u64,
    pub(super) budget_bytes: u64,
    pub(super) readers: usize,
    pub(super) notes: Mutex<Vec<String>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
