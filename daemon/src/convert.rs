//! Between the wire (colibri.v1) and the engine: request fields to engine types, engine
//! errors to gRPC status codes.

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
        Error::ContextOverflow { .. } => Status::invalid_argument(format!("prompt: {msg}")),
        Error::Template(_) => Status::failed_precondition(msg),
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Status::not_found(msg)
        }
        Error::UnsupportedModelType { .. } => Status::invalid_argument(format!("model: {msg}")),
        _ => Status::failed_precondition(msg),
    }
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
    m.iter()
        .map(|m| colibri_engine::text::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect()
}

pub fn pb_messages(m: &[colibri_engine::text::ChatMessage]) -> Vec<pb::ChatMessage> {
    m.iter()
        .map(|m| pb::ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
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
