//! Least recently used.

use super::base::{Access, Policy};
use super::recency::RecencyList;
use crate::experts::Key;

/// Least recently used.
pub struct Lru {
    cap: usize,
    list: RecencyList,
}

impl Lru {
    pub fn new(cap: usize) -> Lru {
        Lru {
            cap,
            list: RecencyList::default(),
        }
    }
}

impl Policy for Lru {
    fn name(&self) -> String {
        "lru".into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.list.len()
    }
    fn contains(&self, key: Key) -> bool {
        self.list.contains(key)
    }
    fn access(&mut self, key: Key, _kind: Access, evicted: &mut Vec<Key>) -> bool {
        if self.list.contains(key) {
            self.list.touch(key);
            return true;
        }
        if self.cap == 0 {
            return false;
        }
        while self.list.len() >= self.cap {
            evicted.extend(self.list.pop_lru());
        }
        self.list.touch(key);
        false
    }
    fn remove(&mut self, key: Key) {
        self.list.remove(key);
    }
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>) {
        self.cap = cap;
        while self.list.len() > cap {
            evicted.extend(self.list.pop_lru());
        }
    }
}
