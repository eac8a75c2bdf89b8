//! Cache replacement policies for routed experts, behind one trait so the simulator and the
//! live [`super::ExpertStore`] run exactly the same code.
//!
//! Capacities are counted in experts: every routed expert of a model has the same shape, so
//! a byte budget is `capacity × expert bytes`.
//!
//! Why several: a decode step visits layer 0, 1, ..., L-1 and then starts again, a loop over a
//! working set larger than the cache. Plain LRU is the worst case for loops (the least
//! recently used expert is the one of the layer about to come back); frequency-based policies
//! keep the experts the router prefers. Which wins is a matter of measurement on traces
//! (`coli simulate`, docs/STREAMING.md), not taste.

use super::Key;
use crate::error::{Error, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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

/// f64 with a total order, for ordered sets of scores.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Score(f64);
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
    label: String,
    cap: usize,
    half_life: f64,
    tick: u64,
    score: HashMap<Key, f64>,
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

/// ARC (Megiddo and Modha, 2003): a recency list T1 and a frequency list T2 whose split `p`
/// adapts to hits in the ghost lists B1 and B2 of recently evicted keys.
pub struct ArcCache {
    cap: usize,
    p: f64,
    t1: RecencyList,
    t2: RecencyList,
    b1: RecencyList,
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

/// The policy names [`build`] accepts (`lrfu` takes an optional `:HALF_LIFE` in tokens;
/// any of them may be prefixed with `pinned-`).
pub const POLICY_NAMES: &[&str] = &["lru", "lfu", "lfu-admit", "lrfu", "lrfu-auto", "arc"];

/// The policy the store uses unless told otherwise: [`AdaptiveLrfu`]. Chosen on the routing
/// of four trained models (Qwen3-30B-A3B, granite-3.0-1b-a400m, gemma-4-26B-A4B,
/// gpt-oss-120b) at 10%, 25% and 40% of their experts, where every fixed policy is the
/// worst of the field somewhere and the adaptive one is within 3% of the best everywhere
/// (docs/STREAMING.md has the tables).
pub const DEFAULT_POLICY: &str = "lrfu-auto";

/// Default half-life of a plain `lrfu`, in tokens: the fixed half-life with the smallest
/// worst case over the real traces (16: at most 1.79× Belady; 64 reached 1.91×, 4 1.95×).
pub const DEFAULT_LRFU_HALF_LIFE_TOKENS: f64 = 16.0;

/// Builds a policy from its name. `counts` (a usage histogram of earlier runs) seeds the
/// frequency policies and chooses the pins of a `pinned-` policy, which gets
/// `pin_share × capacity` of them. `requests_per_token` (MoE layers × top-k) turns LRFU's
/// half-life in tokens (`lrfu:TOKENS`) into accesses.
pub fn build(
    spec: &str,
    capacity: usize,
    counts: Option<&[(Key, u64)]>,
    pin_share: f64,
    requests_per_token: usize,
) -> Result<Box<dyn Policy>> {
    if let Some(rest) = spec.strip_prefix("pinned-") {
        let n = ((capacity as f64) * pin_share.clamp(0.0, 1.0)).floor() as usize;
        let pins = hottest(counts.unwrap_or(&[]), n);
        let mut err = None;
        let p = Pinned::new(capacity, &pins, |cap| {
            match build(rest, cap, counts, 0.0, requests_per_token) {
                Ok(p) => p,
                Err(e) => {
                    err = Some(e);
                    Box::new(Lru::new(cap))
                }
            }
        });
        return match err {
            Some(e) => Err(e),
            None => Ok(Box::new(p)),
        };
    }
    let (name, param) = match spec.split_once(':') {
        Some((n, p)) => (n, Some(p)),
        None => (spec, None),
    };
    let seeded = |mut p: Lfu| {
        if let Some(c) = counts {
            p.seed(c.iter().copied());
        }
        p
    };
    let no_param = |p: Option<&str>| match p {
        Some(_) => Err(Error::invalid(
            "policy",
            format!("'{name}' takes no parameter"),
        )),
        None => Ok(()),
    };
    Ok(match name {
        "lru" => {
            no_param(param)?;
            Box::new(Lru::new(capacity))
        }
        "lfu" => {
            no_param(param)?;
            Box::new(seeded(Lfu::new(capacity, true)))
        }
        "lfu-admit" => {
            no_param(param)?;
            Box::new(seeded(Lfu::new(capacity, false)))
        }
        "arc" => {
            no_param(param)?;
            Box::new(ArcCache::new(capacity))
        }
        "lrfu-auto" => {
            no_param(param)?;
            let mut p = AdaptiveLrfu::new(capacity, requests_per_token);
            if let Some(c) = counts {
                p.seed(c);
            }
            Box::new(p)
        }
        "lrfu" => {
            let tokens = match param {
                None => DEFAULT_LRFU_HALF_LIFE_TOKENS,
                Some(p) => match p.parse::<f64>() {
                    Ok(h) if h > 0.0 && h.is_finite() => h,
                    _ => {
                        return Err(Error::invalid(
                            "policy",
                            format!("lrfu half-life '{p}' is not a positive number of tokens"),
                        ))
                    }
                },
            };
            let mut p = Lrfu::new(capacity, tokens * requests_per_token.max(1) as f64);
            p.label = format!("lrfu:{tokens}");
            if let Some(c) = counts {
                // Seeded counts are old uses: a plain count, not ordered in time.
                for &(k, n) in c {
                    if n > 0 {
                        p.score.insert(k, (n as f64).log2());
                    }
                }
            }
            Box::new(p)
        }
        _ => {
            return Err(Error::invalid(
                "policy",
                format!(
                    "unknown policy '{spec}'; known: {} (each may be prefixed with 'pinned-')",
                    POLICY_NAMES.join(", ")
                ),
            ))
        }
    })
}

/// The `n` keys with the largest counts (ties by key, so the choice is reproducible).
pub fn hottest(counts: &[(Key, u64)], n: usize) -> Vec<Key> {
    let mut v: Vec<(Key, u64)> = counts.iter().copied().filter(|&(_, c)| c > 0).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v.into_iter().map(|(k, _)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(e: u32) -> Key {
        Key {
            layer: 0,
            expert: e,
        }
    }

    /// Runs a sequence of expert ids; returns the hit/miss string ('H'/'m') and evictions.
    fn run(p: &mut dyn Policy, seq: &[u32]) -> (String, Vec<u32>) {
        let mut s = String::new();
        let mut ev_all = Vec::new();
        for &e in seq {
            let mut ev = Vec::new();
            s.push(if p.access(k(e), Access::Demand, &mut ev) {
                'H'
            } else {
                'm'
            });
            ev_all.extend(ev.iter().map(|k| k.expert));
            assert!(p.len() <= p.capacity(), "{} over capacity", p.name());
        }
        (s, ev_all)
    }

    #[test]
    fn lru_by_hand() {
        let mut p = Lru::new(2);
        // 1 2 1 3 (evicts 2) 2 (evicts 1) 1 (evicts 3)
        let (s, ev) = run(&mut p, &[1, 2, 1, 3, 2, 1]);
        assert_eq!(s, "mmHmmm");
        assert_eq!(ev, vec![2, 1, 3]);
    }

    #[test]
    fn lru_loop_larger_than_cache_never_hits() {
        let mut p = Lru::new(3);
        let seq: Vec<u32> = (0..40).map(|i| i % 4).collect();
        let (s, _) = run(&mut p, &seq);
        assert!(!s.contains('H'));
    }

    #[test]
    fn lfu_by_hand() {
        let mut p = Lfu::new(2, true);
        // counts: 1:2, 2:1 -> 3 evicts 2 (coldest); 2 comes back (count 2) evicts 3 (count 1).
        let (s, ev) = run(&mut p, &[1, 1, 2, 3, 2, 1]);
        assert_eq!(s, "mHmmmH");
        assert_eq!(ev, vec![2, 3]);
    }

    #[test]
    fn lfu_admission_keeps_hot_set_on_a_loop() {
        // Loop 0..4 through a cache of 3: classic LFU admits each newcomer; with admission
        // the first three stay and hit every time around.
        let seq: Vec<u32> = (0..40).map(|i| i % 4).collect();
        let (s, _) = run(&mut Lfu::new(3, false), &seq);
        assert_eq!(s.matches('H').count(), 27); // 10 rounds × 3 hits − the first round's 3
        let (s2, _) = run(&mut Lfu::new(3, true), &seq);
        assert!(s2.matches('H').count() < 27);
    }

    #[test]
    fn lfu_seed_decides_first_evictions() {
        let mut p = Lfu::new(2, true);
        p.seed([(k(7), 100)]);
        let (s, ev) = run(&mut p, &[7, 1, 2, 7]);
        assert_eq!(s, "mmmH");
        assert_eq!(ev, vec![1]);
    }

    /// Shrinking evicts what the policy would evict first, down to the new capacity, and
    /// growing again lets it fill up; for every policy.
    #[test]
    fn set_capacity_evicts_in_policy_order() {
        for name in [
            "lru",
            "lfu",
            "lfu-admit",
            "lrfu",
            "lrfu-auto",
            "arc",
            "pinned-lru",
        ] {
            let counts = [(k(1), 50)];
            let mut p = build(name, 4, Some(&counts), 0.25, 1).unwrap();
            let mut ev = Vec::new();
            // 1 is hot (pinned for pinned-lru), 2 used three times, 3 twice, 4 once.
            for e in [1, 2, 2, 2, 3, 3, 4] {
                p.access(k(e), Access::Demand, &mut ev);
            }
            assert!(ev.is_empty(), "{name}");
            p.set_capacity(2, &mut ev);
            assert_eq!(p.len(), 2, "{name}");
            assert_eq!(p.capacity(), 2, "{name}");
            for &v in &ev {
                assert!(!p.contains(v), "{name}");
            }
            let kept: Vec<u32> = (1..=4).filter(|&e| p.contains(k(e))).collect();
            let want: &[u32] = match name {
                "lru" => &[3, 4],
                "arc" => &[2, 3],
                // The pin, and the inner LRU's most recent.
                "pinned-lru" => &[1, 4],
                _ => &[1, 2],
            };
            assert_eq!(kept, want, "{name}");
            p.set_capacity(4, &mut ev);
            for e in [5, 6] {
                p.access(k(e), Access::Demand, &mut ev);
            }
            assert_eq!(p.len(), 4, "{name}");
        }
    }

    #[test]
    fn lrfu_extremes_match_lru_and_lfu() {
        let seq = [1, 1, 1, 2, 3, 2, 4, 1, 3, 3, 5, 1, 2];
        // Tiny half-life: only the last access matters -> LRU.
        let (a, ea) = run(&mut Lrfu::new(2, 1e-3), &seq);
        let (b, eb) = run(&mut Lru::new(2), &seq);
        assert_eq!((a, ea), (b, eb));
        // Huge half-life: counts decide (a sequence without count ties) -> LFU.
        let seq = [1, 1, 1, 2, 2, 3, 1, 2, 3];
        let (a, ea) = run(&mut Lrfu::new(2, 1e12), &seq);
        let (b, eb) = run(&mut Lfu::new(2, true), &seq);
        assert_eq!((a.as_str(), ea.as_slice()), ("mHHmHmHmm", &[2, 3, 2][..]));
        assert_eq!((b.as_str(), eb.as_slice()), ("mHHmHmHmm", &[2, 3, 2][..]));
    }

    /// The adaptive LRFU follows the routing: where the hot set moves every few tokens it
    /// evicts by a short half-life, where a fixed skewed set is hot it counts over a longer
    /// one; on each it misses about as little as the better fixed half-life.
    #[test]
    fn lrfu_auto_picks_the_half_life_the_stream_wants() {
        let mut x = 99u64;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        // One layer, 4 requests per token. Drifting: each phase of 6 tokens uses 6 experts
        // of a fresh group. Stationary: a skewed law over 40 experts.
        let drifting: Vec<u32> = (0..400)
            .flat_map(|t| {
                let base = (t / 6) * 6 % 60;
                (0..4).map(move |i| (base + (t * 3 + i * 5) % 6) as u32)
            })
            .collect();
        let stationary: Vec<u32> = (0..1600)
            .map(|_| {
                let a = rand(40);
                let b = rand(40);
                (a * b / 40) as u32
            })
            .collect();
        let misses = |p: &mut dyn Policy, seq: &[u32]| run(p, seq).0.matches('m').count();
        for (seq, want_short) in [(&drifting, true), (&stationary, false)] {
            let mut auto = AdaptiveLrfu::new(8, 4);
            let m_auto = misses(&mut auto, seq);
            let m_short = misses(&mut Lrfu::new(8, 2.0 * 4.0), seq);
            let m_long = misses(&mut Lrfu::new(8, 128.0 * 4.0), seq);
            let h = auto.half_life_tokens();
            let why = format!("half-life {h}: {m_auto} vs {m_short}/{m_long}");
            if want_short {
                assert!(h <= 8.0 && m_short < m_long, "{why}");
            } else {
                assert!(h > 2.0 && m_long < m_short, "{why}");
            }
            assert!(
                m_auto <= m_short.max(m_long),
                "{m_auto} vs {m_short}/{m_long}"
            );
            let best = m_short.min(m_long) as f64;
            assert!(
                (m_auto as f64) < best * 1.1 + 5.0,
                "{m_auto} vs {m_short}/{m_long}"
            );
        }
    }

    #[test]
    fn lrfu_auto_admission_keeps_a_hot_pair_from_one_offs() {
        // Cache of 2 holding two well-used experts: one-off experts are read and handed
        // over, never kept, so the pair keeps hitting.
        let mut p = AdaptiveLrfu::new(2, 1);
        let mut seq = vec![1, 2, 1, 2, 1, 2];
        for i in 0..10 {
            seq.extend([100 + i, 1, 2]);
        }
        let (s, ev) = run(&mut p, &seq);
        assert!(ev.is_empty(), "{ev:?}");
        assert_eq!(s.matches('m').count(), 2 + 10, "{s}");
        // Counts from a history decide too: a seeded expert is kept over a fresh one.
        let mut p = AdaptiveLrfu::new(1, 1);
        p.seed(&[(k(7), 1000)]);
        let (s, _) = run(&mut p, &[7, 3, 7]);
        assert_eq!(s, "mmH");
    }

    #[test]
    fn arc_by_hand() {
        // c = 2. 1 2 -> T1=[1,2]. 1 hit -> T2=[1], T1=[2]. 3: |T1|+|B1|=1<2, total=2>=2 ->
        // replace: |T1|=1 > p=0 -> evict 2 to B1. T1=[3]. 2: in B1 -> p=1, replace: |T1|=1
        // not > 1 -> evict T2's 1 to B2; 2 into T2. 1: in B2 -> p=0, replace: |T1|=1 > 0 ->
        // evict 3; 1 into T2.
        let mut p = ArcCache::new(2);
        let (s, ev) = run(&mut p, &[1, 2, 1, 3, 2, 1]);
        assert_eq!(s, "mmHmmm");
        assert_eq!(ev, vec![2, 1, 3]);
        assert!(p.contains(k(1)) && p.contains(k(2)));
        assert!(p.b1.contains(k(3)));
    }

    #[test]
    fn arc_resists_a_scan() {
        // A hot pair used twice, then a long one-off scan, then the pair again: ARC keeps the
        // pair in T2 while the scan churns T1; LRU loses it.
        let mut seq = vec![1, 2, 1, 2];
        seq.extend(100..120);
        seq.extend([1, 2]);
        let (s, _) = run(&mut ArcCache::new(3), &seq);
        assert!(s.ends_with("HH"), "{s}");
        let (s, _) = run(&mut Lru::new(3), &seq);
        assert!(s.ends_with("mm"), "{s}");
    }

    #[test]
    fn pinned_never_evicts_pins() {
        let mut p = Pinned::new(3, &[k(9)], |c| Box::new(Lru::new(c)));
        assert_eq!(p.capacity(), 3);
        let (s, ev) = run(&mut p, &[9, 1, 2, 3, 9, 4, 9]);
        assert_eq!(s, "mmmmHmH");
        assert!(!ev.contains(&9));
        assert_eq!(ev, vec![1, 2]);
    }

    #[test]
    fn capacity_zero_keeps_nothing() {
        for name in [
            "lru",
            "lfu",
            "lfu-admit",
            "lrfu",
            "lrfu-auto",
            "arc",
            "pinned-lru",
        ] {
            let mut p = build(name, 0, None, 0.5, 1).unwrap();
            let (s, ev) = run(p.as_mut(), &[1, 1, 2, 1]);
            assert_eq!(s, "mmmm", "{name}");
            assert!(ev.is_empty() && p.is_empty(), "{name}");
        }
    }

    #[test]
    fn every_policy_stays_within_capacity_and_reports_evictions() {
        let mut x = 12345u64;
        let seq: Vec<u32> = (0..3000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x % 40) * (x % 40) / 40) as u32
            })
            .collect();
        let counts: Vec<(Key, u64)> = (0..40).map(|e| (k(e), 40 - e as u64)).collect();
        for name in [
            "lru",
            "lfu",
            "lfu-admit",
            "lrfu:100",
            "lrfu-auto",
            "arc",
            "pinned-lru",
            "pinned-lfu-admit",
        ] {
            for cap in [1, 5, 17] {
                let mut p = build(name, cap, Some(&counts), 0.5, 1).unwrap();
                let mut resident: HashSet<Key> = HashSet::new();
                for &e in &seq {
                    let mut ev = Vec::new();
                    let hit = p.access(k(e), Access::Demand, &mut ev);
                    assert_eq!(hit, resident.contains(&k(e)), "{name} cap {cap}");
                    for v in ev {
                        assert!(resident.remove(&v), "{name}: evicted {v} was not resident");
                    }
                    if p.contains(k(e)) {
                        resident.insert(k(e));
                    }
                    assert_eq!(resident.len(), p.len(), "{name}");
                    assert!(p.len() <= cap, "{name}");
                }
            }
        }
    }

    #[test]
    fn build_rejects_unknown_and_bad_parameters() {
        assert!(build("mru", 4, None, 0.0, 1).is_err());
        assert!(build("lrfu:-1", 4, None, 0.0, 1).is_err());
        assert!(build("lru:3", 4, None, 0.0, 1).is_err());
        assert!(build("pinned-nope", 4, None, 0.5, 1).is_err());
        assert_eq!(build("lrfu:50", 4, None, 0.0, 1).unwrap().name(), "lrfu:50");
        assert_eq!(
            build("pinned-arc", 4, None, 0.5, 1).unwrap().name(),
            "pinned-arc"
        );
    }

    #[test]
    fn hottest_orders_by_count_then_key() {
        let c = [(k(3), 5), (k(1), 9), (k(2), 5), (k(4), 0)];
        assert_eq!(hottest(&c, 3), vec![k(1), k(2), k(3)]);
        assert_eq!(hottest(&c, 10).len(), 3);
    }
}
