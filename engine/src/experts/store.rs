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

use super::book::{self, CacheBook, Held};
use super::buf::{AlignedBuf, ExpertBuf, ALIGN};
use super::hist::UsageHistogram;
use super::policy::{self, Access, Policy};
use super::Key;
use crate::error::{Error, Result};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

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

impl ExpertSpec {
    /// Bytes of the buffer one read of this expert fills (whole pages per read group).
    pub fn buffer_len(&self) -> u64 {
        let lens: Vec<u64> = (0..=self.parts.iter().map(|p| p.file).max().unwrap_or(0))
            .map(|_| u64::MAX)
            .collect();
        ReadPlan::new(self, &lens).map_or(0, |p| p.len as u64)
    }
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

/// Parts of one file closer than this are read with one request (a gap costs less than a
/// second request).
const MERGE_GAP: u64 = 64 << 10;

/// A precomputed read of one expert.
#[derive(Debug)]
struct ReadPlan {
    groups: Vec<ReadGroup>,
    /// Buffer length (each group starts on an [`ALIGN`] boundary of the buffer).
    len: usize,
    parts: Vec<Range<usize>>,
}

#[derive(Debug)]
struct ReadGroup {
    file: usize,
    /// Bytes wanted: `[start, end)` of the file.
    start: u64,
    end: u64,
    /// Buffer offset of `start` rounded down to [`ALIGN`].
    buf_off: usize,
}

impl ReadPlan {
    fn new(spec: &ExpertSpec, file_lens: &[u64]) -> std::result::Result<ReadPlan, String> {
        if spec.parts.is_empty() {
            return Err("an expert with no bytes".into());
        }
        for p in &spec.parts {
            let len = *file_lens
                .get(p.file)
                .ok_or_else(|| format!("file index {} out of range", p.file))?;
            if p.offset.checked_add(p.len).is_none_or(|e| e > len) {
                return Err(format!(
                    "extent [{}, +{}) runs past the end of the file ({len} bytes)",
                    p.offset, p.len
                ));
            }
        }
        let mut order: Vec<usize> = (0..spec.parts.len()).collect();
        order.sort_by_key(|&i| (spec.parts[i].file, spec.parts[i].offset));
        let mut groups: Vec<ReadGroup> = Vec::new();
        let mut group_of = vec![0usize; spec.parts.len()];
        for &i in &order {
            let p = spec.parts[i];
            match groups.last_mut() {
                Some(g) if g.file == p.file && p.offset <= g.end + MERGE_GAP => {
                    g.end = g.end.max(p.offset + p.len)
                }
                _ => groups.push(ReadGroup {
                    file: p.file,
                    start: p.offset,
                    end: p.offset + p.len,
                    buf_off: 0,
                }),
            }
            group_of[i] = groups.len() - 1;
        }
        let mut cursor = 0usize;
        for g in &mut groups {
            g.buf_off = cursor;
            let a0 = align_down(g.start);
            cursor += (align_up(g.end) - a0) as usize;
        }
        let parts = spec
            .parts
            .iter()
            .zip(&group_of)
            .map(|(p, &gi)| {
                let g = &groups[gi];
                let at = g.buf_off + (p.offset - align_down(g.start)) as usize;
                at..at + p.len as usize
            })
            .collect();
        Ok(ReadPlan {
            groups,
            len: cursor,
            parts,
        })
    }
}

fn align_down(x: u64) -> u64 {
    x / ALIGN as u64 * ALIGN as u64
}
fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN as u64) * ALIGN as u64
}

struct DiskFile {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    /// Cleared when a direct read is refused (some file systems accept the flag at open and
    /// fail the read); later reads of this file are buffered.
    direct_ok: AtomicBool,
}

type ReadResult = std::result::Result<Arc<ExpertBuf>, (PathBuf, std::io::ErrorKind, String)>;

/// A read in flight; waiters block on it.
struct Pending {
    result: Mutex<Option<ReadResult>>,
    cv: Condvar,
}

impl Pending {
    fn new() -> Arc<Pending> {
        Arc::new(Pending {
            result: Mutex::new(None),
            cv: Condvar::new(),
        })
    }
    fn complete(&self, r: ReadResult) {
        *lock(&self.result) = Some(r);
        self.cv.notify_all();
    }
    fn wait(&self) -> ReadResult {
        let mut g = lock(&self.result);
        loop {
            if let Some(r) = g.as_ref() {
                return r.clone();
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

enum Slot {
    Loading(Arc<Pending>),
    Ready(Arc<ExpertBuf>),
}

struct State {
    /// Which experts are held and why (the decisions; the simulator runs the same code).
    book: CacheBook,
    /// The buffers of the keys the book holds (always the same keys).
    slots: HashMap<Key, Slot>,
    /// Budget lent to the KV caches ([`ExpertStore::lend`]).
    lent_bytes: u64,
    resident_bytes: u64,
    hist: UsageHistogram,
    /// `[layer][expert]` outcomes of demand requests since the store started (counted under
    /// the state lock `request` already holds, so they cost no extra synchronisation).
    per_expert: Vec<Vec<ExpertCounts>>,
}

/// How one expert's demand requests were served since the store started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExpertCounts {
    /// Resident and ready.
    pub hits: u64,
    /// Resident, its speculative read still in flight.
    pub inflight_hits: u64,
    /// Read on demand.
    pub misses: u64,
}

impl State {
    /// Frees the buffers of keys the book no longer holds (a read still queued is skipped),
    /// counting evictions and prefetches that were never used.
    fn drop_slots(&mut self, dropped: &[(Key, Held)], c: &Counters) {
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
    fn counts_mut(&mut self, key: Key) -> &mut ExpertCounts {
        &mut self.per_expert[key.layer as usize][key.expert as usize]
    }
}

struct Job {
    key: Key,
    pending: Arc<Pending>,
    /// A background preload (its bytes are a start-up cost, counted apart).
    preload: bool,
}

#[derive(Default)]
struct Jobs {
    demand: VecDeque<Job>,
    prefetch: VecDeque<Job>,
    background: VecDeque<Job>,
    shutdown: bool,
}

impl Jobs {
    fn pop(&mut self) -> Option<Job> {
        self.demand
            .pop_front()
            .or_else(|| self.prefetch.pop_front())
            .or_else(|| self.background.pop_front())
    }
    /// Moves a queued speculative read to the demand queue (someone now waits for it).
    fn promote(&mut self, p: &Arc<Pending>) {
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
struct Counters {
    requests: AtomicU64,
    hits: AtomicU64,
    inflight_hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    reads: AtomicU64,
    read_ns: AtomicU64,
    wait_ns: AtomicU64,
    prefetch_issued: AtomicU64,
    prefetch_used: AtomicU64,
    prefetch_wasted: AtomicU64,
    preload_issued: AtomicU64,
    preload_bytes: AtomicU64,
    evictions: AtomicU64,
    tokens: AtomicU64,
    direct_reads: AtomicU64,
    predicted: AtomicU64,
    predicted_correct: AtomicU64,
    predicted_actual: AtomicU64,
    read_errors: AtomicU64,
}

/// Time during which at least one read was in flight, for the disk's throughput.
#[derive(Default)]
struct Busy {
    active: usize,
    since: Option<Instant>,
    ns: u64,
}

struct Shared {
    files: Vec<DiskFile>,
    /// `[layer][expert]`; empty rows for layers without routed experts.
    plans: Vec<Vec<Option<ReadPlan>>>,
    state: Mutex<State>,
    jobs: Mutex<Jobs>,
    jobs_cv: Condvar,
    c: Counters,
    busy: Mutex<Busy>,
    expert_bytes: u64,
    budget_bytes: u64,
    readers: usize,
    notes: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A requested expert: ready, or a read to wait for with [`ExpertStore::wait`].
pub enum Ticket {
    Ready(Arc<ExpertBuf>),
    Wait(Key, PendingHandle),
}

/// Opaque handle of a read in flight.
pub struct PendingHandle(Arc<Pending>);

pub struct ExpertStore {
    shared: Arc<Shared>,
    user_pins: Vec<Key>,
    threads: Vec<JoinHandle<()>>,
    policy_name: String,
    capacity: usize,
}

/// A snapshot of the store's counters and gauges.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StoreStats {
    pub policy: String,
    pub budget_bytes: u64,
    pub expert_bytes: u64,
    pub capacity_experts: usize,
    pub resident_experts: usize,
    pub resident_bytes: u64,
    pub readers: usize,
    /// Demand requests (one per unique expert per layer per step).
    pub requests: u64,
    /// Resident and ready.
    pub hits: u64,
    /// Resident but its (speculative) read still in flight: waited for, not re-read.
    pub inflight_hits: u64,
    /// Read on demand.
    pub misses: u64,
    pub bytes_read: u64,
    pub reads: u64,
    pub direct_reads: u64,
    pub read_errors: u64,
    /// Sum of the durations of every read (reads overlap, so this exceeds wall time).
    pub read_seconds: f64,
    /// Wall time with at least one read in flight.
    pub disk_busy_seconds: f64,
    /// Time callers spent blocked waiting for reads.
    pub wait_seconds: f64,
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub prefetch_wasted: u64,
    pub preload_issued: u64,
    /// Bytes read by background preloads (included in `bytes_read`).
    pub preload_bytes: u64,
    /// Budget lent to the KV caches ([`ExpertStore::lend`]): the cache holds that much less.
    pub lent_bytes: u64,
    pub evictions: u64,
    pub tokens: u64,
    /// Router-based prediction of the next layer's experts: predicted, of which routed, and
    /// experts routed in predicted layers.
    pub predicted: u64,
    pub predicted_correct: u64,
    pub predicted_actual: u64,
    /// Things worth telling the user once (e.g. a fall-back from direct to buffered reads).
    pub notes: Vec<String>,
}

impl StoreStats {
    /// Requests served without a demand read (ready, or already in flight).
    pub fn hit_rate(&self) -> f64 {
        frac(self.hits + self.inflight_hits, self.requests)
    }
    pub fn bytes_per_token(&self) -> f64 {
        frac(self.bytes_read, self.tokens)
    }
    pub fn disk_gbps(&self) -> f64 {
        if self.disk_busy_seconds > 0.0 {
            self.bytes_read as f64 / self.disk_busy_seconds / 1e9
        } else {
            0.0
        }
    }
    /// Of the experts the layers used, the share the predictor named.
    pub fn prefetch_recall(&self) -> f64 {
        frac(self.predicted_correct, self.predicted_actual)
    }
    /// Of the experts the predictor named, the share the layers used.
    pub fn prefetch_precision(&self) -> f64 {
        frac(self.predicted_correct, self.predicted)
    }

    /// What happened between `before` and `self` (two snapshots of the same store): the
    /// counters and times are differences; the gauges (budget, capacity, resident experts,
    /// readers, policy) and the notes are `self`'s, since they describe the store as it is.
    pub fn since(&self, before: &StoreStats) -> StoreStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let ds = |a: f64, b: f64| (a - b).max(0.0);
        StoreStats {
            policy: self.policy.clone(),
            budget_bytes: self.budget_bytes,
            expert_bytes: self.expert_bytes,
            capacity_experts: self.capacity_experts,
            resident_experts: self.resident_experts,
            resident_bytes: self.resident_bytes,
            readers: self.readers,
            requests: d(self.requests, before.requests),
            hits: d(self.hits, before.hits),
            inflight_hits: d(self.inflight_hits, before.inflight_hits),
            misses: d(self.misses, before.misses),
            bytes_read: d(self.bytes_read, before.bytes_read),
            reads: d(self.reads, before.reads),
            direct_reads: d(self.direct_reads, before.direct_reads),
            read_errors: d(self.read_errors, before.read_errors),
            read_seconds: ds(self.read_seconds, before.read_seconds),
            disk_busy_seconds: ds(self.disk_busy_seconds, before.disk_busy_seconds),
            wait_seconds: ds(self.wait_seconds, before.wait_seconds),
            prefetch_issued: d(self.prefetch_issued, before.prefetch_issued),
            prefetch_used: d(self.prefetch_used, before.prefetch_used),
            prefetch_wasted: d(self.prefetch_wasted, before.prefetch_wasted),
            preload_issued: d(self.preload_issued, before.preload_issued),
            preload_bytes: d(self.preload_bytes, before.preload_bytes),
            lent_bytes: self.lent_bytes,
            evictions: d(self.evictions, before.evictions),
            tokens: d(self.tokens, before.tokens),
            predicted: d(self.predicted, before.predicted),
            predicted_correct: d(self.predicted_correct, before.predicted_correct),
            predicted_actual: d(self.predicted_actual, before.predicted_actual),
            notes: self.notes.clone(),
        }
    }
}

fn frac(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl std::fmt::Display for StoreStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mb = |b: f64| b / (1u64 << 20) as f64;
        writeln!(
            f,
            "expert cache: {} policy, {:.0} MiB budget = {} experts of {:.2} MiB; {} resident ({:.0} MiB)",
            self.policy,
            mb(self.budget_bytes as f64),
            self.capacity_experts,
            mb(self.expert_bytes as f64),
            self.resident_experts,
            mb(self.resident_bytes as f64)
        )?;
        writeln!(
            f,
            "requests {}: hit rate {:.1}% ({} ready, {} in flight, {} read on demand)",
            self.requests,
            100.0 * self.hit_rate(),
            self.hits,
            self.inflight_hits,
            self.misses
        )?;
        writeln!(
            f,
            "read {:.1} MiB in {} reads ({} direct, {} readers), {:.2} MiB/token, disk {:.2} GB/s while busy",
            mb(self.bytes_read as f64),
            self.reads,
            self.direct_reads,
            self.readers,
            mb(self.bytes_per_token()),
            self.disk_gbps()
        )?;
        writeln!(
            f,
            "waiting on reads {:.3} s; disk busy {:.3} s",
            self.wait_seconds, self.disk_busy_seconds
        )?;
        if self.lent_bytes > 0 {
            writeln!(
                f,
                "{:.0} MiB of the budget lent to the KV caches",
                mb(self.lent_bytes as f64)
            )?;
        }
        if self.prefetch_issued > 0 || self.predicted > 0 {
            writeln!(
                f,
                "prefetch: {} issued, {} used, {} evicted unused; prediction recall {:.1}%, precision {:.1}%",
                self.prefetch_issued,
                self.prefetch_used,
                self.prefetch_wasted,
                100.0 * self.prefetch_recall(),
                100.0 * self.prefetch_precision()
            )?;
        }
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        Ok(())
    }
}

impl ExpertStore {
    /// A store over `files` serving the experts of `specs[layer][expert]` (empty rows for
    /// layers without routed experts). `hist` holds earlier counts (it seeds frequency
    /// policies and picks pins); the store keeps counting into it.
    pub fn new(
        files: &[PathBuf],
        specs: &[Vec<ExpertSpec>],
        cfg: &StoreConfig,
        hist: UsageHistogram,
    ) -> Result<ExpertStore> {
        let mut disk = Vec::with_capacity(files.len());
        let mut notes = Vec::new();
        for path in files {
            let buffered = File::open(path).map_err(|e| Error::io(path, e))?;
            advise_random(&buffered);
            let direct = if cfg.direct {
                match open_direct(path) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        notes.push(format!(
                            "{}: direct I/O unavailable ({e}); using buffered reads with page-cache eviction",
                            path.display()
                        ));
                        None
                    }
                }
            } else {
                None
            };
            disk.push(DiskFile {
                path: path.clone(),
                buffered,
                direct,
                direct_ok: AtomicBool::new(true),
            });
        }
        let lens: Vec<u64> = disk
            .iter()
            .map(|f| {
                f.buffered
                    .metadata()
                    .map(|m| m.len())
                    .map_err(|e| Error::io(&f.path, e))
            })
            .collect::<Result<_>>()?;
        let mut plans = Vec::with_capacity(specs.len());
        let mut expert_bytes = 0u64;
        for (l, row) in specs.iter().enumerate() {
            let mut prow = Vec::with_capacity(row.len());
            for (e, spec) in row.iter().enumerate() {
                let p = ReadPlan::new(spec, &lens).map_err(|msg| Error::CorruptFile {
                    file: spec
                        .parts
                        .first()
                        .and_then(|p| files.get(p.file))
                        .cloned()
                        .unwrap_or_default(),
                    msg: format!("routed expert {e} of layer {l}: {msg}"),
                })?;
                expert_bytes = expert_bytes.max(p.len as u64);
                prow.push(Some(p));
            }
            plans.push(prow);
        }
        // The experts' bytes are read by us into our own buffers, never through the page
        // cache; whatever of them is cached now (the kernel's read-ahead when the loader read
        // the files' headers: 8 MB per file on the benchmark disk, 384 MB for a 48-layer
        // model, all charged to a memory cgroup) is dropped (clean pages not mapped by
        // anyone; nothing is lost).
        for plan in plans.iter().flatten().flatten() {
            for g in &plan.groups {
                drop_cached(&disk[g.file].buffered, g.start, g.end - g.start);
            }
        }
        let capacity = cfg.budget_bytes.checked_div(expert_bytes).unwrap_or(0) as usize;
        let experts = plans.iter().flatten().filter(|p| p.is_some()).count();
        let prefetch_slots = book::prefetch_slots(capacity, experts, cfg.prefetch_slots);
        let counts = hist.nonzero();
        let known = |k: &Key| {
            plans
                .get(k.layer as usize)
                .and_then(|r| r.get(k.expert as usize))
                .is_some_and(|p| p.is_some())
        };
        let user_pins: Vec<Key> = cfg.pins.iter().copied().filter(known).collect();
        let build = |cap| {
            policy::build(
                &cfg.policy,
                cap,
                Some(&counts),
                cfg.pin_share,
                cfg.requests_per_token,
            )
        };
        let policy_capacity = capacity - prefetch_slots;
        let policy: Box<dyn Policy> = if user_pins.is_empty() {
            build(policy_capacity)?
        } else {
            let mut err = None;
            let p = policy::Pinned::new(policy_capacity, &user_pins, |cap| {
                build(cap).unwrap_or_else(|e| {
                    err = Some(e);
                    Box::new(policy::Lru::new(cap))
                })
            });
            if let Some(e) = err {
                return Err(e);
            }
            Box::new(p)
        };
        let policy_name = policy.name();
        let readers = cfg.readers.max(1);
        let per_expert = plans
            .iter()
            .map(|row| vec![ExpertCounts::default(); row.len()])
            .collect();
        let shared = Arc::new(Shared {
            files: disk,
            plans,
            state: Mutex::new(State {
                book: CacheBook::new(policy, prefetch_slots),
                slots: HashMap::new(),
                lent_bytes: 0,
                resident_bytes: 0,
                hist,
                per_expert,
            }),
            jobs: Mutex::new(Jobs::default()),
            jobs_cv: Condvar::new(),
            c: Counters::default(),
            busy: Mutex::new(Busy::default()),
            expert_bytes,
            budget_bytes: cfg.budget_bytes,
            readers,
            notes: Mutex::new(notes),
        });
        let threads = (0..readers)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("colibri-reader-{i}"))
                    .spawn(move || reader_loop(&s))
                    .map_err(|e| Error::io("reader thread", e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ExpertStore {
            shared,
            user_pins,
            threads,
            policy_name,
            capacity,
        })
    }

    /// Experts the budget holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Lends `bytes` of the budget to memory that grows while the model runs (the KV
    /// caches): the cache shrinks to what is left, evicting in its policy's order, and
    /// grows back when the loan shrinks. Why: the budget is fixed at load, but a long
    /// generation's KV cache is not; without this the process outgrows budget + resident
    /// part and, inside a memory limit, the kernel starts reclaiming (measured: 1024 tokens
    /// of the olmoe shape's f32 KV cache, 260 MiB, pushed the 2 GiB run 0.8% past its
    /// bound).
    pub fn lend(&self, bytes: u64) {
        let s = &self.shared;
        let room = s.budget_bytes.saturating_sub(bytes);
        let cap = room.checked_div(s.expert_bytes).unwrap_or(0) as usize;
        let mut st = lock(&s.state);
        let want = cap.saturating_sub(st.book.prefetch_slots());
        let mut dropped = Vec::new();
        st.book.set_policy_capacity(want, &mut dropped);
        st.drop_slots(&dropped, &s.c);
        st.lent_bytes = bytes;
    }
    /// Bytes of the largest expert's buffer.
    pub fn expert_bytes(&self) -> u64 {
        self.shared.expert_bytes
    }
    pub fn policy_name(&self) -> &str {
        &self.policy_name
    }

    fn check_key(&self, key: Key) -> Result<()> {
        let ok = self
            .shared
            .plans
            .get(key.layer as usize)
            .and_then(|r| r.get(key.expert as usize))
            .is_some_and(|p| p.is_some());
        if ok {
            Ok(())
        } else {
            Err(Error::invalid(
                "expert",
                format!("{key} is not a routed expert of this store"),
            ))
        }
    }

    /// Requests an expert the forward pass needs now. Counts it in the statistics and the
    /// usage histogram; never blocks on I/O.
    pub fn request(&self, key: Key) -> Result<Ticket> {
        self.check_key(key)?;
        let s = &self.shared;
        s.c.requests.fetch_add(1, Ordering::Relaxed);
        let mut st = lock(&s.state);
        st.hist.add(key, 1);
        let mut dropped = Vec::new();
        let demand = st.book.demand(key, &mut dropped);
        st.drop_slots(&dropped, &s.c);
        if let Some(found) = demand.found {
            if found.speculative {
                s.c.prefetch_used.fetch_add(1, Ordering::Relaxed);
            }
            let ticket = match st
                .slots
                .get(&key)
                .expect("the book and the slots hold the same keys")
            {
                Slot::Ready(b) => {
                    s.c.hits.fetch_add(1, Ordering::Relaxed);
                    Ticket::Ready(b.clone())
                }
                Slot::Loading(p) => {
                    s.c.inflight_hits.fetch_add(1, Ordering::Relaxed);
                    let p = p.clone();
                    lock(&s.jobs).promote(&p);
                    Ticket::Wait(key, PendingHandle(p))
                }
            };
            // A staged prefetch the policy did not take is handed over once and dropped.
            if !st.book.contains(key) {
                if let Some(Slot::Ready(b)) = st.slots.remove(&key) {
                    st.resident_bytes -= b.size_bytes() as u64;
                }
            }
            let n = st.counts_mut(key);
            match ticket {
                Ticket::Ready(_) => n.hits += 1,
                Ticket::Wait(..) => n.inflight_hits += 1,
            }
            return Ok(ticket);
        }
        s.c.misses.fetch_add(1, Ordering::Relaxed);
        st.counts_mut(key).misses += 1;
        let p = Pending::new();
        if demand.kept {
            st.slots.insert(key, Slot::Loading(p.clone()));
        }
        drop(st);
        self.enqueue(
            Job {
                key,
                pending: p.clone(),
                preload: false,
            },
            Access::Demand,
            false,
        );
        Ok(Ticket::Wait(key, PendingHandle(p)))
    }

    /// Blocks until the ticket's expert is in RAM.
    pub fn wait(&self, t: Ticket) -> Result<Arc<ExpertBuf>> {
        match t {
            Ticket::Ready(b) => Ok(b),
            Ticket::Wait(_, h) => {
                let t0 = Instant::now();
                let r = h.0.wait();
                self.shared
                    .c
                    .wait_ns
                    .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                r.map_err(|(path, kind, msg)| Error::io(path, std::io::Error::new(kind, msg)))
            }
        }
    }

    /// Requests and waits: the expert's bytes.
    pub fn get(&self, key: Key) -> Result<Arc<ExpertBuf>> {
        let t = self.request(key)?;
        self.wait(t)
    }

    /// Queues reads of the experts of `layer` that are not resident, behind demand reads,
    /// likeliest first: once the cache is full, at most half the prefetch slots' worth per
    /// call (a prefill's prediction can name every expert of a layer; the rest would only
    /// push out the previous layer's before use). Never blocks; unknown experts are ignored.
    /// Returns how many reads were queued.
    pub fn prefetch(&self, layer: usize, experts: &[usize]) -> usize {
        self.speculate(experts.iter().map(|&e| Key::new(layer, e)), false)
    }

    /// Queues background reads (behind demand and prefetch reads) of `keys`, e.g. the pinned
    /// experts at start.
    pub fn preload(&self, keys: &[Key]) -> usize {
        self.speculate(keys.iter().copied(), true)
    }

    /// The hottest experts of `hist`, as many as the cache holds, hottest first: what
    /// [`ExpertStore::preload`] should fetch at start (a pinned policy's pins come first).
    pub fn preload_candidates(&self, hist: &UsageHistogram) -> Vec<Key> {
        let cap = lock(&self.shared.state).book.policy().capacity();
        let mut keys: Vec<Key> = self.user_pins.iter().copied().take(cap).collect();
        for k in policy::hottest(&hist.nonzero(), cap) {
            if keys.len() >= cap {
                break;
            }
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    fn speculate(&self, keys: impl Iterator<Item = Key>, background: bool) -> usize {
        let s = &self.shared;
        let mut queued = Vec::new();
        {
            let mut st = lock(&s.state);
            let mut read = Vec::new();
            let mut dropped = Vec::new();
            let keys = keys.filter(|&k| self.check_key(k).is_ok());
            st.book.speculate(keys, background, &mut read, &mut dropped);
            st.drop_slots(&dropped, &s.c);
            for key in read {
                let p = Pending::new();
                st.slots.insert(key, Slot::Loading(p.clone()));
                queued.push(Job {
                    key,
                    pending: p,
                    preload: background,
                });
            }
        }
        let n = queued.len() as u64;
        let counter = if background {
            &s.c.preload_issued
        } else {
            &s.c.prefetch_issued
        };
        counter.fetch_add(n, Ordering::Relaxed);
        for j in queued {
            self.enqueue(j, Access::Prefetch, background);
        }
        n as usize
    }

    fn enqueue(&self, job: Job, kind: Access, background: bool) {
        let mut q = lock(&self.shared.jobs);
        match (kind, background) {
            (Access::Demand, _) => q.demand.push_back(job),
            (Access::Prefetch, false) => q.prefetch.push_back(job),
            (Access::Prefetch, true) => q.background.push_back(job),
        }
        drop(q);
        self.shared.jobs_cv.notify_one();
    }

    /// Tokens counted so far.
    pub fn tokens(&self) -> u64 {
        self.shared.c.tokens.load(Ordering::Relaxed)
    }

    /// Counts generated or prefilled tokens, for bytes per token.
    pub fn note_tokens(&self, n: u64) {
        self.shared.c.tokens.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one layer's prediction against what the router then chose.
    pub fn note_prediction(&self, predicted: u64, correct: u64, actual: u64) {
        let c = &self.shared.c;
        c.predicted.fetch_add(predicted, Ordering::Relaxed);
        c.predicted_correct.fetch_add(correct, Ordering::Relaxed);
        c.predicted_actual.fetch_add(actual, Ordering::Relaxed);
    }

    /// Whether `key` is resident or being read.
    pub fn contains(&self, key: Key) -> bool {
        lock(&self.shared.state).slots.contains_key(&key)
    }

    /// Every expert the cache holds now, with whether its bytes are ready (false: a read is
    /// in flight), in no particular order. For a live view of the cache (`coli web`); one
    /// pass over the entries under the state lock.
    pub fn residency(&self) -> Vec<(Key, bool)> {
        lock(&self.shared.state)
            .slots
            .iter()
            .map(|(k, s)| (*k, matches!(s, Slot::Ready(_))))
            .collect()
    }

    /// A copy of the usage histogram (earlier runs plus this one).
    pub fn histogram(&self) -> UsageHistogram {
        lock(&self.shared.state).hist.clone()
    }

    pub fn save_histogram(&self, path: &Path) -> Result<()> {
        self.histogram().save(path)
    }

    /// Per-expert outcomes of the demand requests since the store started (not the
    /// persisted history: see [`ExpertStore::histogram`]), for every expert requested at
    /// least once, in (layer, expert) order. They add up to the `hits`, `inflight_hits` and
    /// `misses` of [`ExpertStore::stats`].
    pub fn expert_counts(&self) -> Vec<(Key, ExpertCounts)> {
        let st = lock(&self.shared.state);
        let mut out = Vec::new();
        for (l, row) in st.per_expert.iter().enumerate() {
            for (e, c) in row.iter().enumerate() {
                if *c != ExpertCounts::default() {
                    out.push((Key::new(l, e), *c));
                }
            }
        }
        out
    }

    pub fn stats(&self) -> StoreStats {
        let s = &self.shared;
        let c = &s.c;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (resident_experts, resident_bytes, lent_bytes) = {
            let st = lock(&s.state);
            let ready = st
                .slots
                .values()
                .filter(|s| matches!(s, Slot::Ready(_)))
                .count();
            (ready, st.resident_bytes, st.lent_bytes)
        };
        let busy = {
            let b = lock(&s.busy);
            b.ns + b.since.map_or(0, |t| t.elapsed().as_nanos() as u64)
        };
        StoreStats {
            policy: self.policy_name.clone(),
            budget_bytes: s.budget_bytes,
            expert_bytes: s.expert_bytes,
            capacity_experts: self.capacity,
            resident_experts,
            resident_bytes,
            readers: s.readers,
            requests: g(&c.requests),
            hits: g(&c.hits),
            inflight_hits: g(&c.inflight_hits),
            misses: g(&c.misses),
            bytes_read: g(&c.bytes_read),
            reads: g(&c.reads),
            direct_reads: g(&c.direct_reads),
            read_errors: g(&c.read_errors),
            read_seconds: g(&c.read_ns) as f64 * 1e-9,
            disk_busy_seconds: busy as f64 * 1e-9,
            wait_seconds: g(&c.wait_ns) as f64 * 1e-9,
            prefetch_issued: g(&c.prefetch_issued),
            prefetch_used: g(&c.prefetch_used),
            prefetch_wasted: g(&c.prefetch_wasted),
            preload_issued: g(&c.preload_issued),
            preload_bytes: g(&c.preload_bytes),
            lent_bytes,
            evictions: g(&c.evictions),
            tokens: g(&c.tokens),
            predicted: g(&c.predicted),
            predicted_correct: g(&c.predicted_correct),
            predicted_actual: g(&c.predicted_actual),
            notes: lock(&s.notes).clone(),
        }
    }
}

impl Drop for ExpertStore {
    fn drop(&mut self) {
        lock(&self.shared.jobs).shutdown = true;
        self.shared.jobs_cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn reader_loop(s: &Shared) {
    loop {
        let job = {
            let mut q = lock(&s.jobs);
            loop {
                if q.shutdown {
                    // Nobody will read these; wake anyone still holding a ticket.
                    while let Some(j) = q.pop() {
                        j.pending.complete(Err((
                            PathBuf::new(),
                            std::io::ErrorKind::Interrupted,
                            "the expert store was shut down".into(),
                        )));
                    }
                    return;
                }
                if let Some(j) = q.pop() {
                    break j;
                }
                q = s.jobs_cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        {
            // A speculative read whose entry was evicted before it started, and that nobody
            // waits for, is skipped. (Tickets are only handed out under the state lock.)
            let st = lock(&s.state);
            let live = matches!(st.slots.get(&job.key), Some(Slot::Loading(p)) if Arc::ptr_eq(p, &job.pending));
            if !live && Arc::strong_count(&job.pending) == 1 {
                continue;
            }
        }
        let r: ReadResult = s.read(job.key).map(|(buf, bytes)| {
            if job.preload {
                s.c.preload_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Arc::new(buf)
        });
        {
            // The cache first, then the waiters: whoever wakes up sees the final state.
            let mut st = lock(&s.state);
            let live = matches!(st.slots.get(&job.key), Some(Slot::Loading(p)) if Arc::ptr_eq(p, &job.pending));
            if live {
                match &r {
                    Ok(buf) => {
                        st.resident_bytes += buf.size_bytes() as u64;
                        *st.slots.get_mut(&job.key).expect("live") = Slot::Ready(buf.clone());
                    }
                    Err(_) => {
                        st.slots.remove(&job.key);
                        st.book.remove(job.key);
                    }
                }
            }
        }
        job.pending.complete(r);
    }
}

impl Shared {
    fn read(
        &self,
        key: Key,
    ) -> std::result::Result<(ExpertBuf, u64), (PathBuf, std::io::ErrorKind, String)> {
        let plan = self.plans[key.layer as usize][key.expert as usize]
            .as_ref()
            .expect("keys are checked before they are queued");
        let fail = |path: &Path, e: std::io::Error| {
            self.c.read_errors.fetch_add(1, Ordering::Relaxed);
            (
                path.to_path_buf(),
                e.kind(),
                format!("reading routed expert {key}: {e}"),
            )
        };
        let mut buf = AlignedBuf::new(plan.len).map_err(|e| fail(Path::new("expert buffer"), e))?;
        self.busy_start();
        let t0 = Instant::now();
        let mut result = Ok(());
        let mut bytes = 0;
        for g in &plan.groups {
            let f = &self.files[g.file];
            match self.read_group(f, g, &mut buf) {
                Ok(n) => bytes += n,
                Err(e) => {
                    result = Err(fail(&f.path, e));
                    break;
                }
            }
        }
        self.c
            .read_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.busy_end();
        result?;
        self.c.reads.fetch_add(1, Ordering::Relaxed);
        Ok((
            ExpertBuf {
                buf,
                parts: plan.parts.clone(),
            },
            bytes,
        ))
    }

    /// Reads one group; returns the bytes read from the file.
    fn read_group(
        &self,
        f: &DiskFile,
        g: &ReadGroup,
        buf: &mut AlignedBuf,
    ) -> std::io::Result<u64> {
        let a0 = align_down(g.start);
        let a1 = align_up(g.end);
        if let Some(d) = f
            .direct
            .as_ref()
            .filter(|_| f.direct_ok.load(Ordering::Relaxed))
        {
            let dst = &mut buf.as_mut_full()[g.buf_off..g.buf_off + (a1 - a0) as usize];
            match read_fully(d, dst, a0, (g.end - a0) as usize) {
                Ok(()) => {
                    self.c.direct_reads.fetch_add(1, Ordering::Relaxed);
                    self.c.bytes_read.fetch_add(a1 - a0, Ordering::Relaxed);
                    return Ok(a1 - a0);
                }
                Err(e) if e.raw_os_error() == Some(EINVAL) => {
                    f.direct_ok.store(false, Ordering::Relaxed);
                    lock(&self.notes).push(format!(
                        "{}: direct reads refused ({e}); using buffered reads with page-cache eviction",
                        f.path.display()
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        let off = g.buf_off + (g.start - a0) as usize;
        let n = (g.end - g.start) as usize;
        read_fully(
            &f.buffered,
            &mut buf.as_mut_full()[off..off + n],
            g.start,
            n,
        )?;
        drop_cached(&f.buffered, g.start, n as u64);
        self.c.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n as u64)
    }

    fn busy_start(&self) {
        let mut b = lock(&self.busy);
        if b.active == 0 {
            b.since = Some(Instant::now());
        }
        b.active += 1;
    }

    fn busy_end(&self) {
        let mut b = lock(&self.busy);
        b.active -= 1;
        if b.active == 0 {
            if let Some(t) = b.since.take() {
                b.ns += t.elapsed().as_nanos() as u64;
            }
        }
    }
}

#[cfg(unix)]
const EINVAL: i32 = libc::EINVAL;
#[cfg(not(unix))]
const EINVAL: i32 = 22;

/// Reads into `dst` from `offset` until at least `need` bytes are in (direct reads ask for
/// whole blocks and may get fewer at the end of the file).
fn read_fully(f: &File, dst: &mut [u8], offset: u64, need: usize) -> std::io::Result<()> {
    let mut got = 0usize;
    while got < need {
        match read_at(f, &mut dst[got..], offset + got as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ends {} bytes into a {need}-byte read at {offset}",
                        got
                    ),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, offset)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, offset)
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(target_os = "macos")]
fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn open_direct(_path: &Path) -> std::io::Result<File> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "not on this platform",
    ))
}

/// Turns off the kernel's read-ahead for this descriptor.
fn advise_random(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: advisory call on a descriptor we own; failure only loses the hint.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
    }
    let _ = f;
}

/// Drops the page-cache copy of bytes just read: the expert cache holds them already.
fn drop_cached(f: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: advisory call on a descriptor we own; failure only loses the hint.
        unsafe {
            libc::posix_fadvise(
                f.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    let _ = (f, offset, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file whose byte at offset `i` is `f(i)`, in a temp folder on disk (not tmpfs when
    /// the target folder is on disk; O_DIRECT falls back to buffered otherwise).
    fn make_file(dir: &Path, len: usize) -> PathBuf {
        let p = dir.join("experts.bin");
        let mut f = File::create(&p).unwrap();
        let bytes: Vec<u8> = (0..len).map(pattern).collect();
        f.write_all(&bytes).unwrap();
        p
    }

    fn pattern(i: usize) -> u8 {
        (i.wrapping_mul(2654435761) >> 13) as u8
    }

    fn test_dir() -> tempfile::TempDir {
        // target/ is on the real disk in this workspace, where O_DIRECT works; /tmp may be
        // tmpfs. Either way the store must work (falling back to buffered reads).
        let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
        std::fs::create_dir_all(&base).ok();
        tempfile::tempdir_in(&base).unwrap_or_else(|_| tempfile::tempdir().unwrap())
    }

    /// `layers × experts` experts; each is three parts at unaligned offsets, like a Hub
    /// checkpoint, with a gap between experts.
    fn specs(layers: usize, experts: usize, part: u64) -> (Vec<Vec<ExpertSpec>>, usize) {
        let mut off = 100u64;
        let mut all = Vec::new();
        for _ in 0..layers {
            let mut row = Vec::new();
            for _ in 0..experts {
                let parts = (0..3)
                    .map(|i| {
                        let e = Extent {
                            file: 0,
                            offset: off,
                            len: part + i,
                        };
                        off += part + i + 8;
                        e
                    })
                    .collect();
                off += 5000;
                row.push(ExpertSpec { parts });
            }
            all.push(row);
        }
        (all, off as usize + 10)
    }

    fn check(buf: &ExpertBuf, spec: &ExpertSpec) {
        for (i, p) in spec.parts.iter().enumerate() {
            let got = buf.part(i);
            assert_eq!(got.len() as u64, p.len);
            for (j, &b) in got.iter().enumerate() {
                assert_eq!(b, pattern(p.offset as usize + j), "part {i} byte {j}");
            }
        }
    }

    /// A store whose budget holds `n` experts.
    fn open(
        path: &Path,
        specs: &[Vec<ExpertSpec>],
        n: u64,
        direct: bool,
        readers: usize,
        policy: &str,
        hist: UsageHistogram,
    ) -> ExpertStore {
        let probe = ExpertStore::new(
            &[path.to_path_buf()],
            specs,
            &cfg(0, 1, false, 1, "lru"),
            hist.clone(),
        )
        .unwrap();
        let eb = probe.expert_bytes();
        drop(probe);
        let st = ExpertStore::new(
            &[path.to_path_buf()],
            specs,
            &cfg(n, eb, direct, readers, policy),
            hist,
        )
        .unwrap();
        assert_eq!(st.capacity() as u64, n);
        st
    }

    fn cfg(
        budget_experts: u64,
        expert_bytes: u64,
        direct: bool,
        readers: usize,
        policy: &str,
    ) -> StoreConfig {
        StoreConfig {
            budget_bytes: budget_experts * expert_bytes,
            policy: policy.into(),
            pin_share: 0.5,
            readers,
            direct,
            requests_per_token: 1,
            pins: Vec::new(),
            prefetch_slots: 0,
        }
    }

    #[test]
    fn plan_merges_close_parts_and_aligns_groups() {
        let spec = ExpertSpec {
            parts: vec![
                Extent {
                    file: 0,
                    offset: 10_000,
                    len: 100,
                },
                Extent {
                    file: 0,
                    offset: 5000,
                    len: 100,
                },
                Extent {
                    file: 1,
                    offset: 0,
                    len: 4096,
                },
                Extent {
                    file: 0,
                    offset: 1 << 20,
                    len: 10,
                },
            ],
        };
        let p = ReadPlan::new(&spec, &[2 << 20, 4096]).unwrap();
        assert_eq!(p.groups.len(), 3);
        assert_eq!((p.groups[0].start, p.groups[0].end), (5000, 10_100));
        assert!(p.groups.iter().all(|g| g.buf_off % ALIGN == 0));
        // part 1 (offset 5000) is 5000 - 4096 = 904 bytes into the first group's buffer.
        assert_eq!(p.parts[1], 904..1004);
        assert_eq!(p.parts[0], 904 + 5000..904 + 5100);
        assert!(
            ReadPlan::new(&spec, &[2 << 20, 100]).is_err(),
            "past the end of file 1"
        );
    }

    /// `residency` lists exactly the experts the cache holds, ready once their reads are
    /// done, and drops an evicted one.
    #[test]
    fn residency_lists_what_the_cache_holds() {
        let dir = test_dir();
        let (sp, len) = specs(2, 3, 3000);
        let path = make_file(dir.path(), len);
        let st = open(&path, &sp, 2, false, 1, "lru", UsageHistogram::new(2, 3));
        assert!(st.residency().is_empty());
        st.get(Key::new(0, 1)).unwrap();
        st.get(Key::new(1, 2)).unwrap();
        let mut r = st.residency();
        r.sort();
        assert_eq!(r, vec![(Key::new(0, 1), true), (Key::new(1, 2), true)]);
        // A third expert evicts the least recently used one (L0/E1).
        st.get(Key::new(1, 0)).unwrap();
        let mut r = st.residency();
        r.sort();
        assert_eq!(r, vec![(Key::new(1, 0), true), (Key::new(1, 2), true)]);
        assert_eq!(st.stats().resident_experts, r.len());
    }

    /// Every policy, both I/O modes and several reader counts return the right bytes, and
    /// the cache holds no more than the budget.
    #[test]
    fn reads_right_bytes_under_a_tiny_budget() {
        let dir = test_dir();
        let (specs, len) = specs(3, 6, 3000);
        let path = make_file(dir.path(), len);
        for direct in [true, false] {
            for readers in [1, 4] {
                for policy in ["lru", "lfu-admit", "arc", "pinned-lru"] {
                    let store = open(
                        &path,
                        &specs,
                        2,
                        direct,
                        readers,
                        policy,
                        UsageHistogram::new(3, 6),
                    );
                    let eb = store.expert_bytes();
                    for round in 0..3 {
                        for (l, row) in specs.iter().enumerate() {
                            // Issue the whole layer first, then wait: reads overlap.
                            let tickets: Vec<_> = (0..6)
                                .map(|e| store.request(Key::new(l, (e + round) % 6)).unwrap())
                                .collect();
                            for (e, t) in tickets.into_iter().enumerate() {
                                let b = store.wait(t).unwrap();
                                check(&b, &row[(e + round) % 6]);
                            }
                        }
                        let st = store.stats();
                        assert!(st.resident_experts <= 2, "{policy}: {st}");
                        assert!(st.resident_bytes <= 2 * eb, "{policy}: {st}");
                    }
                    let st = store.stats();
                    assert_eq!(st.requests, 3 * 3 * 6);
                    assert_eq!(st.hits + st.inflight_hits + st.misses, st.requests);
                    assert!(
                        st.misses >= st.requests - 2 * 3,
                        "{policy}: a 2-expert cache cannot hit much"
                    );
                    if !direct {
                        assert_eq!(st.direct_reads, 0);
                    }
                    if direct && st.direct_reads == 0 {
                        // tmpfs and friends: the store said why.
                        assert!(!st.notes.is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn a_large_budget_serves_repeats_from_ram() {
        let dir = test_dir();
        let (specs, len) = specs(2, 4, 5000);
        let path = make_file(dir.path(), len);
        let store = ExpertStore::new(
            &[path],
            &specs,
            &cfg(100, 1 << 20, true, 2, "lru"),
            UsageHistogram::new(2, 4),
        )
        .unwrap();
        for _ in 0..3 {
            for (l, row) in specs.iter().enumerate() {
                for (e, spec) in row.iter().enumerate() {
                    check(&store.get(Key::new(l, e)).unwrap(), spec);
                }
            }
        }
        let st = store.stats();
        assert_eq!((st.requests, st.misses, st.hits), (24, 8, 16));
        assert_eq!(st.resident_experts, 8);
        let h = store.histogram();
        assert_eq!(h.get(Key::new(1, 3)), 3);
        assert_eq!(h.total(), 24);
    }

    #[test]
    fn per_expert_counts_add_up_to_the_totals_and_since_subtracts() {
        let dir = test_dir();
        let (specs, len) = specs(2, 4, 5000);
        let path = make_file(dir.path(), len);
        let store = open(&path, &specs, 2, true, 2, "lru", UsageHistogram::new(2, 4));
        let before = store.stats();
        // Layer 0: experts 0, 1, 0, 0 (one miss each, then hits); layer 1: 3 twice; a
        // prefetched expert demanded counts as a hit of some kind (ready or in flight).
        for e in [0, 1, 0, 0] {
            store.get(Key::new(0, e)).unwrap();
        }
        for _ in 0..2 {
            store.get(Key::new(1, 3)).unwrap();
        }
        store.prefetch(1, &[2]);
        store.get(Key::new(1, 2)).unwrap();
        let st = store.stats();
        let counts = store.expert_counts();
        let keys: Vec<Key> = counts.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                Key::new(0, 0),
                Key::new(0, 1),
                Key::new(1, 2),
                Key::new(1, 3)
            ]
        );
        let get = |k: Key| counts.iter().find(|(x, _)| *x == k).unwrap().1;
        assert_eq!(get(Key::new(0, 1)).misses, 1);
        assert_eq!(get(Key::new(1, 2)).misses, 0);
        let sum = |f: fn(&ExpertCounts) -> u64| counts.iter().map(|(_, c)| f(c)).sum::<u64>();
        assert_eq!(sum(|c| c.hits), st.hits);
        assert_eq!(sum(|c| c.inflight_hits), st.inflight_hits);
        assert_eq!(sum(|c| c.misses), st.misses);
        assert_eq!(st.requests, 7);
        let d = st.since(&before);
        assert_eq!(d, st, "nothing happened before: the delta is the whole");
        let later = store.stats();
        store.get(Key::new(0, 1)).unwrap();
        let d = store.stats().since(&later);
        assert_eq!((d.requests, d.tokens, d.prefetch_issued), (1, 0, 0));
        assert_eq!(d.hits + d.inflight_hits + d.misses, 1);
        assert_eq!(d.capacity_experts, 2);
    }

    #[test]
    fn prefetch_then_demand_is_a_hit_and_counts_as_used() {
        let dir = test_dir();
        let (specs, len) = specs(2, 4, 5000);
        let path = make_file(dir.path(), len);
        let store = ExpertStore::new(
            &[path],
            &specs,
            &cfg(100, 1 << 20, false, 2, "lru"),
            UsageHistogram::new(2, 4),
        )
        .unwrap();
        assert_eq!(
            store.prefetch(1, &[0, 2, 99]),
            2,
            "the unknown expert is ignored"
        );
        assert_eq!(store.prefetch(1, &[0]), 0, "already queued");
        check(&store.get(Key::new(1, 2)).unwrap(), &specs[1][2]);
        let st = store.stats();
        assert_eq!(st.misses, 0);
        assert_eq!(st.hits + st.inflight_hits, 1);
        assert_eq!((st.prefetch_issued, st.prefetch_used), (2, 1));
        // Both speculative reads finish and stay.
        for _ in 0..200 {
            if store.stats().resident_experts == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(store.stats().resident_experts, 2);
    }

    /// The simulator runs the store's bookkeeping: replaying a trace through the live store
    /// (real reads from a file, prefetch calls with the modelled predictor's guesses) gives
    /// the simulator's hits, misses and prefetches exactly, for several policies, with and
    /// without prefetch, with a many-row (prefill) step among the decode steps.
    #[test]
    fn store_and_simulator_agree_on_a_replay() {
        use super::super::sim::{predict, simulate_with, PrefetchModel, SimOptions};
        use super::super::trace::{Trace, TraceStep};
        let (layers, experts, top_k) = (4, 16, 2);
        let mut trace = Trace::synthetic(layers, experts, top_k, 120, 0.8, 0.3, 5);
        // The first eight tokens as one prompt step of eight rows.
        let prompt: Vec<TraceStep> = trace.steps.drain(..8).collect();
        trace.steps.insert(
            0,
            TraceStep {
                rows: 8,
                layers: (0..layers)
                    .map(|l| super::super::trace::LayerRoutes {
                        layer: l,
                        experts: prompt
                            .iter()
                            .map(|s| s.layers[l].experts[0].clone())
                            .collect(),
                        weights: Vec::new(),
                    })
                    .collect(),
            },
        );
        let dir = test_dir();
        let (specs, len) = specs(layers, experts, 3000);
        let path = make_file(dir.path(), len);
        let per_token = layers * top_k;
        for policy in ["lrfu-auto", "lru", "lfu-admit", "arc", "lrfu:8"] {
            for recall in [None, Some(0.8)] {
                let cap = 20;
                let slots = recall.map_or(0, |_| super::book::prefetch_slots(cap, 64, 2 * top_k));
                let mut c = cfg(cap as u64, 1, false, 2, policy);
                let probe = open(
                    &path,
                    &specs,
                    1,
                    false,
                    1,
                    "lru",
                    UsageHistogram::new(4, 16),
                );
                c.budget_bytes = cap as u64 * probe.expert_bytes();
                drop(probe);
                c.requests_per_token = per_token;
                c.prefetch_slots = slots;
                let store = ExpertStore::new(
                    std::slice::from_ref(&path),
                    &specs,
                    &c,
                    UsageHistogram::new(4, 16),
                )
                .unwrap();
                let model = recall.map(|r| PrefetchModel {
                    recall: r,
                    slots,
                    seed: 9,
                });
                let mut rng = crate::sample::Xoshiro256::seed_from_u64(9);
                for step in &trace.steps {
                    for (li, layer) in step.layers.iter().enumerate() {
                        if let (Some(m), Some(next)) = (model, step.layers.get(li + 1)) {
                            let guess = predict(next, experts, m.recall, &mut rng);
                            let guess: Vec<usize> = guess.iter().map(|&e| e as usize).collect();
                            store.prefetch(next.layer, &guess);
                        }
                        for e in layer.unique() {
                            store.get(Key::new(layer.layer, e as usize)).unwrap();
                        }
                    }
                }
                let p = policy::build(policy, cap - slots, None, 0.5, per_token).unwrap();
                let opts = SimOptions {
                    prefetch: model,
                    preload: Vec::new(),
                };
                let sim = simulate_with(&trace, p, &opts);
                let st = store.stats();
                let what = format!("{policy}, prefetch {recall:?}");
                assert_eq!(st.requests, sim.requests, "{what}");
                assert_eq!(st.hits + st.inflight_hits, sim.hits, "{what}");
                assert_eq!(st.misses, sim.misses(), "{what}");
                assert_eq!(st.prefetch_issued, sim.prefetch_reads, "{what}");
                assert_eq!(st.prefetch_used, sim.prefetch_used, "{what}");
                // A prefetch dropped before its read started is skipped: never more reads.
                assert!(st.reads <= sim.reads(), "{what}");
                if recall.is_none() {
                    assert_eq!(st.reads, sim.reads(), "{what}");
                    assert!(sim.hits > 0 && sim.misses() > 0, "{what}");
                } else {
                    assert!(sim.prefetch_used > 0, "{what}");
                }
            }
        }
    }

    /// Prefetched experts wait outside the policy: misses in between do not evict them
    /// (a frequency policy ranks a never-used expert lowest), the oldest unused one goes
    /// when the slots are full, and the memory accounting stays exact.
    #[test]
    fn staged_prefetch_survives_misses_and_the_oldest_unused_goes() {
        let dir = test_dir();
        let (specs, len) = specs(2, 12, 5000);
        let path = make_file(dir.path(), len);
        let probe = open(
            &path,
            &specs,
            1,
            false,
            1,
            "lru",
            UsageHistogram::new(2, 12),
        );
        let eb = probe.expert_bytes();
        drop(probe);
        let mut c = cfg(16, eb, false, 2, "lrfu:1000");
        c.prefetch_slots = 4;
        let store = ExpertStore::new(&[path], &specs, &c, UsageHistogram::new(2, 12)).unwrap();
        assert_eq!(store.capacity(), 16);
        // Twelve frequently used experts fill the policy's share (16 - 4 slots).
        for _ in 0..3 {
            for e in 0..12 {
                store.get(Key::new(0, e)).unwrap();
            }
        }
        assert_eq!(store.prefetch(1, &[3, 5]), 2);
        // Two misses: each evicts from the policy's share, never a staged prefetch.
        store.get(Key::new(1, 8)).unwrap();
        store.get(Key::new(1, 9)).unwrap();
        let misses = store.stats().misses;
        check(&store.get(Key::new(1, 3)).unwrap(), &specs[1][3]);
        let st = store.stats();
        assert_eq!(st.misses, misses, "the staged prefetch was used");
        assert_eq!(st.prefetch_used, 1);
        // [5] staged; 6, 7, 10, 11 come in: the slots hold 4, so 5 (never used) goes.
        assert_eq!(store.prefetch(1, &[6, 7]), 2);
        assert_eq!(store.prefetch(1, &[10, 11]), 2);
        assert_eq!(store.stats().prefetch_wasted, 1);
        assert!(!store.contains(Key::new(1, 5)));
        check(&store.get(Key::new(1, 5)).unwrap(), &specs[1][5]);
        assert_eq!(store.stats().misses, misses + 1);
        // At most half the slots per call, likeliest (first named) first: 6 is staged
        // already, 0 and 1 go in, 2 is not read.
        assert_eq!(store.prefetch(1, &[6, 0, 1, 2]), 2);
        assert!(store.contains(Key::new(1, 0)) && store.contains(Key::new(1, 1)));
        assert!(!store.contains(Key::new(1, 2)));
        // Once every read is done: the bytes held are the ready entries', within the budget.
        for _ in 0..200 {
            let st = store.stats();
            if st.resident_experts == 16 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let st = store.stats();
        assert!(st.resident_bytes <= st.resident_experts as u64 * eb);
        assert!(st.resident_experts <= 16, "{}", st.resident_experts);
    }

    #[test]
    fn lending_budget_shrinks_and_regrows_the_cache() {
        let dir = test_dir();
        let (specs, len) = specs(1, 8, 5000);
        let path = make_file(dir.path(), len);
        let store = open(&path, &specs, 6, false, 2, "lru", UsageHistogram::new(1, 8));
        let eb = store.expert_bytes();
        for e in 0..6 {
            store.get(Key::new(0, e)).unwrap();
        }
        // (Buffers are whole pages: `eb` is the largest.)
        let full = store.stats().resident_bytes;
        assert!(full > 5 * eb && full <= 6 * eb);
        // Two and a half experts' worth lent: three go, the least recent first.
        store.lend(2 * eb + eb / 2);
        let st = store.stats();
        assert_eq!(st.resident_experts, 3);
        assert!(st.resident_bytes <= 3 * eb);
        assert!((0..3).all(|e| !store.contains(Key::new(0, e))));
        assert!((3..6).all(|e| store.contains(Key::new(0, e))));
        // The cache stays at three while the loan lasts...
        store.get(Key::new(0, 6)).unwrap();
        assert_eq!(store.stats().resident_experts, 3);
        // ...and holds six again once it is repaid; the bytes are still right.
        store.lend(0);
        for e in [0, 1, 2] {
            store.get(Key::new(0, e)).unwrap();
        }
        let st = store.stats();
        assert_eq!(st.resident_experts, 6);
        assert!(st.resident_bytes > 5 * eb && st.resident_bytes <= 6 * eb);
        // More than the budget: nothing is kept, and experts are still served.
        store.lend(u64::MAX);
        check(&store.get(Key::new(0, 7)).unwrap(), &specs[0][7]);
        assert_eq!(store.stats().resident_experts, 0);
    }

    #[test]
    fn preload_fills_without_counting_requests() {
        let dir = test_dir();
        let (specs, len) = specs(2, 4, 5000);
        let path = make_file(dir.path(), len);
        let mut hist = UsageHistogram::new(2, 4);
        hist.add(Key::new(0, 3), 10);
        hist.add(Key::new(1, 1), 5);
        let store = open(&path, &specs, 4, false, 1, "pinned-lru", hist.clone());
        let want = store.preload_candidates(&hist);
        assert_eq!(want, vec![Key::new(0, 3), Key::new(1, 1)]);
        assert_eq!(store.preload(&want), 2);
        check(&store.get(Key::new(0, 3)).unwrap(), &specs[0][3]);
        let st = store.stats();
        assert_eq!((st.requests, st.misses, st.preload_issued), (1, 0, 2));
        // The pins survive a sweep over everything else.
        for l in 0..2 {
            for e in 0..4 {
                store.get(Key::new(l, e)).unwrap();
            }
        }
        assert!(store.contains(Key::new(0, 3)) && store.contains(Key::new(1, 1)));
    }

    #[test]
    fn user_pins_survive_any_policy_and_are_preloaded_first() {
        let dir = test_dir();
        let (specs, len) = specs(2, 4, 5000);
        let path = make_file(dir.path(), len);
        let probe = open(&path, &specs, 3, false, 1, "lru", UsageHistogram::new(2, 4));
        let mut c = cfg(3, probe.expert_bytes(), false, 1, "lru");
        drop(probe);
        c.pins = vec![Key::new(1, 2), Key::new(9, 9)];
        let mut hist = UsageHistogram::new(2, 4);
        hist.add(Key::new(0, 0), 5);
        let store =
            ExpertStore::new(std::slice::from_ref(&path), &specs, &c, hist.clone()).unwrap();
        assert_eq!(store.policy_name(), "pinned-lru");
        assert_eq!(
            store.preload_candidates(&hist),
            vec![Key::new(1, 2), Key::new(0, 0)]
        );
        store.get(Key::new(1, 2)).unwrap();
        for _ in 0..2 {
            for l in 0..2 {
                for e in 0..4 {
                    store.get(Key::new(l, e)).unwrap();
                }
            }
        }
        assert!(store.contains(Key::new(1, 2)));
        assert_eq!(store.stats().resident_experts, 3);
    }

    #[test]
    fn preload_bytes_are_counted_apart() {
        let dir = test_dir();
        let (specs, len) = specs(1, 4, 5000);
        let path = make_file(dir.path(), len);
        let store = open(&path, &specs, 4, false, 1, "lru", UsageHistogram::new(1, 4));
        store.preload(&[Key::new(0, 1)]);
        store.get(Key::new(0, 3)).unwrap();
        for _ in 0..200 {
            if store.stats().resident_experts == 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let st = store.stats();
        assert!(
            st.preload_bytes > 0 && st.preload_bytes < st.bytes_read,
            "{st:?}"
        );
        assert_eq!(
            st.bytes_read,
            2 * st.preload_bytes,
            "two experts of equal size"
        );
    }

    #[test]
    fn bad_specs_and_keys_are_errors() {
        let dir = test_dir();
        let path = make_file(dir.path(), 1000);
        let bad = vec![vec![ExpertSpec {
            parts: vec![Extent {
                file: 0,
                offset: 900,
                len: 200,
            }],
        }]];
        let err = ExpertStore::new(
            std::slice::from_ref(&path),
            &bad,
            &StoreConfig::default(),
            UsageHistogram::new(1, 1),
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("past the end"), "{err}");
        let good = vec![vec![ExpertSpec {
            parts: vec![Extent {
                file: 0,
                offset: 0,
                len: 1000,
            }],
        }]];
        let store = ExpertStore::new(
            &[path],
            &good,
            &StoreConfig::default(),
            UsageHistogram::new(1, 1),
        )
        .unwrap();
        assert!(store.get(Key::new(0, 1)).is_err());
        assert!(store.get(Key::new(5, 0)).is_err());
        assert_eq!(store.capacity(), 0);
        // Capacity 0 still serves (nothing stays).
        assert_eq!(
            store.get(Key::new(0, 0)).unwrap().part(0)[..10],
            (0..10).map(pattern).collect::<Vec<_>>()[..]
        );
        assert_eq!(store.stats().resident_experts, 0);
    }

    #[test]
    fn a_file_truncated_underneath_is_an_error_not_a_hang() {
        let dir = test_dir();
        let path = make_file(dir.path(), 20_000);
        let specs = vec![vec![ExpertSpec {
            parts: vec![Extent {
                file: 0,
                offset: 10_000,
                len: 9000,
            }],
        }]];
        let store = ExpertStore::new(
            std::slice::from_ref(&path),
            &specs,
            &cfg(1, 1 << 20, false, 1, "lru"),
            UsageHistogram::new(1, 1),
        )
        .unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(12_000)
            .unwrap();
        let err = store.get(Key::new(0, 0)).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert_eq!(store.stats().read_errors, 1);
        assert!(!store.contains(Key::new(0, 0)));
    }
}
