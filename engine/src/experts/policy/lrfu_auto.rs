//! `lrfu-auto`: LRFU whose half-life its ghost caches choose, with admission (the default).

use super::base::{Access, Policy};
use super::lrfu::Score;
use crate::experts::Key;
use std::collections::{BTreeSet, HashMap, HashSet};

/// The half-lives (in tokens) [`AdaptiveLrfu`] chooses from: from "mostly the last few
/// tokens" (gpt-oss's routing, where LRU wins) to "counts over a long paragraph" (granite's,
/// where frequency wins).
pub const ADAPTIVE_HALF_LIVES_TOKENS: [f64; 4] = [2.0, 8.0, 32.0, 128.0];

/// Window, in tokens, over which [`AdaptiveLrfu`]'s ghost caches' misses are compared (their
/// miss counts halve every this many tokens).
pub const ADAPTIVE_WINDOW_TOKENS: f64 = 8.0;

/// A resident set ordered by one LRFU score (the smallest is evicted first).
#[derive(Default)]
struct Ordered {
    resident: HashSet<Key>,
    order: BTreeSet<(Score, Key)>,
}

impl Ordered {
    fn contains(&self, k: Key) -> bool {
        self.resident.contains(&k)
    }
    fn coldest(&self) -> Option<f64> {
        self.order.first().map(|(s, _)| s.0)
    }
    fn pop_coldest(&mut self) -> Option<Key> {
        let (_, k) = self.order.pop_first()?;
        self.resident.remove(&k);
        Some(k)
    }
    fn rescore(&mut self, k: Key, old: Option<f64>, new: f64) {
        if let Some(o) = old {
            self.order.remove(&(Score(o), k));
        }
        self.order.insert((Score(new), k));
    }
    fn insert(&mut self, k: Key, s: f64) {
        self.resident.insert(k);
        self.order.insert((Score(s), k));
    }
    fn remove(&mut self, k: Key, s: Option<f64>) -> bool {
        if !self.resident.remove(&k) {
            return false;
        }
        if let Some(s) = s {
            self.order.remove(&(Score(s), k));
        }
        true
    }
}

/// LRFU whose half-life adapts to the routing, with admission (a missed expert is kept
/// only when its score beats the coldest resident's).
///
/// One ghost cache per candidate half-life ([`ADAPTIVE_HALF_LIVES_TOKENS`]) replays the same
/// demand stream (keys only, no bytes); the live cache evicts by the half-life whose ghost
/// missed least over the last few tokens ([`ADAPTIVE_WINDOW_TOKENS`]), as ARC steers between
/// recency and frequency with its ghost lists. Why: on real routing the best fixed half-life
/// differs by model (Qwen3 and gemma: 4–16 tokens; granite: 16–64; gpt-oss: 2–4) and no
/// single one is best everywhere (docs/STREAMING.md). Admission: Belady's bypass, online —
/// an expert seen once is not worth the resident it would push out.
///
/// Scores live in the log domain like [`Lrfu`]'s, one per half-life; every ordering (the
/// live cache's under each half-life and each ghost's under its own) is kept up to date, so
/// switching half-lives costs nothing.
pub struct AdaptiveLrfu {
    cap: usize,
    /// Half-lives in accesses.
    half_lives: [f64; 4],
    tick: u64,
    /// Per key, per half-life: log2 of its combined recency-frequency at a common origin.
    score: HashMap<Key, [f64; 4]>,
    /// The live cache, ordered under each half-life.
    live: [Ordered; 4],
    /// The ghost caches, each ordered under its own half-life.
    ghosts: [Ordered; 4],
    /// Each ghost's misses, decayed by `decay` per demand access.
    misses: [f64; 4],
    decay: f64,
    /// The half-life the live cache evicts by (index).
    current: usize,
}

impl AdaptiveLrfu {
    /// `requests_per_token` (MoE layers × top-k) turns tokens into accesses.
    pub fn new(cap: usize, requests_per_token: usize) -> AdaptiveLrfu {
        let per = requests_per_token.max(1) as f64;
        AdaptiveLrfu {
            cap,
            half_lives: ADAPTIVE_HALF_LIVES_TOKENS.map(|t| t * per),
            tick: 0,
            score: HashMap::new(),
            live: Default::default(),
            ghosts: Default::default(),
            misses: [0.0; 4],
            decay: (-1.0 / (ADAPTIVE_WINDOW_TOKENS * per)).exp2(),
            current: 1,
        }
    }

    /// The half-life (tokens) the live cache evicts by now.
    pub fn half_life_tokens(&self) -> f64 {
        ADAPTIVE_HALF_LIVES_TOKENS[self.current]
    }

    /// Remembered counts (a usage histogram): old uses, a plain count.
    pub fn seed(&mut self, counts: &[(Key, u64)]) {
        for &(k, n) in counts {
            if n > 0 {
                self.score.insert(k, [(n as f64).log2(); 4]);
            }
        }
    }

    fn bump(&mut self, key: Key, weight: f64) -> (Option<[f64; 4]>, [f64; 4]) {
        self.tick += 1;
        let old = self.score.get(&key).copied();
        let mut new = [0.0; 4];
        for (i, h) in self.half_lives.iter().enumerate() {
            let now = self.tick as f64 / h;
            new[i] = match old {
                Some(s) => (weight + (s[i] - now).exp2()).log2() + now,
                None => weight.log2() + now,
            };
        }
        self.score.insert(key, new);
        (old, new)
    }

    /// The ghosts replay a demand access; the live cache follows the best of them.
    fn ghost_access(&mut self, key: Key, old: Option<[f64; 4]>, new: [f64; 4]) {
        for i in 0..4 {
            self.misses[i] *= self.decay;
            let g = &mut self.ghosts[i];
            if g.contains(key) {
                g.rescore(key, old.map(|o| o[i]), new[i]);
                continue;
            }
            self.misses[i] += 1.0;
            if self.cap == 0 {
                continue;
            }
            if g.resident.len() >= self.cap {
                match g.coldest() {
                    Some(c) if c < new[i] => {
                        g.pop_coldest();
                    }
                    _ => continue,
                }
            }
            g.insert(key, new[i]);
        }
        // Ties keep the current choice.
        let best = (0..4)
            .min_by(|&a, &b| self.misses[a].total_cmp(&self.misses[b]))
            .expect("four ghosts");
        if self.misses[best] < self.misses[self.current] {
            self.current = best;
        }
    }

    fn evict_one(&mut self, evicted: &mut Vec<Key>) -> Option<Key> {
        let v = self.live[self.current].pop_coldest()?;
        let s = self.score.get(&v).copied();
        for (i, o) in self.live.iter_mut().enumerate() {
            if i != self.current {
                o.remove(v, s.map(|s| s[i]));
            }
        }
        evicted.push(v);
        Some(v)
    }
}

impl Policy for AdaptiveLrfu {
    fn name(&self) -> String {
        "lrfu-auto".into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.live[0].resident.len()
    }
    fn contains(&self, key: Key) -> bool {
        self.live[0].contains(key)
    }
    fn access(&mut self, key: Key, kind: Access, evicted: &mut Vec<Key>) -> bool {
        // A prefetch counts as a very small use (it is not the first to go) and is not part
        // of the demand stream the ghosts compare.
        let (old, new) = self.bump(key, if kind == Access::Demand { 1.0 } else { 1e-3 });
        if kind == Access::Demand {
            self.ghost_access(key, old, new);
        }
        if self.contains(key) {
            for (i, o) in self.live.iter_mut().enumerate() {
                o.rescore(key, old.map(|s| s[i]), new[i]);
            }
            return true;
        }
        if self.cap == 0 {
            return false;
        }
        if self.len() >= self.cap {
            let cur = self.current;
            let coldest = self.live[cur]
                .coldest()
                .expect("a full cache has a coldest key");
            // Admission (demand only: a prefetch was predicted, so it is about to be used).
            if kind == Access::Demand && coldest >= new[cur] {
                return false;
            }
            while self.len() >= self.cap {
                self.evict_one(evicted);
            }
        }
        for (i, o) in self.live.iter_mut().enumerate() {
            o.insert(key, new[i]);
        }
        false
    }
    fn remove(&mut self, key: Key) {
        let s = self.score.get(&key).copied();
        for (i, o) in self.live.iter_mut().enumerate() {
            o.remove(key, s.map(|s| s[i]));
        }
    }
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>) {
        self.cap = cap;
        while self.len() > cap {
            self.evict_one(evicted);
        }
        for g in &mut self.ghosts {
            while g.resident.len() > cap {
                g.pop_coldest();
            }
        }
    }
}
