//! Replays routing traces against cache policies and against Belady's offline optimum.
//!
//! The request sequence is the one the live store sees ([`Trace::requests`]): per forward
//! step, per MoE layer, each selected expert once. Belady's policy here may also decline to
//! keep an expert (bypass) when its next use is later than every resident one's, which is
//! the true optimum for a cache that, like ours, can hand an expert to the forward pass
//! without keeping it. No online policy can read fewer bytes on the same trace.

use super::policy::{Access, Policy};
use super::trace::Trace;
use super::Key;
use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    pub policy: String,
    pub capacity: usize,
    pub requests: u64,
    pub hits: u64,
    /// Bytes read (`misses × expert_bytes`).
    pub bytes: u64,
    pub tokens: usize,
    /// Per step: (rows, requests, hits), for hit rates over a window of tokens.
    pub per_step: Vec<(usize, u32, u32)>,
}

impl SimResult {
    pub fn misses(&self) -> u64 {
        self.requests - self.hits
    }
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.requests)
    }
    pub fn bytes_per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.bytes as f64 / self.tokens as f64
        }
    }
    /// Misses per token: what one token costs in expert reads.
    pub fn misses_per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.misses() as f64 / self.tokens as f64
        }
    }
    /// Hit rate over the steps that hold the first `tokens` tokens (whole steps).
    pub fn hit_rate_first_tokens(&self, tokens: usize) -> f64 {
        let (mut seen, mut req, mut hits) = (0usize, 0u64, 0u64);
        for &(rows, r, h) in &self.per_step {
            if seen >= tokens {
                break;
            }
            seen += rows;
            req += r as u64;
            hits += h as u64;
        }
        ratio(hits, req)
    }
    /// Hit rate over the steps after the first `tokens` tokens (the warm part).
    pub fn hit_rate_after_tokens(&self, tokens: usize) -> f64 {
        let (mut seen, mut req, mut hits) = (0usize, 0u64, 0u64);
        for &(rows, r, h) in &self.per_step {
            if seen >= tokens {
                req += r as u64;
                hits += h as u64;
            }
            seen += rows;
        }
        ratio(hits, req)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Replays `trace` through `policy` (which keeps whatever state it starts with: a seeded or
/// pinned policy simulates a start with a remembered histogram).
pub fn simulate(trace: &Trace, policy: &mut dyn Policy) -> SimResult {
    let mut res = SimResult {
        policy: policy.name(),
        capacity: policy.capacity(),
        requests: 0,
        hits: 0,
        bytes: 0,
        tokens: trace.tokens(),
        per_step: trace.steps.iter().map(|s| (s.rows, 0, 0)).collect(),
    };
    let mut evicted = Vec::new();
    for r in trace.requests() {
        evicted.clear();
        let hit = policy.access(r.key, Access::Demand, &mut evicted);
        res.requests += 1;
        res.per_step[r.step].1 += 1;
        if hit {
            res.hits += 1;
            res.per_step[r.step].2 += 1;
        } else {
            res.bytes += trace.expert_bytes;
        }
    }
    res
}

/// Belady's optimal replacement (with bypass) at `capacity` experts.
pub fn belady(trace: &Trace, capacity: usize) -> SimResult {
    let reqs = trace.requests();
    let keys: Vec<Key> = reqs.iter().map(|r| r.key).collect();
    let next = next_uses(&keys);
    let mut res = SimResult {
        policy: "belady".into(),
        capacity,
        requests: 0,
        hits: 0,
        bytes: 0,
        tokens: trace.tokens(),
        per_step: trace.steps.iter().map(|s| (s.rows, 0, 0)).collect(),
    };
    let hits = belady_hits(&keys, &next, capacity);
    for (r, hit) in reqs.iter().zip(hits) {
        res.requests += 1;
        res.per_step[r.step].1 += 1;
        if hit {
            res.hits += 1;
            res.per_step[r.step].2 += 1;
        } else {
            res.bytes += trace.expert_bytes;
        }
    }
    res
}

/// For each position, the position of the next request of the same key (`usize::MAX`: none).
pub fn next_uses(keys: &[Key]) -> Vec<usize> {
    let mut next = vec![usize::MAX; keys.len()];
    let mut last: HashMap<Key, usize> = HashMap::new();
    for i in (0..keys.len()).rev() {
        if let Some(&j) = last.get(&keys[i]) {
            next[i] = j;
        }
        last.insert(keys[i], i);
    }
    next
}

/// Per request, whether Belady's policy (evict, or do not keep, whatever is used furthest in
/// the future) hits.
pub fn belady_hits(keys: &[Key], next: &[usize], capacity: usize) -> Vec<bool> {
    let mut out = Vec::with_capacity(keys.len());
    let mut at: HashMap<Key, usize> = HashMap::new();
    let mut by_next: BTreeSet<(usize, Key)> = BTreeSet::new();
    for (i, &k) in keys.iter().enumerate() {
        if let Some(n) = at.get_mut(&k) {
            by_next.remove(&(*n, k));
            *n = next[i];
            by_next.insert((next[i], k));
            out.push(true);
            continue;
        }
        out.push(false);
        if capacity == 0 || next[i] == usize::MAX {
            continue;
        }
        if at.len() >= capacity {
            let &(far, v) = by_next.last().expect("a full cache is not empty");
            if far <= next[i] {
                continue; // keeping k would displace something needed sooner
            }
            by_next.pop_last();
            at.remove(&v);
        }
        at.insert(k, next[i]);
        by_next.insert((next[i], k));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::policy::{build, Lru};
    use super::super::trace::{LayerRoutes, TraceStep};
    use super::*;

    fn k(e: u32) -> Key {
        Key {
            layer: 0,
            expert: e,
        }
    }

    fn trace_of(seq: &[u32]) -> Trace {
        let mut t = Trace::new("seq", 1, 16, 1, 10);
        for &e in seq {
            t.steps.push(TraceStep {
                rows: 1,
                layers: vec![LayerRoutes {
                    layer: 0,
                    experts: vec![vec![e]],
                    weights: vec![],
                }],
            });
        }
        t
    }

    #[test]
    fn belady_on_known_sequences() {
        // The textbook example (capacity 3), 9 faults for OPT without bypass. With bypass
        // the one-off 4 and the final 7 are not kept, which saves the fault on 0 that
        // evicting it for 4 would cost: 8 faults (at 7 0 1 2 3 4 1 7).
        let seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];
        let keys: Vec<Key> = seq.iter().map(|&e| k(e)).collect();
        let hits = belady_hits(&keys, &next_uses(&keys), 3);
        let faults: Vec<usize> = (0..seq.len()).filter(|&i| !hits[i]).collect();
        assert_eq!(faults, vec![0, 1, 2, 3, 5, 7, 13, 17]);

        // A loop of 4 through a cache of 3: LRU never hits.
        let seq: Vec<u32> = (0..12).map(|i| i % 4).collect();
        let t = trace_of(&seq);
        let b = belady(&t, 3);
        let l = simulate(&t, &mut Lru::new(3));
        assert_eq!(l.hits, 0);
        // OPT: 0 1 2 cold, 3 bypassed (its next use is the furthest), 0 1 2 hit, 3 bypassed
        // again, 0 1 2 hit, 3 missed: 6 misses.
        assert_eq!(b.misses(), 6);
        assert_eq!(b.bytes, 60);
        assert!((b.hit_rate() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn belady_bypass_beats_forced_eviction() {
        // c = 1: 1 2 1 2 ... with a one-off 9 in the middle. Bypassing 9 keeps 1 (or 2).
        let seq = [1, 1, 9, 1, 1];
        let keys: Vec<Key> = seq.iter().map(|&e| k(e)).collect();
        let hits = belady_hits(&keys, &next_uses(&keys), 1);
        assert_eq!(hits, vec![false, true, false, true, true]);
    }

    #[test]
    fn belady_is_a_lower_bound_for_every_policy() {
        let t = Trace::synthetic(4, 32, 4, 300, 0.9, 0.3, 11);
        for cap in [8, 32, 64] {
            let b = belady(&t, cap);
            for name in ["lru", "lfu", "lfu-admit", "lrfu", "arc"] {
                let r = simulate(&t, build(name, cap, None, 0.0, 16).unwrap().as_mut());
                assert!(
                    r.misses() >= b.misses(),
                    "{name} at {cap}: {} < {}",
                    r.misses(),
                    b.misses()
                );
            }
        }
        // Capacity holding everything: only cold misses, for Belady and LRU alike.
        let all = 4 * 32;
        let b = belady(&t, all);
        let l = simulate(&t, &mut Lru::new(all));
        assert_eq!(b.misses(), l.misses());
        let distinct: std::collections::HashSet<Key> = t.requests().iter().map(|r| r.key).collect();
        assert_eq!(b.misses() as usize, distinct.len());
    }

    #[test]
    fn windows_of_tokens() {
        let t = trace_of(&[1, 1, 1, 1, 2, 2]);
        let r = simulate(&t, &mut Lru::new(1));
        assert_eq!(
            r.per_step.iter().map(|s| s.2).collect::<Vec<_>>(),
            vec![0, 1, 1, 1, 0, 1]
        );
        assert!((r.hit_rate_first_tokens(2) - 0.5).abs() < 1e-12);
        assert!((r.hit_rate_after_tokens(2) - 0.75).abs() < 1e-12);
        assert_eq!(r.tokens, 6);
        assert!((r.bytes_per_token() - 20.0 / 6.0).abs() < 1e-12);
    }
}
