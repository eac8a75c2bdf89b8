use super::*;
use crate::experts::Key;
use std::collections::HashSet;

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
