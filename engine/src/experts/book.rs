//! [`CacheBook`]: which experts the cache holds and why — the decisions of the
//! [`super::ExpertStore`] without its buffers, threads or disk. The live store and the
//! simulator ([`super::sim`]) both run this code, so a replayed trace costs in the simulator
//! what it costs in the store (`store::tests::store_and_simulator_agree_on_a_replay`).
//!
//! It holds the replacement [`Policy`] plus the **prefetch slots**: experts read ahead on a
//! prediction wait there, outside the policy, until their layer asks for them. Why: a
//! frequency policy ranks a never-used expert lowest, so a prefetch entering the policy was
//! evicted by the next miss before its layer came (measured with a 64-token LRFU on the synth
//! model: 15 367 of 15 657 prefetches wasted, +17% bytes per token).

use super::policy::{Access, Policy};
use super::Key;
use std::collections::{HashMap, VecDeque};

/// Why a key is held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Brought in by a prefetch or preload and not demanded yet.
    pub speculative: bool,
    /// In the prefetch slots, outside the policy.
    pub staged: bool,
}

/// What a demand request found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Held before the request (resident or being read): no read needed. Its flags then.
    pub found: Option<Held>,
    /// Held after it (the policy kept it). A miss not kept is read, handed over once, and
    /// dropped.
    pub kept: bool,
}

/// Prefetch slots for a cache of `capacity` experts out of `experts` when `wanted` are
/// asked for: never more than a quarter of the cache, none when every expert fits (nothing
/// is ever evicted then, so a prefetch cannot be lost).
pub fn prefetch_slots(capacity: usize, experts: usize, wanted: usize) -> usize {
    if capacity >= experts {
        0
    } else {
        wanted.min(capacity / 4)
    }
}

pub struct CacheBook {
    policy: Box<dyn Policy>,
    held: HashMap<Key, Held>,
    /// Staged prefetches, oldest first, at most `slots`.
    staged: VecDeque<Key>,
    slots: usize,
}

impl CacheBook {
    /// `policy` governs the cache less its `slots` prefetch slots (build it at that capacity).
    pub fn new(policy: Box<dyn Policy>, slots: usize) -> CacheBook {
        CacheBook {
            policy,
            held: HashMap::new(),
            staged: VecDeque::new(),
            slots,
        }
    }

    pub fn policy(&self) -> &dyn Policy {
        self.policy.as_ref()
    }
    pub fn prefetch_slots(&self) -> usize {
        self.slots
    }
    /// Whether `key` is held (resident, being read, or staged).
    pub fn contains(&self, key: Key) -> bool {
        self.held.contains_key(&key)
    }
    /// Keys held.
    pub fn len(&self) -> usize {
        self.held.len()
    }
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The forward pass needs `key` now. Keys that stop being held (evicted by the policy)
    /// are appended to `dropped` with their flags.
    pub fn demand(&mut self, key: Key, dropped: &mut Vec<(Key, Held)>) -> Demand {
        let mut evicted = Vec::new();
        self.policy.access(key, Access::Demand, &mut evicted);
        self.drop_keys(&evicted, dropped);
        let kept = self.policy.contains(key);
        match self.held.get_mut(&key) {
            Some(h) => {
                let found = *h;
                h.speculative = false;
                // A staged prefetch leaves its slot: kept if the policy took it (the access
                // above), else handed over once and dropped.
                if std::mem::take(&mut h.staged) {
                    self.staged.retain(|k| *k != key);
                    if !kept {
                        self.held.remove(&key);
                    }
                }
                Demand {
                    found: Some(found),
                    kept,
                }
            }
            None => {
                if kept {
                    self.held.insert(key, Held::default());
                }
                Demand { found: None, kept }
            }
        }
    }

    /// Keys predicted (`background == false`: queued behind demand reads, likeliest first)
    /// or preloaded (`true`): the ones not held yet that the book takes are appended to
    /// `read`. Once the policy is full, predictions go to the prefetch slots, at most half of
    /// them per call (a prefill's prediction can name every expert of a layer; the rest
    /// would only push out the previous layer's before use), the oldest unused one leaving
    /// when a new one comes; while the policy has room a prediction goes straight in (it
    /// evicts nothing). Keys that stop being held are appended to `dropped`.
    pub fn speculate(
        &mut self,
        keys: impl IntoIterator<Item = Key>,
        background: bool,
        read: &mut Vec<Key>,
        dropped: &mut Vec<(Key, Held)>,
    ) {
        let read0 = read.len();
        // A key taken and pushed out again within this call (a later prediction evicted
        // it from a small cache) was never there for the caller: neither read nor dropped.
        let mut drop_one =
            |read: &mut Vec<Key>, k: Key, h: Held| match read[read0..].iter().position(|&r| r == k)
            {
                Some(i) => {
                    read.remove(read0 + i);
                }
                None => dropped.push((k, h)),
            };
        let mut staged_now = 0;
        for key in keys {
            if self.held.contains_key(&key) {
                continue;
            }
            let staged =
                !background && self.slots > 0 && self.policy.len() >= self.policy.capacity();
            if staged {
                if staged_now >= self.slots.div_ceil(2) {
                    break;
                }
                staged_now += 1;
                while self.staged.len() >= self.slots {
                    let old = self.staged.pop_front().expect("non-empty");
                    if let Some(h) = self.held.remove(&old) {
                        drop_one(read, old, h);
                    }
                }
                self.staged.push_back(key);
            } else {
                let mut evicted = Vec::new();
                self.policy.access(key, Access::Prefetch, &mut evicted);
                for v in evicted {
                    if let Some(h) = self.held.remove(&v) {
                        drop_one(read, v, h);
                    }
                }
                if !self.policy.contains(key) {
                    continue;
                }
            }
            self.held.insert(
                key,
                Held {
                    speculative: true,
                    staged,
                },
            );
            read.push(key);
        }
    }

    /// Forgets `key` (its read failed).
    pub fn remove(&mut self, key: Key) {
        if let Some(h) = self.held.remove(&key) {
            if h.staged {
                self.staged.retain(|k| *k != key);
            }
        }
        self.policy.remove(key);
    }

    /// Gives the policy `cap` experts (the prefetch slots are apart); when it shrinks, the
    /// keys the policy evicts are appended to `dropped`.
    pub fn set_policy_capacity(&mut self, cap: usize, dropped: &mut Vec<(Key, Held)>) {
        if cap != self.policy.capacity() {
            let mut evicted = Vec::new();
            self.policy.set_capacity(cap, &mut evicted);
            self.drop_keys(&evicted, dropped);
        }
    }

    fn drop_keys(&mut self, evicted: &[Key], dropped: &mut Vec<(Key, Held)>) {
        for &v in evicted {
            if let Some(h) = self.held.remove(&v) {
                dropped.push((v, h));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::policy::Lru;
    use super::*;

    fn k(e: usize) -> Key {
        Key::new(0, e)
    }

    #[test]
    fn staged_prefetches_wait_outside_the_policy() {
        let mut b = CacheBook::new(Box::new(Lru::new(2)), 2);
        let mut dropped = Vec::new();
        let mut read = Vec::new();
        for e in [1, 2] {
            assert_eq!(b.demand(k(e), &mut dropped).found, None);
        }
        // Full: a prediction is staged; one per call (half of two slots).
        b.speculate([k(3), k(4)], false, &mut read, &mut dropped);
        assert_eq!(read, vec![k(3)]);
        // A miss evicts from the policy (1), never the staged 3.
        b.demand(k(5), &mut dropped);
        assert_eq!(dropped, vec![(k(1), Held::default())]);
        assert!(b.contains(k(3)));
        // Demanded: found staged and speculative, taken by the policy (evicting 2).
        let d = b.demand(k(3), &mut dropped);
        assert_eq!(
            d,
            Demand {
                found: Some(Held {
                    speculative: true,
                    staged: true
                }),
                kept: true
            }
        );
        // Staged ones come and the oldest unused goes.
        read.clear();
        dropped.clear();
        for e in [6, 7, 8] {
            b.speculate([k(e)], false, &mut read, &mut dropped);
        }
        assert_eq!(read, vec![k(6), k(7), k(8)]);
        assert_eq!(
            dropped,
            vec![(
                k(6),
                Held {
                    speculative: true,
                    staged: true
                }
            )]
        );
        assert_eq!(b.len(), 2 + 2);
    }

    /// A prediction pushed out by a later one of the same call (a cache smaller than the
    /// prediction) is neither read nor reported dropped.
    #[test]
    fn a_prediction_evicted_within_its_call_is_not_read() {
        let mut b = CacheBook::new(Box::new(Lru::new(2)), 0);
        let (mut read, mut dropped) = (Vec::new(), Vec::new());
        b.speculate([k(1), k(2), k(3)], false, &mut read, &mut dropped);
        assert_eq!(read, vec![k(2), k(3)]);
        assert!(dropped.is_empty());
        assert_eq!(b.len(), 2);
        // Held before the call, pushed out by one prediction and taken again by the next:
        // dropped (its old buffer goes) and read again.
        let (mut read, mut dropped) = (Vec::new(), Vec::new());
        b.speculate([k(4), k(2)], false, &mut read, &mut dropped);
        assert_eq!(read, vec![k(4), k(2)]);
        let gone: Vec<Key> = dropped.iter().map(|d| d.0).collect();
        assert_eq!(gone, vec![k(2), k(3)]);
        assert_eq!(b.len(), 2);
    }
}
