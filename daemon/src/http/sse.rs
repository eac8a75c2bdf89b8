//! Server-sent events: a task pumps a generation's events into SSE frames while the client
//! reads them. When the client goes away the response body is dropped, the pump sees its
//! channel close at once and drops the generation's stream, which cancels the generation
//! before the engine's next step. While nothing else is sent (a long prompt being
//! prefilled) a keep-alive goes out every `ping_every`.

use super::app::App;
use super::error::ApiError;
use crate::service::BoxStream;
use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use colibri_proto::v1 as pb;
use pb::generate_event::Event;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

/// Turns a generation's events into an API's frames.
pub trait Translate: Send + 'static {
    /// Frames for one event, and whether the stream is complete after them.
    fn event(&mut self, ev: pb::generate_event::Event) -> (Vec<String>, bool);
    /// Frames for a failure after the stream started (then it ends).
    fn error(&mut self, e: ApiError) -> Vec<String>;
    /// A keep-alive frame.
    fn ping(&self) -> String;
    /// Frames to send at once, before any further event (e.g. for the Started event that
    /// was read before the response began).
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// `data: JSON` (OpenAI's frames carry no event name).
pub fn data(v: &serde_json::Value) -> String {
    format!("data: {v}\n\n")
}

/// `event: NAME` + `data: JSON` (Anthropic's frames).
pub fn event(name: &str, v: &serde_json::Value) -> String {
    format!("event: {name}\ndata: {v}\n\n")
}

pub fn response(
    events: BoxStream<pb::GenerateEvent>,
    mut t: impl Translate,
    ping_every: Duration,
    request_id: &str,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let mut events = events;
        let send = |frames: Vec<String>| {
            let tx = tx.clone();
            async move {
                for f in frames {
                    if tx.send(Ok(Bytes::from(f))).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        if !send(t.start()).await {
            return;
        }
        let mut deadline = tokio::time::Instant::now() + ping_every;
        loop {
            let frames = tokio::select! {
                biased;
                // The client is gone: returning drops `events`, which cancels the generation.
                _ = tx.closed() => return,
                ev = events.next() => match ev {
                    Some(Ok(pb::GenerateEvent { event: Some(ev) })) => {
                        let (frames, done) = t.event(ev);
                        if !send(frames).await || done {
                            return;
                        }
                        deadline = tokio::time::Instant::now() + ping_every;
                        continue;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(st)) => t.error(ApiError::from_status(&st, &[])),
                    None => t.error(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the generation ended without finishing (the daemon is stopping?)",
                    )),
                },
                _ = tokio::time::sleep_until(deadline) => {
                    deadline = tokio::time::Instant::now() + ping_every;
                    if !send(vec![t.ping()]).await {
                        return;
                    }
                    continue;
                }
            };
            // An error: its frames end the stream.
            send(frames).await;
            return;
        }
    });
    let mut r = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    let h = r.headers_mut();
    h.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
    // Proxies such as nginx must pass each event on at once.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("x-request-id", v);
    }
    r
}

/// The stream's first event is the daemon's Started (the prompt was accepted, already
/// received): it names the request, so it is read before the response's headers go out.
pub async fn first_then_stream<T: Translate>(
    mut events: BoxStream<pb::GenerateEvent>,
    mut t: T,
    app: &App,
) -> Response {
    use tokio_stream::StreamExt;
    let mut pre = Vec::new();
    let mut rid = String::new();
    match events.next().await {
        Some(Ok(pb::GenerateEvent { event: Some(ev) })) => {
            if let Event::Started(s) = &ev {
                rid = s.request_id.clone();
            }
            pre = t.event(ev).0;
        }
        Some(Err(st)) => return ApiError::from_status(&st, &[]).into_response(),
        _ => {}
    }
    response(events, Prefixed { pre, inner: t }, app.cfg.ping_every, &rid)
}

/// Frames already produced (from the Started event) go out first.
struct Prefixed<T> {
    pre: Vec<String>,
    inner: T,
}

impl<T: Translate> Translate for Prefixed<T> {
    fn event(&mut self, ev: Event) -> (Vec<String>, bool) {
        let (frames, done) = self.inner.event(ev);
        let mut out = std::mem::take(&mut self.pre);
        out.extend(frames);
        (out, done)
    }
    fn error(&mut self, e: ApiError) -> Vec<String> {
        let mut out = std::mem::take(&mut self.pre);
        out.extend(self.inner.error(e));
        out
    }
    fn ping(&self) -> String {
        self.inner.ping()
    }
    fn start(&mut self) -> Vec<String> {
        std::mem::take(&mut self.pre)
    }
}
