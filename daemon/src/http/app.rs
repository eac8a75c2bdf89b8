//! What every HTTP handler reaches ([`App`]) and the steps both APIs share around a
//! request: the body within its limit, its JSON with the failing field named, the model it
//! names, a whole (non-streamed) generation read to its end.

use super::error::{ApiError, Flavor};
use super::models;
use crate::daemon::{Daemon, ModelHandle};
use crate::service::Service;
use crate::serving::HttpConfig;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use colibri_proto::v1 as pb;
use http_body_util::BodyExt;
use std::sync::Arc;

/// What every handler reaches.
#[derive(Clone)]
pub struct App {
    pub daemon: Arc<Daemon>,
    pub service: Arc<Service>,
    pub cfg: Arc<HttpConfig>,
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

#[cfg(test)]
mod tests {
    use super::*;

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
