//! Least frequently used, with or without admission.

use super::base::{Access, Policy};
use crate::experts::Key;
use std::collections::{BTreeSet, HashMap};

/// Least frequently used, counting every demand access since start (or since the seed
/// histogram), resident or not; ties go to the least recent.
///
/// With `admit_colder == false` a missed expert is kept only when it has been used at least
/// as often as the coldest resident one; the cache then converges on the most used experts,
/// the best an online policy can do when routing is independent from token to token.
pub struct Lfu {
    cap: usize,
    admit_colder: bool,
    tick: u64,
    counts: HashMap<Key, u64>,
    /// Resident keys: (count, last tick).
    resident: HashMap<Key, (u64, u64)>,
    order: BTreeSet<(u64, u64, Key)>,
}

impl Lfu {
    pub fn new(cap: usize, admit_colder: bool) -> Lfu {
        Lfu {
            cap,
            admit_colder,
            tick: 0,
            counts: HashMap::new(),
            resident: HashMap::new(),
            order: BTreeSet::new(),
        }
    }

    /// Starts from remembered counts (a usage histogram of earlier runs).
    pub fn seed(&mut self, counts: impl IntoIterator<Item = (Key, u64)>) {
        for (k, c) in counts {
            if c > 0 {
                *self.counts.entry(k).or_default() += c;
            }
        }
    }

    fn place(&mut self, key: Key) {
        let c = self.counts.get(&key).copied().unwrap_or(0);
        self.tick += 1;
        if let Some((oc, ot)) = self.resident.insert(key, (c, self.tick)) {
            self.order.remove(&(oc, ot, key));
        }
        self.order.insert((c, self.tick, key));
    }
}

impl Policy for Lfu {
    fn name(&self) -> String {
        if self.admit_colder {
            "lfu".into()
        } else {
            "lfu-admit".into()
        }
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.resident.len()
    }
    fn contains(&self, key: Key) -> bool {
        self.resident.contains_key(&key)
    }
    fn access(&mut self, key: Key, kind: Access, evicted: &mut Vec<Key>) -> bool {
        if kind == Access::Demand {
            *self.counts.entry(key).or_default() += 1;
        }
        if self.resident.contains_key(&key) {
            self.place(key);
            return true;
        }
        if self.cap == 0 {
            return false;
        }
        if self.resident.len() >= self.cap {
            let &(vc, _, _) = self.order.first().expect("a full cache has a coldest key");
            let c = self.counts.get(&key).copied().unwrap_or(0);
            // A prefetch is admitted: it was predicted, so it is about to be used.
            if !self.admit_colder && kind == Access::Demand && c <= vc {
                return false;
            }
            while self.resident.len() >= self.cap {
                let (vc, vt, v) = self.order.pop_first().expect("non-empty");
                let _ = (vc, vt);
                self.resident.remove(&v);
                evicted.push(v);
            }
        }
        self.place(key);
        false
    }
    fn remove(&mut self, key: Key) {
        if let Some((c, t)) = self.resident.remove(&key) {
            self.order.remove(&(c, t, key));
        }
    }
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>) {
        self.cap = cap;
        while self.resident.len() > cap {
            let (_, _, v) = self.order.pop_first().expect("non-empty");
            self.resident.remove(&v);
            evicted.push(v);
        }
    }
}
