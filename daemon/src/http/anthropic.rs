//! The Anthropic Messages API: `POST /v1/messages` (streamed or not) and
//! `POST /v1/messages/count_tokens`.
//!
//! [`parse_messages`] is pure (fuzzed with the OpenAI parsers). Blocks and fields the
//! engine cannot honour are refused by name (docs/http.md).

use super::app::{collect, read_body, resolve, App};
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

pub const FIELDS: &[(&str, &str)] = &[("prompt", "messages")];

#[derive(Deserialize, Debug)]
struct MessagesBody {
    model: String,
    messages: Vec<MessageBody>,
    system: Option<Value>,
    max_tokens: Option<u32>,
    stop_sequences: Option<Value>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    stream: Option<bool>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
    output_config: Option<Value>,
    /// Not Anthropic's; accepted as the OpenAI endpoints accept them.
    min_p: Option<f32>,
    seed: Option<u64>,
    repetition_penalty: Option<f32>,
}

#[derive(Deserialize, Debug)]
struct MessageBody {
    role: String,
    content: Value,
}

#[derive(Debug, PartialEq)]
pub struct MessagesCall {
    pub model: String,
    pub messages: Vec<pb::ChatMessage>,
    pub params: GenParams,
    pub tools: Vec<pb::Tool>,
    pub tool_choice: Option<pb::ToolChoice>,
    pub parallel_tool_calls: Option<bool>,
    /// From `thinking`: {"enable_thinking": ...} for templates that read it; empty = none.
    pub template_kwargs: String,
}

/// One message's blocks: its text, and the tool blocks and reasoning it carries.
#[derive(Default)]
struct Blocks {
    text: String,
    thinking: String,
    /// assistant tool_use blocks.
    calls: Vec<pb::ToolCall>,
    /// user tool_result blocks: (tool_use_id, content text).
    results: Vec<(String, String)>,
}

/// A tool_result's content: a string or a list of text blocks.
fn result_text(v: Option<&Value>, f: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(c) => blocks_text(c, f, true),
    }
}

fn message_blocks(v: &Value, f: &str, role: &str) -> Result<Blocks, ApiError> {
    let Value::Array(blocks) = v else {
        return Ok(Blocks {
            text: blocks_text(v, f, false)?,
            ..Default::default()
        });
    };
    let mut out = Blocks::default();
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let fj = format!("{f}[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("tool_use") if role == "assistant" => {
                let s = |k: &str| {
                    b.get(k)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| ApiError::field(format!("{fj}.{k}"), "must be a string"))
                };
                let input = b
                    .get("input")
                    .filter(|i| i.is_object())
                    .ok_or_else(|| ApiError::field(format!("{fj}.input"), "must be an object"))?;
                out.calls.push(pb::ToolCall {
                    id: s("id")?,
                    name: s("name")?,
                    arguments: input.to_string(),
                });
            }
            Some("tool_result") if role == "user" => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::field(format!("{fj}.tool_use_id"), "must be a string")
                    })?;
                let mut text = result_text(b.get("content"), &format!("{fj}.content"))?;
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    text = format!("Error: {text}");
                }
                out.results.push((id.to_string(), text));
            }
            Some("thinking") if role == "assistant" => {
                if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                    out.thinking.push_str(t);
                }
            }
            _ => texts.push(
                blocks_text(&Value::Array(vec![b.clone()]), f, false).map_err(|e| {
                    // Name the block itself, not the one-block list built here.
                    let mut e = e;
                    if let Some(p) = e.param.as_mut() {
                        *p = p.replacen(&format!("{f}[0]"), &fj, 1);
                    }
                    e.message = e.message.replacen(&format!("{f}[0]"), &fj, 1);
                    e
                })?,
            ),
        }
    }
    out.text = texts
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    Ok(out)
}

/// Text of a `system` field or a message's content: a string or a list of blocks.
/// `thinking` blocks of earlier turns are dropped (the API does the same: a model does not
/// see its old reasoning).
fn blocks_text(v: &Value, field: &str, system: bool) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::new();
            for (j, b) in blocks.iter().enumerate() {
                let f = format!("{field}[{j}]");
                let kind = b
                    .get("type")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::field(format!("{f}.type"), "is required"))?;
                match kind {
                    "text" => texts.push(
                        b.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ApiError::field(format!("{f}.text"), "must be a string")
                            })?
                            .to_string(),
                    ),
                    "thinking" | "redacted_thinking" if !system => {}
                    "tool_use" | "tool_result" => {
                        return Err(ApiError::field(
                            format!("{f}.type"),
                            "tool_use blocks belong in assistant messages, tool_result blocks in user messages",
                        ))
                    }
                    "server_tool_use" => {
                        return Err(ApiError::unsupported(
                            format!("{f}.type"),
                            "server tools are not available here",
                        ))
                    }
                    other => {
                        return Err(ApiError::unsupported(
                            format!("{f}.type"),
                            format!("'{other}' blocks: the models served here read text only"),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(ApiError::field(
            field,
            "must be a string or a list of content blocks",
        )),
    }
}

/// A Messages request (or a count_tokens one: `max_tokens` not required).
pub fn parse_messages(bytes: &[u8], count_only: bool) -> Result<MessagesCall, ApiError> {
    let b: MessagesBody = super::app::parse_json(bytes).map_err(|e| e.flavor(Flavor::Anthropic))?;
    parse_body(b, count_only).map_err(|e| e.flavor(Flavor::Anthropic))
}

fn parse_body(b: MessagesBody, count_only: bool) -> Result<MessagesCall, ApiError> {
    let max_tokens = match b.max_tokens {
        None if !count_only => return Err(ApiError::field("max_tokens", "is required")),
        Some(0) => return Err(ApiError::field("max_tokens", "must be at least 1")),
        m => m.unwrap_or(0),
    };
    let tools: Vec<pb::Tool> = b
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = format!("tools[{i}]");
            match t.get("type").and_then(Value::as_str) {
                None | Some("custom") => tool(t, &f, "input_schema"),
                Some(other) => Err(ApiError::unsupported(
                    format!("{f}.type"),
                    format!("'{other}': server tools are not available here; only custom tools"),
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    let mut parallel_tool_calls = None;
    let tool_choice = match b.tool_choice.as_ref().filter(|c| !c.is_null()) {
        None => None,
        Some(c) => {
            if c.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
                parallel_tool_calls = Some(false);
            }
            let mode = |m: pb::tool_choice::Mode| pb::ToolChoice {
                mode: m as i32,
                name: String::new(),
            };
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => None,
                Some("none") => Some(mode(pb::tool_choice::Mode::None)),
                Some("any") => Some(mode(pb::tool_choice::Mode::Required)),
                Some("tool") => {
                    let name = c.get("name").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::field("tool_choice.name", "must be a tool's name")
                    })?;
                    Some(named_choice(name, &tools, "tool_choice.name")?)
                }
                _ => {
                    return Err(ApiError::field(
                        "tool_choice.type",
                        "must be 'auto', 'any', 'tool' or 'none'",
                    ))
                }
            };
            let forces = choice
                .as_ref()
                .is_some_and(|c| c.mode != pb::tool_choice::Mode::None as i32);
            if forces && tools.is_empty() {
                return Err(ApiError::field(
                    "tool_choice",
                    "names a tool choice, but the request has no tools",
                ));
            }
            choice
        }
    };
    let template_kwargs = match b.thinking.as_ref().filter(|t| !t.is_null()) {
        None => String::new(),
        Some(t) => match t.get("type").and_then(Value::as_str) {
            // Templates with a thinking switch (Qwen3, GLM) read enable_thinking; the
            // reasoning comes back as thinking blocks whenever the model writes some.
            Some("disabled") => json!({"enable_thinking": false}).to_string(),
            Some("enabled" | "adaptive") => json!({"enable_thinking": true}).to_string(),
            _ => {
                return Err(ApiError::field(
                    "thinking.type",
                    "must be 'enabled', 'adaptive' or 'disabled'",
                ))
            }
        },
    };
    let response_format = match b
        .output_config
        .as_ref()
        .and_then(|c| c.get("format"))
        .filter(|f| !f.is_null())
    {
        None => None,
        Some(f) => match f.get("type").and_then(Value::as_str) {
            Some("json_schema") => Some(json_schema_format(
                f.get("schema")
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| {
                        ApiError::field("output_config.format.schema", "must be a JSON schema")
                    })?,
            )),
            _ => {
                return Err(ApiError::field(
                    "output_config.format.type",
                    "must be 'json_schema'",
                ))
            }
        },
    };
    let top_k = match b.top_k {
        None => None,
        Some(k) if k < 0 => return Err(ApiError::field("top_k", "must be >= 0")),
        Some(k) => Some(k.min(u32::MAX as i64) as u32),
    };
    let mut messages = Vec::with_capacity(b.messages.len() + 1);
    if let Some(sys) = b.system.as_ref().filter(|s| !s.is_null()) {
        let text = blocks_text(sys, "system", true)?;
        if !text.is_empty() {
            messages.push(pb::ChatMessage {
                role: "system".into(),
                content: text,
                ..Default::default()
            });
        }
    }
    for (i, m) in b.messages.iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::field(
                format!("messages[{i}].role"),
                format!("'{}' is not one of user, assistant", m.role),
            ));
        }
        let blocks = message_blocks(&m.content, &format!("messages[{i}].content"), &m.role)?;
        // A user message's tool results come first, as the chat templates' "tool" messages
        // answering the previous assistant message's calls; its text follows.
        for (id, text) in blocks.results {
            messages.push(pb::ChatMessage {
                role: "tool".into(),
                content: text,
                tool_call_id: id,
                ..Default::default()
            });
        }
        let only_results = m.role == "user" && blocks.text.is_empty() && {
            messages.last().is_some_and(|l| l.role == "tool")
        };
        if !only_results {
            messages.push(pb::ChatMessage {
                role: m.role.clone(),
                content: blocks.text,
                tool_calls: blocks.calls,
                reasoning_content: blocks.thinking,
                ..Default::default()
            });
        }
    }
    if let Some(last) = b.messages.last() {
        if last.role == "assistant" && !count_only {
            return Err(ApiError::unsupported(
                format!("messages[{}].role", b.messages.len() - 1),
                "continuing a final assistant message (prefill) is not implemented; end with a user message",
            ));
        }
    }
    Ok(MessagesCall {
        model: b.model,
        messages,
        params: GenParams {
            max_tokens,
            sampling: Sampling {
                temperature: b.temperature,
                top_p: b.top_p,
                top_k,
                min_p: b.min_p,
                repetition_penalty: b.repetition_penalty,
                seed: b.seed,
                ..Default::default()
            },
            stop: stops(b.stop_sequences.as_ref(), "stop_sequences")?,
            ignore_eos: false,
            stream: b.stream.unwrap_or(false),
            include_usage: true,
            return_token_ids: false,
            response_format,
            ..Default::default()
        },
        tools,
        tool_choice,
        parallel_tool_calls,
        template_kwargs,
    })
}

fn stop_reason(f: &pb::generate_event::Finished) -> (&'static str, Value) {
    match pb::FinishReason::try_from(f.reason) {
        Ok(pb::FinishReason::Length) => ("max_tokens", Value::Null),
        Ok(pb::FinishReason::ToolCalls) => ("tool_use", Value::Null),
        Ok(pb::FinishReason::Stop) => ("stop_sequence", json!(f.stop_sequence)),
        _ => ("end_turn", Value::Null),
    }
}

/// Anthropic's usage: input_tokens are the ones not read from a cache.
fn usage(input: u32, cached: u32, output: u32) -> Value {
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

pub async fn messages(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let fl = Flavor::Anthropic;
    let bytes = read_body(&app, body, fl).await?;
    let call = parse_messages(&bytes, false)?;
    let (name, h) = resolve(&app, &call.model, fl)?;
    let req = pb::ChatRequest {
        model: h.id.clone(),
        messages: call.messages,
        options: Some(call.params.options(&h)),
        session_id: String::new(),
        tools: call.tools,
        tool_choice: call.tool_choice,
        parallel_tool_calls: call.parallel_tool_calls,
        template_kwargs: call.template_kwargs,
    };
    let events = app
        .service
        .chat(tonic::Request::new(req))
        .await
        .map_err(|st| ApiError::from_status(&st, FIELDS).flavor(fl))?
        .into_inner();
    if call.params.stream {
        let t = Events {
            model: name,
            open: None,
            blocks: 0,
            output_tokens: 0,
        };
        return Ok(first_then_stream(events, t, &app).await);
    }
    let c = collect(events, FIELDS, fl).await?;
    let s = c.finished.stats.clone().unwrap_or_default();
    let (reason, seq) = stop_reason(&c.finished);
    let mut content = Vec::new();
    if !c.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": c.reasoning, "signature": ""}));
    }
    if !c.text.is_empty() {
        content.push(json!({"type": "text", "text": c.text}));
    }
    for call in &c.finished.tool_calls {
        content.push(tool_use(call));
    }
    Ok(axum::Json(json!({
        "id": format!("msg_{}", c.started.request_id),
        "type": "message",
        "role": "assistant",
        "model": name,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(s.prompt_tokens, s.cached_tokens, s.generated_tokens),
    }))
    .into_response())
}

pub async fn count_tokens(State(app): State<App>, body: Body) -> Result<Response, ApiError> {
    let fl = Flavor::Anthropic;
    let bytes = read_body(&app, body, fl).await?;
    let call = parse_messages(&bytes, true)?;
    let (_, h) = resolve(&app, &call.model, fl)?;
    if call.messages.is_empty() {
        return Err(ApiError::field("messages", "is empty").flavor(fl));
    }
    let r = app
        .service
        .tokenize(tonic::Request::new(pb::TokenizeRequest {
            model: h.id.clone(),
            text: String::new(),
            add_special_tokens: None,
            messages: call.messages,
        }))
        .await
        .map_err(|st| ApiError::from_status(&st, FIELDS).flavor(fl))?
        .into_inner();
    Ok(axum::Json(json!({"input_tokens": r.ids.len()})).into_response())
}

/// A reply's tool call as a tool_use block (its arguments are a JSON object).
fn tool_use(c: &pb::ToolCall) -> Value {
    let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input})
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Open {
    Thinking,
    Text,
    /// A tool_use block, for the reply's call of this index.
    Tool(u32),
}

/// Anthropic's event stream: message_start; content blocks in order, each opened
/// (content_block_start), filled (thinking_delta / text_delta / input_json_delta) and
/// closed (content_block_stop): the reasoning as a thinking block, the answer's text, each
/// tool call as a tool_use block; then message_delta with the stop reason and the
/// cumulative output tokens, message_stop; `ping` while nothing else is sent.
struct Events {
    model: String,
    /// The block being filled, if any.
    open: Option<Open>,
    /// Blocks opened so far (the next block's index).
    blocks: u32,
    output_tokens: u32,
}

impl Events {
    fn close(&mut self, frames: &mut Vec<String>) {
        if self.open.take().is_some() {
            frames.push(sse::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.blocks - 1}),
            ));
        }
    }

    /// Makes `kind` the open block (closing another one), starting it as `start`.
    fn ensure(&mut self, kind: Open, start: Value, frames: &mut Vec<String>) {
        if self.open == Some(kind) {
            return;
        }
        self.close(frames);
        frames.push(sse::event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.blocks, "content_block": start}),
        ));
        self.blocks += 1;
        self.open = Some(kind);
    }

    fn delta(&self, delta: Value) -> String {
        sse::event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta}),
        )
    }
}

impl Translate for Events {
    fn event(&mut self, ev: Event) -> (Vec<String>, bool) {
        match ev {
            Event::Started(s) => {
                let msg = json!({
                    "type": "message_start",
                    "message": {
                        "id": format!("msg_{}", s.request_id),
                        "type": "message",
                        "role": "assistant",
                        "model": self.model,
                        "content": [],
                        "stop_reason": null,
                        "stop_sequence": null,
                        "usage": usage(s.prompt_tokens, 0, 0),
                    },
                });
                (vec![sse::event("message_start", &msg)], false)
            }
            Event::Tokens(t) => {
                self.output_tokens += t.ids.len() as u32;
                let mut frames = Vec::new();
                if !t.reasoning.is_empty() {
                    self.ensure(
                        Open::Thinking,
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        &mut frames,
                    );
                    frames.push(
                        self.delta(json!({"type": "thinking_delta", "thinking": t.reasoning})),
                    );
                }
                if !t.text.is_empty() {
                    self.ensure(Open::Text, json!({"type": "text", "text": ""}), &mut frames);
                    frames.push(self.delta(json!({"type": "text_delta", "text": t.text})));
                }
                for d in &t.tool_calls {
                    if !d.id.is_empty() || !d.name.is_empty() {
                        // A new call: its own block, even right after another call's.
                        self.close(&mut frames);
                        self.ensure(
                            Open::Tool(d.index),
                            json!({"type": "tool_use", "id": d.id, "name": d.name, "input": {}}),
                            &mut frames,
                        );
                    }
                    if !d.arguments.is_empty() && self.open == Some(Open::Tool(d.index)) {
                        frames.push(self.delta(
                            json!({"type": "input_json_delta", "partial_json": d.arguments}),
                        ));
                    }
                }
                (frames, false)
            }
            Event::Finished(f) => {
                if f.reason == pb::FinishReason::Cancelled as i32 {
                    return (self.error(super::app::cancelled()), true);
                }
                let mut frames = Vec::new();
                self.close(&mut frames);
                let (reason, seq) = stop_reason(&f);
                let s = f.stats.clone().unwrap_or_default();
                frames.push(sse::event(
                    "message_delta",
                    &json!({"type": "message_delta",
                            "delta": {"stop_reason": reason, "stop_sequence": seq},
                            "usage": {"output_tokens": s.generated_tokens.max(self.output_tokens)}}),
                ));
                frames.push(sse::event("message_stop", &json!({"type": "message_stop"})));
                (frames, true)
            }
        }
    }

    fn error(&mut self, e: ApiError) -> Vec<String> {
        vec![sse::event("error", &e.flavor(Flavor::Anthropic).body())]
    }

    fn ping(&self) -> String {
        sse::event("ping", &json!({"type": "ping"}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_map_to_the_proto() {
        let c = parse_messages(
            br#"{"model":"m","max_tokens":9,"system":[{"type":"text","text":"sys"}],
            "messages":[{"role":"user","content":"hi"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"x"},{"type":"text","text":"yo"}]},
            {"role":"user","content":[{"type":"text","text":"a"}]}],
            "stop_sequences":["END"],"top_k":5,"thinking":{"type":"disabled"}}"#,
            false,
        )
        .unwrap();
        let m: Vec<(&str, &str)> = c
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            m,
            [
                ("system", "sys"),
                ("user", "hi"),
                ("assistant", "yo"),
                ("user", "a")
            ]
        );
        assert_eq!(c.params.max_tokens, 9);
        assert_eq!(c.params.stop, ["END"]);
        assert_eq!(c.params.sampling.top_k, Some(5));
    }

    #[test]
    fn tools_thinking_and_formats_map_to_the_proto() {
        let c = parse_messages(
            br#"{"model":"m","max_tokens":50,
            "tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object"}}],
            "tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
            "thinking":{"type":"enabled","budget_tokens":1024},
            "output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}},
            "messages":[{"role":"user","content":"weather?"},
            {"role":"assistant","content":[{"type":"thinking","thinking":"look","signature":"s"},
              {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
            {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},
              {"type":"text","text":"and tomorrow?"}]}]}"#,
            false,
        )
        .unwrap();
        assert_eq!(c.tools[0].name, "get_weather");
        assert_eq!(c.tools[0].parameters, r#"{"type":"object"}"#);
        let choice = c.tool_choice.unwrap();
        assert_eq!(choice.mode, pb::tool_choice::Mode::Named as i32);
        assert_eq!(c.parallel_tool_calls, Some(false));
        assert_eq!(c.template_kwargs, r#"{"enable_thinking":true}"#);
        let rf = c.params.response_format.unwrap();
        assert_eq!(rf.r#type, pb::response_format::Type::JsonSchema as i32);
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        let a = &c.messages[1];
        assert_eq!(a.reasoning_content, "look");
        assert_eq!(a.tool_calls[0].id, "toolu_1");
        assert_eq!(a.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(c.messages[2].tool_call_id, "toolu_1");
        assert_eq!(c.messages[2].content, "sunny");
        assert_eq!(c.messages[3].content, "and tomorrow?");
    }

    #[test]
    fn stream_blocks_open_and_close_in_order() {
        let mut e = Events {
            model: "m".into(),
            open: None,
            blocks: 0,
            output_tokens: 0,
        };
        let tokens = |reasoning: &str, text: &str, calls: Vec<pb::ToolCallDelta>| {
            Event::Tokens(pb::generate_event::Tokens {
                ids: vec![1],
                text: text.into(),
                reasoning: reasoning.into(),
                tool_calls: calls,
                ..Default::default()
            })
        };
        let call = |index: u32, id: &str, args: &str| pb::ToolCallDelta {
            index,
            id: id.into(),
            name: if id.is_empty() {
                String::new()
            } else {
                "f".into()
            },
            arguments: args.into(),
        };
        let mut all = Vec::new();
        for ev in [
            tokens("hmm", "", vec![]),
            tokens(" ok", "Hi", vec![]),
            tokens("", "", vec![call(0, "toolu_a", "")]),
            tokens(
                "",
                "",
                vec![call(0, "", "{\"a\":1}"), call(1, "toolu_b", "{}")],
            ),
        ] {
            all.extend(e.event(ev).0);
        }
        let mut f = pb::generate_event::Finished {
            reason: pb::FinishReason::ToolCalls as i32,
            ..Default::default()
        };
        f.stats = Some(Default::default());
        all.extend(e.event(Event::Finished(f)).0);
        let kinds: Vec<String> = all
            .iter()
            .map(|fr| {
                let data: Value =
                    serde_json::from_str(fr.lines().nth(1).unwrap().trim_start_matches("data: "))
                        .unwrap();
                let mut k = data["type"].as_str().unwrap().to_string();
                if let Some(i) = data.get("index") {
                    k += &format!("#{i}");
                }
                if let Some(d) = data["delta"]["type"].as_str() {
                    k += &format!(":{d}");
                }
                if let Some(r) = data["delta"]["stop_reason"].as_str() {
                    k += &format!(":{r}");
                }
                k
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "content_block_start#0",
                "content_block_delta#0:thinking_delta",
                "content_block_delta#0:thinking_delta",
                "content_block_stop#0",
                "content_block_start#1",
                "content_block_delta#1:text_delta",
                "content_block_stop#1",
                "content_block_start#2",
                "content_block_delta#2:input_json_delta",
                "content_block_stop#2",
                "content_block_start#3",
                "content_block_delta#3:input_json_delta",
                "content_block_stop#3",
                "message_delta:tool_use",
                "message_stop",
            ]
        );
    }

    #[test]
    fn refusals_name_the_field_in_anthropics_shape() {
        let ok = r#""model":"m","messages":[{"role":"user","content":"hi"}]"#;
        for (body, field) in [
            (format!("{{{ok}}}"), "max_tokens"),
            (format!(r#"{{{ok},"max_tokens":1,"tools":[{{"type":"web_search_20250305","name":"w"}}]}}"#), "tools[0].type"),
            (format!(r#"{{{ok},"max_tokens":1,"tools":[{{"description":"f"}}]}}"#), "tools[0].name"),
            (format!(r#"{{{ok},"max_tokens":1,"tool_choice":{{"type":"any"}}}}"#), "tool_choice"),
            (
                format!(r#"{{{ok},"max_tokens":1,"tools":[{{"name":"f"}}],"tool_choice":{{"type":"tool","name":"g"}}}}"#),
                "tool_choice.name",
            ),
            (
                format!(r#"{{{ok},"max_tokens":1,"thinking":{{"type":"sometimes"}}}}"#),
                "thinking.type",
            ),
            (
                format!(r#"{{{ok},"max_tokens":1,"output_config":{{"format":{{"type":"xml"}}}}}}"#),
                "output_config.format.type",
            ),
            (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use","id":"x","name":"f","input":{}}]}]}"#.to_string(),
                "messages[0].content[0].type",
            ),
            (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}"#.to_string(),
                "messages[1].role",
            ),
            (
                r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}"#.to_string(),
                "messages[0].content[0].type",
            ),
        ] {
            let e = parse_messages(body.as_bytes(), false).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            let b = e.body();
            assert_eq!(b["type"], "error");
            assert!(b["error"]["message"].as_str().unwrap().contains(field));
        }
        // count_tokens needs no max_tokens.
        assert!(parse_messages(format!("{{{ok}}}").as_bytes(), true).is_ok());
    }
}
