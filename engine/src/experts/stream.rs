//! Serving a loaded model's routed experts from the [`ExpertStore`] instead of the memory
//! map: [`enable`] plans the memory, opens the store over the experts' byte ranges in the
//! model files, and installs the hooks every MoE block consults.
//!
//! The experts' `Matrix` templates built by the loader stay as they are (borrowed from the
//! memory map, never touched); a streamed expert is the same matrices re-pointed at the
//! bytes the store read. Same bytes, same kernels, same order of accumulation: outputs are
//! bit-identical to the resident run whatever the budget, policy, prefetch or readers.

use super::hist::{self, UsageHistogram};
use super::hooks::{MoeHooks, Predictor};
use super::plan::{MemInfo, MemoryPlan, ModelBytes};
use super::store::{ExpertSpec, ExpertStore, Extent, StoreConfig, StoreStats, Ticket};
use super::{ExpertBuf, Key};
use crate::arch::blocks::Mlp;
use crate::arch::moe::{Moe, Route};
use crate::arch::{Ffn, Network};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::tensor::{Blob, Matrix};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
pub struct StreamOptions {
    /// `--expert-cache` in bytes; `None`: the plan's default.
    pub budget: Option<u64>,
    pub policy: String,
    pub pin_share: f64,
    pub readers: usize,
    pub direct: bool,
    /// Read the next layer's predicted experts ahead.
    pub prefetch: bool,
    /// The state folder (`--state-dir`); `None`: the daemon's default
    /// ([`hist::default_state_dir`]). The histogram goes to `models/<hash>/` inside.
    pub state_dir: Option<PathBuf>,
    /// Load and save the usage histogram.
    pub persist: bool,
    /// Read the hottest experts of the histogram (and the pins) in the background at start.
    pub preload: bool,
    /// Experts the user pinned: kept once loaded, whatever the policy.
    pub pins: Vec<Key>,
}

impl Default for StreamOptions {
    fn default() -> Self {
        let s = StoreConfig::default();
        StreamOptions {
            budget: None,
            policy: s.policy,
            pin_share: s.pin_share,
            readers: s.readers,
            direct: s.direct,
            prefetch: true,
            state_dir: None,
            persist: true,
            preload: true,
            pins: Vec::new(),
        }
    }
}

/// Save the histogram every this many tokens (and when the model is dropped).
const AUTOSAVE_TOKENS: u64 = 256;

/// The streaming state shared by every MoE block of one model.
pub struct Streaming {
    pub store: ExpertStore,
    pub plan: MemoryPlan,
    /// Things to tell the user (a damaged history set aside, no direct I/O, ...).
    pub warnings: Vec<String>,
    pub hist_path: Option<PathBuf>,
    /// Reads of a layer's missing experts in flight at most (as many buffers as the
    /// prefetch staging slots the memory plan counts, and never fewer than the readers).
    window: usize,
    /// The first MoE layer: its rows are counted as tokens.
    first_layer: usize,
    error: Mutex<Option<Error>>,
    predictions: Mutex<HashMap<usize, Vec<usize>>>,
    saved_at: AtomicU64,
    idle_kv: AtomicU64,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.save_histogram();
    }
}

impl Streaming {
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Tells the store how many bytes the KV caches of every sequence on this model hold
    /// now; past half the plan's safety margin, they are taken from the expert cache
    /// ([`ExpertStore::lend`]), so the process stays within budget + resident part + margin
    /// however long the generation. Callers pass the total after each step.
    pub fn set_kv_bytes(&self, total: u64) {
        self.store.lend(total.saturating_sub(self.plan.margin / 2));
    }

    /// KV bytes of the sequences that stay in memory between steps without being stepped
    /// (a daemon's idle sessions); [`Model::forward`](crate::Model::forward) adds the
    /// stepped sequences' own and calls [`set_kv_bytes`](Self::set_kv_bytes).
    pub fn set_idle_kv_bytes(&self, bytes: u64) {
        self.idle_kv.store(bytes, Ordering::Relaxed);
    }

    /// Writes the usage histogram (when persisting).
    pub fn save_histogram(&self) -> Result<()> {
        match &self.hist_path {
            Some(p) => self.store.save_histogram(p),
            None => Ok(()),
        }
    }

    /// The first read error of a forward pass since the last call, if any. A forward pass
    /// that met one produced garbage and must be discarded.
    pub fn take_error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn record_prediction(&self, layer: usize, set: Vec<usize>) {
        self.predictions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(layer, set);
    }

    /// Scores the prediction made for `layer` (if any) against its routes.
    pub(crate) fn check_prediction(&self, layer: usize, routes: &[Route]) {
        let Some(pred) = self
            .predictions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&layer)
        else {
            return;
        };
        let mut actual: Vec<usize> = routes
            .iter()
            .flat_map(|r| r.experts.iter().copied())
            .collect();
        actual.sort_unstable();
        actual.dedup();
        let correct = actual
            .iter()
            .filter(|e| pred.binary_search(e).is_ok())
            .count();
        self.store
            .note_prediction(pred.len() as u64, correct as u64, actual.len() as u64);
    }

    /// The outputs of the experts of `layer` that rows are routed to (`by_expert[e]` lists
    /// `(row, weight)`), in ascending expert order like the resident path (the caller sums
    /// them in this order: the same bits as resident). Each expert is fetched once for all
    /// the step's rows. The step's misses are requested first (up to `window` at a time,
    /// topped up as they are consumed), so their reads are queued together and run while
    /// the experts already in the cache are computed; then the others, in the order they
    /// were asked for.
    pub fn expert_outputs(
        &self,
        layer: usize,
        templates: &[Mlp],
        by_expert: &[Vec<(usize, f32)>],
        h: &[f32],
        hidden: usize,
    ) -> Vec<(usize, Vec<f32>)> {
        if layer == self.first_layer && hidden > 0 {
            self.store.note_tokens((h.len() / hidden) as u64);
            self.autosave();
        }
        let (cached, missing): (Vec<usize>, Vec<usize>) = (0..by_expert.len())
            .filter(|&e| !by_expert[e].is_empty())
            .partition(|&e| self.store.contains(Key::new(layer, e)));
        let mut tickets: VecDeque<(usize, Result<Ticket>)> = VecDeque::new();
        let mut next = 0;
        let mut top_up = |tickets: &mut VecDeque<(usize, Result<Ticket>)>| {
            while next < missing.len() && tickets.len() < self.window {
                let e = missing[next];
                tickets.push_back((e, self.store.request(Key::new(layer, e))));
                next += 1;
            }
        };
        top_up(&mut tickets);
        let mut out = Vec::with_capacity(cached.len() + missing.len());
        for &e in &cached {
            let t = self.store.request(Key::new(layer, e));
            out.push((e, self.compute(&templates[e], &by_expert[e], h, hidden, t)));
        }
        while let Some((e, t)) = tickets.pop_front() {
            top_up(&mut tickets);
            out.push((e, self.compute(&templates[e], &by_expert[e], h, hidden, t)));
        }
        out.sort_unstable_by_key(|(e, _)| *e);
        out
    }

    /// One expert's output for its rows once its bytes are in (zeros and the error kept
    /// for [`take_error`] when they cannot be read).
    fn compute(
        &self,
        template: &Mlp,
        rows: &[(usize, f32)],
        h: &[f32],
        hidden: usize,
        ticket: Result<Ticket>,
    ) -> Vec<f32> {
        let mut x = Vec::with_capacity(rows.len() * hidden);
        for &(r, _) in rows {
            x.extend_from_slice(&h[r * hidden..(r + 1) * hidden]);
        }
        match ticket.and_then(|t| self.store.wait(t)) {
            Ok(buf) => rebind(template, &buf).forward(&x, rows.len()),
            Err(err) => {
                let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(err);
                vec![0f32; rows.len() * hidden]
            }
        }
    }

    fn autosave(&self) {
        let t = self.store.tokens();
        let last = self.saved_at.load(Ordering::Relaxed);
        if t >= last + AUTOSAVE_TOKENS
            && self
                .saved_at
                .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // A failed save (read-only state folder) must not stop generation.
            let _ = self.save_histogram();
        }
    }
}

/// The parts of an expert in the order [`rebind`] consumes them.
fn matrices(m: &Mlp) -> [&Matrix; 3] {
    [&m.gate, &m.up, &m.down]
}

/// The blobs of an expert that are read from disk: each matrix's data, then its scales
/// unless they are held in RAM (a merged expert's, see `container::split_merged_expert`).
fn streamed_blobs(m: &Matrix) -> impl Iterator<Item = &Blob> {
    std::iter::once(&m.data).chain(m.scales.as_ref().filter(|s| !matches!(s, Blob::Owned(_))))
}

/// The expert's matrices pointing into `buf` (parts: each matrix's streamed blobs, gate, up,
/// down); scales held in RAM stay as they are.
fn rebind(t: &Mlp, buf: &Arc<ExpertBuf>) -> Mlp {
    let mut i = 0;
    let mut next = |b: &Blob| {
        let r = buf.parts[i].clone();
        i += 1;
        debug_assert_eq!(r.len(), b.bytes().len());
        Blob::Shared {
            owner: buf.clone(),
            start: r.start,
            end: r.end,
        }
    };
    let mut one = |m: &Matrix| {
        let data = next(&m.data);
        let scales = m.scales.as_ref().map(|s| match s {
            Blob::Owned(_) => s.clone(),
            _ => next(s),
        });
        // A matrix interleaved in RAM at load is read from its file in the file's layout.
        let format = match &m.data {
            Blob::Mapped { file, start, .. } if file.repacked_at(*start) => m.format.row_major(),
            _ => m.format,
        };
        Matrix {
            data,
            scales,
            format,
            ..m.clone()
        }
    };
    Mlp {
        gate: one(&t.gate),
        up: one(&t.up),
        down: one(&t.down),
    }
}

/// Where one expert's bytes are in the model files.
fn spec_of(
    m: &Mlp,
    files: &mut Vec<PathBuf>,
    index: &mut HashMap<PathBuf, usize>,
    what: &str,
) -> Result<ExpertSpec> {
    let mut parts = Vec::new();
    for mat in matrices(m) {
        for b in streamed_blobs(mat) {
            let Blob::Mapped { file, start, end } = b else {
                return Err(Error::invalid(
                    "experts",
                    format!("{what} is not read from a model file, so it cannot be streamed"),
                ));
            };
            let fi = *index.entry(file.path.clone()).or_insert_with(|| {
                files.push(file.path.clone());
                files.len() - 1
            });
            parts.push(Extent {
                file: fi,
                offset: *start as u64,
                len: (*end - *start) as u64,
            });
        }
    }
    Ok(ExpertSpec { parts })
}

/// The sizes of a network's resident part and routed experts (as the cache holds them).
pub fn model_bytes(net: &Network) -> ModelBytes {
    let mut experts = 0u64;
    let mut count = 0usize;
    let mut size = 0u64;
    for l in &net.layers {
        if let Ffn::Moe(m) = &l.ffn {
            for e in &m.experts {
                let mut files = Vec::new();
                let mut index = HashMap::new();
                let b = match spec_of(e, &mut files, &mut index, "") {
                    Ok(s) => s.buffer_len(),
                    Err(_) => e.size_bytes() as u64,
                };
                experts += e.size_bytes() as u64;
                size = size.max(b);
                count += 1;
            }
        }
    }
    ModelBytes {
        resident: (net.weight_bytes() as u64).saturating_sub(experts),
        experts,
        expert_count: count,
        expert_size: size,
    }
}

/// The memory plan of a loaded model (what `coli plan` prints).
pub fn plan(model: &Model, budget: Option<u64>) -> MemoryPlan {
    MemoryPlan::new(model_bytes(&model.net), MemInfo::read(), budget)
}

/// Serves `model`'s routed experts from a budgeted store. Refuses (with the plan in the
/// error) a model whose resident part does not fit.
pub fn enable(model: &mut Model, opts: &StreamOptions) -> Result<Arc<Streaming>> {
    let plan = plan(model, opts.budget);
    plan.check()?;
    enable_with_plan(model, opts, plan)
}

/// [`enable`] with a plan made elsewhere (tests pin the budget whatever the machine has).
pub fn enable_with_plan(
    model: &mut Model,
    opts: &StreamOptions,
    plan: MemoryPlan,
) -> Result<Arc<Streaming>> {
    let net = &model.net;
    let mut files = Vec::new();
    let mut index = HashMap::new();
    let mut specs: Vec<Vec<ExpertSpec>> = Vec::with_capacity(net.layers.len());
    let mut n_experts = 0;
    let mut per_token = 0;
    let mut top_k = 0;
    let mut moe_layers = Vec::new();
    for (li, l) in net.layers.iter().enumerate() {
        let row = match &l.ffn {
            Ffn::Moe(m) => {
                moe_layers.push(li);
                n_experts = n_experts.max(m.experts.len());
                per_token += m.top_k;
                top_k = top_k.max(m.top_k);
                m.experts
                    .iter()
                    .enumerate()
                    .map(|(e, x)| {
                        spec_of(
                            x,
                            &mut files,
                            &mut index,
                            &format!("expert {e} of layer {li}"),
                        )
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            Ffn::Dense(_) => Vec::new(),
        };
        specs.push(row);
    }
    let Some(&first_layer) = moe_layers.first() else {
        return Err(Error::invalid("model", "has no routed experts to stream"));
    };
    let mut warnings = Vec::new();
    let (hist, hist_path, from_file) = if opts.persist {
        let root = match &opts.state_dir {
            Some(d) => d.clone(),
            None => hist::default_state_dir().ok_or_else(|| {
                Error::invalid(
                    "state-dir",
                    "no home or data folder is known; give --state-dir",
                )
            })?,
        };
        let path = hist::model_state_dir(&root, &model.info.dir).join(hist::FILE_NAME);
        let loaded = UsageHistogram::load(&path, net.layers.len(), n_experts);
        warnings.extend(loaded.warning);
        (loaded.hist, Some(path), loaded.from_file)
    } else {
        (
            UsageHistogram::new(net.layers.len(), n_experts),
            None,
            false,
        )
    };
    let cfg = StoreConfig {
        budget_bytes: plan.budget,
        policy: opts.policy.clone(),
        pin_share: opts.pin_share,
        readers: opts.readers,
        direct: opts.direct,
        requests_per_token: per_token,
        pins: opts.pins.clone(),
        // Two layers' predictions: the next layer's, and the current one's still arriving.
        prefetch_slots: if opts.prefetch { 2 * top_k } else { 0 },
    };
    let store = ExpertStore::new(&files, &specs, &cfg, hist.clone())?;
    warnings.extend(store.stats().notes);
    let window = (opts.readers.max(1) + 1).max(2 * top_k);
    let streaming = Arc::new(Streaming {
        store,
        plan,
        warnings,
        hist_path,
        window,
        first_layer,
        error: Mutex::new(None),
        predictions: Mutex::new(HashMap::new()),
        saved_at: AtomicU64::new(0),
        idle_kv: AtomicU64::new(0),
    });
    // Predictors first (they clone the next layer's router and norm), then the hooks.
    let mut predictors: HashMap<usize, Arc<Predictor>> = HashMap::new();
    if opts.prefetch {
        for w in moe_layers.windows(2) {
            let (l, next) = (w[0], w[1]);
            let nl = &net.layers[next];
            if let Ffn::Moe(m) = &nl.ffn {
                predictors.insert(
                    l,
                    Arc::new(Predictor {
                        layer: next,
                        norm: nl.ffn_norm.clone(),
                        router: Moe {
                            router: m.router.clone(),
                            routing: m.routing.clone(),
                            top_k: m.top_k,
                            experts: Vec::new(),
                            shared: None,
                            hooks: MoeHooks::default(),
                        },
                        stream: streaming.clone(),
                    }),
                );
            }
        }
    }
    for (li, l) in model.net.layers.iter_mut().enumerate() {
        if let Ffn::Moe(m) = &mut l.ffn {
            m.hooks.layer = li;
            m.hooks.stream = Some(streaming.clone());
            m.hooks.predictor = predictors.remove(&li);
        }
    }
    if opts.preload && (from_file || !opts.pins.is_empty()) {
        let keys = streaming.store.preload_candidates(&hist);
        streaming.store.preload(&keys);
    }
    Ok(streaming)
}

/// Stops streaming: the blocks read their experts from the memory map again.
pub fn disable(model: &mut Model) {
    for l in model.net.layers.iter_mut() {
        if let Ffn::Moe(m) = &mut l.ffn {
            m.hooks.stream = None;
            m.hooks.predictor = None;
        }
    }
}

/// The streaming state of a model, if its experts are streamed.
pub fn streaming_of(net: &Network) -> Option<&Arc<Streaming>> {
    net.layers.iter().find_map(|l| match &l.ffn {
        Ffn::Moe(m) => m.hooks.stream.as_ref(),
        Ffn::Dense(_) => None,
    })
}

/// Before a forward step: the KV bytes the stepped sequences will hold after it (plus the
/// idle ones') are taken from the expert cache's budget where they exceed its allowance
/// ([`Streaming::set_kv_bytes`]). No-op (not even counted) without streaming.
pub fn note_kv_bytes(net: &Network, stepped_after: impl FnOnce() -> u64) {
    if let Some(s) = streaming_of(net) {
        s.set_kv_bytes(stepped_after() + s.idle_kv.load(Ordering::Relaxed));
    }
}

/// The read error a forward pass met, as the error of that pass.
pub fn take_error(net: &Network) -> Result<()> {
    match streaming_of(net).and_then(|s| s.take_error()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
