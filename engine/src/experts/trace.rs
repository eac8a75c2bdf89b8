//! Routing traces: which experts each row of each forward step was routed to, layer by
//! layer. Recorded by `coli trace` (through a [`super::RoutingObserver`]) and replayed by the
//! simulator ([`super::sim`]).
//!
//! Stored as JSON (small: a token costs `layers × top_k` numbers) with a version, validated
//! on read like every other file the engine reads.

use super::hist::UsageHistogram;
use super::hooks::RoutingObserver;
use super::Key;
use super::Route;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Mutex;

pub const TRACE_VERSION: u32 = 1;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    pub version: u32,
    /// Free text: the model folder or synthetic generator that produced it.
    pub model: String,
    /// Layers of the model (MoE or not); keys use the model's layer index.
    pub n_layers: usize,
    pub n_experts: usize,
    pub top_k: usize,
    /// Bytes of one routed expert (weights and scales), for byte counts.
    pub expert_bytes: u64,
    pub steps: Vec<TraceStep>,
}

/// One forward step: a prefill chunk (many rows) or a decode step (one row per sequence).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceStep {
    pub rows: usize,
    /// The MoE layers in the order the forward pass visited them.
    pub layers: Vec<LayerRoutes>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LayerRoutes {
    pub layer: usize,
    /// Per row: the selected experts, in routing-weight order.
    pub experts: Vec<Vec<u32>>,
    /// Per row: their routing weights (same order). May be empty (synthetic traces).
    #[serde(default)]
    pub weights: Vec<Vec<f32>>,
}

impl LayerRoutes {
    /// The experts this layer loads in this step: each selected expert once (batch-union),
    /// in ascending order, which is the order the store requests them.
    pub fn unique(&self) -> Vec<u32> {
        let mut u: Vec<u32> = self.experts.iter().flatten().copied().collect();
        u.sort_unstable();
        u.dedup();
        u
    }
}

/// One expert request of a replayed trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub step: usize,
    pub key: Key,
}

impl Trace {
    pub fn new(
        model: impl Into<String>,
        n_layers: usize,
        n_experts: usize,
        top_k: usize,
        expert_bytes: u64,
    ) -> Trace {
        Trace {
            version: TRACE_VERSION,
            model: model.into(),
            n_layers,
            n_experts,
            top_k,
            expert_bytes,
            steps: Vec::new(),
        }
    }

    /// Tokens (rows) over all steps.
    pub fn tokens(&self) -> usize {
        self.steps.iter().map(|s| s.rows).sum()
    }

    /// The request sequence the store sees: per step, per layer, the unique experts.
    pub fn requests(&self) -> Vec<Request> {
        let mut out = Vec::new();
        for (i, s) in self.steps.iter().enumerate() {
            for l in &s.layers {
                for e in l.unique() {
                    out.push(Request {
                        step: i,
                        key: Key::new(l.layer, e as usize),
                    });
                }
            }
        }
        out
    }

    /// Demand counts per expert over the whole trace (what the store's histogram would
    /// hold after replaying it).
    pub fn histogram(&self) -> UsageHistogram {
        let mut h = UsageHistogram::new(self.n_layers, self.n_experts);
        for r in self.requests() {
            h.add(r.key, 1);
        }
        h
    }

    /// The first `tokens` tokens (whole steps).
    pub fn head(&self, tokens: usize) -> Trace {
        let mut t = Trace {
            steps: Vec::new(),
            ..self.clone()
        };
        let mut seen = 0;
        for s in &self.steps {
            if seen >= tokens {
                break;
            }
            seen += s.rows;
            t.steps.push(s.clone());
        }
        t
    }

    /// The trace as a store running prompts in chunks of at most `rows` rows sees it: a
    /// step with more rows is split, in order, into steps of `rows` (the last one shorter).
    pub fn chunked(&self, rows: usize) -> Trace {
        let rows = rows.max(1);
        let mut t = Trace {
            steps: Vec::with_capacity(self.steps.len()),
            ..self.clone()
        };
        for s in &self.steps {
            if s.rows <= rows {
                t.steps.push(s.clone());
                continue;
            }
            for start in (0..s.rows).step_by(rows) {
                let end = (start + rows).min(s.rows);
                let cut = |v: &Vec<Vec<f32>>| v.get(start..end).map_or(Vec::new(), <[_]>::to_vec);
                t.steps.push(TraceStep {
                    rows: end - start,
                    layers: s
                        .layers
                        .iter()
                        .map(|l| LayerRoutes {
                            layer: l.layer,
                            experts: l.experts[start..end].to_vec(),
                            weights: cut(&l.weights),
                        })
                        .collect(),
                });
            }
        }
        t
    }

    /// Checks every index against the declared shape.
    pub fn validate(&self, src: &Path) -> Result<()> {
        let bad = |msg: String| Error::CorruptFile {
            file: src.to_path_buf(),
            msg,
        };
        if self.version != TRACE_VERSION {
            return Err(bad(format!(
                "trace version {} (this build reads version {TRACE_VERSION})",
                self.version
            )));
        }
        if self.n_experts == 0 || self.top_k == 0 || self.top_k > self.n_experts {
            return Err(bad(format!(
                "n_experts {} and top_k {} make no MoE layer",
                self.n_experts, self.top_k
            )));
        }
        for (i, s) in self.steps.iter().enumerate() {
            for l in &s.layers {
                if l.layer >= self.n_layers {
                    return Err(bad(format!(
                        "step {i}: layer {} of {}",
                        l.layer, self.n_layers
                    )));
                }
                if l.experts.len() != s.rows {
                    return Err(bad(format!(
                        "step {i} layer {}: {} rows of experts for {} rows",
                        l.layer,
                        l.experts.len(),
                        s.rows
                    )));
                }
                if !l.weights.is_empty()
                    && (l.weights.len() != s.rows
                        || l.weights
                            .iter()
                            .zip(&l.experts)
                            .any(|(w, e)| w.len() != e.len()))
                {
                    return Err(bad(format!(
                        "step {i} layer {}: weights do not match experts",
                        l.layer
                    )));
                }
                if let Some(e) = l
                    .experts
                    .iter()
                    .flatten()
                    .find(|&&e| e as usize >= self.n_experts)
                {
                    return Err(bad(format!(
                        "step {i} layer {}: expert {e} of {}",
                        l.layer, self.n_experts
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<Trace> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let t: Trace = serde_json::from_slice(&bytes).map_err(|e| Error::CorruptFile {
            file: path.to_path_buf(),
            msg: format!("not a routing trace: {e}"),
        })?;
        t.validate(path)?;
        Ok(t)
    }

    /// Writes atomically (temp file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = serde_json::to_vec(self).expect("a trace serializes");
        super::hist::write_atomic(path, &bytes)
    }

    /// A synthetic trace of `tokens` decode steps drawn from [`ZipfRouting`]. For policy
    /// studies when no model trace is at hand.
    pub fn synthetic(
        n_layers: usize,
        n_experts: usize,
        top_k: usize,
        tokens: usize,
        s: f64,
        stickiness: f64,
        seed: u64,
    ) -> Trace {
        let z = ZipfRouting::new(n_layers, n_experts, top_k, s, stickiness, seed);
        let mut t = Trace::new(
            format!("synthetic zipf s={s} stickiness={stickiness} seed={seed}"),
            n_layers,
            n_experts,
            top_k,
            0,
        );
        for _ in 0..tokens {
            let layers = (0..n_layers)
                .map(|l| LayerRoutes {
                    layer: l,
                    experts: vec![z.next(l)],
                    weights: Vec::new(),
                })
                .collect();
            t.steps.push(TraceStep { rows: 1, layers });
        }
        t
    }
}

/// Synthetic routing: each layer ranks its experts in its own random order and draws a
/// token's `top_k` distinct experts from a Zipf law of exponent `s` over the ranks; with
/// probability `stickiness` a slot keeps the previous token's expert (the temporal locality
/// real routers show). Used for policy studies and, through [`super::hooks::RouteSource`],
/// to give a random-weight model realistic routing in benchmarks.
pub struct ZipfRouting {
    top_k: usize,
    stickiness: f64,
    perms: Vec<Vec<u32>>,
    cdf: Vec<f64>,
    state: Mutex<(crate::sample::Xoshiro256, Vec<Vec<u32>>)>,
}

impl ZipfRouting {
    pub fn new(
        n_layers: usize,
        n_experts: usize,
        top_k: usize,
        s: f64,
        stickiness: f64,
        seed: u64,
    ) -> ZipfRouting {
        let mut rng = crate::sample::Xoshiro256::seed_from_u64(seed);
        // Per layer: a random permutation mapping popularity rank -> expert.
        let perms: Vec<Vec<u32>> = (0..n_layers)
            .map(|_| {
                let mut p: Vec<u32> = (0..n_experts as u32).collect();
                for i in (1..p.len()).rev() {
                    let j = (rng.next_f64() * (i + 1) as f64) as usize;
                    p.swap(i, j.min(i));
                }
                p
            })
            .collect();
        let weights: Vec<f64> = (1..=n_experts).map(|r| 1.0 / (r as f64).powf(s)).collect();
        let total: f64 = weights.iter().sum();
        let cdf: Vec<f64> = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        ZipfRouting {
            top_k: top_k.min(n_experts),
            stickiness,
            perms,
            cdf,
            state: Mutex::new((rng, vec![Vec::new(); n_layers])),
        }
    }

    /// Draws tokens from a fresh random stream `seed`, keeping the experts' ranking: another
    /// run of the same "model".
    pub fn with_draw_seed(self, seed: u64) -> ZipfRouting {
        let n = self.perms.len();
        ZipfRouting {
            state: Mutex::new((
                crate::sample::Xoshiro256::seed_from_u64(seed ^ 0x5eed),
                vec![Vec::new(); n],
            )),
            ..self
        }
    }

    /// The next token's experts at `layer` (a layer outside the shape gets layer 0's law).
    pub fn next(&self, layer: usize) -> Vec<u32> {
        let l = if layer < self.perms.len() { layer } else { 0 };
        let perm = &self.perms[l];
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (rng, prev) = &mut *st;
        let mut chosen: Vec<u32> = Vec::with_capacity(self.top_k);
        for slot in 0..self.top_k {
            if let Some(&p) = prev[l].get(slot) {
                if rng.next_f64() < self.stickiness && !chosen.contains(&p) {
                    chosen.push(p);
                    continue;
                }
            }
            loop {
                let u = rng.next_f64();
                let r = self.cdf.partition_point(|&c| c < u).min(perm.len() - 1);
                let e = perm[r];
                if !chosen.contains(&e) {
                    chosen.push(e);
                    break;
                }
            }
        }
        prev[l] = chosen.clone();
        chosen
    }
}

impl super::hooks::RouteSource for ZipfRouting {
    fn reroute(&self, layer: usize, routes: &mut [Route]) {
        for r in routes.iter_mut() {
            r.experts = self.next(layer).into_iter().map(|e| e as usize).collect();
            r.weights.resize(r.experts.len(), 0.0);
        }
    }
}

/// Replays the routing recorded in a trace (benchmarks only: it changes outputs): each row
/// a model's forward step computes takes the next row of the trace, in order, and every MoE
/// layer of it routes to the experts that row's layer chose (with their weights; equal
/// weights when the trace has none). A random-weight model of the same expert topology
/// (`coli synth --like-trace`) then reads its experts from disk the way the traced model did:
/// `coli trace --replay-routing`. The model's steps are its own (a prompt chunk, then one row
/// per decode step); a layer the trace did not record for a row keeps the router's choice;
/// past the trace's last row it starts again from the first.
pub struct ReplayRouting {
    trace: Trace,
    /// Per row of the trace, in order: (step, row within the step).
    rows: Vec<(usize, usize)>,
    /// Per step: model layer → index into the step's layers.
    layer_at: Vec<std::collections::HashMap<usize, usize>>,
    /// The model's first MoE layer: a forward step starts there.
    first_layer: usize,
    /// (first trace row of the current forward step, its rows).
    cursor: Mutex<(usize, usize)>,
}

impl ReplayRouting {
    /// `first_layer` is the replaying model's first MoE layer.
    pub fn new(trace: Trace, first_layer: usize) -> Result<ReplayRouting> {
        let rows: Vec<(usize, usize)> = trace
            .steps
            .iter()
            .enumerate()
            .flat_map(|(s, st)| (0..st.rows).map(move |r| (s, r)))
            .collect();
        if rows.is_empty() {
            return Err(Error::invalid("replay-routing", "the trace has no rows"));
        }
        let layer_at = trace
            .steps
            .iter()
            .map(|st| {
                st.layers
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (l.layer, i))
                    .collect()
            })
            .collect();
        Ok(ReplayRouting {
            trace,
            rows,
            layer_at,
            first_layer,
            cursor: Mutex::new((0, 0)),
        })
    }

    /// Rows of the trace (tokens).
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Rows of the trace's first step (its prompt, when it was recorded as one step).
    pub fn first_step_rows(&self) -> usize {
        self.trace.steps.first().map_or(1, |s| s.rows.max(1))
    }
}

impl super::hooks::RouteSource for ReplayRouting {
    fn reroute(&self, layer: usize, routes: &mut [Route]) {
        let mut c = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        if layer == self.first_layer {
            c.0 += c.1;
            c.1 = routes.len();
        }
        for (i, r) in routes.iter_mut().enumerate() {
            let (s, row) = self.rows[(c.0 + i) % self.rows.len()];
            let Some(&li) = self.layer_at[s].get(&layer) else {
                continue;
            };
            let lr = &self.trace.steps[s].layers[li];
            let experts = &lr.experts[row];
            r.experts = experts.iter().map(|&e| e as usize).collect();
            r.weights = match lr.weights.get(row) {
                Some(w) if w.len() == experts.len() => w.clone(),
                _ => vec![1.0 / experts.len().max(1) as f32; experts.len()],
            };
        }
    }
}

/// Records the routing of a model's forward steps into a [`Trace`]: install it as every MoE
/// block's observer and call [`Recorder::begin_step`] before each step.
pub struct Recorder {
    trace: Mutex<Trace>,
}

impl Recorder {
    pub fn new(trace: Trace) -> Recorder {
        Recorder {
            trace: Mutex::new(trace),
        }
    }

    /// Starts a forward step of `rows` rows.
    pub fn begin_step(&self, rows: usize) {
        self.lock().steps.push(TraceStep {
            rows,
            layers: Vec::new(),
        });
    }

    pub fn trace(&self) -> Trace {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Trace> {
        self.trace.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RoutingObserver for Recorder {
    fn observe(&self, layer: usize, routes: &[Route]) {
        let mut t = self.lock();
        if t.steps.is_empty() {
            t.steps.push(TraceStep {
                rows: routes.len(),
                layers: Vec::new(),
            });
        }
        let step = t.steps.last_mut().expect("a step");
        step.layers.push(LayerRoutes {
            layer,
            experts: routes
                .iter()
                .map(|r| r.experts.iter().map(|&e| e as u32).collect())
                .collect(),
            weights: routes.iter().map(|r| r.weights.clone()).collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Trace {
        let mut t = Trace::new("test", 2, 4, 2, 100);
        t.steps.push(TraceStep {
            rows: 2,
            layers: vec![
                LayerRoutes {
                    layer: 0,
                    experts: vec![vec![3, 1], vec![1, 2]],
                    weights: vec![vec![0.6, 0.4], vec![0.5, 0.5]],
                },
                LayerRoutes {
                    layer: 1,
                    experts: vec![vec![0, 1], vec![0, 1]],
                    weights: vec![],
                },
            ],
        });
        t
    }

    #[test]
    fn requests_are_the_batch_union_per_layer() {
        let r: Vec<(u32, u32)> = tiny()
            .requests()
            .iter()
            .map(|r| (r.key.layer, r.key.expert))
            .collect();
        assert_eq!(r, vec![(0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]);
        assert_eq!(tiny().tokens(), 2);
    }

    #[test]
    fn round_trip_and_validation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        tiny().save(&p).unwrap();
        assert_eq!(Trace::load(&p).unwrap(), tiny());

        let mut t = tiny();
        t.steps[0].layers[0].experts[0][0] = 4;
        assert!(t
            .validate(&p)
            .unwrap_err()
            .to_string()
            .contains("expert 4 of 4"));
        let mut t = tiny();
        t.steps[0].layers[1].layer = 2;
        assert!(t.validate(&p).is_err());
        let mut t = tiny();
        t.steps[0].rows = 3;
        assert!(t.validate(&p).is_err());
        let mut t = tiny();
        t.steps[0].layers[0].weights[1].pop();
        assert!(t.validate(&p).is_err());

        std::fs::write(&p, b"{\"version\": 1}").unwrap();
        assert!(matches!(Trace::load(&p), Err(Error::CorruptFile { .. })));
    }

    #[test]
    fn recorder_builds_steps_and_histogram_counts_requests() {
        let r = Recorder::new(Trace::new("rec", 2, 4, 2, 8));
        let route = |e: &[usize]| Route {
            experts: e.to_vec(),
            weights: vec![0.5; e.len()],
        };
        r.begin_step(2);
        r.observe(0, &[route(&[3, 1]), route(&[1, 2])]);
        r.observe(1, &[route(&[0, 1]), route(&[0, 1])]);
        r.begin_step(1);
        r.observe(0, &[route(&[1, 2])]);
        let t = r.trace();
        t.validate(Path::new("rec")).unwrap();
        assert_eq!(t.tokens(), 3);
        assert_eq!(t.steps[0].layers[0].experts, vec![vec![3, 1], vec![1, 2]]);
        let h = t.histogram();
        // Batch-union: in step 0 layer 0, expert 1 is counted once.
        assert_eq!(h.get(Key::new(0, 1)), 2);
        assert_eq!(h.get(Key::new(1, 0)), 1);
        assert_eq!(h.total(), 3 + 2 + 2);
        assert_eq!(t.head(2).steps.len(), 1);
        let c = t.chunked(1);
        assert_eq!(c.steps.len(), 3);
        assert_eq!(c.tokens(), 3);
        assert_eq!(c.steps[1].layers[0].experts, vec![vec![1, 2]]);
        assert_eq!(c.steps[1].layers[0].weights, vec![vec![0.5, 0.5]]);
        c.validate(Path::new("chunked")).unwrap();
        assert_eq!(t.chunked(512), t);
        assert_eq!(t.head(3).steps.len(), 2);
    }

    #[test]
    fn replay_routes_each_row_as_recorded_and_wraps() {
        use super::super::hooks::RouteSource;
        let mut t = tiny();
        t.steps.push(TraceStep {
            rows: 1,
            layers: vec![LayerRoutes {
                layer: 1,
                experts: vec![vec![2, 3]],
                weights: vec![],
            }],
        });
        let r = ReplayRouting::new(t, 0).unwrap();
        assert_eq!((r.rows(), r.first_step_rows()), (3, 2));
        let route = |e: &[usize]| Route {
            experts: e.to_vec(),
            weights: vec![0.5; e.len()],
        };
        // A model step of one row, then one of two rows (trace rows 1 and 2).
        let mut a = vec![route(&[0, 0])];
        r.reroute(0, &mut a);
        assert_eq!(a[0].experts, vec![3, 1]);
        assert_eq!(a[0].weights, vec![0.6, 0.4]);
        let mut a = vec![route(&[0, 0]), route(&[0, 0])];
        r.reroute(0, &mut a);
        // Row 1 is step 0's second row; row 2 (step 1) did not record layer 0: kept.
        assert_eq!(a[0].experts, vec![1, 2]);
        assert_eq!(a[1].experts, vec![0, 0]);
        r.reroute(1, &mut a);
        assert_eq!(a[0].experts, vec![0, 1]);
        assert_eq!(a[1].experts, vec![2, 3]);
        assert_eq!(a[1].weights, vec![0.5, 0.5]);
        // Past the end: from the first row again.
        let mut a = vec![route(&[0, 0])];
        r.reroute(0, &mut a);
        assert_eq!(a[0].experts, vec![3, 1]);
    }

    #[test]
    fn synthetic_is_skewed_reproducible_and_valid() {
        let a = Trace::synthetic(3, 16, 2, 500, 1.0, 0.0, 7);
        assert_eq!(a, Trace::synthetic(3, 16, 2, 500, 1.0, 0.0, 7));
        a.validate(Path::new("synthetic")).unwrap();
        assert_eq!(a.requests().len(), 3 * 2 * 500);
        let mut counts = [0usize; 16];
        for r in a.requests().iter().filter(|r| r.key.layer == 0) {
            counts[r.key.expert as usize] += 1;
        }
        counts.sort_unstable();
        // Zipf(1) over 16: the most popular expert is picked far more often than the least.
        assert!(counts[15] > 4 * counts[0].max(1), "{counts:?}");
        for s in &a.steps {
            for l in &s.layers {
                assert_eq!(l.unique().len(), 2, "top-k experts are distinct");
            }
        }
    }
}
