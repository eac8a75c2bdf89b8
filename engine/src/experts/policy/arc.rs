//! ARC: recency and frequency lists steered by ghost lists.

use super::base::{Access, Policy};
use super::recency::RecencyList;
use crate::experts::Key;

/// ARC (Megiddo and Modha, 2003): a recency list T1 and a frequency list T2 whose split `p`
/// adapts to hits in the ghost lists B1 and B2 of recently evicted keys.
pub struct ArcCache {
    cap: usize,
    p: f64,
    t1: RecencyList,
    t2: RecencyList,
    pub(super) b1: RecencyList,
    b2: RecencyList,
}

impl ArcCache {
    pub fn new(cap: usize) -> ArcCache {
        ArcCache {
            cap,
            p: 0.0,
            t1: RecencyList::default(),
            t2: RecencyList::default(),
            b1: RecencyList::default(),
            b2: RecencyList::default(),
        }
    }

    fn replace(&mut self, in_b2: bool, evicted: &mut Vec<Key>) {
        let t1 = self.t1.len() as f64;
        if !self.t1.is_empty() && ((in_b2 && t1 == self.p.floor()) || t1 > self.p) {
            let v = self.t1.pop_lru().expect("non-empty");
            self.b1.touch(v);
            evicted.push(v);
        } else if let Some(v) = self.t2.pop_lru() {
            self.b2.touch(v);
            evicted.push(v);
        } else if let Some(v) = self.t1.pop_lru() {
            self.b1.touch(v);
            evicted.push(v);
        }
    }
}

impl Policy for ArcCache {
    fn name(&self) -> String {
        "arc".into()
    }
    fn capacity(&self) -> usize {
        self.cap
    }
    fn len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }
    fn contains(&self, key: Key) -> bool {
        self.t1.contains(key) || self.t2.contains(key)
    }
    fn access(&mut self, key: Key, _kind: Access, evicted: &mut Vec<Key>) -> bool {
        let c = self.cap;
        if c == 0 {
            return false;
        }
        if self.t1.remove(key) || self.t2.contains(key) {
            self.t2.touch(key);
            return true;
        }
        if self.b1.contains(key) {
            let d = (self.b2.len() as f64 / self.b1.len() as f64).max(1.0);
            self.p = (self.p + d).min(c as f64);
            if self.len() >= c {
                self.replace(false, evicted);
            }
            self.b1.remove(key);
            self.t2.touch(key);
            return false;
        }
        if self.b2.contains(key) {
            let d = (self.b1.len() as f64 / self.b2.len() as f64).max(1.0);
            self.p = (self.p - d).max(0.0);
            if self.len() >= c {
                self.replace(true, evicted);
            }
            self.b2.remove(key);
            self.t2.touch(key);
            return false;
        }
        let l1 = self.t1.len() + self.b1.len();
        if l1 == c {
            if self.t1.len() < c {
                self.b1.pop_lru();
                if self.len() >= c {
                    self.replace(false, evicted);
                }
            } else {
                evicted.extend(self.t1.pop_lru());
            }
        } else {
            let total = l1 + self.t2.len() + self.b2.len();
            if total >= c {
                if total >= 2 * c {
                    self.b2.pop_lru();
                }
                if self.len() >= c {
                    self.replace(false, evicted);
                }
            }
        }
        self.t1.touch(key);
        false
    }
    fn remove(&mut self, key: Key) {
        self.t1.remove(key);
        self.t2.remove(key);
    }
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>) {
        self.cap = cap;
        self.p = self.p.min(cap as f64);
        while self.len() > cap {
            self.replace(false, evicted);
        }
        // ARC's invariants: |T1| + |B1| <= c and the four lists together <= 2c.
        while self.t1.len() + self.b1.len() > cap && self.b1.pop_lru().is_some() {}
        while self.len() + self.b1.len() + self.b2.len() > 2 * cap && self.b2.pop_lru().is_some() {}
    }
}
