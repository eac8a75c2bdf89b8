//! What every replacement policy answers to: the [`Policy`] trait and why a key is asked for.

use crate::experts::Key;

/// Why a key is requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The forward pass needs it now.
    Demand,
    /// A predicted or preloaded expert: make it resident without counting it as a use.
    Prefetch,
}

pub trait Policy: Send {
    /// The name with parameters, as [`build`] accepts it.
    fn name(&self) -> String;
    fn capacity(&self) -> usize;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn contains(&self, key: Key) -> bool;
    /// Records an access to `key`. Returns whether it was resident. A key that was not
    /// resident normally becomes resident (a policy may decline to keep it: capacity 0, or
    /// an admission rule); keys evicted to make room are appended to `evicted`.
    fn access(&mut self, key: Key, kind: Access, evicted: &mut Vec<Key>) -> bool;
    /// Forgets a resident key (a dropped prefetch). No-op when absent.
    fn remove(&mut self, key: Key);
    /// Changes the capacity; when it shrinks, the keys the policy would evict first go
    /// (appended to `evicted`) until the rest fit.
    fn set_capacity(&mut self, cap: usize, evicted: &mut Vec<Key>);
}
