//! The store's statistics: per-expert counts and the snapshot of counters and gauges.

use serde::Serialize;

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
