//! The daemon's shared state: configuration, the loaded models (each with its engine
//! thread), session discovery across models and disk, keep-alive, shutdown.

use crate::scheduler::{EngineConfig, EngineShared, EngineThread, Job};
use crate::snapshot::{self, SnapshotError};
use crate::state::{self, StateDir};
use crate::wire::{self, status_from_engine};
use colibri_engine::experts::stream::{self, StreamOptions, Streaming};
use colibri_engine::model::{LoadProgress, LoadStage};
use colibri_engine::Model;
use colibri_proto::v1 as pb;
use std::cell::Cell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tonic::Status;

#[derive(Clone, Debug)]
pub struct Config {
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// Unload a model idle this long; None = keep it loaded.
    pub keep_alive: Option<Duration>,
    pub engine: EngineConfig,
    /// Requests that may wait for a place in the batch, beyond `engine.max_batch`.
    pub queue: usize,
    /// Serve routed experts from the budgeted expert cache (ExpertStore) instead of the
    /// memory map, for every model; a LoadModel with `expert_cache_bytes` streams too.
    pub stream: bool,
    /// Expert cache budget in bytes; None = the memory plan's default.
    pub expert_cache: Option<u64>,
    /// The HTTP API's settings (`--http*`, `--api-key`); its address is empty when the
    /// daemon starts without the API (a ServeHttp request may start it later).
    pub http: crate::serving::HttpConfig,
}

/// A loaded model: its weights (shared read-only with handlers for tokenization) and the
/// channel to its engine thread.
pub struct ModelHandle {
    pub id: String,
    pub model: Arc<Model>,
    pub info: pb::ModelInfo,
    pub shared: Arc<EngineShared>,
    pub loaded_at: Instant,
    /// Routed experts per layer (0 for a dense layer), for validating pins.
    pub experts_per_layer: Vec<usize>,
    /// The expert cache, when the model's experts are streamed.
    pub streaming: Option<Arc<Streaming>>,
    /// Routing counts per expert and the latest token's experts (the dashboard's grid).
    pub activity: Arc<crate::activity::ExpertActivity>,
    /// This model's keep-alive when set apart from the daemon's (`Some(None)`: never
    /// unloaded); None: the daemon's `--keep-alive`.
    pub keep_alive: Mutex<Option<Option<Duration>>>,
    jobs: std::sync::mpsc::Sender<Job>,
    capacity: usize,
}

/// A place in a model's bounded queue, released by the engine thread when the request
/// finishes (or here, if the job never reached it).
pub struct Admission<'a> {
    handle: &'a ModelHandle,
    sent: bool,
}

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        if !self.sent {
            self.handle
                .shared
                .outstanding
                .fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl ModelHandle {
    /// The idle time after which this model is unloaded (None: never).
    pub fn keep_alive(&self, daemon_default: Option<Duration>) -> Option<Duration> {
        self.keep_alive
            .lock()
            .expect("keep-alive lock")
            .unwrap_or(daemon_default)
    }

    /// Sends a control job (not counted against the queue).
    pub fn send(&self, job: Job) -> Result<(), Status> {
        self.jobs
            .send(job)
            .map_err(|_| Status::unavailable(format!("model {} is being unloaded", self.id)))
    }

    /// Takes a place for a Generate/Chat/Score job, or RESOURCE_EXHAUSTED when the model
    /// already has `max_batch + queue` requests.
    pub fn admit(&self) -> Result<Admission<'_>, Status> {
        let before = self.shared.outstanding.fetch_add(1, Ordering::SeqCst);
        let a = Admission {
            handle: self,
            sent: false,
        };
        if before >= self.capacity {
            return Err(Status::resource_exhausted(format!(
                "model {} is busy: {before} requests are running or queued (the limit, set by \
                 colibrid --max-batch and --queue); retry later",
                self.id
            )));
        }
        Ok(a)
    }

    /// Sends a job that holds an admission; the engine thread now owns its release.
    pub fn send_admitted(&self, mut a: Admission<'_>, job: Job) -> Result<(), Status> {
        self.send(job)?;
        a.sent = true;
        Ok(())
    }
}

/// Load progress is forwarded to LoadModel streams at most this often (plus the last report).
pub const LOAD_PROGRESS_EVERY: Duration = Duration::from_millis(100);

#[derive(Clone)]
pub enum LoadState {
    /// Where the engine's load has got (forwarded at most every [`LOAD_PROGRESS_EVERY`]).
    Loading(LoadProgress),
    Ready(Arc<ModelHandle>),
    Failed(Status),
}

enum Slot {
    Loading(watch::Receiver<LoadState>),
    Ready(Arc<ModelHandle>),
}

pub struct Daemon {
    pub cfg: Config,
    pub state: StateDir,
    pub started: Instant,
    models: Mutex<HashMap<String, Slot>>,
    next_request: AtomicU64,
    /// Set to true to stop the daemon (Shutdown RPC, signals).
    pub shutdown: watch::Sender<bool>,
    /// Counters for the HTTP API's /metrics (requests of both front doors).
    pub metrics: crate::metrics::Metrics,
    /// The HTTP API listener, once started (`--http`, ServeHttp).
    pub http: tokio::sync::Mutex<Option<crate::serving::Serving>>,
}

/// Session ids become file names: keep them to a safe alphabet.
pub fn check_session_id(field: &str, id: &str) -> Result<(), Status> {
    if id.is_empty()
        || id.len() > 64
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(wire::invalid(
            field,
            format!("'{id}' is not a session id (1 to 64 of A-Z a-z 0-9 - _)"),
        ));
    }
    Ok(())
}

impl Daemon {
    pub fn new(cfg: Config, state: StateDir) -> Arc<Daemon> {
        let (shutdown, _) = watch::channel(false);
        Arc::new(Daemon {
            cfg,
            state,
            started: Instant::now(),
            models: Mutex::new(HashMap::new()),
            next_request: AtomicU64::new(1),
            shutdown,
            metrics: Default::default(),
            http: tokio::sync::Mutex::new(None),
        })
    }

    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        format!(
            "{prefix}{:012x}{n:04x}",
            (t ^ ((std::process::id() as u64) << 40)) & 0xffff_ffff_ffff
        )
    }

    /// Canonical id of a model directory.
    fn canonical(dir: &str) -> Result<String, Status> {
        if dir.is_empty() {
            return Err(wire::invalid("model", "is empty"));
        }
        let p = std::fs::canonicalize(dir)
            .map_err(|e| Status::not_found(format!("model '{dir}': {e}")))?;
        if !p.is_dir() {
            return Err(wire::invalid(
                "model",
                format!("'{dir}' is not a directory"),
            ));
        }
        Ok(p.to_string_lossy().into_owned())
    }

    pub fn ready_models(&self) -> Vec<Arc<ModelHandle>> {
        let mut v: Vec<_> = self
            .models
            .lock()
            .expect("models lock")
            .values()
            .filter_map(|s| match s {
                Slot::Ready(h) => Some(Arc::clone(h)),
                Slot::Loading(_) => None,
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Starts loading `dir` (or joins a load in progress, or finds it loaded).
    /// `expert_cache_bytes` asks for streamed experts with that budget (the daemon's
    /// `--stream`/`--expert-cache` otherwise decide); it only matters for the first load.
    pub fn load(
        self: &Arc<Self>,
        dir: &str,
        expert_cache_bytes: Option<u64>,
    ) -> Result<watch::Receiver<LoadState>, Status> {
        let id = Self::canonical(dir)?;
        let mut models = self.models.lock().expect("models lock");
        match models.get(&id) {
            Some(Slot::Ready(h)) => return Ok(watch::channel(LoadState::Ready(Arc::clone(h))).1),
            Some(Slot::Loading(rx)) => return Ok(rx.clone()),
            None => {}
        }
        let (tx, rx) = watch::channel(LoadState::Loading(LoadProgress {
            stage: LoadStage::Opening,
            done: 0,
            total: 0,
            message: format!("opening {id}"),
        }));
        models.insert(id.clone(), Slot::Loading(rx.clone()));
        drop(models);
        let daemon = Arc::clone(self);
        let name = Path::new(&id)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let spawned = std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || daemon.engine_thread(id, tx, expert_cache_bytes));
        if let Err(e) = spawned {
            return Err(Status::internal(format!(
                "cannot start an engine thread: {e}"
            )));
        }
        Ok(rx)
    }

    /// Body of a model's thread: load, register, then run the scheduler until unloaded.
    fn engine_thread(
        self: Arc<Self>,
        id: String,
        tx: watch::Sender<LoadState>,
        expert_cache_bytes: Option<u64>,
    ) {
        let t = Instant::now();
        // Lets tests watch a tiny fixture's load progress: a pause after each report.
        let pause = std::env::var("COLIBRI_LOAD_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis);
        let last_sent: Cell<Option<Instant>> = Cell::new(None);
        let report = |p: LoadProgress| {
            if p.stage == LoadStage::Copying && p.done >= p.total {
                tracing::info!(
                    "{id}: {:.1} MB of weights copied into RAM in {:.2} s",
                    p.total as f64 / 1e6,
                    t.elapsed().as_secs_f64()
                );
            }
            // The engine reports per layer; clients need no more than a few a second, and
            // always the last (done == total).
            let due = p.done >= p.total
                || last_sent
                    .get()
                    .is_none_or(|at| at.elapsed() >= LOAD_PROGRESS_EVERY);
            if due {
                last_sent.set(Some(Instant::now()));
                let _ = tx.send(LoadState::Loading(p));
            }
            if let Some(d) = pause {
                std::thread::sleep(d);
            }
        };
        // Expert files the cache will stream stay mapped; the rest may be copied into RAM.
        let open = colibri_engine::container::OpenOptions {
            streamed_experts: self.cfg.stream || expert_cache_bytes.is_some(),
            ..Default::default()
        };
        let loaded = Model::load_with(Path::new(&id), &open, &report).and_then(|mut m| {
            for n in &m.info.notes {
                tracing::warn!("{id}: {n}");
            }
            let streaming = if self.cfg.stream || expert_cache_bytes.is_some() {
                let opts = StreamOptions {
                    budget: expert_cache_bytes.or(self.cfg.expert_cache),
                    state_dir: Some(self.state.root.clone()),
                    ..Default::default()
                };
                let s = stream::enable(&mut m.net, &m.info.dir, &opts)?;
                for w in &s.warnings {
                    tracing::warn!("{id}: {w}");
                }
                Some(s)
            } else {
                None
            };
            // Every MoE block reports its routing to the dashboard's counters.
            let per_layer: Vec<usize> = m
                .net
                .layers
                .iter()
                .map(|l| match &l.ffn {
                    colibri_engine::arch::Ffn::Moe(x) => x.experts.len(),
                    _ => 0,
                })
                .collect();
            let activity = Arc::new(crate::activity::ExpertActivity::new(&per_layer));
            for (li, l) in m.net.layers.iter_mut().enumerate() {
                if let colibri_engine::arch::Ffn::Moe(x) = &mut l.ffn {
                    x.hooks.layer = li;
                    x.hooks.observer = Some(activity.clone());
                }
            }
            Ok((m, streaming, activity))
        });
        let (model, streaming, activity) = match loaded {
            Ok((m, s, a)) => (Arc::new(m), s, a),
            Err(e) => {
                tracing::warn!("loading {id} failed: {e}");
                self.models.lock().expect("models lock").remove(&id);
                let _ = tx.send(LoadState::Failed(status_from_engine(&e)));
                return;
            }
        };
        let experts_per_layer = model
            .net
            .layers
            .iter()
            .map(|l| match &l.ffn {
                colibri_engine::arch::Ffn::Moe(m) => m.experts.len(),
                _ => 0,
            })
            .collect();
        let (jobs, rx) = std::sync::mpsc::channel();
        let shared = Arc::new(EngineShared::new(self.state.load_pins(&id)));
        let handle = Arc::new(ModelHandle {
            id: id.clone(),
            info: wire::model_info(&id, &model),
            model: Arc::clone(&model),
            shared: Arc::clone(&shared),
            loaded_at: Instant::now(),
            experts_per_layer,
            streaming,
            activity,
            keep_alive: Mutex::new(None),
            jobs,
            capacity: self.cfg.engine.max_batch.max(1) + self.cfg.queue,
        });
        tracing::info!(
            "loaded {id} ({}, {} layers, {:.1} MB of weights) in {:.2} s",
            model.info.model_type,
            model.info.num_layers,
            model.info.weight_bytes as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
        self.models
            .lock()
            .expect("models lock")
            .insert(id.clone(), Slot::Ready(Arc::clone(&handle)));
        let _ = tx.send(LoadState::Ready(handle));
        drop(tx);
        let engine = EngineThread::new(
            id.clone(),
            model,
            rx,
            shared,
            self.state.clone(),
            self.cfg.engine.clone(),
        );
        engine.run();
        tracing::info!("engine thread for {id} stopped");
    }

    /// Waits until a load finishes.
    pub async fn wait_loaded(
        mut rx: watch::Receiver<LoadState>,
    ) -> Result<Arc<ModelHandle>, Status> {
        let state = rx
            .wait_for(|s| !matches!(s, LoadState::Loading(_)))
            .await
            .map_err(|_| Status::internal("model load was abandoned"))?
            .clone();
        match state {
            LoadState::Ready(h) => Ok(h),
            LoadState::Failed(st) => Err(st),
            LoadState::Loading(_) => unreachable!("waited for a final state"),
        }
    }

    /// The loaded model a request names (`model` may be empty when exactly one is loaded).
    pub async fn resolve(&self, model: &str) -> Result<Arc<ModelHandle>, Status> {
        if model.is_empty() {
            let ready = self.ready_models();
            return match ready.len() {
                1 => Ok(Arc::clone(&ready[0])),
                0 => Err(Status::failed_precondition(
                    "invalid argument 'model': required (no model is loaded; LoadModel first)",
                )),
                n => Err(wire::invalid(
                    "model",
                    format!("required: {n} models are loaded"),
                )),
            };
        }
        let lookup = |id: &str| {
            self.models
                .lock()
                .expect("models lock")
                .get(id)
                .map(|s| match s {
                    Slot::Ready(h) => Ok(Arc::clone(h)),
                    Slot::Loading(rx) => Err(rx.clone()),
                })
        };
        let found = match lookup(model) {
            Some(x) => Some(x),
            None => lookup(&Self::canonical(model)?),
        };
        match found {
            Some(Ok(h)) => Ok(h),
            // A load in progress is waited for.
            Some(Err(rx)) => Self::wait_loaded(rx).await,
            None => Err(Status::not_found(format!(
                "model {} is not loaded (LoadModel it first, e.g. `coli load {model}`)",
                Self::canonical(model)?
            ))),
        }
    }

    /// Unloads a model: its engine cancels running requests, snapshots sessions, saves pins.
    pub async fn unload(&self, model: &str) -> Result<pb::UnloadModelResponse, Status> {
        let id = if self.models.lock().expect("models lock").contains_key(model) {
            model.to_string()
        } else {
            Self::canonical(model)?
        };
        let handle = {
            let mut models = self.models.lock().expect("models lock");
            match models.remove(&id) {
                Some(Slot::Ready(h)) => h,
                Some(loading @ Slot::Loading(_)) => {
                    models.insert(id.clone(), loading);
                    return Err(Status::failed_precondition(format!(
                        "model {id} is still loading; unload it when it is ready"
                    )));
                }
                None => return Err(Status::not_found(format!("model {id} is not loaded"))),
            }
        };
        let (tx, rx) = oneshot::channel();
        handle.send(Job::Unload { reply: tx })?;
        let resp = rx.await.map_err(|_| {
            Status::internal(format!("engine thread of {id} stopped without answering"))
        })?;
        tracing::info!("unloaded {id} ({} sessions saved)", resp.sessions_saved);
        Ok(resp)
    }

    pub async fn unload_all(&self) {
        for h in self.ready_models() {
            if let Err(e) = self.unload(&h.id).await {
                tracing::warn!("unloading {}: {}", h.id, e.message());
            }
        }
    }

    /// Unloads models idle for longer than the keep-alive.
    pub async fn keep_alive_tick(&self) {
        for h in self.ready_models() {
            let Some(limit) = h.keep_alive(self.cfg.keep_alive) else {
                continue;
            };
            let idle = h
                .shared
                .published
                .lock()
                .expect("published lock")
                .idle_since;
            let busy = h.shared.outstanding.load(Ordering::SeqCst) > 0;
            if !busy && idle.is_some_and(|t| t.elapsed() >= limit) {
                tracing::info!("{} idle for {:?}: unloading (keep-alive)", h.id, limit);
                let _ = self.unload(&h.id).await;
            }
        }
    }

    /// The model a session belongs to: a live one, else its snapshot's header.
    pub fn session_model(&self, id: &str) -> Result<Option<String>, Status> {
        for h in self.ready_models() {
            if h.shared
                .published
                .lock()
                .expect("published lock")
                .sessions
                .iter()
                .any(|s| s.id == id)
            {
                return Ok(Some(h.id.clone()));
            }
        }
        let path = self.state.session_path(id);
        if !path.exists() {
            return Ok(None);
        }
        match snapshot::read_summary(&path) {
            Ok(s) => Ok(Some(s.meta.model)),
            Err(SnapshotError::Damaged(msg)) => {
                let aside = state::set_aside(&path)
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|e| format!("(could not move it aside: {e})"));
                tracing::warn!("{}: {msg}; moved to {aside}", path.display());
                Err(Status::data_loss(format!(
                    "the snapshot of session '{id}' is damaged ({msg}); it was moved aside to {aside}"
                )))
            }
            Err(SnapshotError::Io(e)) => {
                Err(Status::unavailable(format!("{}: {e}", path.display())))
            }
        }
    }

    /// Every session: live ones from the engines, then snapshots of sessions not live.
    /// Damaged snapshots are set aside (and logged) on the way.
    pub fn all_sessions(&self) -> Vec<pb::SessionInfo> {
        let mut out: Vec<pb::SessionInfo> = Vec::new();
        for h in self.ready_models() {
            out.extend(
                h.shared
                    .published
                    .lock()
                    .expect("published lock")
                    .sessions
                    .iter()
                    .cloned(),
            );
        }
        for (path, r) in snapshot::scan(&self.state.sessions_dir()) {
            match r {
                Ok(s) => {
                    // A live session is described by its engine (which knows whether the
                    // snapshot is current).
                    if out.iter().any(|x| x.id == s.meta.id) {
                        continue;
                    }
                    out.push(pb::SessionInfo {
                        id: s.meta.id,
                        model: s.meta.model,
                        cached_tokens: s.cached_tokens as u32,
                        history_tokens: s.meta.tokens.len() as u32,
                        kv_bytes: s.kv_bytes,
                        state: "saved".into(),
                        created_unix_ms: s.meta.created_unix_ms,
                        last_used_unix_ms: s.meta.last_used_unix_ms,
                        persisted: true,
                        messages: s.meta.messages.len() as u32,
                    });
                }
                Err(SnapshotError::Damaged(msg)) => {
                    let aside = state::set_aside(&path);
                    tracing::warn!("{}: {msg}; set aside as {:?}", path.display(), aside);
                }
                Err(SnapshotError::Io(e)) => tracing::warn!("{}: {e}", path.display()),
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse(s.last_used_unix_ms));
        out
    }

    pub fn model_status(&self, h: &ModelHandle) -> pb::ModelStatus {
        let p = h.shared.published.lock().expect("published lock").clone();
        let pinned = h.shared.pins.lock().expect("pins lock").len() as u32;
        pb::ModelStatus {
            info: Some(h.info.clone()),
            active_generations: p.active,
            queued: p.queued,
            live_sessions: p.sessions.len() as u32,
            kv_bytes: p.kv_bytes,
            idle_seconds: p
                .idle_since
                .map(|t| t.elapsed().as_secs_f64())
                .unwrap_or(0.0),
            loaded_seconds: h.loaded_at.elapsed().as_secs_f64(),
            steps: p.steps,
            tokens_generated: p.tokens_generated,
            tokens_prefilled: p.tokens_prefilled,
            expert_cache: Some(expert_cache_stats(h, pinned, p.forward_seconds)),
            keep_alive_seconds: h
                .keep_alive(self.cfg.keep_alive)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0),
            prefix_cache_bytes: p.prefix_cache_bytes,
            prefix_cache_entries: p.prefix_cache_entries,
            prefix_cache_reused_tokens: p.prefix_cache_reused_tokens,
        }
    }
}

/// The expert cache's statistics since load (zeros but the totals when experts are not
/// streamed).
fn expert_cache_stats(h: &ModelHandle, pinned: u32, forward_seconds: f64) -> pb::ExpertCacheStats {
    let mut c = match &h.streaming {
        Some(s) => wire::expert_cache_stats(&s.stats(), forward_seconds),
        None => pb::ExpertCacheStats::default(),
    };
    c.pinned_experts = pinned;
    c.total_experts = h.experts_per_layer.iter().sum::<usize>() as u32;
    c
}

/// Memory figures of this process and machine (zeros where the platform does not say).
pub fn memory_stats() -> pb::MemoryStats {
    #[cfg_attr(not(target_os = "linux"), allow(unused_mut))]
    let mut m = pb::MemoryStats::default();
    #[cfg(target_os = "linux")]
    {
        let kb = |text: &str, key: &str| -> u64 {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
            m.rss_bytes = kb(&s, "VmRSS:");
        }
        if let Ok(s) = std::fs::read_to_string("/proc/meminfo") {
            m.system_total_bytes = kb(&s, "MemTotal:");
            m.system_available_bytes = kb(&s, "MemAvailable:");
        }
    }
    m
}
