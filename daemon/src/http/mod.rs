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

pub mod anthropic;
pub mod error;
pub mod guard;
pub mod metrics;
pub mod models;
pub mod openai;
mod sse;
pub mod web;

use crate::daemon::{Daemon, ModelHandle};
use crate::service::Service;
pub use crate::serving::{HttpConfig, Serving, DEFAULT_BODY_LIMIT, DEFAULT_PORT};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use colibri_proto::v1 as pb;
use error::{ApiError, Flavor};
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::sync::Arc;

/// What every handler reaches.
#[derive(Clone)]
pub struct App {
    pub daemon: Arc<Daemon>,
    pub service: Arc<Service>,
    pub cfg: Arc<HttpConfig>,
}

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

impl Service {
    /// The ServeHttp RPC (its gRPC handler in service.rs hands it here, to the layer that
    /// owns the listener): starts the listener unless one runs, and lists the models it
    /// serves.
    pub(crate) async fn serve_http_rpc(
        &self,
        req: pb::ServeHttpRequest,
    ) -> Result<pb::ServeHttpResponse, tonic::Status> {
        let address = if req.address.is_empty() {
            format!("127.0.0.1:{DEFAULT_PORT}")
        } else {
            req.address
        };
        // The daemon's own --http-* settings (and its key, unless the request brings one).
        let mut cfg = self.daemon.cfg.http.clone();
        cfg.address = address;
        if !req.api_key.is_empty() {
            cfg.api_key = Some(req.api_key);
        }
        let (url, started) = ensure_serving(&self.daemon, cfg)
            .await
            .map_err(|e| tonic::Status::failed_precondition(format!("{e:#}")))?;
        let models = models::listed(&self.daemon)
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
    }
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
        .merge(web::api_routes(&app))
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
            guard::host_and_count,
        ))
        .with_state(app)
}

/// The API whose conventions a request follows: Anthropic's for /v1/messages and for any
/// request carrying an `anthropic-version` header, OpenAI's otherwise.
pub fn flavor_of(path: &str, headers: &HeaderMap) -> Flavor {
    if path.starts_with("/v1/messages") || headers.contains_key("anthropic-version") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

/// The body, at most the configured limit (413 beyond it).
pub async fn read_body(app: &App, body: Body, flavor: Flavor) -> Result<Bytes, ApiError> {
    let limit = app.cfg.body_limit;
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes (colibrid --http-body-limit)"),
        )
        .with_code("request_too_large")
        .flavor(flavor)),
        Err(e) => Err(
            ApiError::new(StatusCode::BAD_REQUEST, format!("reading the request body: {e}"))
                .flavor(flavor),
        ),
    }
}

/// Parses JSON into `T`; a syntax error or a bad value is a 400 naming the field's path
/// (`messages[0].content`).
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde would take a list for a struct's fields in order: only an object is a request.
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {}
        None => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "the body is empty: send a JSON object",
            ))
        }
        Some(_) if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "the body is not valid JSON",
            ))
        }
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "the body must be a JSON object of this endpoint's fields",
            ))
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let msg = strip_position(&inner.to_string()).to_string();
        let missing = msg
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next());
        if inner.is_syntax() || inner.is_eof() {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the body is not valid JSON: {inner}"),
            )
        } else if let Some(name) = missing {
            let full = if path == "." {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            ApiError::field(full, "is required")
        } else if path == "." {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("the body must be a JSON object of this endpoint's fields: {msg}"),
            )
        } else {
            ApiError::field(path, msg)
        }
    })
}

/// serde_json's " at line 1 column 17" tail says nothing a client can use once the field
/// is named.
fn strip_position(msg: &str) -> &str {
    msg.rfind(" at line ").map(|i| &msg[..i]).unwrap_or(msg)
}

/// The loaded model a request names, with its API name; 404 model_not_found otherwise.
pub fn resolve(
    app: &App,
    model: &str,
    flavor: Flavor,
) -> Result<(String, Arc<ModelHandle>), ApiError> {
    models::find(&app.daemon, model).ok_or_else(|| {
        let known: Vec<String> = models::listed(&app.daemon)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        ApiError::model_not_found(model, &known).flavor(flavor)
    })
}

/// Sampling as a request asked for it, each field None when the client left it out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<u64>,
    /// OpenAI's frequency / presence penalties and logit_bias (token id, bias).
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub logit_bias: Vec<(u32, f32)>,
}

impl Sampling {
    /// The proto's sampling: what the client set, else the model's generation_config.json
    /// (as transformers and vLLM use it: `do_sample: false` means greedy), else the APIs'
    /// documented defaults (temperature 1, top_p 1). A sampled request without a seed gets
    /// a fresh one, so that two identical requests do not answer alike.
    pub fn resolve(&self, model: &ModelHandle) -> pb::SamplingParams {
        let d = model
            .model
            .text
            .as_ref()
            .map(|t| t.generation_defaults().clone())
            .unwrap_or_default();
        let temperature = self.temperature.unwrap_or(match d.do_sample {
            Some(false) => 0.0,
            _ => d.temperature.unwrap_or(1.0),
        });
        let seed = self.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            h.finish()
        });
        pb::SamplingParams {
            temperature: Some(temperature),
            top_k: self.top_k.or(d.top_k.map(|k| k as u32)).unwrap_or(0),
            top_p: Some(self.top_p.or(d.top_p).unwrap_or(1.0)),
            min_p: Some(self.min_p.or(d.min_p).unwrap_or(0.0)),
            repetition_penalty: Some(
                self.repetition_penalty
                    .or(d.repetition_penalty)
                    .unwrap_or(1.0),
            ),
            seed: Some(seed),
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self.logit_bias.iter().copied().collect(),
        }
    }
}

/// What a generation handler needs besides the prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenParams {
    /// 0 = as many as fit in the context.
    pub max_tokens: u32,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's extension: the generated token ids in the answer.
    pub return_token_ids: bool,
    /// Each generated token's log-probability, with this many alternatives (0..=20).
    pub logprobs: bool,
    pub top_logprobs: u32,
    /// Structured output (json_object / json_schema); None = free text.
    pub response_format: Option<pb::ResponseFormat>,
}

impl GenParams {
    pub fn options(&self, model: &ModelHandle) -> pb::GenerationOptions {
        pb::GenerationOptions {
            sampling: Some(self.sampling.resolve(model)),
            max_tokens: self.max_tokens,
            clamp_max_tokens: true,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            logprobs: self.logprobs,
            top_logprobs: self.top_logprobs,
            response_format: self.response_format.clone(),
            ..Default::default()
        }
    }
}

/// The generated text and tokens of a whole (non-streamed) answer.
#[derive(Debug, Default)]
pub struct Collected {
    pub started: pb::generate_event::Started,
    pub text: String,
    pub ids: Vec<u32>,
    /// The reasoning (text between think tags) and the tokens' log-probabilities, when the
    /// request asked for them.
    pub reasoning: String,
    pub logprobs: Vec<pb::TokenLogprob>,
    pub finished: pb::generate_event::Finished,
}

/// Reads a generation's events to the end. A failure after the start (the engine stopped,
/// the model was unloaded) is an error: a half answer is not passed off as whole.
pub async fn collect(
    mut events: crate::service::BoxStream<pb::GenerateEvent>,
    fields: &[(&str, &str)],
    flavor: Flavor,
) -> Result<Collected, ApiError> {
    use pb::generate_event::Event;
    use tokio_stream::StreamExt;
    let mut c = Collected::default();
    while let Some(ev) = events.next().await {
        match ev
            .map_err(|st| ApiError::from_status(&st, fields).flavor(flavor))?
            .event
        {
            Some(Event::Started(s)) => c.started = s,
            Some(Event::Tokens(t)) => {
                c.text.push_str(&t.text);
                c.ids.extend(t.ids);
                c.reasoning.push_str(&t.reasoning);
                c.logprobs.extend(t.logprobs);
            }
            Some(Event::Finished(f)) => {
                if f.reason == pb::FinishReason::Cancelled as i32 {
                    return Err(cancelled().flavor(flavor));
                }
                c.finished = f;
                return Ok(c);
            }
            None => {}
        }
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the generation ended without finishing (the daemon is stopping?)",
    )
    .flavor(flavor))
}

/// A generation cut short by the daemon (unload, shutdown, a Cancel RPC).
pub fn cancelled() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the generation was cancelled (the model was unloaded, the daemon is stopping, or a \
         Cancel request named it)",
    )
}

/// Seconds since the Unix epoch (the APIs' `created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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

    #[test]
    fn json_errors_name_the_field() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct R {
            messages: Vec<M>,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct M {
            role: String,
        }
        let e = parse_json::<R>(br#"{"messages": [{"role": 3}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        assert!(e.message.contains("invalid type: integer"), "{}", e.message);
        assert!(!e.message.contains("line 1"), "{}", e.message);
        let e = parse_json::<R>(b"{\"messages\": [").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("not valid JSON"), "{}", e.message);
        let e = parse_json::<R>(b"{}").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("is required"), "{}", e.message);
        let e = parse_json::<R>(br#"{"messages": [{}]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = parse_json::<R>(b"[1]").unwrap_err();
        assert!(e.message.contains("JSON object"), "{}", e.message);
    }
}
