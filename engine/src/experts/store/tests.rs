use super::cache::ExpertStore;
use super::config::{ExpertSpec, Extent, StoreConfig};
use super::reads::ReadPlan;
use super::stats::ExpertCounts;
use crate::error::Error;
use crate::experts::buf::{ExpertBuf, ALIGN};
use crate::experts::hist::UsageHistogram;
use crate::experts::policy;
use crate::experts::Key;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A file whose byte at offset `i` is `f(i)`, in a temp folder on disk (not tmpfs when
/// the target folder is on disk; O_DIRECT falls back to buffered otherwise).
fn make_file(dir: &Path, len: usize) -> PathBuf {
    let p = dir.join("experts.bin");
    let mut f = File::create(&p).unwrap();
    let bytes: Vec<u8> = (0..len).map(pattern).collect();
    f.write_all(&bytes).unwrap();
    p
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(2654435761) >> 13) as u8
}

fn test_dir() -> tempfile::TempDir {
    // target/ is on the real disk in this workspace, where O_DIRECT works; /tmp may be
    // tmpfs. Either way the store must work (falling back to buffered reads).
    let base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tmp");
    std::fs::create_dir_all(&base).ok();
    tempfile::tempdir_in(&base).unwrap_or_else(|_| tempfile::tempdir().unwrap())
}

/// `layers × experts` experts; each is three parts at unaligned offsets, like a Hub
/// checkpoint, with a gap between experts.
fn specs(layers: usize, experts: usize, part: u64) -> (Vec<Vec<ExpertSpec>>, usize) {
    let mut off = 100u64;
    let mut all = Vec::new();
    for _ in 0..layers {
        let mut row = Vec::new();
        for _ in 0..experts {
            let parts = (0..3)
                .map(|i| {
                    let e = Extent {
                        file: 0,
                        offset: off,
                        len: part + i,
                    };
                    off += part + i + 8;
                    e
                })
                .collect();
            off += 5000;
            row.push(ExpertSpec { parts });
        }
        all.push(row);
    }
    (all, off as usize + 10)
}

fn check(buf: &ExpertBuf, spec: &ExpertSpec) {
    for (i, p) in spec.parts.iter().enumerate() {
        let got = buf.part(i);
        assert_eq!(got.len() as u64, p.len);
        for (j, &b) in got.iter().enumerate() {
            assert_eq!(b, pattern(p.offset as usize + j), "part {i} byte {j}");
        }
    }
}

/// A store whose budget holds `n` experts.
fn open(
    path: &Path,
    specs: &[Vec<ExpertSpec>],
    n: u64,
    direct: bool,
    readers: usize,
    policy: &str,
    hist: UsageHistogram,
) -> ExpertStore {
    let probe = ExpertStore::new(
        &[path.to_path_buf()],
        specs,
        &cfg(0, 1, false, 1, "lru"),
        hist.clone(),
    )
    .unwrap();
    let eb = probe.expert_bytes();
    drop(probe);
    let st = ExpertStore::new(
        &[path.to_path_buf()],
        specs,
        &cfg(n, eb, direct, readers, policy),
        hist,
    )
    .unwrap();
    assert_eq!(st.capacity() as u64, n);
    st
}

fn cfg(
    budget_experts: u64,
    expert_bytes: u64,
    direct: bool,
    readers: usize,
    policy: &str,
) -> StoreConfig {
    StoreConfig {
        budget_bytes: budget_experts * expert_bytes,
        policy: policy.into(),
        pin_share: 0.5,
        readers,
        direct,
        requests_per_token: 1,
        pins: Vec::new(),
        prefetch_slots: 0,
    }
}

#[test]
fn plan_merges_close_parts_and_aligns_groups() {
    let spec = ExpertSpec {
        parts: vec![
            Extent {
                file: 0,
                offset: 10_000,
                len: 100,
            },
            Extent {
                file: 0,
                offset: 5000,
                len: 100,
            },
            Extent {
                file: 1,
                offset: 0,
                len: 4096,
            },
            Extent {
                file: 0,
                offset: 1 << 20,
                len: 10,
            },
        ],
    };
    let p = ReadPlan::new(&spec, &[2 << 20, 4096]).unwrap();
    assert_eq!(p.groups.len(), 3);
    assert_eq!((p.groups[0].start, p.groups[0].end), (5000, 10_100));
    assert!(p.groups.iter().all(|g| g.buf_off % ALIGN == 0));
    // part 1 (offset 5000) is 5000 - 4096 = 904 bytes into the first group's buffer.
    assert_eq!(p.parts[1], 904..1004);
    assert_eq!(p.parts[0], 904 + 5000..904 + 5100);
    assert!(
        ReadPlan::new(&spec, &[2 << 20, 100]).is_err(),
        "past the end of file 1"
    );
}

/// `residency` lists exactly the experts the cache holds, ready once their reads are
/// done, and drops an evicted one.
#[test]
fn residency_lists_what_the_cache_holds() {
    let dir = test_dir();
    let (sp, len) = specs(2, 3, 3000);
    let path = make_file(dir.path(), len);
    let st = open(&path, &sp, 2, false, 1, "lru", UsageHistogram::new(2, 3));
    assert!(st.residency().is_empty());
    st.get(Key::new(0, 1)).unwrap();
    st.get(Key::new(1, 2)).unwrap();
    let mut r = st.residency();
    r.sort();
    assert_eq!(r, vec![(Key::new(0, 1), true), (Key::new(1, 2), true)]);
    // A third expert evicts the least recently used one (L0/E1).
    st.get(Key::new(1, 0)).unwrap();
    let mut r = st.residency();
    r.sort();
    assert_eq!(r, vec![(Key::new(1, 0), true), (Key::new(1, 2), true)]);
    assert_eq!(st.stats().resident_experts, r.len());
}

/// Every policy, both I/O modes and several reader counts return the right bytes, and
/// the cache holds no more than the budget.
#[test]
fn reads_right_bytes_under_a_tiny_budget() {
    let dir = test_dir();
    let (specs, len) = specs(3, 6, 3000);
    let path = make_file(dir.path(), len);
    for direct in [true, false] {
        for readers in [1, 4] {
            for policy in ["lru", "lfu-admit", "arc", "pinned-lru"] {
                let store = open(
                    &path,
                    &specs,
                    2,
                    direct,
                    readers,
                    policy,
                    UsageHistogram::new(3, 6),
                );
                let eb = store.expert_bytes();
                for round in 0..3 {
                    for (l, row) in specs.iter().enumerate() {
                        // Issue the whole layer first, then wait: reads overlap.
                        let tickets: Vec<_> = (0..6)
                            .map(|e| store.request(Key::new(l, (e + round) % 6)).unwrap())
                            .collect();
                        for (e, t) in tickets.into_iter().enumerate() {
                            let b = store.wait(t).unwrap();
                            check(&b, &row[(e + round) % 6]);
                        }
                    }
                    let st = store.stats();
                    assert!(st.resident_experts <= 2, "{policy}: {st}");
                    assert!(st.resident_bytes <= 2 * eb, "{policy}: {st}");
                }
                let st = store.stats();
                assert_eq!(st.requests, 3 * 3 * 6);
                assert_eq!(st.hits + st.inflight_hits + st.misses, st.requests);
                assert!(
                    st.misses >= st.requests - 2 * 3,
                    "{policy}: a 2-expert cache cannot hit much"
                );
                if !direct {
                    assert_eq!(st.direct_reads, 0);
                }
                if direct && st.direct_reads == 0 {
                    // tmpfs and friends: the store said why.
                    assert!(!st.notes.is_empty());
                }
            }
        }
    }
}

#[test]
fn a_large_budget_serves_repeats_from_ram() {
    let dir = test_dir();
    let (specs, len) = specs(2, 4, 5000);
    let path = make_file(dir.path(), len);
    let store = ExpertStore::new(
        &[path],
        &specs,
        &cfg(100, 1 << 20, true, 2, "lru"),
        UsageHistogram::new(2, 4),
    )
    .unwrap();
    for _ in 0..3 {
        for (l, row) in specs.iter().enumerate() {
            for (e, spec) in row.iter().enumerate() {
                check(&store.get(Key::new(l, e)).unwrap(), spec);
            }
        }
    }
    let st = store.stats();
    assert_eq!((st.requests, st.misses, st.hits), (24, 8, 16));
    assert_eq!(st.resident_experts, 8);
    let h = store.histogram();
    assert_eq!(h.get(Key::new(1, 3)), 3);
    assert_eq!(h.total(), 24);
}

#[test]
fn per_expert_counts_add_up_to_the_totals_and_since_subtracts() {
    let dir = test_dir();
    let (specs, len) = specs(2, 4, 5000);
    let path = make_file(dir.path(), len);
    let store = open(&path, &specs, 2, true, 2, "lru", UsageHistogram::new(2, 4));
    let before = store.stats();
    // Layer 0: experts 0, 1, 0, 0 (one miss each, then hits); layer 1: 3 twice; a
    // prefetched expert demanded counts as a hit of some kind (ready or in flight).
    for e in [0, 1, 0, 0] {
        store.get(Key::new(0, e)).unwrap();
    }
    for _ in 0..2 {
        store.get(Key::new(1, 3)).unwrap();
    }
    store.prefetch(1, &[2]);
    store.get(Key::new(1, 2)).unwrap();
    let st = store.stats();
    let counts = store.expert_counts();
    let keys: Vec<Key> = counts.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            Key::new(0, 0),
            Key::new(0, 1),
            Key::new(1, 2),
            Key::new(1, 3)
        ]
    );
    let get = |k: Key| counts.iter().find(|(x, _)| *x == k).unwrap().1;
    assert_eq!(get(Key::new(0, 1)).misses, 1);
    assert_eq!(get(Key::new(1, 2)).misses, 0);
    let sum = |f: fn(&ExpertCounts) -> u64| counts.iter().map(|(_, c)| f(c)).sum::<u64>();
    assert_eq!(sum(|c| c.hits), st.hits);
    assert_eq!(sum(|c| c.inflight_hits), st.inflight_hits);
    assert_eq!(sum(|c| c.misses), st.misses);
    assert_eq!(st.requests, 7);
    let d = st.since(&before);
    assert_eq!(d, st, "nothing happened before: the delta is the whole");
    let later = store.stats();
    store.get(Key::new(0, 1)).unwrap();
    let d = store.stats().since(&later);
    assert_eq!((d.requests, d.tokens, d.prefetch_issued), (1, 0, 0));
    assert_eq!(d.hits + d.inflight_hits + d.misses, 1);
    assert_eq!(d.capacity_experts, 2);
}

#[test]
fn prefetch_then_demand_is_a_hit_and_counts_as_used() {
    let dir = test_dir();
    let (specs, len) = specs(2, 4, 5000);
    let path = make_file(dir.path(), len);
    let store = ExpertStore::new(
        &[path],
        &specs,
        &cfg(100, 1 << 20, false, 2, "lru"),
        UsageHistogram::new(2, 4),
    )
    .unwrap();
    assert_eq!(
        store.prefetch(1, &[0, 2, 99]),
        2,
        "the unknown expert is ignored"
    );
    assert_eq!(store.prefetch(1, &[0]), 0, "already queued");
    check(&store.get(Key::new(1, 2)).unwrap(), &specs[1][2]);
    let st = store.stats();
    assert_eq!(st.misses, 0);
    assert_eq!(st.hits + st.inflight_hits, 1);
    assert_eq!((st.prefetch_issued, st.prefetch_used), (2, 1));
    // Both speculative reads finish and stay.
    for _ in 0..200 {
        if store.stats().resident_experts == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(store.stats().resident_experts, 2);
}

/// The simulator runs the store's bookkeeping: replaying a trace through the live store
/// (real reads from a file, prefetch calls with the modelled predictor's guesses) gives
/// the simulator's hits, misses and prefetches exactly, for several policies, with and
/// without prefetch, with a many-row (prefill) step among the decode steps.
#[test]
fn store_and_simulator_agree_on_a_replay() {
    use crate::experts::sim::{predict, simulate_with, PrefetchModel, SimOptions};
    use crate::experts::trace::{Trace, TraceStep};
    let (layers, experts, top_k) = (4, 16, 2);
    let mut trace = Trace::synthetic(layers, experts, top_k, 120, 0.8, 0.3, 5);
    // The first eight tokens as one prompt step of eight rows.
    let prompt: Vec<TraceStep> = trace.steps.drain(..8).collect();
    trace.steps.insert(
        0,
        TraceStep {
            rows: 8,
            layers: (0..layers)
                .map(|l| crate::experts::trace::LayerRoutes {
                    layer: l,
                    experts: prompt
                        .iter()
                        .map(|s| s.layers[l].experts[0].clone())
                        .collect(),
                    weights: Vec::new(),
                })
                .collect(),
        },
    );
    let dir = test_dir();
    let (specs, len) = specs(layers, experts, 3000);
    let path = make_file(dir.path(), len);
    let per_token = layers * top_k;
    for policy in ["lrfu-auto", "lru", "lfu-admit", "arc", "lrfu:8"] {
        for recall in [None, Some(0.8)] {
            let cap = 20;
            let slots = recall.map_or(0, |_| {
                crate::experts::book::prefetch_slots(cap, 64, 2 * top_k)
            });
            let mut c = cfg(cap as u64, 1, false, 2, policy);
            let probe = open(
                &path,
                &specs,
                1,
                false,
                1,
                "lru",
                UsageHistogram::new(4, 16),
            );
            c.budget_bytes = cap as u64 * probe.expert_bytes();
            drop(probe);
            c.requests_per_token = per_token;
            c.prefetch_slots = slots;
            let store = ExpertStore::new(
                std::slice::from_ref(&path),
                &specs,
                &c,
                UsageHistogram::new(4, 16),
            )
            .unwrap();
            let model = recall.map(|r| PrefetchModel {
                recall: r,
                slots,
                seed: 9,
            });
            let mut rng = crate::sample::Xoshiro256::seed_from_u64(9);
            for step in &trace.steps {
                for (li, layer) in step.layers.iter().enumerate() {
                    if let (Some(m), Some(next)) = (model, step.layers.get(li + 1)) {
                        let guess = predict(next, experts, m.recall, &mut rng);
                        let guess: Vec<usize> = guess.iter().map(|&e| e as usize).collect();
                        store.prefetch(next.layer, &guess);
                    }
                    for e in layer.unique() {
                        store.get(Key::new(layer.layer, e as usize)).unwrap();
                    }
                }
            }
            let p = policy::build(policy, cap - slots, None, 0.5, per_token).unwrap();
            let opts = SimOptions {
                prefetch: model,
                preload: Vec::new(),
            };
            let sim = simulate_with(&trace, p, &opts);
            let st = store.stats();
            let what = format!("{policy}, prefetch {recall:?}");
            assert_eq!(st.requests, sim.requests, "{what}");
            assert_eq!(st.hits + st.inflight_hits, sim.hits, "{what}");
            assert_eq!(st.misses, sim.misses(), "{what}");
            assert_eq!(st.prefetch_issued, sim.prefetch_reads, "{what}");
            assert_eq!(st.prefetch_used, sim.prefetch_used, "{what}");
            // A prefetch dropped before its read started is skipped: never more reads.
            assert!(st.reads <= sim.reads(), "{what}");
            if recall.is_none() {
                assert_eq!(st.reads, sim.reads(), "{what}");
                assert!(sim.hits > 0 && sim.misses() > 0, "{what}");
            } else {
                assert!(sim.prefetch_used > 0, "{what}");
            }
        }
    }
}

/// Prefetched experts wait outside the policy: misses in between do not evict them
/// (a frequency policy ranks a never-used expert lowest), the oldest unused one goes
/// when the slots are full, and the memory accounting stays exact.
#[test]
fn staged_prefetch_survives_misses_and_the_oldest_unused_goes() {
    let dir = test_dir();
    let (specs, len) = specs(2, 12, 5000);
    let path = make_file(dir.path(), len);
    let probe = open(
        &path,
        &specs,
        1,
        false,
        1,
        "lru",
        UsageHistogram::new(2, 12),
    );
    let eb = probe.expert_bytes();
    drop(probe);
    let mut c = cfg(16, eb, false, 2, "lrfu:1000");
    c.prefetch_slots = 4;
    let store = ExpertStore::new(&[path], &specs, &c, UsageHistogram::new(2, 12)).unwrap();
    assert_eq!(store.capacity(), 16);
    // Twelve frequently used experts fill the policy's share (16 - 4 slots).
    for _ in 0..3 {
        for e in 0..12 {
            store.get(Key::new(0, e)).unwrap();
        }
    }
    assert_eq!(store.prefetch(1, &[3, 5]), 2);
    // Two misses: each evicts from the policy's share, never a staged prefetch.
    store.get(Key::new(1, 8)).unwrap();
    store.get(Key::new(1, 9)).unwrap();
    let misses = store.stats().misses;
    check(&store.get(Key::new(1, 3)).unwrap(), &specs[1][3]);
    let st = store.stats();
    assert_eq!(st.misses, misses, "the staged prefetch was used");
    assert_eq!(st.prefetch_used, 1);
    // [5] staged; 6, 7, 10, 11 come in: the slots hold 4, so 5 (never used) goes.
    assert_eq!(store.prefetch(1, &[6, 7]), 2);
    assert_eq!(store.prefetch(1, &[10, 11]), 2);
    assert_eq!(store.stats().prefetch_wasted, 1);
    assert!(!store.contains(Key::new(1, 5)));
    check(&store.get(Key::new(1, 5)).unwrap(), &specs[1][5]);
    assert_eq!(store.stats().misses, misses + 1);
    // At most half the slots per call, likeliest (first named) first: 6 is staged
    // already, 0 and 1 go in, 2 is not read.
    assert_eq!(store.prefetch(1, &[6, 0, 1, 2]), 2);
    assert!(store.contains(Key::new(1, 0)) && store.contains(Key::new(1, 1)));
    assert!(!store.contains(Key::new(1, 2)));
    // Once every read is done: the bytes held are the ready entries', within the budget.
    for _ in 0..200 {
        let st = store.stats();
        if st.resident_experts == 16 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = store.stats();
    assert!(st.resident_bytes <= st.resident_experts as u64 * eb);
    assert!(st.resident_experts <= 16, "{}", st.resident_experts);
}

#[test]
fn lending_budget_shrinks_and_regrows_the_cache() {
    let dir = test_dir();
    let (specs, len) = specs(1, 8, 5000);
    let path = make_file(dir.path(), len);
    let store = open(&path, &specs, 6, false, 2, "lru", UsageHistogram::new(1, 8));
    let eb = store.expert_bytes();
    for e in 0..6 {
        store.get(Key::new(0, e)).unwrap();
    }
    // (Buffers are whole pages: `eb` is the largest.)
    let full = store.stats().resident_bytes;
    assert!(full > 5 * eb && full <= 6 * eb);
    // Two and a half experts' worth lent: three go, the least recent first.
    store.lend(2 * eb + eb / 2);
    let st = store.stats();
    assert_eq!(st.resident_experts, 3);
    assert!(st.resident_bytes <= 3 * eb);
    assert!((0..3).all(|e| !store.contains(Key::new(0, e))));
    assert!((3..6).all(|e| store.contains(Key::new(0, e))));
    // The cache stays at three while the loan lasts...
    store.get(Key::new(0, 6)).unwrap();
    assert_eq!(store.stats().resident_experts, 3);
    // ...and holds six again once it is repaid; the bytes are still right.
    store.lend(0);
    for e in [0, 1, 2] {
        store.get(Key::new(0, e)).unwrap();
    }
    let st = store.stats();
    assert_eq!(st.resident_experts, 6);
    assert!(st.resident_bytes > 5 * eb && st.resident_bytes <= 6 * eb);
    // More than the budget: nothing is kept, and experts are still served.
    store.lend(u64::MAX);
    check(&store.get(Key::new(0, 7)).unwrap(), &specs[0][7]);
    assert_eq!(store.stats().resident_experts, 0);
}

#[test]
fn preload_fills_without_counting_requests() {
    let dir = test_dir();
    let (specs, len) = specs(2, 4, 5000);
    let path = make_file(dir.path(), len);
    let mut hist = UsageHistogram::new(2, 4);
    hist.add(Key::new(0, 3), 10);
    hist.add(Key::new(1, 1), 5);
    let store = open(&path, &specs, 4, false, 1, "pinned-lru", hist.clone());
    let want = store.preload_candidates(&hist);
    assert_eq!(want, vec![Key::new(0, 3), Key::new(1, 1)]);
    assert_eq!(store.preload(&want), 2);
    check(&store.get(Key::new(0, 3)).unwrap(), &specs[0][3]);
    let st = store.stats();
    assert_eq!((st.requests, st.misses, st.preload_issued), (1, 0, 2));
    // The pins survive a sweep over everything else.
    for l in 0..2 {
        for e in 0..4 {
            store.get(Key::new(l, e)).unwrap();
        }
    }
    assert!(store.contains(Key::new(0, 3)) && store.contains(Key::new(1, 1)));
}

#[test]
fn user_pins_survive_any_policy_and_are_preloaded_first() {
    let dir = test_dir();
    let (specs, len) = specs(2, 4, 5000);
    let path = make_file(dir.path(), len);
    let probe = open(&path, &specs, 3, false, 1, "lru", UsageHistogram::new(2, 4));
    let mut c = cfg(3, probe.expert_bytes(), false, 1, "lru");
    drop(probe);
    c.pins = vec![Key::new(1, 2), Key::new(9, 9)];
    let mut hist = UsageHistogram::new(2, 4);
    hist.add(Key::new(0, 0), 5);
    let store = ExpertStore::new(std::slice::from_ref(&path), &specs, &c, hist.clone()).unwrap();
    assert_eq!(store.policy_name(), "pinned-lru");
    assert_eq!(
        store.preload_candidates(&hist),
        vec![Key::new(1, 2), Key::new(0, 0)]
    );
    store.get(Key::new(1, 2)).unwrap();
    for _ in 0..2 {
        for l in 0..2 {
            for e in 0..4 {
                store.get(Key::new(l, e)).unwrap();
            }
        }
    }
    assert!(store.contains(Key::new(1, 2)));
    assert_eq!(store.stats().resident_experts, 3);
}

#[test]
fn preload_bytes_are_counted_apart() {
    let dir = test_dir();
    let (specs, len) = specs(1, 4, 5000);
    let path = make_file(dir.path(), len);
    let store = open(&path, &specs, 4, false, 1, "lru", UsageHistogram::new(1, 4));
    store.preload(&[Key::new(0, 1)]);
    store.get(Key::new(0, 3)).unwrap();
    for _ in 0..200 {
        if store.stats().resident_experts == 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = store.stats();
    assert!(
        st.preload_bytes > 0 && st.preload_bytes < st.bytes_read,
        "{st:?}"
    );
    assert_eq!(
        st.bytes_read,
        2 * st.preload_bytes,
        "two experts of equal size"
    );
}

#[test]
fn bad_specs_and_keys_are_errors() {
    let dir = test_dir();
    let path = make_file(dir.path(), 1000);
    let bad = vec![vec![ExpertSpec {
        parts: vec![Extent {
            file: 0,
            offset: 900,
            len: 200,
        }],
    }]];
    let err = ExpertStore::new(
        std::slice::from_ref(&path),
        &bad,
        &StoreConfig::default(),
        UsageHistogram::new(1, 1),
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("past the end"), "{err}");
    let good = vec![vec![ExpertSpec {
        parts: vec![Extent {
            file: 0,
            offset: 0,
            len: 1000,
        }],
    }]];
    let store = ExpertStore::new(
        &[path],
        &good,
        &StoreConfig::default(),
        UsageHistogram::new(1, 1),
    )
    .unwrap();
    assert!(store.get(Key::new(0, 1)).is_err());
    assert!(store.get(Key::new(5, 0)).is_err());
    assert_eq!(store.capacity(), 0);
    // Capacity 0 still serves (nothing stays).
    assert_eq!(
        store.get(Key::new(0, 0)).unwrap().part(0)[..10],
        (0..10).map(pattern).collect::<Vec<_>>()[..]
    );
    assert_eq!(store.stats().resident_experts, 0);
}

#[test]
fn a_file_truncated_underneath_is_an_error_not_a_hang() {
    let dir = test_dir();
    let path = make_file(dir.path(), 20_000);
    let specs = vec![vec![ExpertSpec {
        parts: vec![Extent {
            file: 0,
            offset: 10_000,
            len: 9000,
        }],
    }]];
    let store = ExpertStore::new(
        std::slice::from_ref(&path),
        &specs,
        &cfg(1, 1 << 20, false, 1, "lru"),
        UsageHistogram::new(1, 1),
    )
    .unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(12_000)
        .unwrap();
    let err = store.get(Key::new(0, 0)).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert_eq!(store.stats().read_errors, 1);
    assert!(!store.contains(Key::new(0, 0)));
}
