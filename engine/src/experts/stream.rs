//! Serving a loaded model's routed experts from the [`ExpertStore`] instead of the memory
//! map: [`enable`] plans the memory, opens the store over the experts' byte ranges in the
//! model files, and installs the hooks every MoE block consults.
//!
//! The experts' `Matrix` templates built by the loader stay as they are (borrowed from the
//! memory map, never touched); a streamed expert is the same matrices re-pointed at the
//! bytes the store read. Same bytes, same kernels, same order of accumulation: outputs are
//! bit-identical to the resident run whatever the budget, policy, prefetch or readers.

use super::hist::{self, UsageHistogram};
use super::hooks::{LayerPredictor, MoeHooks};
use super::plan::{MemInfo, MemoryPlan, ModelBytes};
use super::store::{ExpertSpec, ExpertStore, Extent, StoreConfig};
use super::Key;
use crate::arch::blocks::{Mlp, RmsNorm};
use crate::arch::moe::Moe;
use crate::arch::{Ffn, Network};
use crate::error::{Error, Result};
use crate::tensor::{Blob, Matrix};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use super::streaming::Streaming;

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

/// Applies layer L+1's norm and router to the residual stream after layer L's attention and
/// queues reads of the experts it picks, so they load while layer L's experts compute.
/// Only the reads' timing depends on it, never the outputs.
pub struct Predictor {
    /// The layer predicted.
    pub layer: usize,
    pub norm: RmsNorm,
    /// The predicted layer's router (its experts are not needed here).
    pub router: Moe,
    pub stream: Arc<Streaming>,
}

impl LayerPredictor for Predictor {
    fn layer(&self) -> usize {
        self.layer
    }

    fn predict(&self, x: &[f32], n: usize) {
        let h = self.norm.forward(x);
        let routes = self.router.route(&h, n);
        // Heaviest first (routing weight summed over the rows): when a prefill predicts more
        // experts than the prefetch slots hold, the store keeps the likeliest.
        let mut weight: HashMap<usize, f32> = HashMap::new();
        for r in &routes {
            for (&e, &w) in r.experts.iter().zip(&r.weights) {
                *weight.entry(e).or_default() += w;
            }
        }
        let mut ordered: Vec<(usize, f32)> = weight.into_iter().collect();
        ordered.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let ordered: Vec<usize> = ordered.into_iter().map(|(e, _)| e).collect();
        self.stream.store.prefetch(self.layer, &ordered);
        let mut set = ordered;
        set.sort_unstable();
        self.stream.record_prediction(self.layer, set);
    }
}

/// The parts of an expert in the order `streaming::rebind` consumes them.
fn matrices(m: &Mlp) -> [&Matrix; 3] {
    [&m.gate, &m.up, &m.down]
}

/// The blobs of an expert that are read from disk: each matrix's data, then its scales
/// unless they are held in RAM (a merged expert's, see `container::split_merged_expert`).
fn streamed_blobs(m: &Matrix) -> impl Iterator<Item = &Blob> {
    std::iter::once(&m.data).chain(m.scales.as_ref().filter(|s| !matches!(s, Blob::Owned(_))))
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

/// The memory plan of a loaded model's network (what `coli plan` prints).
pub fn plan(net: &Network, budget: Option<u64>) -> MemoryPlan {
    MemoryPlan::new(model_bytes(net), MemInfo::read(), budget)
}

/// Serves the routed experts of `net` (the network of the model loaded from `model_dir`,
/// which names its usage histogram) from a budgeted store. Refuses (with the plan in the
/// error) a model whose resident part does not fit.
pub fn enable(net: &mut Network, model_dir: &Path, opts: &StreamOptions) -> Result<Arc<Streaming>> {
    let plan = plan(net, opts.budget);
    plan.check()?;
    enable_with_plan(net, model_dir, opts, plan)
}

/// [`enable`] with a plan made elsewhere (tests pin the budget whatever the machine has).
pub fn enable_with_plan(
    net: &mut Network,
    model_dir: &Path,
    opts: &StreamOptions,
    plan: MemoryPlan,
) -> Result<Arc<Streaming>> {
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
        let path = hist::model_state_dir(&root, model_dir).join(hist::FILE_NAME);
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
    let mut predictors: HashMap<usize, Arc<dyn LayerPredictor>> = HashMap::new();
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
    for (li, l) in net.layers.iter_mut().enumerate() {
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
pub fn disable(net: &mut Network) {
    for l in net.layers.iter_mut() {
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
