//! The Anthropic Messages API: `POST /v1/messages` (streamed or not) and
//! `POST /v1/messages/count_tokens`.
//!
//! [`parse_messages`] is pure (fuzzed with the OpenAI parsers). Blocks and fields the
//! engine cannot honour are refused by name (docs/http.md).

use super::error::{ApiError, Flavor};
use super::openai::{first_then_stream, stops};
use super::sse::{self, Translate};
use super::{collect, read_body, resolve, App, GenParams, Sampling};
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
                    "tool_use" | "tool_result" | "server_tool_use" => {
                        return Err(ApiError::unsupported(
                            format!("{f}.type"),
                            "tool use is not implemented yet",
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
    let b: MessagesBody = super::parse_json(bytes).map_err(|e| e.flavor(Flavor::Anthropic))?;
    parse_body(b, count_only).map_err(|e| e.flavor(Flavor::Anthropic))
}

fn parse_body(b: MessagesBody, count_only: bool) -> Result<MessagesCall, ApiError> {
    let max_tokens = match b.max_tokens {
        None if !count_only => return Err(ApiError::field("max_tokens", "is required")),
        Some(0) => return Err(ApiError::field("max_tokens", "must be at least 1")),
        m => m.unwrap_or(0),
    };
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::unsupported(
            "tools",
            "tool use is not implemented yet",
        ));
    }
    match b
        .tool_choice
        .as_ref()
        .and_then(|c| c.get("type"))
        .and_then(Value::as_str)
    {
        None | Some("auto" | "none") => {}
        Some(_) => {
            return Err(ApiError::field(
                "tool_choice",
                "names a tool choice, but the request has no tools",
            ))
        }
    }
    match b.thinking.as_ref().filter(|t| !t.is_null()) {
        None => {}
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("disabled") => {}
            Some("enabled" | "adaptive") => {
                return Err(ApiError::unsupported(
                    "thinking",
                    "separating the model's reasoning is not implemented yet",
                ))
            }
            _ => {
                return Err(ApiError::field(
                    "thinking.type",
                    "must be 'enabled' or 'disabled'",
                ))
            }
        },
    }
    if b.output_config
        .as_ref()
        .and_then(|c| c.get("format"))
        .is_some_and(|f| !f.is_null())
    {
        return Err(ApiError::unsupported(
            "output_config.format",
            "structured output (constrained decoding) is not implemented yet",
        ));
    }
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
        messages.push(pb::ChatMessage {
            role: m.role.clone(),
            content: blocks_text(&m.content, &format!("messages[{i}].content"), false)?,
        });
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
            },
            stop: stops(b.stop_sequences.as_ref(), "stop_sequences")?,
            ignore_eos: false,
            stream: b.stream.unwrap_or(false),
            include_usage: true,
            return_token_ids: false,
        },
    })
}

fn stop_reason(f: &pb::generate_event::Finished) -> (&'static str, Value) {
    match pb::FinishReason::try_from(f.reason) {
        Ok(pb::FinishReason::Length) => ("max_tokens", Value::Null),
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
            block_open: false,
            output_tokens: 0,
        };
        return Ok(first_then_stream(events, t, &app).await);
    }
    let c = collect(events, FIELDS, fl).await?;
    let s = c.finished.stats.clone().unwrap_or_default();
    let (reason, seq) = stop_reason(&c.finished);
    let content = if c.text.is_empty() {
        json!([])
    } else {
        json!([{"type": "text", "text": c.text}])
    };
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

/// Anthropic's event stream: message_start, one text block (content_block_start, its
/// text_delta events, content_block_stop), message_delta with the stop reason and the
/// cumulative output tokens, message_stop; `ping` while nothing else is sent.
struct Events {
    model: String,
    block_open: bool,
    output_tokens: u32,
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
                if t.text.is_empty() {
                    return (frames, false);
                }
                if !self.block_open {
                    self.block_open = true;
                    frames.push(sse::event(
                        "content_block_start",
                        &json!({"type": "content_block_start", "index": 0,
                                "content_block": {"type": "text", "text": ""}}),
                    ));
                }
                frames.push(sse::event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": t.text}}),
                ));
                (frames, false)
            }
            Event::Finished(f) => {
                if f.reason == pb::FinishReason::Cancelled as i32 {
                    return (self.error(super::cancelled()), true);
                }
                let mut frames = Vec::new();
                if self.block_open {
                    frames.push(sse::event(
                        "content_block_stop",
                        &json!({"type": "content_block_stop", "index": 0}),
                    ));
                }
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
    fn refusals_name_the_field_in_anthropics_shape() {
        let ok = r#""model":"m","messages":[{"role":"user","content":"hi"}]"#;
        for (body, field) in [
            (format!("{{{ok}}}"), "max_tokens"),
            (format!(r#"{{{ok},"max_tokens":1,"tools":[{{"name":"f"}}]}}"#), "tools"),
            (
                format!(r#"{{{ok},"max_tokens":1,"thinking":{{"type":"enabled","budget_tokens":1024}}}}"#),
                "thinking",
            ),
            (
                format!(r#"{{{ok},"max_tokens":1,"output_config":{{"format":{{"type":"json_schema","schema":{{}}}}}}}}"#),
                "output_config.format",
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
