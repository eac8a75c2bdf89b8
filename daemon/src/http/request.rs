//! Request building shared by the OpenAI and Anthropic parsers: sampling and generation
//! options as a request asked for them, one function tool, a named tool choice, a JSON
//! schema response format, stop strings.

use super::error::ApiError;
use crate::daemon::ModelHandle;
use colibri_proto::v1 as pb;
use serde_json::Value;

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

/// One function tool: `name`, `description`, and its arguments' JSON schema under
/// `schema_key` (OpenAI's `parameters`, Anthropic's `input_schema`).
pub fn tool(func: &Value, f: &str, schema_key: &str) -> Result<pb::Tool, ApiError> {
    let name = func
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::field(format!("{f}.name"), "must be a non-empty string"))?;
    let parameters = match func.get(schema_key) {
        None | Some(Value::Null) => String::new(),
        Some(p @ Value::Object(_)) => p.to_string(),
        Some(_) => {
            return Err(ApiError::field(
                format!("{f}.{schema_key}"),
                "must be a JSON schema object",
            ))
        }
    };
    Ok(pb::Tool {
        name: name.to_string(),
        description: func
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        parameters,
    })
}

/// A tool choice that names a function must name one of the request's tools.
pub fn named_choice(name: &str, tools: &[pb::Tool], f: &str) -> Result<pb::ToolChoice, ApiError> {
    if !tools.iter().any(|t| t.name == name) {
        return Err(ApiError::field(
            f,
            format!("names '{name}', which is not one of the request's tools"),
        ));
    }
    Ok(pb::ToolChoice {
        mode: pb::tool_choice::Mode::Named as i32,
        name: name.to_string(),
    })
}

pub fn json_schema_format(schema: &Value) -> pb::ResponseFormat {
    pb::ResponseFormat {
        r#type: pb::response_format::Type::JsonSchema as i32,
        schema: schema.to_string(),
        grammar: String::new(),
    }
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
