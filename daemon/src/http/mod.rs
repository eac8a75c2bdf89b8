//! The OpenAI- and Anthropic-compatible HTTP API (`colibrid --http ADDR`, the ServeHttp RPC,
//! `coli serve`). docs/http.md describes it for users.
//!
//! A thin translation: each handler parses the API's JSON ([`openai`], [`anthropic`]; pure
//! functions, fuzzed), turns it into the proto request (pb::ChatRequest,
//! pb::GenerateRequest, pb::TokenizeRequest) and calls the very gRPC handler a gRPC client
//! reaches ([`Service`]'s `chat`/`generate`/`tokenize`), which validates it, submits the job
//! to the model's engine thread and answers once the prompt is accepted. So HTTP runs no
//! model code and repeats no validation; the event stream it gets back becomes one JSON
//! answer or the API's server-sent events ([`sse`]). Dropping that stream (a client that
//! went away) cancels the generation before the engine's next step.
//!
//! Around the handlers ([`guard`]): the Host allowlist (DNS rebinding), CORS (off unless
//! origins are allowed), the API key, a body limit (413); errors in each API's own shape
//! ([`error`]); `/metrics` in Prometheus text ([`metrics`]).
//!
//! Shared by both APIs, below this file: [`app`] (what every handler reaches, the body and
//! its JSON, the model named, a whole answer read) and [`request`] (sampling, tools, stop
//! strings as the proto wants them); the streamed answer's first event in [`sse`].

pub mod anthropic;
pub mod app;
pub mod error;
pub mod guard;
pub mod metrics;
pub mod models;
pub mod openai;
pub mod origin;
pub mod request;
mod sse;
pub mod web;

use crate::daemon::{Daemon, ModelHandle};
use crate::service::Service;
pub use crate::serving::{HttpConfig, Serving, DEFAULT_BODY_LIMIT, DEFAULT_PORT};
use app::{flavor_of, resolve, unix_now, App};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use colibri_proto::v1 as pb;
use error::{ApiError, Flavor};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

/// Binds the listener and serves until [`Serving::stop`]. Refuses a non-loopback address
/// without an API key.
pub async fn start(daemon: Arc<Daemon>, cfg: HttpConfig) -> anyhow::Result<Serving> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(&cfg.address)
        .await
        .map_err(|e| anyhow::anyhow!("--http {}: not a host:port to listen on ({e})", cfg.address))?
        .collect();
    let Some(&first) = addrs.first() else {
        anyhow::bail!("--http {}: the name resolves to no address", cfg.address);
    };
    if cfg.api_key.is_none() {
        if let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback()) {
            anyhow::bail!(
                "--http {}: {} is reachable from other machines, and no API key is set; set one \
                 with --api-key or COLIBRI_API_KEY (clients send it as a Bearer token or \
                 x-api-key), or listen on a loopback address such as 127.0.0.1:{}",
                cfg.address,
                open.ip(),
                first.port()
            );
        }
    }
    if cfg.api_key.as_deref() == Some("") {
        anyhow::bail!("the API key is empty");
    }
    let listener = tokio::net::TcpListener::bind(first)
        .await
        .map_err(|e| anyhow::anyhow!("--http {}: cannot listen on {first}: {e}", cfg.address))?;
    let addr = listener.local_addr()?;
    let host = match addr.ip() {
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let url = format!("http://{host}:{}/v1", addr.port());
    let app = App {
        service: Arc::new(Service {
            daemon: Arc::clone(&daemon),
            serve_http: serve_http_rpc,
        }),
        daemon,
        cfg: Arc::new(cfg),
    };
    let router = router(app);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("HTTP server: {e}");
        }
    });
    tracing::info!("HTTP API listening on {url}");
    Ok(Serving {
        url,
        addr,
        stop,
        task,
    })
}

/// Starts the listener unless one runs; answers its URL and whether it was started now.
pub async fn ensure_serving(
    daemon: &Arc<Daemon>,
    cfg: HttpConfig,
) -> anyhow::Result<(String, bool)> {
    let mut slot = daemon.http.lock().await;
    if let Some(s) = slot.as_ref() {
        return Ok((s.url.clone(), false));
    }
    let serving = start(Arc::clone(daemon), cfg).await?;
    let url = serving.url.clone();
    *slot = Some(serving);
    Ok((url, true))
}

/// The ServeHttp RPC (its gRPC handler in service.rs is handed this function by server.rs):
/// starts the listener unless one runs, and lists the models it serves.
pub fn serve_http_rpc(
    daemon: Arc<Daemon>,
    req: pb::ServeHttpRequest,
) -> Pin<Box<dyn Future<Output = Result<pb::ServeHttpResponse, tonic::Status>> + Send>> {
    Box::pin(async move {
        let address = if req.address.is_empty() {
            format!("127.0.0.1:{DEFAULT_PORT}")
        } else {
            req.address
        };
        // The daemon's own --http-* settings (and its key, unless the request brings one).
        let mut cfg = daemon.cfg.http.clone();
        cfg.address = address;
        if !req.api_key.is_empty() {
            cfg.api_key = Some(req.api_key);
        }
        let (url, started) = ensure_serving(&daemon, cfg)
            .await
            .map_err(|e| tonic::Status::failed_precondition(format!("{e:#}")))?;
        let models = models::listed(&daemon)
            .into_iter()
            .map(|(name, h)| pb::HttpModel {
                name,
                id: h.id.clone(),
            })
            .collect();
        Ok(pb::ServeHttpResponse {
            url,
            started,
            models,
        })
    })
}

/// Every route, behind the guards.
pub fn router(app: App) -> Router {
    let api = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/models/{*id}", get(get_model))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/metrics", get(prometheus))
        .merge(web::api_routes())
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::api_key,
        ));
    Router::new()
        .route("/health", get(health))
        .merge(web::page_routes())
        .merge(api)
        .layer(guard::cors(&app.cfg))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            origin::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::host_and_count,
        ))
        .with_state(app)
}

async fn health(State(app): State<App>) -> Response {
    let models: Vec<String> = models::listed(&app.daemon)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    axum::Json(serde_json::json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "models": models,
    }))
    .into_response()
}

async fn prometheus(State(app): State<App>) -> Response {
    let models: Vec<(String, pb::ModelStatus)> = models::listed(&app.daemon)
        .into_iter()
        .map(|(n, h)| (n, app.daemon.model_status(&h)))
        .collect();
    let text = app.daemon.metrics.render(&app.daemon, &models);
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}

async fn list_models(State(app): State<App>, headers: HeaderMap) -> Response {
    let listed = models::listed(&app.daemon);
    let flavor = flavor_of("", &headers);
    let data: Vec<serde_json::Value> = listed
        .iter()
        .map(|(name, h)| model_object(name, h, flavor))
        .collect();
    let body = match flavor {
        Flavor::OpenAi => serde_json::json!({"object": "list", "data": data}),
        Flavor::Anthropic => serde_json::json!({
            "data": data,
            "has_more": false,
            "first_id": listed.first().map(|(n, _)| n),
            "last_id": listed.last().map(|(n, _)| n),
        }),
    };
    axum::Json(body).into_response()
}

async fn get_model(
    State(app): State<App>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let flavor = flavor_of("", &headers);
    // The wildcard drops the leading '/' of a full path.
    let found = resolve(&app, &id, flavor).or_else(|e| {
        if id.starts_with('/') {
            Err(e)
        } else {
            resolve(&app, &format!("/{id}"), flavor).map_err(|_| e)
        }
    })?;
    Ok(axum::Json(model_object(&found.0, &found.1, flavor)).into_response())
}

fn model_object(name: &str, h: &ModelHandle, flavor: Flavor) -> serde_json::Value {
    let loaded = unix_now().saturating_sub(h.loaded_at.elapsed().as_secs());
    match flavor {
        Flavor::OpenAi => serde_json::json!({
            "id": name,
            "object": "model",
            "created": loaded,
            "owned_by": "colibri",
            // Beyond OpenAI's fields, what a client may want to know.
            "path": h.id,
            "model_type": h.info.model_type,
            "max_context": h.info.max_context,
        }),
        Flavor::Anthropic => {
            let created = chrono_like_utc(loaded);
            serde_json::json!({
                "type": "model",
                "id": name,
                "display_name": name,
                "created_at": created,
            })
        }
    }
}

/// RFC 3339 UTC time of a Unix timestamp (Anthropic's `created_at`), without a date crate:
/// days to a civil date by Howard Hinnant's algorithm.
fn chrono_like_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

async fn not_found(uri: axum::http::Uri, headers: HeaderMap) -> ApiError {
    let flavor = flavor_of(uri.path(), &headers);
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {}: the API serves /v1/models, /v1/chat/completions, /v1/completions, \
             /v1/messages, /v1/messages/count_tokens, /health and /metrics; the dashboard \
             is at /",
            uri.path()
        ),
    )
    .with_code("not_found")
    .flavor(flavor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(chrono_like_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(chrono_like_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(chrono_like_utc(1_767_225_599), "2025-12-31T23:59:59Z");
    }
}
