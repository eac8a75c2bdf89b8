//! LRFU with a fixed half-life, and the ordered score it keeps per key.

use super::base::{Access, Policy};
use crate::experts::Key;
use std::collections::{BTreeSet, HashMap, HashSet};

/// f64 with a total order, for ordered sets of scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Score(pub(super) f64);
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Score {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// LRFU (Lee et al., 2001): each key's "combined recency and frequency" is the sum over its
/// past accesses of `2^(-Δt / half_life)`, Δt counted in accesses; the smallest is evicted.
/// A long half-life approaches LFU, a short one LRU. Counts survive eviction (like [`Lfu`]).
///
/// Kept in the log domain at a common origin so ordering never needs recomputing:
/// `s = log2(crf(t_last)) + t_last / half_life` orders keys as `crf(now)` does for every
/// `now`, because all keys decay at the same rate.
pub struct Lrfu {
    /// The name as built (half-life in tokens).
    pub(super) label: String,
    cap: usize,
    half_life: f64,
    tick: u64,
    pub(super) score: HashMap<Key, f64>,
    resident: HashSet<Key>,
    order: BTreeSet<(Score, Key)>,
}

impl Lrfu {
    pub fn new(cap: usize, half_life: f64) -> Lrfu {
        Lrfu {
            label: format!("lrfu:{half_life}/access"),
            cap,
            half_life: half_life.max(1e-9),
            tick: 0,
            score: HashMap::new(),
            resident: HashSet::new(),
            order: BTreeSet::new(),
        }
    }

    fn bump(&mut self, key: Key, weight: f64) -> f64 {
        self.tick += 1;
        let now = self.tick as f64 / self.half_life;
        let s = match self.score.get(&key) {
            // crf(now) = 2^(s - now); new crf = weight + crf(now).
            Some(&s) => (weight + (s - now).exp2()).log2() + now,
            None => weight.log2() + now,
        };
        self.score.insert(key, s);
        s
    }
}

impl Policy for Lrfu {
    fn name(&self) -> String {
        self.label.clone()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.resident.len()
    }
    fn contains(&self, key: Key) -> bool {
        self.resident.contains(&key)
    }
    fn access(&mut self, key: Key, kind: Access, evicted: &mut Vec<Key>) -> bool {
        let old = self.score.get(&key).copied();
        // A prefetch counts as a very small use so it is not the first to go.
        let s = self.bump(key, if kind == Access::Demand { 1.0 } else { 1e-3 });
        if self.resident.contains(&key) {
            if let Some(o) = old {
                self.order.remove(&(Score(o), key));
            }
            self.order.insert((Score(s), key));
            return true;
        }
        if self.cap == 0 {
            return false;
        }
        while self.resident.len() >= self.cap {
            let (_, v) = self.order.pop_first().expect("non-empty");
            self.resident.remove(&v);
            evicted.push(v);
        }
        self.resident.insert(key);
        self.order.insert((Score(s), key));
        false
    }
    fn remove(&mut self, key: Key) {
        if self.resident.remove(&key) {
            if let Some(&s) = self.score.get(&key) {
                self.order.remove(&(Score(s), key));
            }
        }
    }
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>) {
        self.cap = cap;
        while self.resident.len() > cap {
            let (_, v) = self.order.pop_first().expect("non-empty");
            self.resident.remove(&v);
            evicted.push(v);
        }
    }
}
