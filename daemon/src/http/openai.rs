//! The OpenAI API: `POST /v1/chat/completions` and `POST /v1/completions`, streamed or not.
//!
//! [`parse_chat`] and [`parse_completion`] turn a request body into the proto's messages or
//! prompt and the generation options, naming the field at fault in a 400; they never touch
//! a model (the fuzz target and the mutation test call them directly). Fields the engine
//! cannot honour are refused by name, never ignored (docs/http.md lists them).

use super::app::{collect, read_body, resolve, unix_now, App};
use super::error::{ApiError, Flavor};
use super::request::{json_schema_format, named_choice, stops, tool, GenParams, Sampling};
use super::sse::{self, first_then_stream, Translate};
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
    parallel_tool_calls: Option<bool>,
    /// vLLM's extension: extra variables for the chat template, e.g. {"enable_thinking": false}.
    chat_template_kwargs: Option<Value>,
    /// colibri's extension: continue this daemon session (`messages` are then the turn's
    /// new messages; the session remembers the earlier ones, as with gRPC Chat).
    session_id: Option<String>,
});

#[derive(Deserialize, Debug)]
struct MessageBody {
    role: String,
    content: Option<Value>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
    name: Option<String>,
    /// DeepSeek's and vLLM's name for an assistant message's reasoning.
    reasoning_content: Option<String>,
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
    pub tools: Vec<pb::Tool>,
    pub tool_choice: Option<pb::ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// chat_template_kwargs as JSON text; empty = none.
    pub template_kwargs: String,
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
        if v.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
            return Err(ApiError::field(field, "must be between -2 and 2"));
        }
    }
    let logit_bias = logit_bias(c.logit_bias.as_ref())?;
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
            frequency_penalty: c.frequency_penalty,
            presence_penalty: c.presence_penalty,
            logit_bias,
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
        ..Default::default()
    })
}

/// `logit_bias`: {"token id": bias in [-100, 100]} (ids are checked against the model's
/// vocabulary by the daemon).
fn logit_bias(v: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let o = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(ApiError::field(
                "logit_bias",
                "must be an object of token id -> bias",
            ))
        }
    };
    let mut out = Vec::with_capacity(o.len());
    for (k, b) in o {
        let f = format!("logit_bias.{k}");
        let id: u32 = k
            .parse()
            .map_err(|_| ApiError::field(&f, "the key must be a token id"))?;
        let b = b
            .as_f64()
            .filter(|b| (-100.0..=100.0).contains(b))
            .ok_or_else(|| ApiError::field(&f, "must be a number between -100 and 100"))?;
        out.push((id, b as f32));
    }
    out.sort_by_key(|e| e.0);
    Ok(out)
}

/// `tools`: OpenAI's function tools.
fn tools(v: &[Value]) -> Result<Vec<pb::Tool>, ApiError> {
    v.iter()
        .enumerate()
        .map(|(i, t)| {
            let f = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::unsupported(
                    format!("{f}.type"),
                    "only 'function' tools",
                ));
            }
            let func = t
                .get("function")
                .filter(|x| x.is_object())
                .ok_or_else(|| ApiError::field(format!("{f}.function"), "is required"))?;
            tool(func, &format!("{f}.function"), "parameters")
        })
        .collect()
}

fn tool_choice(v: Option<&Value>, tools: &[pb::Tool]) -> Result<Option<pb::ToolChoice>, ApiError> {
    let mode = |m: pb::tool_choice::Mode| {
        Some(pb::ToolChoice {
            mode: m as i32,
            name: String::new(),
        })
    };
    let choice = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s == "none" => return Ok(mode(pb::tool_choice::Mode::None)),
        Some(Value::String(s)) if s == "auto" => return Ok(None),
        Some(Value::String(s)) if s == "required" => mode(pb::tool_choice::Mode::Required),
        Some(o @ Value::Object(_)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::field("tool_choice.function.name", "must be a tool's name")
                })?;
            Some(named_choice(name, tools, "tool_choice.function.name")?)
        }
        Some(_) => {
            return Err(ApiError::field(
                "tool_choice",
                "must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            ))
        }
    };
    if tools.is_empty() {
        return Err(ApiError::field(
            "tool_choice",
            "names a tool choice, but the request has no tools",
        ));
    }
    Ok(choice)
}

/// An assistant message's `tool_calls` (history): arguments are JSON text (an object is
/// accepted too).
fn history_calls(v: &[Value], f: &str) -> Result<Vec<pb::ToolCall>, ApiError> {
    v.iter()
        .enumerate()
        .map(|(j, c)| {
            let f = format!("{f}[{j}]");
            let func = c
                .get("function")
                .ok_or_else(|| ApiError::field(format!("{f}.function"), "is required"))?;
            let name = func
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::field(format!("{f}.function.name"), "must be a string"))?;
            let arguments = match func.get("arguments") {
                None | Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => {
                    if serde_json::from_str::<serde_json::Map<String, Value>>(s).is_err() {
                        return Err(ApiError::field(
                            format!("{f}.function.arguments"),
                            "must be a JSON object (as text)",
                        ));
                    }
                    s.clone()
                }
                Some(o @ Value::Object(_)) => o.to_string(),
                Some(_) => {
                    return Err(ApiError::field(
                        format!("{f}.function.arguments"),
                        "must be a JSON object (as text)",
                    ))
                }
            };
            Ok(pb::ToolCall {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// `response_format` (OpenAI) → the proto's constraint; None = free text.
fn response_format(v: Option<&Value>) -> Result<Option<pb::ResponseFormat>, ApiError> {
    use pb::response_format::Type;
    let Some(rf) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(pb::ResponseFormat {
            r#type: Type::JsonObject as i32,
            ..Default::default()
        })),
        Some("json_schema") => {
            let schema = rf
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| {
                    ApiError::field(
                        "response_format.json_schema.schema",
                        "must be a JSON schema",
                    )
                })?;
            Ok(Some(json_schema_format(schema)))
        }
        _ => Err(ApiError::field(
            "response_format.type",
            "must be 'text', 'json_object' or 'json_schema'",
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
    let mut b: ChatBody = super::app::parse_json(bytes)?;
    let common = b.common();
    let (max, max_field) = match (b.max_completion_tokens, common.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    let mut params = params(&common, max, max_field)?;
    let top = b.top_logprobs.unwrap_or(0);
    if top > 20 {
        return Err(ApiError::field("top_logprobs", "must be between 0 and 20"));
    }
    if top > 0 && b.logprobs != Some(true) {
        return Err(ApiError::field("top_logprobs", "needs logprobs: true"));
    }
    params.logprobs = b.logprobs == Some(true);
    params.top_logprobs = top;
    params.response_format = response_format(b.response_format.as_ref())?;
    let tools = tools(b.tools.as_deref().unwrap_or_default())?;
    let tool_choice = tool_choice(b.tool_choice.as_ref(), &tools)?;
    let template_kwargs = match b.chat_template_kwargs.as_ref() {
        None | Some(Value::Null) => String::new(),
        Some(o @ Value::Object(_)) => o.to_string(),
        Some(_) => return Err(ApiError::field("chat_template_kwargs", "must be an object")),
    };
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
        let tool_calls = match m.tool_calls.as_deref() {
            Some(c) if !c.is_empty() => {
                if role != "assistant" {
                    return Err(ApiError::field(
                        format!("messages[{i}].tool_calls"),
                        "only assistant messages make tool calls",
                    ));
                }
                history_calls(c, &format!("messages[{i}].tool_calls"))?
            }
            _ => Vec::new(),
        };
        messages.push(pb::ChatMessage {
            role: role.to_string(),
            content: content_text(m.content.as_ref(), &format!("messages[{i}].content"))?,
            tool_calls,
            tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            reasoning_content: m.reasoning_content.clone().unwrap_or_default(),
        });
    }
    Ok(ChatCall {
        model: common.model,
        messages,
        params,
        session_id: b.session_id.take().unwrap_or_default(),
        tools,
        tool_choice,
        parallel_tool_calls: b.parallel_tool_calls,
        template_kwargs,
    })
}

pub fn parse_completion(bytes: &[u8]) -> Result<CompletionCall, ApiError> {
    let mut b: CompletionBody = super::app::parse_json(bytes)?;
    let common = b.common();
    let mut params = params(&common, common.max_tokens, "max_tokens")?;
    if let Some(n) = b.logprobs {
        if n > 20 {
            return Err(ApiError::field("logprobs", "must be between 0 and 20"));
        }
        params.logprobs = true;
        params.top_logprobs = n;
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
        Ok(pb::FinishReason::ToolCalls) => "tool_calls",
        _ => "stop",
    }
}

/// A reply's tool calls as OpenAI's message.tool_calls.
fn tool_calls_json(calls: &[pb::ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

/// Streamed tool-call pieces as OpenAI's delta.tool_calls: the first piece of a call carries
/// its id, type and name; later ones only argument fragments.
fn tool_call_deltas(ds: &[pb::ToolCallDelta]) -> Value {
    ds.iter()
        .map(|d| {
            if d.id.is_empty() && d.name.is_empty() {
                json!({"index": d.index, "function": {"arguments": d.arguments}})
            } else {
                json!({"index": d.index, "id": d.id, "type": "function",
                       "function": {"name": d.name, "arguments": d.arguments}})
            }
        })
        .collect()
}

/// Chat logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(lps: &[pb::TokenLogprob]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let top: Vec<Value> = l
                .top
                .iter()
                .map(|t| json!({"token": t.token, "logprob": t.logprob, "bytes": t.bytes}))
                .collect();
            json!({"token": l.token, "logprob": l.logprob, "bytes": l.bytes, "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// The legacy completions logprobs: parallel lists, `top_logprobs` as {token: logprob}
/// maps, `text_offset` from `offset` (the text already sent).
fn completion_logprobs(lps: &[pb::TokenLogprob], mut offset: usize) -> Value {
    let mut tokens = Vec::new();
    let mut lp = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for l in lps {
        tokens.push(json!(l.token));
        lp.push(json!(l.logprob));
        let m: serde_json::Map<String, Value> = l
            .top
            .iter()
            .map(|t| (t.token.clone(), json!(t.logprob)))
            .collect();
        top.push(Value::Object(m));
        offsets.push(json!(offset));
        offset += l.token.len();
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offsets})
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
        tools: call.tools,
        tool_choice: call.tool_choice,
        parallel_tool_calls: call.parallel_tool_calls,
        template_kwargs: call.template_kwargs,
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
    let calls = &c.finished.tool_calls;
    let mut message = json!({
        "role": "assistant",
        // OpenAI's replies that only call tools have a null content.
        "content": if c.text.is_empty() && !calls.is_empty() { Value::Null } else { json!(c.text) },
        "refusal": null,
    });
    if !c.reasoning.is_empty() {
        message["reasoning_content"] = json!(c.reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = tool_calls_json(calls);
    }
    let mut choice = json!({
        "index": 0,
        "message": message,
        "logprobs": if p.logprobs { chat_logprobs(&c.logprobs) } else { Value::Null },
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
        "logprobs": if p.logprobs { completion_logprobs(&c.logprobs, 0) } else { Value::Null },
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
    logprobs: bool,
    /// Bytes of text sent so far (the completions logprobs' text_offset).
    sent: usize,
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
            logprobs: p.logprobs,
            sent: 0,
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
                let lps = self.logprobs && !t.logprobs.is_empty();
                if t.text.is_empty()
                    && t.reasoning.is_empty()
                    && t.tool_calls.is_empty()
                    && !lps
                    && !self.return_token_ids
                {
                    return (Vec::new(), false);
                }
                let mut c = self.choice(Some(&t.text), None, Some(&t.ids));
                if self.kind == Kind::Chat {
                    let mut delta = serde_json::Map::new();
                    if !t.text.is_empty() {
                        delta.insert("content".into(), json!(t.text));
                    }
                    if !t.reasoning.is_empty() {
                        delta.insert("reasoning_content".into(), json!(t.reasoning));
                    }
                    if !t.tool_calls.is_empty() {
                        delta.insert("tool_calls".into(), tool_call_deltas(&t.tool_calls));
                    }
                    c["delta"] = Value::Object(delta);
                    if lps {
                        c["logprobs"] = chat_logprobs(&t.logprobs);
                    }
                } else if lps {
                    c["logprobs"] = completion_logprobs(&t.logprobs, self.sent);
                }
                self.sent += t.text.len();
                (vec![self.chunk(json!([c]))], false)
            }
            Event::Finished(f) => {
                if f.reason == pb::FinishReason::Cancelled as i32 {
                    return (self.error(super::app::cancelled()), true);
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
            (r#""top_logprobs":3"#, "top_logprobs"),
            (r#""logprobs":true,"top_logprobs":21"#, "top_logprobs"),
            (r#""tools":[{"type":"web_search"}]"#, "tools[0].type"),
            (
                r#""tools":[{"type":"function","function":{"description":"x"}}]"#,
                "tools[0].function.name",
            ),
            (r#""tool_choice":"required""#, "tool_choice"),
            (
                r#""tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
                "tool_choice.function.name",
            ),
            (
                r#""response_format":{"type":"json_schema","json_schema":{"name":"x"}}"#,
                "response_format.json_schema.schema",
            ),
            (
                r#""response_format":{"type":"yaml"}"#,
                "response_format.type",
            ),
            (r#""presence_penalty":2.5"#, "presence_penalty"),
            (r#""logit_bias":{"x":1}"#, "logit_bias.x"),
            (r#""logit_bias":{"5":101}"#, "logit_bias.5"),
            (r#""chat_template_kwargs":[1]"#, "chat_template_kwargs"),
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
    fn tools_formats_logprobs_and_penalties_map_to_the_proto() {
        let c = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":"weather?"},
            {"role":"assistant","content":null,"reasoning_content":"look it up",
             "tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"sunny"}],
            "tools":[{"type":"function","function":{"name":"get_weather","description":"d",
              "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],
            "tool_choice":{"type":"function","function":{"name":"get_weather"}},
            "parallel_tool_calls":false,"logprobs":true,"top_logprobs":3,
            "frequency_penalty":0.5,"presence_penalty":-1,"logit_bias":{"7":-100,"3":2.5},
            "response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}},
            "chat_template_kwargs":{"enable_thinking":false}}"#,
        )
        .unwrap();
        assert_eq!(c.tools.len(), 1);
        assert_eq!(c.tools[0].name, "get_weather");
        let params: Value = serde_json::from_str(&c.tools[0].parameters).unwrap();
        assert_eq!(params["properties"]["city"]["type"], "string");
        let choice = c.tool_choice.unwrap();
        assert_eq!(choice.mode, pb::tool_choice::Mode::Named as i32);
        assert_eq!(choice.name, "get_weather");
        assert_eq!(c.parallel_tool_calls, Some(false));
        let a = &c.messages[1];
        assert_eq!(a.reasoning_content, "look it up");
        assert_eq!(a.tool_calls[0].id, "call_1");
        assert_eq!(a.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(c.messages[2].role, "tool");
        assert_eq!(c.messages[2].tool_call_id, "call_1");
        assert!(c.params.logprobs);
        assert_eq!(c.params.top_logprobs, 3);
        assert_eq!(c.params.sampling.frequency_penalty, Some(0.5));
        assert_eq!(c.params.sampling.presence_penalty, Some(-1.0));
        assert_eq!(c.params.sampling.logit_bias, [(3, 2.5), (7, -100.0)]);
        let rf = c.params.response_format.unwrap();
        assert_eq!(rf.r#type, pb::response_format::Type::JsonSchema as i32);
        assert_eq!(rf.schema, r#"{"type":"object"}"#);
        assert_eq!(c.template_kwargs, r#"{"enable_thinking":false}"#);
        // tool_choice none: the tools are not offered.
        let c = parse_chat(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],"tool_choice":"none",
            "response_format":{"type":"json_object"}}"#,
        )
        .unwrap();
        assert_eq!(
            c.tool_choice.unwrap().mode,
            pb::tool_choice::Mode::None as i32
        );
        assert_eq!(
            c.params.response_format.unwrap().r#type,
            pb::response_format::Type::JsonObject as i32
        );
        let c = parse_completion(br#"{"model":"m","prompt":"x","logprobs":2}"#).unwrap();
        assert!(c.params.logprobs);
        assert_eq!(c.params.top_logprobs, 2);
    }

    #[test]
    fn logprobs_render_in_both_shapes() {
        let lp = |token: &str, logprob: f32| pb::TokenLogprob {
            id: 1,
            logprob,
            token: token.into(),
            bytes: token.as_bytes().to_vec(),
            top: vec![pb::TopLogprob {
                id: 2,
                logprob: -0.5,
                token: "b".into(),
                bytes: b"b".to_vec(),
            }],
        };
        let lps = [lp("ab", -1.0), lp("c", -2.0)];
        let chat = chat_logprobs(&lps);
        assert_eq!(chat["content"][1]["token"], "c");
        assert_eq!(chat["content"][0]["bytes"], json!([97, 98]));
        assert_eq!(chat["content"][0]["top_logprobs"][0]["logprob"], -0.5);
        let legacy = completion_logprobs(&lps, 10);
        assert_eq!(legacy["text_offset"], json!([10, 12]));
        assert_eq!(legacy["token_logprobs"], json!([-1.0, -2.0]));
        assert_eq!(legacy["top_logprobs"][1]["b"], -0.5);
        let d = tool_call_deltas(&[
            pb::ToolCallDelta {
                index: 0,
                id: "call_x".into(),
                name: "f".into(),
                arguments: String::new(),
            },
            pb::ToolCallDelta {
                index: 0,
                arguments: "{\"a\":".into(),
                ..Default::default()
            },
        ]);
        assert_eq!(d[0]["function"]["name"], "f");
        assert_eq!(d[0]["type"], "function");
        assert_eq!(
            d[1],
            json!({"index": 0, "function": {"arguments": "{\"a\":"}})
        );
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
