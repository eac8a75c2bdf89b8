//! Replays routing traces against cache policies and against Belady's offline optimum.
//!
//! The request sequence is the one the live store sees ([`Trace::requests`]): per forward
//! step, per MoE layer, each selected expert once. Belady's policy here may also decline to
//! keep an expert (bypass) when its next use is later than every resident one's, which is
//! the true optimum for a cache that, like ours, can hand an expert to the forward pass
//! without keeping it. No online policy can read fewer bytes on the same trace.

use super::book::CacheBook;
use super::policy::Policy;
use super::trace::{LayerRoutes, Trace};
use super::Key;
use std::collections::{BTreeSet, HashMap};

#[derive(Clone, Debug, PartialEq)]
pub struct SimResult {
    pub policy: String,
    pub capacity: usize,
    pub requests: u64,
    pub hits: u64,
    /// Bytes read: demand misses and prefetches, `× expert_bytes`.
    pub bytes: u64,
    pub tokens: usize,
    /// Per step: (rows, requests, hits), for hit rates over a window of tokens.
    pub per_step: Vec<(usize, u32, u32)>,
    /// Prefetch reads (their bytes are in `bytes`) and how many were then demanded.
    pub prefetch_reads: u64,
    pub prefetch_used: u64,
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
    /// Expert reads: demand misses and prefetches.
    pub fn reads(&self) -> u64 {
        self.misses() + self.prefetch_reads
    }
    /// Reads per token: what one token costs in expert reads.
    pub fn reads_per_token(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            self.reads() as f64 / self.tokens as f64
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

/// How the simulated store runs, beyond its policy.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// Prefetch on a prediction of the next layer's experts (off: `None`).
    pub prefetch: Option<PrefetchModel>,
    /// Preloaded in the background before the first step (a start with a usage history:
    /// its hottest experts), in this order.
    pub preload: Vec<Key>,
}

/// The store's prefetch as the simulator models it. A trace records what the routers chose,
/// not what the predictor guessed, so the guess is made from the truth: of the experts a
/// row is routed to in the next layer, each is missed with probability `1 - recall`, the
/// misses falling on the row's lightest experts, each replaced by a wrong expert of the same
/// weight (a real predictor names `top_k` per row too). The predictions of a step's rows are merged heaviest first, as
/// `experts::stream::Predictor` does, and handed to the same [`CacheBook`] the store uses,
/// so prefetch slots, their half-per-layer limit and the policy's room behave as live.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefetchModel {
    /// Share of the next layer's routed experts the predictor names (the store reports its
    /// own as `prefetch recall`).
    pub recall: f64,
    /// Prefetch slots taken from the capacity ([`super::book::prefetch_slots`] of what the
    /// store asks: two layers' top-k).
    pub slots: usize,
    /// Seed of the predictor's mistakes.
    pub seed: u64,
}

/// Replays `trace` through `policy` (which keeps whatever state it starts with: a seeded or
/// pinned policy simulates a start with a remembered histogram).
pub fn simulate(trace: &Trace, policy: Box<dyn Policy>) -> SimResult {
    simulate_with(trace, policy, &SimOptions::default())
}

/// Replays `trace` through the store's bookkeeping ([`CacheBook`]) with `policy` and, when
/// asked, prefetch: every demand miss and every prefetch costs `trace.expert_bytes`
/// (preloads are a start-up cost, not counted, like the store's `preload_bytes`). With
/// prefetch, `policy` should be built at the capacity less the slots, as the store does; a
/// prefetched expert that is then demanded counts as a hit, so compare bytes, not hit rates.
pub fn simulate_with(trace: &Trace, policy: Box<dyn Policy>, opts: &SimOptions) -> SimResult {
    let slots = opts.prefetch.map_or(0, |p| p.slots);
    let mut res = SimResult {
        policy: policy.name(),
        capacity: policy.capacity() + slots,
        requests: 0,
        hits: 0,
        bytes: 0,
        tokens: trace.tokens(),
        per_step: trace.steps.iter().map(|s| (s.rows, 0, 0)).collect(),
        prefetch_reads: 0,
        prefetch_used: 0,
    };
    let mut book = CacheBook::new(policy, slots);
    let mut read = Vec::new();
    let mut dropped = Vec::new();
    book.speculate(opts.preload.iter().copied(), true, &mut read, &mut dropped);
    let mut rng = opts
        .prefetch
        .map(|p| crate::sample::Xoshiro256::seed_from_u64(p.seed));
    for (si, step) in trace.steps.iter().enumerate() {
        for (li, layer) in step.layers.iter().enumerate() {
            // The predictor of the next MoE layer runs after this layer's attention, before
            // its experts are requested.
            if let (Some(pm), Some(rng), Some(next)) =
                (opts.prefetch, rng.as_mut(), step.layers.get(li + 1))
            {
                let guess = predict(next, trace.n_experts, pm.recall, rng);
                read.clear();
                book.speculate(
                    guess.into_iter().map(|e| Key::new(next.layer, e as usize)),
                    false,
                    &mut read,
                    &mut dropped,
                );
                res.prefetch_reads += read.len() as u64;
                res.bytes += read.len() as u64 * trace.expert_bytes;
            }
            for e in layer.unique() {
                let d = book.demand(Key::new(layer.layer, e as usize), &mut dropped);
                res.requests += 1;
                res.per_step[si].1 += 1;
                match d.found {
                    Some(h) => {
                        res.hits += 1;
                        res.per_step[si].2 += 1;
                        if h.speculative {
                            res.prefetch_used += 1;
                        }
                    }
                    None => res.bytes += trace.expert_bytes,
                }
            }
        }
    }
    res
}

/// What the modelled predictor names for `layer` (see [`PrefetchModel`]): heaviest first.
pub fn predict(
    layer: &LayerRoutes,
    n_experts: usize,
    recall: f64,
    rng: &mut crate::sample::Xoshiro256,
) -> Vec<u32> {
    let mut weight: HashMap<u32, f64> = HashMap::new();
    for (r, row) in layer.experts.iter().enumerate() {
        let w = |j: usize| {
            layer
                .weights
                .get(r)
                .and_then(|w| w.get(j))
                .map_or(1.0 / (j + 1) as f64, |&w| w as f64)
        };
        // How many of the row's experts the predictor gets wrong; they are the lightest
        // ones (a router's near-ties at the edge of its top-k are what a guess from the
        // previous layer's state confuses).
        let wrong = (0..row.len())
            .filter(|_| rng.next_f64() >= recall)
            .count()
            .min(n_experts - row.len());
        let mut by_weight: Vec<usize> = (0..row.len()).collect();
        by_weight.sort_by(|&a, &b| w(b).total_cmp(&w(a)).then(a.cmp(&b)));
        let mut named: Vec<u32> = Vec::with_capacity(row.len());
        for (rank, &j) in by_weight.iter().enumerate() {
            let mut guess = row[j];
            if rank >= row.len() - wrong {
                // A wrong expert: neither routed in this row nor named already.
                loop {
                    let x = (rng.next_f64() * n_experts as f64) as u32 % n_experts as u32;
                    if !row.contains(&x) && !named.contains(&x) {
                        guess = x;
                        break;
                    }
                }
            }
            named.push(guess);
            *weight.entry(guess).or_default() += w(j);
        }
    }
    let mut v: Vec<(u32, f64)> = weight.into_iter().collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.into_iter().map(|(e, _)| e).collect()
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
        prefetch_reads: 0,
        prefetch_used: 0,
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
    use super::super::trace::TraceStep;
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
        let l = simulate(&t, Box::new(Lru::new(3)));
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
            for name in ["lru", "lfu", "lfu-admit", "lrfu", "lrfu-auto", "arc"] {
                let r = simulate(&t, build(name, cap, None, 0.0, 16).unwrap());
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
        let l = simulate(&t, Box::new(Lru::new(all)));
        assert_eq!(b.misses(), l.misses());
        let distinct: std::collections::HashSet<Key> = t.requests().iter().map(|r| r.key).collect();
        assert_eq!(b.misses() as usize, distinct.len());
    }

    #[test]
    fn windows_of_tokens() {
        let t = trace_of(&[1, 1, 1, 1, 2, 2]);
        let r = simulate(&t, Box::new(Lru::new(1)));
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
