//! The OpenAI API: `POST /v1/chat/completions` and `POST /v1/completions`, streamed or not.
//!
//! [`parse_chat`] and [`parse_completion`] turn a request body into the proto's messages or
//! prompt and the generation options, naming the field at fault in a 400; they never touch
//! a model (the fuzz target and the mutation test call them directly). Fields the engine
//! cannot honour are refused by name, never ignored (docs/http.md lists them).

use super::error::{ApiError, Flavor};
use super::sse::{self, Translate};
use super::{collect, read_body, resolve, unix_now, App, GenParams, Sampling};
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use colibri_proto::v1 as pb;
use pb::colibri_server::Colibri;
use pb::generate_event::Event;
use serde::Deserialize;
use serde_json::{json, Value};

/// Proto field names in daemon errors → the chat API's.
pub const CHAT_FIELDS: &[(&str, &str)] = &[("prompt", "messages")];
/// ... and the completions API's.
pub const COMPLETION_FIELDS: &[(&str, &str)] = &[("prompt_ids", "prompt")];

/// Fields common to both endpoints. Unknown fields are ignored, as OpenAI's own server
/// does for fields it does not know.
#[derive(Debug, Default)]
struct Common {
    model: String,
    max_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Not OpenAI's, but what vLLM and llama.cpp accept: 0 or -1 = off.
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<serde_json::Number>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop: Option<Value>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
    logit_bias: Option<Value>,
    /// vLLM's extensions.
    ignore_eos: Option<bool>,
    return_token_ids: Option<bool>,
}

/// A request body: the [`Common`] fields plus the endpoint's own. (Not `#[serde(flatten)]`,
/// which would hide the path of a bad value from the error.)
macro_rules! body_with_common {
    ($name:ident { $($(#[$m:meta])* $field:ident: $ty:ty,)* }) => {
        #[derive(Deserialize, Debug)]
        struct $name {
            model: String,
            max_tokens: Option<u32>,
            temperature: Option<f32>,
            top_p: Option<f32>,
            top_k: Option<i64>,
            min_p: Option<f32>,
            seed: Option<serde_json::Number>,
            frequency_penalty: Option<f32>,
            presence_penalty: Option<f32>,
            repetition_penalty: Option<f32>,
            stop: Option<Value>,
            stream: Option<bool>,
            stream_options: Option<StreamOptions>,
            n: Option<u32>,
            logit_bias: Option<Value>,
            ignore_eos: Option<bool>,
            return_token_ids: Option<bool>,
            $($(#[$m])* $field: $ty,)*
        }
        impl $name {
            fn common(&mut self) -> Common {
                Common {
                    model: std::mem::take(&mut self.model),
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    min_p: self.min_p,
                    seed: self.seed.take(),
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    repetition_penalty: self.repetition_penalty,
                    stop: self.stop.take(),
                    stream: self.stream,
                    stream_options: self.stream_options.take(),
                    n: self.n,
                    logit_bias: self.logit_bias.take(),
                    ignore_eos: self.ignore_eos,
                    return_token_ids: self.return_token_ids,
                }
            }
        }
    };
}

#[derive(Deserialize, Debug)]
struct StreamOptions {
    include_usage: Option<bool>,
}

body_with_common!(ChatBody {
    messages: Vec<MessageBody>,
    max_completion_tokens: Option<u32>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    /// colibri's extension: continue this daemon session (`messages` are then the turn's
    /// new messages; the session remembers the earlier ones, as with gRPC Chat).
    session_id: Option<String>,
});

#[derive(Deserialize, Debug)]
struct MessageBody {
    role: String,
    content: Option<Value>,
    tool_calls: Option<Vec<Value>>,
}

body_with_common!(CompletionBody {
    prompt: Value,
    /// A number here (how many top tokens), not a flag.
    logprobs: Option<u32>,
    echo: Option<bool>,
    suffix: Option<String>,
    best_of: Option<u32>,
});

/// A chat request ready for the daemon (the model still to be resolved).
#[derive(Debug, PartialEq)]
pub struct ChatCall {
    pub model: String,
    pub messages: Vec<pb::ChatMessage>,
    pub params: GenParams,
    /// colibri's `session_id` extension; empty = none.
    pub session_id: String,
}

#[derive(Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

#[derive(Debug, PartialEq)]
pub struct CompletionCall {
    pub model: String,
    pub prompt: Prompt,
    pub params: GenParams,
}

/// The parameters both endpoints share; `max_tokens` already chosen by the caller.
fn params(c: &Common, max_tokens: Option<u32>, max_field: &str) -> Result<GenParams, ApiError> {
    if let Some(n) = c.n {
        if n != 1 {
            return Err(ApiError::unsupported(
                "n",
                "only one choice per request (n = 1)",
            ));
        }
    }
    for (field, v) in [
        ("frequency_penalty", c.frequency_penalty),
        ("presence_penalty", c.presence_penalty),
    ] {
        if v.is_some_and(|v| v != 0.0) {
            return Err(ApiError::unsupported(
                field,
                "not implemented yet; use repetition_penalty",
            ));
        }
    }
    if c.logit_bias
        .as_ref()
        .is_some_and(|b| !b.is_null() && b.as_object().is_none_or(|o| !o.is_empty()))
    {
        return Err(ApiError::unsupported("logit_bias", "not implemented"));
    }
    if max_tokens == Some(0) {
        return Err(ApiError::field(max_field, "must be at least 1"));
    }
    let top_k = match c.top_k {
        None => None,
        Some(k) if k <= 0 => {
            if k < -1 {
                return Err(ApiError::field("top_k", "must be >= 1, or 0 or -1 for off"));
            }
            Some(0)
        }
        Some(k) => Some(k.min(u32::MAX as i64) as u32),
    };
    let seed = match &c.seed {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .or_else(|| n.as_i64().map(|i| i as u64))
                .ok_or_else(|| ApiError::field("seed", "must be an integer"))?,
        ),
    };
    Ok(GenParams {
        max_tokens: max_tokens.unwrap_or(0),
        sampling: Sampling {
            temperature: c.temperature,
            top_p: c.top_p,
            top_k,
            min_p: c.min_p,
            repetition_penalty: c.repetition_penalty,
            seed,
        },
        stop: stops(c.stop.as_ref(), "stop")?,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        stream: c.stream.unwrap_or(false),
        include_usage: c
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        return_token_ids: c.return_token_ids.unwrap_or(false),
    })
}

/// `stop`: a string or a list of strings.
pub fn stops(v: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::field(format!("{field}[{i}]"), "must be a string"))
            })
            .collect(),
        Some(_) => Err(ApiError::field(
            field,
            "must be a string or a list of strings",
        )),
    }
}

/// A message's content: a string, null, or a list of text parts (joined by newlines).
fn content_text(v: Option<&Value>, field: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let f = format!("{field}[{j}]");
                let kind = p
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::field(format!("{f}.type"), "is required"))?;
                match kind {
                    "text" | "refusal" => texts.push(
                        p.get(kind)
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ApiError::field(format!("{f}.{kind}"), "must be a string")
                            })?
                            .to_string(),
                    ),
                    other => {
                        return Err(ApiError::unsupported(
                            format!("{f}.type"),
                            format!("'{other}' parts: the models served here read text only"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(ApiError::field(
            field,
            "must be a string, null or a list of content parts",
        )),
    }
}

pub fn parse_chat(bytes: &[u8]) -> Result<ChatCall, ApiError> {
    let mut b: ChatBody = super::parse_json(bytes)?;
    let common = b.common();
    let (max, max_field) = match (b.max_completion_tokens, common.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    let params = params(&common, max, max_field)?;
    if b.logprobs == Some(true) || b.top_logprobs.is_some_and(|n| n > 0) {
        let field = if b.logprobs == Some(true) {
            "logprobs"
        } else {
            "top_logprobs"
        };
        return Err(ApiError::unsupported(
            field,
            "log probabilities are not implemented yet",
        ));
    }
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::unsupported(
            "tools",
            "tool calling is not implemented yet",
        ));
    }
    match b.tool_choice.as_ref() {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "none" || s == "auto" => {}
        Some(_) => {
            return Err(ApiError::field(
                "tool_choice",
                "names a tool choice, but the request has no tools",
            ))
        }
    }
    if let Some(rf) = b.response_format.as_ref().filter(|v| !v.is_null()) {
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some(t @ ("json_object" | "json_schema")) => {
                return Err(ApiError::unsupported(
                    "response_format",
                    format!("'{t}' (constrained decoding) is not implemented yet"),
                ))
            }
            _ => {
                return Err(ApiError::field(
                    "response_format.type",
                    "must be 'text', 'json_object' or 'json_schema'",
                ))
            }
        }
    }
    let mut messages = Vec::with_capacity(b.messages.len());
    for (i, m) in b.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            // The chat templates know no "developer": it is OpenAI's new name for system.
            "developer" | "system" => "system",
            r @ ("user" | "assistant" | "tool") => r,
            other => {
                return Err(ApiError::field(
                    format!("messages[{i}].role"),
                    format!("'{other}' is not one of system, developer, user, assistant, tool"),
                ))
            }
        };
        if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
            return Err(ApiError::unsupported(
                format!("messages[{i}].tool_calls"),
                "tool calling is not implemented yet",
            ));
        }
        messages.push(pb::ChatMessage {
            role: role.to_string(),
            content: content_text(m.content.as_ref(), &format!("messages[{i}].content"))?,
        });
    }
    Ok(ChatCall {
        model: common.model,
        messages,
        params,
        session_id: b.session_id.take().unwrap_or_default(),
    })
}

pub fn parse_completion(bytes: &[u8]) -> Result<CompletionCall, ApiError> {
    let mut b: CompletionBody = super::parse_json(bytes)?;
    let common = b.common();
    let params = params(&common, common.max_tokens, "max_tokens")?;
    if b.logprobs.is_some() {
        return Err(ApiError::unsupported(
            "logprobs",
            "log probabilities are not implemented yet",
        ));
    }
    if b.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "not implemented"));
    }
    if b.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported(
            "suffix",
            "fill-in-the-middle is not implemented",
        ));
    }
    if b.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::unsupported("best_of", "only 1"));
    }
    let ids = |a: &[Value], field: &str| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_u64()
                    .filter(|&x| x <= u32::MAX as u64)
                    .map(|x| x as u32)
                    .ok_or_else(|| ApiError::field(format!("{field}[{i}]"), "must be a token id"))
            })
            .collect()
    };
    let one = "one prompt per request: batches are not supported";
    let prompt = match &b.prompt {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(a) if a.is_empty() => return Err(ApiError::field("prompt", "is empty")),
        Value::Array(a) => match &a[0] {
            Value::String(s) if a.len() == 1 => Prompt::Text(s.clone()),
            Value::Number(_) => Prompt::Ids(ids(a, "prompt")?),
            Value::Array(inner) if a.len() == 1 => Prompt::Ids(ids(inner, "prompt[0]")?),
            Value::String(_) | Value::Array(_) => return Err(ApiError::unsupported("prompt", one)),
            _ => {
                return Err(ApiError::field(
                    "prompt[0]",
                    "must be a string, a token id or a list of token ids",
                ))
            }
        },
        _ => {
            return Err(ApiError::field(
                "prompt",
                "must be a string or a list of token ids",
            ))
        }
    };
    Ok(CompletionCall {
        model: common.model,
        prompt,
        params,
    })
}

fn finish_reason(f: &pb::generate_event::Finished) -> &'static str {
    match pb::FinishReason::try_from(f.reason) {
        Ok(pb::FinishReason::Length) => "length",
        _ => "stop",
    }
}

/// OpenAI's usage object: prompt tokens include those served from a cached prefix.
fn usage(f: &pb::generate_event::Finished) -> Value {
    let s = f.stats.clone().unwrap_or_default();
    let prompt = s.prompt_tokens + s.cached_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": s.generated_tokens,
        "total_tokens": prompt + s.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// The request's timings under llama.cpp server's names (`timings`), plus colibri's own:
/// what a client needs to show speed without timing the stream itself.
fn timings(f: &pb::generate_event::Finished) -> Value {
    let s = f.stats.clone().unwrap_or_default();
    let per_token_ms = |tps: f64| if tps > 0.0 { 1e3 / tps } else { 0.0 };
    json!({
        "cache_n": s.cached_tokens,
        "prompt_n": s.prompt_tokens,
        "prompt_per_second": s.prefill_tokens_per_second,
        "prompt_per_token_ms": per_token_ms(s.prefill_tokens_per_second),
        "predicted_n": s.generated_tokens,
        "predicted_per_second": s.decode_tokens_per_second,
        "predicted_per_token_ms": per_token_ms(s.decode_tokens_per_second),
        "time_to_first_token_ms": s.time_to_first_token_ms,
        "queue_ms": s.queue_ms,
        "total_ms": s.total_ms,
        "expert_cache_hit_rate": s.expert_cache.as_ref().map(|c| c.hit_rate),
    })
}

fn fingerprint() -> String {
    format!("colibri-{}", env!("CARGO_PKG_VERSION"))
}

pub async fn chat_completions(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&app, body, Flavor::OpenAi).await?;
    let call = parse_chat(&bytes)?;
    let (name, h) = resolve(&app, &call.model, Flavor::OpenAi)?;
    let req = pb::ChatRequest {
        model: h.id.clone(),
        messages: call.messages,
        options: Some(call.params.options(&h)),
        session_id: call.session_id,
    };
    let events = app
        .service
        .chat(tonic::Request::new(req))
        .await
        .map_err(|st| ApiError::from_status(&st, CHAT_FIELDS))?
        .into_inner();
    let p = call.params;
    if p.stream {
        let t = Chunks::new(name, Kind::Chat, &p);
        return Ok(first_then_stream(events, t, &app).await);
    }
    let c = collect(events, CHAT_FIELDS, Flavor::OpenAi).await?;
    let mut choice = json!({
        "index": 0,
        "message": {"role": "assistant", "content": c.text, "refusal": null},
        "logprobs": null,
        "finish_reason": finish_reason(&c.finished),
    });
    if p.return_token_ids {
        choice["token_ids"] = json!(c.ids);
    }
    let body = json!({
        "id": format!("chatcmpl-{}", c.started.request_id),
        "object": "chat.completion",
        "created": unix_now(),
        "model": name,
        "system_fingerprint": fingerprint(),
        "choices": [choice],
        "usage": usage(&c.finished),
    });
    Ok(with_request_id(
        axum::Json(body).into_response(),
        &c.started.request_id,
    ))
}

pub async fn completions(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let bytes = read_body(&app, body, Flavor::OpenAi).await?;
    let call = parse_completion(&bytes)?;
    let (name, h) = resolve(&app, &call.model, Flavor::OpenAi)?;
    let (prompt_ids, prompt_text) = match call.prompt {
        Prompt::Ids(ids) => (ids, String::new()),
        Prompt::Text(t) => (Vec::new(), t),
    };
    if prompt_ids.is_empty() && prompt_text.is_empty() {
        return Err(ApiError::field("prompt", "is empty"));
    }
    let req = pb::GenerateRequest {
        model: h.id.clone(),
        prompt_ids,
        prompt_text,
        add_special_tokens: None,
        options: Some(call.params.options(&h)),
        session_id: String::new(),
    };
    let events = app
        .service
        .generate(tonic::Request::new(req))
        .await
        .map_err(|st| ApiError::from_status(&st, COMPLETION_FIELDS))?
        .into_inner();
    let p = call.params;
    if p.stream {
        let t = Chunks::new(name, Kind::Completion, &p);
        return Ok(first_then_stream(events, t, &app).await);
    }
    let c = collect(events, COMPLETION_FIELDS, Flavor::OpenAi).await?;
    let mut choice = json!({
        "index": 0,
        "text": c.text,
        "logprobs": null,
        "finish_reason": finish_reason(&c.finished),
    });
    if p.return_token_ids {
        choice["token_ids"] = json!(c.ids);
    }
    let body = json!({
        "id": format!("cmpl-{}", c.started.request_id),
        "object": "text_completion",
        "created": unix_now(),
        "model": name,
        "system_fingerprint": fingerprint(),
        "choices": [choice],
        "usage": usage(&c.finished),
    });
    Ok(with_request_id(
        axum::Json(body).into_response(),
        &c.started.request_id,
    ))
}

fn with_request_id(mut r: Response, id: &str) -> Response {
    if let Ok(v) = axum::http::HeaderValue::from_str(id) {
        r.headers_mut().insert("x-request-id", v);
    }
    r
}

/// The stream's first event is the daemon's Started (the prompt was accepted, already
/// received): it names the request, so it is read before the response's headers go out.
pub(super) async fn first_then_stream<T: Translate>(
    mut events: crate::service::BoxStream<pb::GenerateEvent>,
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
    sse::response(events, Prefixed { pre, inner: t }, app.cfg.ping_every, &rid)
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

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

/// OpenAI's streamed chunks: chat.completion.chunk (role first, then content deltas, then
/// the finish reason, then usage when asked) or text_completion; `data: [DONE]` last.
struct Chunks {
    kind: Kind,
    model: String,
    request_id: String,
    created: u64,
    include_usage: bool,
    return_token_ids: bool,
}

impl Chunks {
    fn new(model: String, kind: Kind, p: &GenParams) -> Chunks {
        Chunks {
            kind,
            model,
            request_id: String::new(),
            created: unix_now(),
            include_usage: p.include_usage,
            return_token_ids: p.return_token_ids,
        }
    }

    fn chunk(&self, choices: Value) -> String {
        let (prefix, object) = match self.kind {
            Kind::Chat => ("chatcmpl", "chat.completion.chunk"),
            Kind::Completion => ("cmpl", "text_completion"),
        };
        let mut c = json!({
            "id": format!("{prefix}-{}", self.request_id),
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": fingerprint(),
            "choices": choices,
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        sse::data(&c)
    }

    fn choice(&self, text: Option<&str>, finish: Option<&str>, ids: Option<&[u32]>) -> Value {
        let mut ch = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "delta": match text { Some(t) => json!({"content": t}), None => json!({}) },
                "logprobs": null,
                "finish_reason": finish,
            }),
            Kind::Completion => json!({
                "index": 0,
                "text": text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": finish,
            }),
        };
        if let (true, Some(ids)) = (self.return_token_ids, ids) {
            ch["token_ids"] = json!(ids);
        }
        ch
    }
}

impl Translate for Chunks {
    fn event(&mut self, ev: Event) -> (Vec<String>, bool) {
        match ev {
            Event::Started(s) => {
                self.request_id = s.request_id;
                if self.kind == Kind::Chat {
                    let mut c = self.choice(None, None, None);
                    c["delta"] = json!({"role": "assistant", "content": ""});
                    (vec![self.chunk(json!([c]))], false)
                } else {
                    (Vec::new(), false)
                }
            }
            Event::Tokens(t) => {
                if t.text.is_empty() && !self.return_token_ids {
                    return (Vec::new(), false);
                }
                let c = self.choice(Some(&t.text), None, Some(&t.ids));
                (vec![self.chunk(json!([c]))], false)
            }
            Event::Finished(f) => {
                if f.reason == pb::FinishReason::Cancelled as i32 {
                    return (self.error(super::cancelled()), true);
                }
                let c = self.choice(None, Some(finish_reason(&f)), None);
                let mut frames = vec![self.chunk(json!([c]))];
                if self.include_usage {
                    let mut last: Value = serde_json::from_str(
                        self.chunk(json!([])).trim_start_matches("data: ").trim(),
                    )
                    .expect("a chunk is JSON");
                    last["usage"] = usage(&f);
                    last["timings"] = timings(&f);
                    frames.push(sse::data(&last));
                }
                frames.push("data: [DONE]\n\n".to_string());
                (frames, true)
            }
        }
    }

    fn error(&mut self, e: ApiError) -> Vec<String> {
        vec![sse::data(&e.flavor(Flavor::OpenAi).body())]
    }

    fn ping(&self) -> String {
        // A comment line: SSE parsers (and the SDKs) skip it.
        ": ping\n\n".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_fields_map_to_the_proto() {
        let c = parse_chat(
            br#"{"model":"m","messages":[{"role":"developer","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null,"tool_calls":null}],
            "max_tokens":5,"max_completion_tokens":7,"temperature":0.5,"top_k":-1,"seed":-1,
            "stop":"x","stream":true,"stream_options":{"include_usage":true},"n":1,
            "session_id":"s1","unknown_field":{"ignored":true}}"#,
        )
        .unwrap();
        assert_eq!(c.model, "m");
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant"]);
        assert_eq!(c.messages[1].content, "a\nb");
        assert_eq!(c.messages[2].content, "");
        assert_eq!(c.params.max_tokens, 7);
        assert_eq!(c.params.sampling.temperature, Some(0.5));
        assert_eq!(c.params.sampling.top_k, Some(0));
        assert_eq!(c.params.sampling.seed, Some(u64::MAX));
        assert_eq!(c.params.stop, ["x"]);
        assert!(c.params.stream && c.params.include_usage);
        assert_eq!(c.session_id, "s1");
    }

    #[test]
    fn refusals_name_the_field() {
        let base = r#""model":"m","messages":[{"role":"user","content":"hi"}]"#;
        for (extra, field) in [
            (r#""n":2"#, "n"),
            (r#""logprobs":true"#, "logprobs"),
            (r#""top_logprobs":3"#, "top_logprobs"),
            (
                r#""tools":[{"type":"function","function":{"name":"f"}}]"#,
                "tools",
            ),
            (r#""tool_choice":"required""#, "tool_choice"),
            (
                r#""response_format":{"type":"json_object"}"#,
                "response_format",
            ),
            (
                r#""response_format":{"type":"yaml"}"#,
                "response_format.type",
            ),
            (r#""presence_penalty":0.5"#, "presence_penalty"),
            (r#""max_tokens":0"#, "max_tokens"),
            (r#""max_tokens":-3"#, "max_tokens"),
            (r#""temperature":"hot""#, "temperature"),
            (r#""stop":[1]"#, "stop[0]"),
            (r#""top_k":-5"#, "top_k"),
        ] {
            let body = format!("{{{base},{extra}}}");
            let e = parse_chat(body.as_bytes()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{extra}: {}", e.message);
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
        }
        let e = parse_chat(br#"{"model":"m","messages":[{"role":"wizard","content":"x"}]}"#)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let e = parse_chat(br#"{"messages":[]}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("model"));
    }

    #[test]
    fn completion_prompts() {
        let p = |s: &str| parse_completion(format!(r#"{{"model":"m","prompt":{s}}}"#).as_bytes());
        assert_eq!(p(r#""hi""#).unwrap().prompt, Prompt::Text("hi".into()));
        assert_eq!(p(r#"["hi"]"#).unwrap().prompt, Prompt::Text("hi".into()));
        assert_eq!(p("[1,2,3]").unwrap().prompt, Prompt::Ids(vec![1, 2, 3]));
        assert_eq!(p("[[4,5]]").unwrap().prompt, Prompt::Ids(vec![4, 5]));
        assert_eq!(
            p(r#"["a","b"]"#).unwrap_err().param.as_deref(),
            Some("prompt")
        );
        assert_eq!(p("[1,-2]").unwrap_err().param.as_deref(), Some("prompt[1]"));
        assert_eq!(p("{}").unwrap_err().param.as_deref(), Some("prompt"));
        let e = parse_completion(br#"{"model":"m","prompt":"x","echo":true}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("echo"));
    }
}
