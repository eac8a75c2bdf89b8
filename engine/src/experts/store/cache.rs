//! [`ExpertStore`] itself: opening the files, requests, tickets, prefetch and preload, lending
//! budget to the KV caches, and the statistics' snapshot.

use super::config::{ExpertSpec, StoreConfig};
use super::direct_io::{advise_random, drop_cached, open_direct};
use super::readers::reader_loop;
use super::reads::ReadPlan;
use super::shared::{lock, Busy, Counters, DiskFile, Job, Jobs, Pending, Shared, Slot, State};
use super::stats::{ExpertCounts, StoreStats};
use crate::error::{Error, Result};
use crate::experts::book::{self, CacheBook};
use crate::experts::buf::ExpertBuf;
use crate::experts::hist::UsageHistogram;
use crate::experts::policy::{self, Access, Policy};
use crate::experts::Key;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

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
