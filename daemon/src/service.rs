//! The colibri.v1 gRPC handlers. They validate, route and wait; model code runs only on
//! the engine threads (scheduler/). Tokenize/Detokenize use the model's tokenizer on
//! tokio's blocking pool.

use crate::daemon::{check_session_id, memory_stats, Daemon, LoadState};
use crate::limits;
use crate::scheduler::{GenInput, GenJob, Job, PerplexityJob, ScoreJob};
use crate::wire::{self, status_from_engine};
use colibri_engine::experts::Key;
use colibri_engine::model::LoadStage;
use colibri_proto::v1 as pb;
use pb::colibri_server::Colibri;
use pb::load_model_progress::Stage;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A generation's event stream that reports to [`crate::metrics::Metrics`]: its Finished event, or, when
/// it is dropped unfinished (a client gone: the engine cancels the generation) or fails,
/// that.
pub struct Observed {
    inner: BoxStream<pb::GenerateEvent>,
    daemon: Arc<Daemon>,
    model: String,
    ended: bool,
}

impl Observed {
    pub fn new(
        inner: BoxStream<pb::GenerateEvent>,
        daemon: Arc<Daemon>,
        model: String,
    ) -> Observed {
        Observed {
            inner,
            daemon,
            model,
            ended: false,
        }
    }
}

impl tokio_stream::Stream for Observed {
    type Item = Result<pb::GenerateEvent, tonic::Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let p = self.inner.as_mut().poll_next(cx);
        if !self.ended {
            match &p {
                std::task::Poll::Ready(Some(Ok(pb::GenerateEvent {
                    event: Some(pb::generate_event::Event::Finished(f)),
                }))) => {
                    self.ended = true;
                    self.daemon.metrics.generation_finished(&self.model, f);
                }
                std::task::Poll::Ready(Some(Err(_)) | None) => {
                    self.ended = true;
                    self.daemon
                        .metrics
                        .generation_ended_early(&self.model, "error");
                }
                _ => {}
            }
        }
        p
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        if !self.ended {
            self.daemon
                .metrics
                .generation_ended_early(&self.model, "cancelled");
        }
    }
}

/// The ServeHttp RPC's work. It belongs to the HTTP layer, which sits above this one, so the
/// gRPC door is handed it (server.rs passes `http::serve_http_rpc`) instead of importing it.
pub type ServeHttpFn =
    fn(
        Arc<Daemon>,
        pb::ServeHttpRequest,
    ) -> Pin<Box<dyn Future<Output = Result<pb::ServeHttpResponse, Status>> + Send>>;

pub struct Service {
    pub daemon: Arc<Daemon>,
    pub serve_http: ServeHttpFn,
}

fn engine_gone() -> Status {
    Status::unavailable("the model's engine stopped (unloaded or shutting down)")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("worker failed: {e}")))?
}

impl Service {
    /// The model for a request that may name a session: the session's model when `model`
    /// is empty, and INVALID_ARGUMENT when they disagree.
    async fn model_for(
        &self,
        model: &str,
        session_id: &str,
    ) -> Result<Arc<crate::daemon::ModelHandle>, Status> {
        if session_id.is_empty() {
            return self.daemon.resolve(model).await;
        }
        check_session_id("session_id", session_id)?;
        let d = Arc::clone(&self.daemon);
        let sid = session_id.to_string();
        let owner = blocking(move || d.session_model(&sid)).await?;
        let h = match (&owner, model.is_empty()) {
            (Some(owner), true) => self.daemon.resolve(owner).await.map_err(|e| {
                Status::new(
                    e.code(),
                    format!(
                        "session '{session_id}' belongs to model {owner}: {}",
                        e.message()
                    ),
                )
            })?,
            _ => self.daemon.resolve(model).await?,
        };
        if let Some(owner) = owner {
            if owner != h.id {
                return Err(wire::invalid(
                    "session_id",
                    format!(
                        "session '{session_id}' belongs to model {owner}, not {}",
                        h.id
                    ),
                ));
            }
        }
        Ok(h)
    }

    /// Queues a generation and waits for its first event, so that a refused request fails
    /// the call itself (a plain gRPC error) rather than the first message of a stream.
    async fn start_generation(
        &self,
        model: &str,
        session_id: String,
        input: GenInput,
        options: Option<pb::GenerationOptions>,
        chat: Option<&pb::ChatRequest>,
    ) -> Result<Response<BoxStream<pb::GenerateEvent>>, Status> {
        let arrived = Instant::now();
        let o = options.unwrap_or_default();
        let extras = wire::gen_extras(&o, chat)?;
        let h = self.model_for(model, &session_id).await?;
        if let GenInput::Text { text, .. } = &input {
            limits::check_prompt_bytes(&h.model, text.len(), "prompt")?;
        }
        if o.request_id.len() > 128 {
            return Err(wire::invalid(
                "options.request_id",
                "is longer than 128 bytes",
            ));
        }
        let request_id = if o.request_id.is_empty() {
            self.daemon.new_id("r")
        } else {
            o.request_id.clone()
        };
        let (tx, mut rx) = mpsc::unbounded_channel();
        let job = GenJob {
            request_id,
            session_id: (!session_id.is_empty()).then_some(session_id),
            input,
            max_tokens: o.max_tokens as usize,
            clamp_max_tokens: o.clamp_max_tokens,
            sampling: wire::sampling(o.sampling.as_ref()),
            stop: o.stop,
            ignore_eos: o.ignore_eos,
            return_logits: o.return_logits,
            draft: o.draft_tokens.map(|n| n as usize),
            events: tx,
            arrived,
            extras,
        };
        let admission = h.admit()?;
        h.send_admitted(admission, Job::Generate(job))?;
        match rx.recv().await {
            Some(Ok(first)) => {
                let rest = UnboundedReceiverStream::new(rx);
                // Every generation is counted for /metrics, whichever door it came in.
                Ok(Response::new(Box::pin(Observed::new(
                    Box::pin(tokio_stream::once(Ok(first)).chain(rest)),
                    Arc::clone(&self.daemon),
                    h.id.clone(),
                ))))
            }
            Some(Err(st)) => Err(st),
            None => Err(engine_gone()),
        }
    }
}

#[tonic::async_trait]
impl Colibri for Service {
    type LoadModelStream = BoxStream<pb::LoadModelProgress>;

    async fn load_model(
        &self,
        req: Request<pb::LoadModelRequest>,
    ) -> Result<Response<Self::LoadModelStream>, Status> {
        let req = req.into_inner();
        let mut rx = self.daemon.load(&req.model, req.expert_cache_bytes)?;
        let (tx, out) = mpsc::channel(8);
        tokio::spawn(async move {
            let mut already = true;
            // Ready repeats the load's total so a bar ends where it was heading.
            let mut total = None;
            let ready = |h: &crate::daemon::ModelHandle, already: bool, total: Option<u64>| {
                let bytes = total.unwrap_or(h.info.weight_bytes);
                pb::LoadModelProgress {
                    stage: Stage::Ready as i32,
                    done: bytes,
                    total: bytes,
                    message: format!("{} ready", h.id),
                    already_loaded: already,
                    info: Some(h.info.clone()),
                }
            };
            loop {
                let state = rx.borrow_and_update().clone();
                let msg = match state {
                    LoadState::Loading(p) => {
                        already = false;
                        if p.total > 0 {
                            total = Some(p.total);
                        }
                        Ok(pb::LoadModelProgress {
                            stage: match p.stage {
                                LoadStage::Opening => Stage::Opening,
                                LoadStage::Copying | LoadStage::Weights | LoadStage::Text => {
                                    Stage::Loading
                                }
                            } as i32,
                            done: p.done,
                            total: p.total,
                            message: p.message,
                            ..Default::default()
                        })
                    }
                    LoadState::Ready(h) => Ok(ready(&h, already, total)),
                    LoadState::Failed(st) => Err(st),
                };
                let last = !matches!(msg, Ok(ref m) if m.stage != Stage::Ready as i32);
                if tx.send(msg).await.is_err() || last {
                    return;
                }
                if rx.changed().await.is_err() {
                    // The loader dropped its sender: report the final state it left.
                    let state = rx.borrow().clone();
                    let msg = match state {
                        LoadState::Ready(h) => Ok(ready(&h, false, total)),
                        LoadState::Failed(st) => Err(st),
                        LoadState::Loading(_) => Err(Status::internal("model load was abandoned")),
                    };
                    let _ = tx.send(msg).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(out))))
    }

    async fn unload_model(
        &self,
        req: Request<pb::UnloadModelRequest>,
    ) -> Result<Response<pb::UnloadModelResponse>, Status> {
        let req = req.into_inner();
        Ok(Response::new(self.daemon.unload(&req.model).await?))
    }

    async fn list_models(
        &self,
        _: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let models = self
            .daemon
            .ready_models()
            .iter()
            .map(|h| self.daemon.model_status(h))
            .collect();
        Ok(Response::new(pb::ListModelsResponse { models }))
    }

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let d = Arc::clone(&self.daemon);
        let sessions = blocking(move || Ok(d.all_sessions())).await?;
        let models: Vec<pb::ModelStatus> = self
            .daemon
            .ready_models()
            .iter()
            .map(|h| self.daemon.model_status(h))
            .collect();
        let mut memory = memory_stats();
        for m in &models {
            memory.weight_bytes += m.info.as_ref().map(|i| i.weight_bytes).unwrap_or(0);
            memory.kv_bytes += m.kv_bytes;
            memory.expert_cache_bytes += m.expert_cache.as_ref().map(|c| c.used_bytes).unwrap_or(0);
        }
        let cfg = &self.daemon.cfg;
        Ok(Response::new(pb::StatusResponse {
            version: env!("CARGO_PKG_VERSION").to_string(),
            uptime_seconds: self.daemon.started.elapsed().as_secs_f64(),
            pid: std::process::id(),
            socket: cfg.socket.display().to_string(),
            state_dir: self.daemon.state.root.display().to_string(),
            models,
            memory: Some(memory),
            sessions,
            queue_capacity: (cfg.engine.max_batch.max(1) + cfg.queue) as u32,
            http_url: self
                .daemon
                .http
                .lock()
                .await
                .as_ref()
                .map(|s| s.url.clone())
                .unwrap_or_default(),
        }))
    }

    type GenerateStream = BoxStream<pb::GenerateEvent>;

    async fn generate(
        &self,
        req: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let req = req.into_inner();
        if !req.prompt_ids.is_empty() && !req.prompt_text.is_empty() {
            return Err(wire::invalid(
                "prompt_ids",
                "set prompt_ids or prompt_text, not both",
            ));
        }
        let input = if req.prompt_text.is_empty() {
            GenInput::Ids(req.prompt_ids)
        } else {
            GenInput::Text {
                text: req.prompt_text,
                add_special: req.add_special_tokens,
            }
        };
        self.start_generation(&req.model, req.session_id, input, req.options, None)
            .await
    }

    type ChatStream = BoxStream<pb::GenerateEvent>;

    async fn chat(
        &self,
        req: Request<pb::ChatRequest>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let req = req.into_inner();
        if req.messages.is_empty() {
            return Err(wire::invalid("messages", "is empty"));
        }
        if let Some(i) = req.messages.iter().position(|m| m.role.is_empty()) {
            return Err(wire::invalid(&format!("messages[{i}].role"), "is empty"));
        }
        let input = GenInput::Chat(wire::chat_messages(&req.messages));
        self.start_generation(
            &req.model,
            req.session_id.clone(),
            input,
            req.options.clone(),
            Some(&req),
        )
        .await
    }

    async fn tokenize(
        &self,
        req: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let req = req.into_inner();
        let h = self.daemon.resolve(&req.model).await?;
        blocking(move || {
            let text = h.model.text.as_ref().ok_or_else(|| {
                Status::failed_precondition(format!(
                    "model {} has no tokenizer (tokenizer.json or tiktoken.model)",
                    h.id
                ))
            })?;
            // Bounded by the context like a prompt: the cost of a huge text is refused.
            let room = h.model.info.max_context;
            if req.messages.is_empty() {
                let add = req.add_special_tokens.unwrap_or(true);
                let ids = limits::encode_text(text, &req.text, add, room, "text")?;
                Ok(pb::TokenizeResponse {
                    ids,
                    rendered: String::new(),
                })
            } else {
                let msgs = wire::chat_messages(&req.messages);
                let (ids, rendered) = limits::encode_chat(text, &msgs, room, "messages")?;
                Ok(pb::TokenizeResponse { ids, rendered })
            }
        })
        .await
        .map(Response::new)
    }

    async fn detokenize(
        &self,
        req: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let req = req.into_inner();
        limits::check_detokenize(req.ids.len())?;
        let h = self.daemon.resolve(&req.model).await?;
        blocking(move || {
            h.model
                .check_tokens(0, &req.ids, "ids")
                .or_else(|e| match e {
                    // Detokenizing is not bound by the context length.
                    colibri_engine::Error::ContextOverflow { .. } => Ok(()),
                    e => Err(status_from_engine(&e)),
                })?;
            let text = h.model.text.as_ref().ok_or_else(|| {
                Status::failed_precondition(format!(
                    "model {} has no tokenizer (tokenizer.json or tiktoken.model)",
                    h.id
                ))
            })?;
            let text = text
                .decode(&req.ids, req.skip_special_tokens)
                .map_err(|e| status_from_engine(&e))?;
            Ok(pb::DetokenizeResponse { text })
        })
        .await
        .map(Response::new)
    }

    async fn score(
        &self,
        req: Request<pb::ScoreRequest>,
    ) -> Result<Response<pb::ScoreResponse>, Status> {
        let req = req.into_inner();
        let h = self.daemon.resolve(&req.model).await?;
        limits::check_score(&h.model, req.ids.len(), req.argmax_only)?;
        let (tx, rx) = oneshot::channel();
        let admission = h.admit()?;
        h.send_admitted(
            admission,
            Job::Score(ScoreJob {
                ids: req.ids,
                argmax_only: req.argmax_only,
                reply: tx,
            }),
        )?;
        rx.await.map_err(|_| engine_gone())?.map(Response::new)
    }

    type PerplexityStream = BoxStream<pb::PerplexityProgress>;

    async fn perplexity(
        &self,
        req: Request<pb::PerplexityRequest>,
    ) -> Result<Response<Self::PerplexityStream>, Status> {
        let req = req.into_inner();
        let h = self.daemon.resolve(&req.model).await?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let admission = h.admit()?;
        h.send_admitted(
            admission,
            Job::Perplexity(PerplexityJob {
                ids: req.ids,
                ctx: req.ctx as usize,
                events: tx,
            }),
        )?;
        // The engine answers a refused request with an error, an accepted one with a first
        // progress message (no window done): a refusal fails the call itself.
        match rx.recv().await {
            Some(Ok(first)) => Ok(Response::new(Box::pin(
                tokio_stream::once(Ok(first)).chain(UnboundedReceiverStream::new(rx)),
            ))),
            Some(Err(st)) => Err(st),
            None => Err(engine_gone()),
        }
    }

    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let req = req.into_inner();
        let id = if req.id.is_empty() {
            self.daemon.new_id("s")
        } else {
            check_session_id("id", &req.id)?;
            req.id
        };
        let d = Arc::clone(&self.daemon);
        let sid = id.clone();
        if let Some(owner) = blocking(move || d.session_model(&sid)).await? {
            return Err(Status::already_exists(format!(
                "session '{id}' already exists (model {owner})"
            )));
        }
        let h = self.daemon.resolve(&req.model).await?;
        let (tx, rx) = oneshot::channel();
        h.send(Job::CreateSession { id, reply: tx })?;
        rx.await.map_err(|_| engine_gone())?.map(Response::new)
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let req = req.into_inner();
        let filter = if req.model.is_empty() {
            None
        } else {
            Some(
                std::fs::canonicalize(&req.model)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or(req.model),
            )
        };
        let d = Arc::clone(&self.daemon);
        let mut sessions = blocking(move || Ok(d.all_sessions())).await?;
        if let Some(m) = filter {
            sessions.retain(|s| s.model == m);
        }
        Ok(Response::new(pb::ListSessionsResponse { sessions }))
    }

    async fn resume_session(
        &self,
        req: Request<pb::ResumeSessionRequest>,
    ) -> Result<Response<pb::ResumeSessionResponse>, Status> {
        let req = req.into_inner();
        check_session_id("id", &req.id)?;
        let d = Arc::clone(&self.daemon);
        let sid = req.id.clone();
        let Some(owner) = blocking(move || d.session_model(&sid)).await? else {
            return Err(Status::not_found(format!("no session '{}'", req.id)));
        };
        let h = match self.daemon.resolve(&owner).await {
            Ok(h) => h,
            Err(e) if e.code() == tonic::Code::NotFound && req.load_model => {
                Daemon::wait_loaded(self.daemon.load(&owner, None)?).await?
            }
            Err(e) => {
                return Err(Status::new(
                    e.code(),
                    format!(
                        "session '{}' belongs to model {owner}: {} (or set load_model)",
                        req.id,
                        e.message()
                    ),
                ))
            }
        };
        let (tx, rx) = oneshot::channel();
        h.send(Job::ResumeSession {
            id: req.id,
            reply: tx,
        })?;
        rx.await.map_err(|_| engine_gone())?.map(Response::new)
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let req = req.into_inner();
        check_session_id("id", &req.id)?;
        let d = Arc::clone(&self.daemon);
        let sid = req.id.clone();
        let owner = match blocking(move || d.session_model(&sid)).await {
            Ok(o) => o,
            // A damaged snapshot has just been set aside: nothing is left to delete.
            Err(e) if e.code() == tonic::Code::DataLoss => {
                return Ok(Response::new(pb::DeleteSessionResponse {}))
            }
            Err(e) => return Err(e),
        };
        let Some(owner) = owner else {
            return Err(Status::not_found(format!("no session '{}'", req.id)));
        };
        match self.daemon.resolve(&owner).await {
            Ok(h) => {
                let (tx, rx) = oneshot::channel();
                h.send(Job::DeleteSession {
                    id: req.id,
                    reply: tx,
                })?;
                rx.await.map_err(|_| engine_gone())??;
            }
            // Only a snapshot of a model that is not loaded: remove the file.
            Err(_) => {
                let path = self.daemon.state.session_path(&req.id);
                std::fs::remove_file(&path)
                    .map_err(|e| Status::internal(format!("{}: {e}", path.display())))?;
            }
        }
        Ok(Response::new(pb::DeleteSessionResponse {}))
    }

    async fn cancel(
        &self,
        req: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let req = req.into_inner();
        if req.request_id.is_empty() && req.session_id.is_empty() {
            return Err(wire::invalid("request_id", "set request_id or session_id"));
        }
        let mut cancelled = 0;
        for h in self.daemon.ready_models() {
            let (tx, rx) = oneshot::channel();
            if h.send(Job::Cancel {
                request_id: req.request_id.clone(),
                session_id: req.session_id.clone(),
                reply: tx,
            })
            .is_ok()
            {
                cancelled += rx.await.unwrap_or(0);
            }
        }
        Ok(Response::new(pb::CancelResponse { cancelled }))
    }

    async fn expert_stats(
        &self,
        req: Request<pb::ExpertStatsRequest>,
    ) -> Result<Response<pb::ExpertStatsResponse>, Status> {
        let req = req.into_inner();
        let h = self.daemon.resolve(&req.model).await?;
        let status = self.daemon.model_status(&h);
        let pins = h.shared.pins.lock().expect("pins lock").clone();
        let h2 = Arc::clone(&h);
        let experts = blocking(move || Ok(expert_usage(&h2, &pins))).await?;
        let mut experts = experts;
        if req.top > 0 {
            experts.truncate(req.top as usize);
        }
        Ok(Response::new(pb::ExpertStatsResponse {
            model: h.id.clone(),
            cache: status.expert_cache,
            experts,
        }))
    }

    async fn pin(&self, req: Request<pb::PinRequest>) -> Result<Response<pb::PinResponse>, Status> {
        let req = req.into_inner();
        let h = self.daemon.resolve(&req.model).await?;
        if req.hottest > 0 && h.streaming.is_none() {
            return Err(Status::failed_precondition(
                "pinning the hottest experts needs their usage history, which is recorded when experts are \
                 streamed (colibrid --stream, or LoadModel with expert_cache_bytes); pin experts by (layer, expert)",
            ));
        }
        for (i, e) in req.experts.iter().enumerate() {
            let n = h.experts_per_layer.get(e.layer as usize).copied();
            match n {
                None => {
                    return Err(wire::invalid(
                        &format!("experts[{i}].layer"),
                        format!(
                            "{} >= the model's {} layers",
                            e.layer,
                            h.experts_per_layer.len()
                        ),
                    ))
                }
                Some(0) => {
                    return Err(wire::invalid(
                        &format!("experts[{i}].layer"),
                        format!("layer {} has no routed experts", e.layer),
                    ))
                }
                Some(n) if e.expert as usize >= n => {
                    return Err(wire::invalid(
                        &format!("experts[{i}].expert"),
                        format!("{} >= the {n} experts of layer {}", e.expert, e.layer),
                    ))
                }
                _ => {}
            }
        }
        let mut add: Vec<(u32, u32)> = req.experts.iter().map(|e| (e.layer, e.expert)).collect();
        if let (Some(s), true) = (&h.streaming, req.hottest > 0) {
            let mut used = s.store.histogram().nonzero();
            used.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            add.extend(
                used.iter()
                    .take(req.hottest as usize)
                    .map(|(k, _)| (k.layer, k.expert)),
            );
        }
        let pinned = {
            let mut pins = h.shared.pins.lock().expect("pins lock");
            pins.extend(add.iter().copied());
            pins.iter().copied().collect::<Vec<_>>()
        };
        // Read the pinned experts into the cache now (background reads behind demand ones);
        // the saved pins are preloaded at the next start too.
        if let Some(s) = &h.streaming {
            let keys: Vec<Key> = add
                .iter()
                .map(|&(l, e)| Key::new(l as usize, e as usize))
                .collect();
            s.store.preload(&keys);
        }
        self.save_pins(&h.id, pinned.clone()).await;
        Ok(Response::new(pin_response(&pinned)))
    }

    async fn unpin(
        &self,
        req: Request<pb::UnpinRequest>,
    ) -> Result<Response<pb::PinResponse>, Status> {
        let req = req.into_inner();
        let h = self.daemon.resolve(&req.model).await?;
        let pinned = {
            let mut pins = h.shared.pins.lock().expect("pins lock");
            if req.all {
                pins.clear();
            }
            for e in &req.experts {
                pins.remove(&(e.layer, e.expert));
            }
            pins.iter().copied().collect::<Vec<_>>()
        };
        self.save_pins(&h.id, pinned.clone()).await;
        Ok(Response::new(pin_response(&pinned)))
    }

    async fn shutdown(
        &self,
        _: Request<pb::ShutdownRequest>,
    ) -> Result<Response<pb::ShutdownResponse>, Status> {
        tracing::info!("shutdown requested over gRPC");
        // send_replace, not send: a Shutdown that arrives before the server's stop watcher
        // subscribed (possible on a socket inherited from systemd, served at once) must still
        // be seen; `send` drops the value when nobody listens yet.
        self.daemon.shutdown.send_replace(true);
        Ok(Response::new(pb::ShutdownResponse {}))
    }

    async fn serve_http(
        &self,
        req: Request<pb::ServeHttpRequest>,
    ) -> Result<Response<pb::ServeHttpResponse>, Status> {
        (self.serve_http)(Arc::clone(&self.daemon), req.into_inner())
            .await
            .map(Response::new)
    }
}

impl Service {
    async fn save_pins(&self, model: &str, pinned: Vec<(u32, u32)>) {
        let state = self.daemon.state.clone();
        let model = model.to_string();
        let r = tokio::task::spawn_blocking(move || state.save_pins(&model, &pinned)).await;
        if let Ok(Err(e)) = r {
            tracing::error!("cannot save pins: {e}");
        }
    }
}

/// Per-expert usage (from the expert cache's usage history when experts are streamed) with
/// the cache's hits and misses since load, most used first, then the pinned experts that
/// were never used.
fn expert_usage(
    h: &crate::daemon::ModelHandle,
    pins: &std::collections::BTreeSet<(u32, u32)>,
) -> Vec<pb::ExpertUsage> {
    let mut out: Vec<pb::ExpertUsage> = Vec::new();
    if let Some(s) = &h.streaming {
        // Every demand request is counted in the history too, so its keys cover the counts'.
        let counts: std::collections::HashMap<Key, _> =
            s.store.expert_counts().into_iter().collect();
        let mut used = s.store.histogram().nonzero();
        used.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out.extend(used.into_iter().map(|(k, n)| {
            let c = counts.get(&k).copied().unwrap_or_default();
            pb::ExpertUsage {
                layer: k.layer,
                expert: k.expert,
                uses: n,
                hits: c.hits + c.inflight_hits,
                misses: c.misses,
                resident: s.store.contains(k),
                pinned: pins.contains(&(k.layer, k.expert)),
            }
        }));
    }
    for &(layer, expert) in pins {
        if !out.iter().any(|u| u.layer == layer && u.expert == expert) {
            out.push(pb::ExpertUsage {
                layer,
                expert,
                pinned: true,
                resident: h
                    .streaming
                    .as_ref()
                    .is_some_and(|s| s.store.contains(Key::new(layer as usize, expert as usize))),
                ..Default::default()
            });
        }
    }
    out
}

fn pin_response(pinned: &[(u32, u32)]) -> pb::PinResponse {
    pb::PinResponse {
        pinned: pinned
            .iter()
            .map(|&(layer, expert)| pb::ExpertRef { layer, expert })
            .collect(),
    }
}
