//! The prefix cache: KV caches of finished requests, kept so that a later request starting
//! with the same tokens (a chat client resending the conversation, an agent resending its
//! system prompt) prefills only what is new.
//!
//! Each entry is a token sequence and the KV of exactly those positions. A lookup finds the
//! entry sharing the longest prefix with the new prompt and hands out a copy of that many
//! positions (the entry stays for others). Memory is bounded by a byte budget; entries are
//! evicted by [`Policy`]. An entry whose tokens extend another's replaces it, so a growing
//! conversation holds one entry, not one per turn.

use colibri_engine::KvCache;

/// What the cache stores: the KV of a token sequence.
pub trait Payload: Sized {
    fn bytes(&self) -> usize;
    /// A copy holding only the first `n` positions.
    fn prefix(&self, n: usize) -> Self;
}

impl Payload for KvCache {
    fn bytes(&self) -> usize {
        self.size_bytes()
    }
    fn prefix(&self, n: usize) -> Self {
        let mut c = self.clone();
        c.truncate(n);
        c
    }
}

/// Which entry goes first when the budget is exceeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Least recently used (inserted or hit).
    Lru,
    /// Lowest (hits + 1) / age, age in lookups since the entry was last used: a prefix many
    /// requests share (a system prompt) outlives a one-off conversation of the same age.
    Lfu,
    /// Largest first: keeps many short entries.
    Largest,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "lru" => Some(Policy::Lru),
            "lfu" => Some(Policy::Lfu),
            "largest" => Some(Policy::Largest),
            _ => None,
        }
    }
}

struct Entry<T> {
    tokens: Vec<u32>,
    kv: T,
    bytes: usize,
    last_used: u64,
    hits: u64,
}

/// Counters since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStats {
    pub lookups: u64,
    pub hits: u64,
    /// Prompt tokens served from the cache instead of prefilled.
    pub reused_tokens: u64,
    /// Prompt tokens looked up.
    pub looked_up_tokens: u64,
    pub evictions: u64,
}

pub struct PrefixCache<T: Payload> {
    entries: Vec<Entry<T>>,
    budget: usize,
    used: usize,
    /// Shortest prefix worth reusing.
    min_tokens: usize,
    policy: Policy,
    clock: u64,
    pub stats: PrefixStats,
}

impl<T: Payload> PrefixCache<T> {
    pub fn new(budget_bytes: usize, policy: Policy) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget: budget_bytes,
            used: 0,
            min_tokens: 1,
            policy,
            clock: 0,
            stats: PrefixStats::default(),
        }
    }

    pub fn bytes(&self) -> usize {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The KV of the longest cached prefix of `prompt`, and its length. At least one prompt
    /// token is always left to feed (its logits start the reply).
    pub fn lookup(&mut self, prompt: &[u32]) -> Option<(T, usize)> {
        self.clock += 1;
        self.stats.lookups += 1;
        self.stats.looked_up_tokens += prompt.len() as u64;
        let limit = prompt.len().saturating_sub(1);
        let (best, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, &prompt[..limit])))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))?;
        if n < self.min_tokens {
            return None;
        }
        let e = &mut self.entries[best];
        e.last_used = self.clock;
        e.hits += 1;
        self.stats.hits += 1;
        self.stats.reused_tokens += n as u64;
        Some((e.kv.prefix(n), n))
    }

    /// Keeps the KV of `tokens` (exactly `tokens.len()` positions).
    pub fn insert(&mut self, tokens: Vec<u32>, kv: T) {
        if tokens.len() < self.min_tokens {
            return;
        }
        let bytes = kv.bytes();
        if bytes > self.budget {
            return;
        }
        self.clock += 1;
        // An entry that already covers these tokens: just mark it used.
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.len() >= tokens.len() && e.tokens.starts_with(&tokens))
        {
            e.last_used = self.clock;
            return;
        }
        // Entries these tokens extend are covered by the new one.
        let mut hits = 0;
        let mut i = 0;
        while i < self.entries.len() {
            if tokens.starts_with(&self.entries[i].tokens) {
                let e = self.entries.swap_remove(i);
                self.used -= e.bytes;
                hits += e.hits;
            } else {
                i += 1;
            }
        }
        while self.used + bytes > self.budget && !self.entries.is_empty() {
            self.evict_one();
        }
        self.used += bytes;
        self.entries.push(Entry {
            tokens,
            kv,
            bytes,
            last_used: self.clock,
            hits,
        });
    }

    fn evict_one(&mut self) {
        let clock = self.clock;
        let score = |e: &Entry<T>| -> f64 {
            match self.policy {
                Policy::Lru => e.last_used as f64,
                Policy::Lfu => (e.hits + 1) as f64 / (clock - e.last_used + 1) as f64,
                Policy::Largest => -(e.bytes as f64),
            }
        };
        let victim = (0..self.entries.len())
            .min_by(|&a, &b| score(&self.entries[a]).total_cmp(&score(&self.entries[b])))
            .expect("not empty");
        let e = self.entries.swap_remove(victim);
        self.used -= e.bytes;
        self.stats.evictions += 1;
    }

    /// Drops everything (e.g. to give the memory back).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in KV: `n` positions of `per` bytes.
    #[derive(Clone, Debug, PartialEq)]
    struct Fake(usize);
    impl Payload for Fake {
        fn bytes(&self) -> usize {
            self.0 * 10
        }
        fn prefix(&self, n: usize) -> Self {
            Fake(n)
        }
    }

    fn seq(v: &[u32]) -> Vec<u32> {
        v.to_vec()
    }

    #[test]
    fn longest_prefix_leaves_one_token_to_feed() {
        let mut c = PrefixCache::new(1000, Policy::Lru);
        c.insert(seq(&[1, 2, 3, 4]), Fake(4));
        c.insert(seq(&[1, 2, 9]), Fake(3));
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5]), Some((Fake(4), 4)));
        // The whole prompt is cached: one token must still be fed.
        assert_eq!(c.lookup(&[1, 2, 3, 4]), Some((Fake(3), 3)));
        assert_eq!(c.lookup(&[1, 2, 9, 9]), Some((Fake(3), 3)));
        assert_eq!(c.lookup(&[7, 1, 2]), None);
        assert_eq!(c.stats.hits, 3);
        assert_eq!(c.stats.reused_tokens, 10);
    }

    #[test]
    fn a_growing_conversation_keeps_one_entry() {
        let mut c = PrefixCache::new(1000, Policy::Lru);
        c.insert(seq(&[1, 2, 3]), Fake(3));
        c.insert(seq(&[1, 2, 3, 4, 5]), Fake(5));
        assert_eq!((c.len(), c.bytes()), (1, 50));
        // A shorter sequence already covered changes nothing.
        c.insert(seq(&[1, 2]), Fake(2));
        assert_eq!((c.len(), c.bytes()), (1, 50));
    }

    #[test]
    fn budget_is_kept_by_each_policy() {
        for p in [Policy::Lru, Policy::Lfu, Policy::Largest] {
            let mut c = PrefixCache::new(100, p);
            c.insert(seq(&[1; 5]), Fake(5));
            c.insert(seq(&[2; 3]), Fake(3));
            c.lookup(&[1, 1, 1, 1, 1, 1]);
            c.insert(seq(&[3; 4]), Fake(4));
            assert!(c.bytes() <= 100, "{p:?}");
            let kept: Vec<bool> = [1u32, 2, 3]
                .iter()
                .map(|&t| c.lookup(&[t, t, t, t]).is_some())
                .collect();
            match p {
                // [2;3] was used least recently.
                Policy::Lru => assert_eq!(kept, vec![true, false, true]),
                // [2;3] has no hits.
                Policy::Lfu => assert_eq!(kept, vec![true, false, true]),
                // [1;5] is the largest.
                Policy::Largest => assert_eq!(kept, vec![false, true, true]),
            }
            // An entry larger than the whole budget is not kept.
            c.insert(seq(&[4; 11]), Fake(11));
            assert!(c.lookup(&[4; 12]).is_none());
        }
    }
}
