//! The dashboard served at `/` (`coli web`): a chat, the expert cache as a live grid, the
//! loaded models and sessions. docs/web.md describes it for users.
//!
//! The page is three files embedded in the binary (`assets/`: HTML, CSS, plain JS drawing
//! the grid on a canvas; no build step, nothing fetched from elsewhere). It talks to the
//! same listener: the chat streams through `/v1/chat/completions` (with colibri's
//! `session_id` extension, so conversations are daemon sessions), everything else through
//! the small JSON API below, behind the same API key.
//!
//! | route | what |
//! |---|---|
//! | `GET /`, `GET /assets/*` | the page (no key needed: it holds no data; a status table for browsers without script when the request is authorized) |
//! | `GET /api/status` | daemon, models, sessions, memory |
//! | `GET /api/experts?model=M` | snapshot of a model's expert grid ([`grid`]) with its statistics |
//! | `GET /api/experts/events?model=M` | server-sent events: that snapshot, then deltas (changed cells only) |
//! | `POST /api/models/load` | `{"model": DIR, "expert_cache": BYTES?}`; progress as server-sent events |
//! | `POST /api/models/unload`, `/api/models/keep_alive` | `{"model"}`; `{"model", "seconds": N or null}` |
//! | `POST /api/pins`, `/api/unpin` | `{"model", "hottest": N, "experts": [[layer, expert]]}`; `{"model", "all"}` |
//! | `POST /api/sessions`, `GET`/`DELETE /api/sessions/{id}` | create; resume (with its messages); delete |
//!
//! Requests from other origins never reach these handlers, and a `POST` here must be
//! `content-type: application/json` (a cross-site form post cannot unload a model): the
//! origin policy of every route, `super::origin`.

pub mod grid;

use super::app::{read_body, App};
use super::error::ApiError;
use super::models;
use crate::daemon::{memory_stats, Daemon, ModelHandle};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use colibri_proto::v1 as pb;
use grid::Grid;
use pb::colibri_server::Colibri;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const ICON_SVG: &str = include_str!("assets/icon.svg");

/// The page may load only its own files and talk only to this origin: no CDN, no inline
/// script (model output is text, but a bug in rendering it must not run anything).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How often a live grid stream looks for changes, unless the client asks otherwise.
const DEFAULT_TICK: Duration = Duration::from_millis(250);
/// A live stream with nothing new still sends the statistics this often (idle timers,
/// memory), which also keeps proxies from closing it.
const QUIET_EVERY: Duration = Duration::from_secs(5);

/// The page and its files: no API key needed.
pub fn page_routes() -> Router<App> {
    Router::new()
        .route("/", get(page))
        .route(
            "/assets/app.js",
            get(|| asset(APP_JS, "text/javascript; charset=utf-8")),
        )
        .route(
            "/assets/app.css",
            get(|| asset(APP_CSS, "text/css; charset=utf-8")),
        )
        .route("/assets/icon.svg", get(|| asset(ICON_SVG, "image/svg+xml")))
}

/// The dashboard's API (behind the API key like the rest).
pub fn api_routes() -> Router<App> {
    Router::new()
        .route("/api/status", get(status))
        .route("/api/experts", get(experts))
        .route("/api/experts/events", get(expert_events))
        .route("/api/models/load", post(load))
        .route("/api/models/unload", post(unload))
        .route("/api/models/keep_alive", post(keep_alive))
        .route("/api/pins", post(pin))
        .route("/api/unpin", post(unpin))
        .route("/api/sessions", post(create_session))
        .route(
            "/api/sessions/{id}",
            get(resume_session).delete(delete_session),
        )
}

fn security_headers(r: &mut Response) {
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
}

async fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut r = ([("content-type", content_type)], body).into_response();
    security_headers(&mut r);
    r
}

/// `GET /`: the page. Its `<noscript>` part lists the loaded models (the page's plain
/// predecessor) when the request may see them.
async fn page(State(app): State<App>, headers: HeaderMap) -> Response {
    let table = if super::guard::authorized(&app.cfg, &headers) {
        status_table(&app)
    } else {
        "<p>This daemon needs an API key: open the page with <code>coli web</code>, or add \
         <code>#key=KEY</code> to the address.</p>"
            .to_string()
    };
    let html = INDEX_HTML
        .replace("<!--STATUS-->", &table)
        .replace("{{VERSION}}", env!("CARGO_PKG_VERSION"));
    let mut r = axum::response::Html(html).into_response();
    security_headers(&mut r);
    r
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The loaded models as an HTML table (no script needed).
fn status_table(app: &App) -> String {
    let mut rows = String::new();
    for (name, h) in models::listed(&app.daemon) {
        let st = app.daemon.model_status(&h);
        let c = st.expert_cache.clone().unwrap_or_default();
        rows.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            esc(&name),
            esc(&h.info.model_type),
            h.info.max_context,
            st.active_generations,
            st.queued,
            st.tokens_generated,
            if c.streamed { format!("{:.1}%", c.hit_rate * 100.0) } else { "resident".into() },
            esc(&h.id),
        ));
    }
    if rows.is_empty() {
        rows = "<tr><td colspan=8>no model is loaded: <code>coli web --model DIR</code></td></tr>"
            .into();
    }
    format!(
        "<p>colibri {}, up {:.0} s. OpenAI base URL <code>/v1</code>, Anthropic base URL \
         <code>/</code>. <a href=\"/metrics\">metrics</a> &middot; <a href=\"/v1/models\">models</a></p>\
         <table><tr><th>model</th><th>type</th><th>context</th><th>running</th><th>queued</th>\
         <th>tokens out</th><th>expert cache hits</th><th>path</th></tr>\n{rows}</table>",
        env!("CARGO_PKG_VERSION"),
        app.daemon.started.elapsed().as_secs_f64(),
    )
}

/// The model a dashboard request names (by API name or path); the only loaded one when it
/// names none.
fn model_named(app: &App, name: Option<&str>) -> Result<(String, Arc<ModelHandle>), ApiError> {
    match name.filter(|n| !n.is_empty()) {
        Some(n) => super::app::resolve(app, n, super::error::Flavor::OpenAi),
        None => {
            let mut all = models::listed(&app.daemon);
            match all.len() {
                1 => Ok(all.remove(0)),
                0 => Err(ApiError::new(StatusCode::NOT_FOUND, "no model is loaded")
                    .with_code("model_not_found")),
                _ => Err(ApiError::field(
                    "model",
                    "is required: several models are loaded",
                )),
            }
        }
    }
}

fn status_error(st: tonic::Status) -> ApiError {
    ApiError::from_status(&st, &[])
}

/// The API name of a model id, when it is loaded.
fn name_of(daemon: &Daemon, id: &str) -> Option<String> {
    models::listed(daemon)
        .into_iter()
        .find(|(_, h)| h.id == id)
        .map(|(n, _)| n)
}

/// A model's figures for the page: what it is, what it is doing, its expert cache.
pub fn model_json(daemon: &Daemon, name: &str, h: &ModelHandle) -> Value {
    let st = daemon.model_status(h);
    let c = st.expert_cache.clone().unwrap_or_default();
    let resident = h
        .streaming
        .as_ref()
        .map(|s| s.plan.model.resident)
        .unwrap_or(h.info.weight_bytes);
    json!({
        "name": name,
        "id": h.id,
        "model_type": h.info.model_type,
        "layers": h.info.num_layers,
        "max_context": h.info.max_context,
        "weight_bytes": h.info.weight_bytes,
        "resident_bytes": resident,
        "streamed": c.streamed,
        "active": st.active_generations,
        "queued": st.queued,
        "live_sessions": st.live_sessions,
        "kv_bytes": st.kv_bytes,
        "idle_seconds": st.idle_seconds,
        "loaded_seconds": st.loaded_seconds,
        "steps": st.steps,
        "tokens_generated": st.tokens_generated,
        "tokens_prefilled": st.tokens_prefilled,
        "keep_alive_seconds": st.keep_alive_seconds,
        "keep_alive_own": h.keep_alive.lock().expect("keep-alive lock").is_some(),
        "cache": cache_json(&c),
    })
}

/// The expert cache's figures (zeros but the totals when experts are not streamed).
fn cache_json(c: &pb::ExpertCacheStats) -> Value {
    json!({
        "streamed": c.streamed,
        "policy": c.policy,
        "budget_bytes": c.budget_bytes,
        "used_bytes": c.used_bytes,
        "lent_bytes": c.lent_bytes,
        "expert_bytes": c.expert_bytes,
        "capacity_experts": c.capacity_experts,
        "resident_experts": c.resident_experts,
        "pinned_experts": c.pinned_experts,
        "total_experts": c.total_experts,
        "requests": c.requests,
        "hits": c.hits,
        "misses": c.misses,
        "hit_rate": c.hit_rate,
        "evictions": c.evictions,
        "tokens": c.tokens,
        "bytes_read": c.bytes_read,
        "bytes_per_token": c.bytes_per_token,
        "disk_busy_seconds": c.disk_busy_seconds,
        "disk_read_gb_per_s": c.disk_read_gb_per_s,
        "read_wait_seconds": c.read_wait_seconds,
        "forward_seconds": c.forward_seconds,
        "prefetch_issued": c.prefetch_issued,
        "prefetch_used": c.prefetch_used,
        "prefetch_wasted": c.prefetch_wasted,
        "predicted": c.predicted,
        "predicted_correct": c.predicted_correct,
        "predicted_actual": c.predicted_actual,
        "prefetch_recall": c.prefetch_recall,
        "prefetch_precision": c.prefetch_precision,
        "preload_bytes": c.preload_bytes,
        "notes": c.notes,
    })
}

/// The machine's and the daemon's memory, and each model's share (the page's stacked bar).
fn memory_json(daemon: &Daemon) -> Value {
    let m = memory_stats();
    let models: Vec<Value> = models::listed(daemon)
        .into_iter()
        .map(|(name, h)| {
            let st = daemon.model_status(&h);
            let c = st.expert_cache.unwrap_or_default();
            json!({
                "name": name,
                "resident_bytes": h.streaming.as_ref().map(|s| s.plan.model.resident).unwrap_or(h.info.weight_bytes),
                "expert_cache_bytes": c.used_bytes,
                "expert_budget_bytes": c.budget_bytes,
                "kv_bytes": st.kv_bytes,
            })
        })
        .collect();
    json!({
        "rss_bytes": m.rss_bytes,
        "total_bytes": m.system_total_bytes,
        "available_bytes": m.system_available_bytes,
        "models": models,
    })
}

fn session_json(daemon: &Daemon, s: &pb::SessionInfo) -> Value {
    json!({
        "id": s.id,
        "model": s.model,
        "model_name": name_of(daemon, &s.model),
        "cached_tokens": s.cached_tokens,
        "history_tokens": s.history_tokens,
        "kv_bytes": s.kv_bytes,
        "state": s.state,
        "created_unix_ms": s.created_unix_ms,
        "last_used_unix_ms": s.last_used_unix_ms,
        "persisted": s.persisted,
        "messages": s.messages,
    })
}

async fn status(State(app): State<App>) -> Result<Response, ApiError> {
    let d = Arc::clone(&app.daemon);
    let sessions = tokio::task::spawn_blocking(move || d.all_sessions())
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let daemon = &app.daemon;
    let models: Vec<Value> = models::listed(daemon)
        .iter()
        .map(|(n, h)| model_json(daemon, n, h))
        .collect();
    let http_url = daemon
        .http
        .lock()
        .await
        .as_ref()
        .map(|s| s.url.clone())
        .unwrap_or_default();
    Ok(axum::Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_seconds": daemon.started.elapsed().as_secs_f64(),
        "pid": std::process::id(),
        "http_url": http_url,
        "keep_alive_seconds": daemon.cfg.keep_alive.map(|d| d.as_secs_f64()).unwrap_or(0.0),
        "models": models,
        "sessions": sessions.iter().map(|s| session_json(daemon, s)).collect::<Vec<_>>(),
        "memory": memory_json(daemon),
    }))
    .into_response())
}

#[derive(Deserialize)]
struct ModelQuery {
    model: Option<String>,
    /// Milliseconds between a live stream's looks for changes (100 to 5000).
    interval_ms: Option<u64>,
}

fn snapshot(app: &App, name: &str, h: &ModelHandle, grid: &Grid) -> Value {
    json!({
        "model": model_json(&app.daemon, name, h),
        "grid": grid.snapshot_json(),
        "memory": memory_json(&app.daemon),
        "t": super::app::unix_now(),
    })
}

async fn experts(
    State(app): State<App>,
    Query(q): Query<ModelQuery>,
) -> Result<Response, ApiError> {
    let (name, h) = model_named(&app, q.model.as_deref())?;
    let grid = Grid::of(&h);
    Ok(axum::Json(snapshot(&app, &name, &h, &grid)).into_response())
}

fn sse_frame(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

fn sse_response(rx: mpsc::Receiver<Result<Bytes, Infallible>>) -> Response {
    let mut r = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    let h = r.headers_mut();
    h.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// The figures of a model that say something happened (not its idle timers).
fn activity_key(model: &Value) -> String {
    let mut m = model.clone();
    if let Some(o) = m.as_object_mut() {
        o.remove("idle_seconds");
        o.remove("loaded_seconds");
    }
    m.to_string()
}

/// `GET /api/experts/events`: a `snapshot` event, then a `delta` whenever the grid or the
/// model's figures changed (at most every tick; the statistics at least every few seconds
/// while quiet), and `gone` when the model is unloaded.
async fn expert_events(
    State(app): State<App>,
    Query(q): Query<ModelQuery>,
) -> Result<Response, ApiError> {
    let (name, h) = model_named(&app, q.model.as_deref())?;
    let tick = q
        .interval_ms
        .map(|ms| Duration::from_millis(ms.clamp(100, 5000)))
        .unwrap_or(DEFAULT_TICK);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        let mut grid = Grid::of(&h);
        let first = snapshot(&app, &name, &h, &grid);
        let mut key = activity_key(&first["model"]);
        if tx.send(Ok(sse_frame("snapshot", &first))).await.is_err() {
            return;
        }
        let mut sent = Instant::now();
        loop {
            tokio::select! {
                _ = tx.closed() => return,
                _ = tokio::time::sleep(tick) => {}
            }
            let still = models::listed(&app.daemon)
                .into_iter()
                .find(|(_, x)| Arc::ptr_eq(x, &h));
            let Some((name, _)) = still else {
                let _ = tx
                    .send(Ok(sse_frame("gone", &json!({"model": name, "id": h.id}))))
                    .await;
                return;
            };
            let now = Grid::of(&h);
            let delta = now.delta(&grid);
            let model = model_json(&app.daemon, &name, &h);
            let k = activity_key(&model);
            if delta.is_none() && k == key && sent.elapsed() < QUIET_EVERY {
                continue;
            }
            let ev = json!({
                "grid": delta,
                "model": model,
                "memory": memory_json(&app.daemon),
                "t": super::app::unix_now(),
            });
            if tx.send(Ok(sse_frame("delta", &ev))).await.is_err() {
                return;
            }
            grid = now;
            key = k;
            sent = Instant::now();
        }
    });
    Ok(sse_response(rx))
}

#[derive(Deserialize)]
struct LoadBody {
    model: String,
    /// Expert cache budget: bytes, or a size such as "512M" or "8G"; absent = the daemon's.
    expert_cache: Option<Value>,
}

/// "8G", "512M", "64K" or a number of bytes.
fn parse_size(v: &Value) -> Result<u64, ApiError> {
    let bad = || ApiError::field("expert_cache", "must be bytes or a size such as 512M or 8G");
    match v {
        Value::Number(n) => n.as_u64().ok_or_else(bad),
        Value::String(s) => {
            let t = s.trim();
            let split = t
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(t.len());
            let (num, unit) = t.split_at(split);
            let x: f64 = num.parse().map_err(|_| bad())?;
            let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
                "" | "b" => 1,
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "t" | "tb" | "tib" => 1 << 40,
                _ => return Err(bad()),
            };
            Ok((x * mult as f64) as u64)
        }
        _ => Err(bad()),
    }
}

/// `POST /api/models/load`: the daemon's LoadModel, its progress as server-sent events
/// (`progress` {stage, done, total, message}, then `ready` {model} or `error` {message}).
async fn load(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let b: LoadBody =
        super::app::parse_json(&read_body(&app, body, super::error::Flavor::OpenAi).await?)?;
    if b.model.trim().is_empty() {
        return Err(ApiError::field("model", "is empty: give a model folder"));
    }
    let expert_cache_bytes = b
        .expert_cache
        .as_ref()
        .filter(|v| !v.is_null())
        .map(parse_size)
        .transpose()?;
    let mut progress = app
        .service
        .load_model(tonic::Request::new(pb::LoadModelRequest {
            model: b.model.trim().to_string(),
            expert_cache_bytes,
        }))
        .await
        .map_err(status_error)?
        .into_inner();
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(16);
    tokio::spawn(async move {
        use pb::load_model_progress::Stage;
        while let Some(p) = progress.next().await {
            let frame = match p {
                Ok(p) if p.stage == Stage::Ready as i32 => {
                    let id = p.info.map(|i| i.id).unwrap_or_default();
                    let name = name_of(&app.daemon, &id).unwrap_or(id.clone());
                    sse_frame(
                        "ready",
                        &json!({"model": name, "id": id, "already_loaded": p.already_loaded}),
                    )
                }
                Ok(p) => sse_frame(
                    "progress",
                    &json!({
                        "stage": if p.stage == Stage::Loading as i32 { "loading" } else { "opening" },
                        "done": p.done, "total": p.total, "message": p.message,
                    }),
                ),
                Err(st) => sse_frame("error", &json!({"message": st.message()})),
            };
            // A page that went away does not stop the load (others may be waiting for it).
            if tx.send(Ok(frame)).await.is_err() {
                return;
            }
        }
    });
    Ok(sse_response(rx))
}

#[derive(Deserialize)]
struct ModelBody {
    model: Option<String>,
}

async fn unload(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let b: ModelBody =
        super::app::parse_json(&read_body(&app, body, super::error::Flavor::OpenAi).await?)?;
    let (name, h) = model_named(&app, b.model.as_deref())?;
    let r = app.daemon.unload(&h.id).await.map_err(status_error)?;
    Ok(
        axum::Json(json!({"model": name, "id": r.model, "sessions_saved": r.sessions_saved}))
            .into_response(),
    )
}

#[derive(Deserialize)]
struct KeepAliveBody {
    model: Option<String>,
    /// Seconds of idleness before the model is unloaded; 0 = never; null = the daemon's
    /// --keep-alive.
    seconds: Option<f64>,
}

async fn keep_alive(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let b: KeepAliveBody =
        super::app::parse_json(&read_body(&app, body, super::error::Flavor::OpenAi).await?)?;
    let (name, h) = model_named(&app, b.model.as_deref())?;
    let own = match b.seconds {
        None => None,
        Some(s) if !(0.0..=1e9).contains(&s) => return Err(ApiError::field(
            "seconds",
            "must be a number of seconds >= 0 (0 = never unload), or null for the daemon's default",
        )),
        Some(0.0) => Some(None),
        Some(s) => Some(Some(Duration::from_secs_f64(s))),
    };
    *h.keep_alive.lock().expect("keep-alive lock") = own;
    Ok(axum::Json(model_json(&app.daemon, &name, &h)).into_response())
}

#[derive(Deserialize)]
struct PinBody {
    model: Option<String>,
    #[serde(default)]
    hottest: u32,
    #[serde(default)]
    experts: Vec<(u32, u32)>,
    #[serde(default)]
    all: bool,
}

fn pinned_json(r: pb::PinResponse) -> Value {
    json!({"pinned": r.pinned.iter().map(|e| [e.layer, e.expert]).collect::<Vec<_>>()})
}

async fn pin(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let b: PinBody =
        super::app::parse_json(&read_body(&app, body, super::error::Flavor::OpenAi).await?)?;
    let (_, h) = model_named(&app, b.model.as_deref())?;
    let r = app
        .service
        .pin(tonic::Request::new(pb::PinRequest {
            model: h.id.clone(),
            experts: b
                .experts
                .iter()
                .map(|&(layer, expert)| pb::ExpertRef { layer, expert })
                .collect(),
            hottest: b.hottest,
        }))
        .await
        .map_err(status_error)?
        .into_inner();
    Ok(axum::Json(pinned_json(r)).into_response())
}

async fn unpin(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let b: PinBody =
        super::app::parse_json(&read_body(&app, body, super::error::Flavor::OpenAi).await?)?;
    let (_, h) = model_named(&app, b.model.as_deref())?;
    let r = app
        .service
        .unpin(tonic::Request::new(pb::UnpinRequest {
            model: h.id.clone(),
            experts: b
                .experts
                .iter()
                .map(|&(layer, expert)| pb::ExpertRef { layer, expert })
                .collect(),
            all: b.all,
        }))
        .await
        .map_err(status_error)?
        .into_inner();
    Ok(axum::Json(pinned_json(r)).into_response())
}

#[derive(Deserialize)]
struct SessionBody {
    model: Option<String>,
    id: Option<String>,
}

async fn create_session(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let b: SessionBody =
        super::app::parse_json(&read_body(&app, body, super::error::Flavor::OpenAi).await?)?;
    let (_, h) = model_named(&app, b.model.as_deref())?;
    let s = app
        .service
        .create_session(tonic::Request::new(pb::CreateSessionRequest {
            model: h.id.clone(),
            id: b.id.unwrap_or_default(),
        }))
        .await
        .map_err(status_error)?
        .into_inner();
    Ok(axum::Json(session_json(&app.daemon, &s)).into_response())
}

/// `GET /api/sessions/{id}`: makes the session live (from its snapshot after a restart)
/// and answers it with its conversation.
async fn resume_session(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let r = app
        .service
        .resume_session(tonic::Request::new(pb::ResumeSessionRequest {
            id,
            load_model: false,
        }))
        .await
        .map_err(status_error)?
        .into_inner();
    let session = r.session.unwrap_or_default();
    Ok(axum::Json(json!({
        "session": session_json(&app.daemon, &session),
        "messages": r.messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
        "restored_from_disk": r.restored_from_disk,
    }))
    .into_response())
}

async fn delete_session(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    app.service
        .delete_session(tonic::Request::new(pb::DeleteSessionRequest {
            id: id.clone(),
        }))
        .await
        .map_err(status_error)?;
    Ok(axum::Json(json!({"deleted": id})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size(&json!(4096)).unwrap(), 4096);
        assert_eq!(parse_size(&json!("64K")).unwrap(), 64 << 10);
        assert_eq!(parse_size(&json!(" 1.5g ")).unwrap(), 3 << 29);
        for bad in [json!("8X"), json!(-1), json!("G"), json!([1])] {
            assert_eq!(
                parse_size(&bad).unwrap_err().param.as_deref(),
                Some("expert_cache")
            );
        }
    }

    #[test]
    fn the_page_needs_nothing_from_elsewhere() {
        // Every reference the page makes is to its own origin: no scheme, no //host.
        let icon = ICON_SVG.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
        for (name, text) in [
            ("index.html", INDEX_HTML),
            ("app.js", APP_JS),
            ("app.css", APP_CSS),
            ("icon.svg", &icon),
        ] {
            for needle in ["http://", "https://", "//cdn", "@import", "url(http"] {
                assert!(!text.contains(needle), "{name} contains {needle}");
            }
        }
        assert!(INDEX_HTML.contains("<!--STATUS-->"));
        assert!(INDEX_HTML.contains("/assets/app.js"));
    }
}
