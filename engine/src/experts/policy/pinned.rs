//! Pinned experts that are never evicted once loaded, over an inner policy.

use super::base::{Access, Policy};
use crate::experts::Key;
use std::collections::HashSet;

/// A set of pinned experts that are never evicted once loaded (they take their share of the
/// capacity from the start), and an inner policy for the rest.
pub struct Pinned {
    pins: HashSet<Key>,
    loaded: HashSet<Key>,
    inner: Box<dyn Policy>,
}

impl Pinned {
    /// `pins` beyond `capacity` are ignored; the inner policy gets what the pins leave.
    pub fn new(
        capacity: usize,
        pins: &[Key],
        inner: impl FnOnce(usize) -> Box<dyn Policy>,
    ) -> Pinned {
        let pins: HashSet<Key> = pins.iter().copied().take(capacity).collect();
        let inner = inner(capacity - pins.len());
        Pinned {
            pins,
            loaded: HashSet::new(),
            inner,
        }
    }
    pub fn pins(&self) -> impl Iterator<Item = &Key> {
        self.pins.iter()
    }
}

impl Policy for Pinned {
    fn name(&self) -> String {
        format!("pinned-{}", self.inner.name())
    }
    fn capacity(&self) -> usize {
        self.pins.len() + self.inner.capacity()
    }
    fn len(&self) -> usize {
        self.loaded.len() + self.inner.len()
    }
    fn contains(&self, key: Key) -> bool {
        self.loaded.contains(&key) || self.inner.contains(key)
    }
    fn access(&mut self, key: Key, kind: Access, evicted: &mut Vec<Key>) -> bool {
        if self.pins.contains(&key) {
            return !self.loaded.insert(key);
        }
        self.inner.access(key, kind, evicted)
    }
    fn remove(&mut self, key: Key) {
        self.loaded.remove(&key);
        self.inner.remove(key);
    }
    /// The pins stay; the inner policy gets what they leave.
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>) {
        self.inner
            .set_capacity(cap.saturating_sub(self.pins.len()), evicted);
    }
}
