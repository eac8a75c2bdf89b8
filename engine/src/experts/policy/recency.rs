//! Keys in recency order, the list LRU and ARC are built on.

use crate::experts::Key;
use std::collections::{BTreeMap, HashMap};

/// Keys in recency order: O(log n) touch, remove and pop of the least recent.
#[derive(Default, Clone, Debug)]
pub struct RecencyList {
    tick: u64,
    at: HashMap<Key, u64>,
    order: BTreeMap<u64, Key>,
}

impl RecencyList {
    pub fn len(&self) -> usize {
        self.at.len()
    }
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
    pub fn contains(&self, k: Key) -> bool {
        self.at.contains_key(&k)
    }
    /// Inserts or moves `k` to the most recent end.
    pub fn touch(&mut self, k: Key) {
        self.tick += 1;
        if let Some(old) = self.at.insert(k, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, k);
    }
    pub fn remove(&mut self, k: Key) -> bool {
        match self.at.remove(&k) {
            Some(t) => {
                self.order.remove(&t);
                true
            }
            None => false,
        }
    }
    pub fn pop_lru(&mut self) -> Option<Key> {
        let (_, k) = self.order.pop_first()?;
        self.at.remove(&k);
        Some(k)
    }
}
