//! Between the wire (colibri.v1) and the engine: request fields to engine types, engine
//! errors to gRPC status codes.

use colibri_engine::experts::StoreStats;
use colibri_engine::{Error, FinishReason, SamplingParams};
use colibri_proto::v1 as pb;
use tonic::{Code, Status};

/// The gRPC status for an engine error. Anything the request caused is INVALID_ARGUMENT
/// (its message names the field); a file that cannot be read is NOT_FOUND or
/// FAILED_PRECONDITION; a missing chat template is FAILED_PRECONDITION.
pub fn status_from_engine(e: &Error) -> Status {
    let msg = e.to_string();
    match e {
        Error::InvalidArgument { .. } | Error::Tokenizer(_) => Status::invalid_argument(msg),
        Error::ContextOverflow { .. } | Error::TextTooLong { .. } => context_exceeded(msg),
        Error::Template(_) => Status::failed_precondition(msg),
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Status::not_found(msg)
        }
        Error::UnsupportedModelType { .. } => Status::invalid_argument(format!("model: {msg}")),
        _ => Status::failed_precondition(msg),
    }
}

/// Metadata key of a status that says which kind of refusal it is beyond its code, for
/// front ends that must say so in their own error shape (the HTTP API).
pub const ERROR_KIND_KEY: &str = "colibri-error";
pub const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

/// INVALID_ARGUMENT for a prompt that does not fit the context (with nothing generated),
/// marked as such in the metadata.
pub fn context_exceeded(msg: impl std::fmt::Display) -> Status {
    let mut st = Status::invalid_argument(format!("prompt: {msg}"));
    st.metadata_mut().insert(
        ERROR_KIND_KEY,
        tonic::metadata::MetadataValue::from_static(CONTEXT_LENGTH_EXCEEDED),
    );
    st
}

/// Sampling parameters with proto3's absent fields at their "off" values. Validation is the
/// engine's (`SamplingParams::validate`, through `Generation::new`).
pub fn sampling(p: Option<&pb::SamplingParams>) -> SamplingParams {
    let d = SamplingParams::default();
    let Some(p) = p else { return d };
    SamplingParams {
        temperature: p.temperature.unwrap_or(d.temperature),
        top_k: p.top_k as usize,
        top_p: p.top_p.unwrap_or(d.top_p),
        min_p: p.min_p.unwrap_or(d.min_p),
        repetition_penalty: p.repetition_penalty.unwrap_or(d.repetition_penalty),
        seed: p.seed.unwrap_or(d.seed),
        frequency_penalty: p.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: p.presence_penalty.unwrap_or(d.presence_penalty),
        logit_bias: {
            let mut b: Vec<(u32, f32)> = p.logit_bias.iter().map(|(&k, &v)| (k, v)).collect();
            b.sort_by_key(|e| e.0);
            b
        },
    }
}

pub fn finish_reason(r: FinishReason) -> pb::FinishReason {
    match r {
        FinishReason::Length => pb::FinishReason::Length,
        FinishReason::Eos => pb::FinishReason::Eos,
        FinishReason::Stop => pb::FinishReason::Stop,
        FinishReason::Cancelled => pb::FinishReason::Cancelled,
    }
}

pub fn chat_messages(m: &[pb::ChatMessage]) -> Vec<colibri_engine::text::ChatMessage> {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    m.iter()
        .map(|m| colibri_engine::text::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
            tool_calls: m
                .tool_calls
                .iter()
                .map(|c| colibri_engine::text::ToolCall {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
            tool_call_id: opt(&m.tool_call_id),
            name: opt(&m.name),
            reasoning_content: opt(&m.reasoning_content),
        })
        .collect()
}

/// The chat-API fields of a request (tools, tool_choice, template variables, logprobs,
/// response_format) checked and converted; errors name the field.
pub fn gen_extras(
    options: &pb::GenerationOptions,
    chat: Option<&pb::ChatRequest>,
) -> Result<crate::scheduler::GenExtras, Status> {
    use colibri_engine::structured::OutputFormat;
    use colibri_engine::text::{ToolChoice, ToolSpec};
    let engine = |e: Error| status_from_engine(&e);
    let mut x = crate::scheduler::GenExtras {
        parallel_tool_calls: true,
        ..Default::default()
    };
    if options.logprobs {
        let k = options.top_logprobs as usize;
        if k > colibri_engine::generate::MAX_TOP_LOGPROBS {
            return Err(invalid(
                "options.top_logprobs",
                format!(
                    "{k} is more than {}",
                    colibri_engine::generate::MAX_TOP_LOGPROBS
                ),
            ));
        }
        x.logprobs = Some(k);
    } else if options.top_logprobs > 0 {
        return Err(invalid("options.top_logprobs", "needs options.logprobs"));
    }
    if let Some(f) = &options.response_format {
        use pb::response_format::Type;
        let schema = |required: bool| -> Result<Option<serde_json::Value>, Status> {
            if f.schema.trim().is_empty() {
                return if required {
                    Err(invalid("options.response_format.schema", "is empty"))
                } else {
                    Ok(None)
                };
            }
            serde_json::from_str(&f.schema).map(Some).map_err(|e| {
                invalid(
                    "options.response_format.schema",
                    format!("is not JSON: {e}"),
                )
            })
        };
        let grammar = || {
            if f.grammar.is_empty() {
                Err(invalid("options.response_format.grammar", "is empty"))
            } else {
                Ok(f.grammar.clone())
            }
        };
        x.response_format = match Type::try_from(f.r#type) {
            Ok(Type::Text) => None,
            Ok(Type::JsonObject) => Some(OutputFormat::JsonObject(schema(false)?)),
            Ok(Type::JsonSchema) => {
                Some(OutputFormat::JsonSchema(schema(true)?.expect("required")))
            }
            Ok(Type::Lark) => Some(OutputFormat::Lark(grammar()?)),
            Ok(Type::Regex) => Some(OutputFormat::Regex(grammar()?)),
            Err(_) => {
                return Err(invalid(
                    "options.response_format.type",
                    format!("unknown type {}", f.r#type),
                ))
            }
        };
    }
    let Some(c) = chat else { return Ok(x) };
    if c.tools.len() > 1024 {
        return Err(invalid("tools", "more than 1024 tools"));
    }
    for (i, t) in c.tools.iter().enumerate() {
        let spec = ToolSpec::parse(
            &t.name,
            &t.description,
            &t.parameters,
            &format!("tools[{i}]"),
        )
        .map_err(engine)?;
        if x.tools.iter().any(|o: &ToolSpec| o.name == spec.name) {
            return Err(invalid(
                &format!("tools[{i}].name"),
                format!("'{}' is given twice", spec.name),
            ));
        }
        x.tools.push(spec);
    }
    if let Some(tc) = &c.tool_choice {
        use pb::tool_choice::Mode;
        x.tool_choice = match Mode::try_from(tc.mode) {
            Ok(Mode::Auto) => ToolChoice::Auto,
            Ok(Mode::None) => ToolChoice::None,
            Ok(Mode::Required) => ToolChoice::Required,
            Ok(Mode::Named) if tc.name.is_empty() => {
                return Err(invalid("tool_choice.name", "is empty"))
            }
            Ok(Mode::Named) => ToolChoice::Named(tc.name.clone()),
            Err(_) => {
                return Err(invalid(
                    "tool_choice.mode",
                    format!("unknown mode {}", tc.mode),
                ))
            }
        };
    }
    x.parallel_tool_calls = c.parallel_tool_calls.unwrap_or(true);
    if !c.template_kwargs.trim().is_empty() {
        match serde_json::from_str::<serde_json::Value>(&c.template_kwargs) {
            Ok(serde_json::Value::Object(m)) => {
                for reserved in ["messages", "tools", "add_generation_prompt"] {
                    if m.contains_key(reserved) {
                        return Err(invalid(
                            "template_kwargs",
                            format!("may not set '{reserved}'"),
                        ));
                    }
                }
                x.template_vars = m;
            }
            Ok(_) => return Err(invalid("template_kwargs", "must be a JSON object")),
            Err(e) => return Err(invalid("template_kwargs", format!("is not JSON: {e}"))),
        }
    }
    Ok(x)
}

pub fn pb_tool_calls(calls: &[colibri_engine::text::ToolCall]) -> Vec<pb::ToolCall> {
    calls
        .iter()
        .map(|c| pb::ToolCall {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        })
        .collect()
}

/// A token's logprob on the wire, with its text (lossy where it holds part of a UTF-8
/// character) and bytes.
pub fn token_logprob(
    text: &colibri_engine::text::Text,
    lp: &colibri_engine::generate::TokenLogprob,
) -> pb::TokenLogprob {
    let piece = |id: u32| {
        let b = text.token_text_bytes(id);
        (String::from_utf8_lossy(&b).into_owned(), b)
    };
    let (token, bytes) = piece(lp.id);
    pb::TokenLogprob {
        id: lp.id,
        logprob: lp.logprob,
        token,
        bytes,
        top: lp
            .top
            .iter()
            .map(|&(id, logprob)| {
                let (token, bytes) = piece(id);
                pb::TopLogprob {
                    id,
                    logprob,
                    token,
                    bytes,
                }
            })
            .collect(),
    }
}

pub fn pb_messages(m: &[colibri_engine::text::ChatMessage]) -> Vec<pb::ChatMessage> {
    m.iter()
        .map(|m| pb::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
            tool_calls: pb_tool_calls(&m.tool_calls),
            tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            reasoning_content: m.reasoning_content.clone().unwrap_or_default(),
        })
        .collect()
}

pub fn model_info(id: &str, m: &colibri_engine::Model) -> pb::ModelInfo {
    let i = &m.info;
    pb::ModelInfo {
        id: id.to_string(),
        model_type: i.model_type.clone(),
        vocab_size: i.vocab_size as u32,
        hidden_size: i.hidden_size as u32,
        num_layers: i.num_layers as u32,
        max_context: i.max_context as u32,
        eos_ids: i.eos_ids.clone(),
        bos_id: i.bos_id,
        weight_bytes: i.weight_bytes as u64,
        has_tokenizer: m.text.is_some(),
        notes: i.notes.clone(),
        layout: i.layout.clone(),
        weight_classes: i
            .weight_classes
            .iter()
            .map(|c| pb::WeightClass {
                class: c.class.clone(),
                format: c.format.clone(),
                tensors: c.tensors as u32,
                bytes: c.bytes,
            })
            .collect(),
        has_chat_template: m.text.as_ref().is_some_and(|t| t.has_chat_template()),
        tool_call_format: m
            .text
            .as_ref()
            .and_then(|t| t.tool_format())
            .map(|f| f.as_str().to_string())
            .unwrap_or_default(),
        has_reasoning: m.text.as_ref().is_some_and(|t| t.has_think_tags()),
    }
}

/// The expert store's statistics on the wire; `forward_seconds` is the engine's time in
/// forward passes over the same span. `pinned_experts` and `total_experts` are the
/// daemon's to fill.
pub fn expert_cache_stats(st: &StoreStats, forward_seconds: f64) -> pb::ExpertCacheStats {
    pb::ExpertCacheStats {
        budget_bytes: st.budget_bytes,
        used_bytes: st.resident_bytes,
        hits: st.hits + st.inflight_hits,
        misses: st.misses,
        hit_rate: st.hit_rate(),
        bytes_read: st.bytes_read,
        resident_experts: st.resident_experts as u32,
        pinned_experts: 0,
        total_experts: 0,
        streamed: true,
        policy: st.policy.clone(),
        readers: st.readers as u32,
        capacity_experts: st.capacity_experts as u32,
        expert_bytes: st.expert_bytes,
        requests: st.requests,
        inflight_hits: st.inflight_hits,
        evictions: st.evictions,
        tokens: st.tokens,
        bytes_per_token: st.bytes_per_token(),
        reads: st.reads,
        direct_reads: st.direct_reads,
        read_errors: st.read_errors,
        read_seconds: st.read_seconds,
        disk_busy_seconds: st.disk_busy_seconds,
        read_wait_seconds: st.wait_seconds,
        disk_read_gb_per_s: st.disk_gbps(),
        forward_seconds,
        prefetch_issued: st.prefetch_issued,
        prefetch_used: st.prefetch_used,
        prefetch_wasted: st.prefetch_wasted,
        predicted: st.predicted,
        predicted_correct: st.predicted_correct,
        predicted_actual: st.predicted_actual,
        prefetch_recall: st.prefetch_recall(),
        prefetch_precision: st.prefetch_precision(),
        preload_issued: st.preload_issued,
        preload_bytes: st.preload_bytes,
        lent_bytes: st.lent_bytes,
        notes: st.notes.clone(),
    }
}

/// The engine's statistics back from the wire (what a client prints with their `Display`,
/// exactly as the in-process path does). The derived figures (rates) are recomputed.
pub fn store_stats(c: &pb::ExpertCacheStats) -> StoreStats {
    StoreStats {
        policy: c.policy.clone(),
        budget_bytes: c.budget_bytes,
        expert_bytes: c.expert_bytes,
        capacity_experts: c.capacity_experts as usize,
        resident_experts: c.resident_experts as usize,
        resident_bytes: c.used_bytes,
        readers: c.readers as usize,
        requests: c.requests,
        hits: c.hits.saturating_sub(c.inflight_hits),
        inflight_hits: c.inflight_hits,
        misses: c.misses,
        bytes_read: c.bytes_read,
        reads: c.reads,
        direct_reads: c.direct_reads,
        read_errors: c.read_errors,
        read_seconds: c.read_seconds,
        disk_busy_seconds: c.disk_busy_seconds,
        wait_seconds: c.read_wait_seconds,
        prefetch_issued: c.prefetch_issued,
        prefetch_used: c.prefetch_used,
        prefetch_wasted: c.prefetch_wasted,
        preload_issued: c.preload_issued,
        preload_bytes: c.preload_bytes,
        lent_bytes: c.lent_bytes,
        evictions: c.evictions,
        tokens: c.tokens,
        predicted: c.predicted,
        predicted_correct: c.predicted_correct,
        predicted_actual: c.predicted_actual,
        notes: c.notes.clone(),
    }
}

/// A status whose message starts with the offending field, as every validation error does.
pub fn invalid(field: &str, msg: impl std::fmt::Display) -> Status {
    Status::new(
        Code::InvalidArgument,
        format!("invalid argument '{field}': {msg}"),
    )
}

pub fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statistic survives the wire: distinct values in, the same struct out.
    #[test]
    fn store_stats_round_trip_through_the_proto() {
        let st = StoreStats {
            policy: "pinned-lrfu:4".into(),
            budget_bytes: 1,
            expert_bytes: 2,
            capacity_experts: 3,
            resident_experts: 4,
            resident_bytes: 5,
            readers: 6,
            requests: 7,
            hits: 8,
            inflight_hits: 9,
            misses: 10,
            bytes_read: 11,
            reads: 12,
            direct_reads: 13,
            read_errors: 14,
            read_seconds: 15.5,
            disk_busy_seconds: 16.5,
            wait_seconds: 17.5,
            prefetch_issued: 18,
            prefetch_used: 19,
            prefetch_wasted: 20,
            preload_issued: 21,
            preload_bytes: 22,
            lent_bytes: 28,
            evictions: 23,
            tokens: 24,
            predicted: 25,
            predicted_correct: 26,
            predicted_actual: 27,
            notes: vec!["a note".into()],
        };
        let c = expert_cache_stats(&st, 3.0);
        assert_eq!(store_stats(&c), st);
        assert_eq!((c.hits, c.forward_seconds), (17, 3.0));
        assert_eq!(c.bytes_per_token, st.bytes_per_token());
        assert_eq!(c.disk_read_gb_per_s, st.disk_gbps());
        assert_eq!(c.prefetch_recall, st.prefetch_recall());
        assert_eq!(c.prefetch_precision, st.prefetch_precision());
        assert_eq!(store_stats(&c).to_string(), st.to_string());
    }
}
