//! Errors in each API's own shape. OpenAI: `{"error": {"message", "type", "param", "code"}}`;
//! Anthropic: `{"type": "error", "error": {"type", "message"}}`. The SDKs pick their
//! exception class from the HTTP status, so the status is what matters most; the body names
//! the field at fault.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tonic::{Code, Status};

/// Which API's conventions a response follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (OpenAI's `param`), e.g. `messages[0].content`.
    pub param: Option<String>,
    /// OpenAI's machine-readable `code`, e.g. `model_not_found`.
    pub code: Option<&'static str>,
    /// Seconds for a Retry-After header (429).
    pub retry_after: Option<u64>,
    pub flavor: Flavor,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
            flavor: Flavor::OpenAi,
        }
    }

    /// 400 naming `field`: "invalid value for 'field': msg".
    pub fn field(field: impl Into<String>, msg: impl std::fmt::Display) -> ApiError {
        let field = field.into();
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid value for '{field}': {msg}"),
        );
        e.param = Some(field);
        e
    }

    /// 400 for a field this server does not support (yet).
    pub fn unsupported(field: impl Into<String>, msg: impl std::fmt::Display) -> ApiError {
        let field = field.into();
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("unsupported '{field}': {msg}"),
        );
        e.param = Some(field);
        e.code = Some("unsupported_parameter");
        e
    }

    pub fn model_not_found(model: &str, known: &[String]) -> ApiError {
        let list = if known.is_empty() {
            "no model is loaded (coli serve --model DIR, or coli load --model DIR)".to_string()
        } else {
            format!("loaded: {}", known.join(", "))
        };
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model '{model}' does not exist or is not loaded; {list}"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn flavor(mut self, flavor: Flavor) -> ApiError {
        self.flavor = flavor;
        self
    }

    /// A daemon status as an API error. `fields` maps the proto's field names in the
    /// message ("invalid argument 'prompt': ...") to the API's ("messages").
    pub fn from_status(st: &Status, fields: &[(&str, &str)]) -> ApiError {
        let msg = st.message().to_string();
        let field = msg
            .strip_prefix("invalid argument '")
            .and_then(|r| r.split_once('\''))
            .map(|(f, _)| f.to_string());
        let api_field = |f: &str| {
            fields
                .iter()
                .find(|(proto, _)| *proto == f)
                .map(|(_, api)| api.to_string())
                .unwrap_or_else(|| f.to_string())
        };
        let context = st
            .metadata()
            .get(crate::wire::ERROR_KIND_KEY)
            .is_some_and(|v| v == crate::wire::CONTEXT_LENGTH_EXCEEDED);
        let (status, code) = match st.code() {
            Code::InvalidArgument if context => {
                (StatusCode::BAD_REQUEST, Some("context_length_exceeded"))
            }
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                (StatusCode::BAD_REQUEST, None)
            }
            Code::NotFound => (StatusCode::NOT_FOUND, None),
            Code::AlreadyExists => (StatusCode::CONFLICT, None),
            Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, Some("rate_limit_exceeded")),
            Code::Unavailable | Code::Cancelled => (StatusCode::SERVICE_UNAVAILABLE, None),
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, None),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, None),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
        };
        let mut e = ApiError::new(status, msg);
        e.code = code;
        e.param = if context {
            Some(api_field("prompt"))
        } else {
            field.map(|f| api_field(&f))
        };
        if status == StatusCode::TOO_MANY_REQUESTS {
            e.retry_after = Some(1);
        }
        e
    }

    fn openai_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn anthropic_type(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            s if s.is_server_error() => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body (also sent as an SSE error event when a stream fails midway).
    pub fn body(&self) -> serde_json::Value {
        match self.flavor {
            Flavor::OpenAi => json!({"error": {
                "message": self.message,
                "type": self.openai_type(),
                "param": self.param,
                "code": self.code,
            }}),
            Flavor::Anthropic => json!({
                "type": "error",
                "error": {"type": self.anthropic_type(), "message": self.message},
            }),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert("retry-after", HeaderValue::from(s.max(1)));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_http_codes_and_fields() {
        let st = crate::wire::invalid("temperature", "must be finite");
        let e = ApiError::from_status(&st, &[]);
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let st = crate::wire::context_exceeded("prompt of 300 tokens does not fit");
        let e = ApiError::from_status(&st, &[("prompt", "messages")]);
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = ApiError::from_status(&Status::resource_exhausted("busy"), &[]);
        assert_eq!(
            (e.status, e.retry_after),
            (StatusCode::TOO_MANY_REQUESTS, Some(1))
        );
        let b = e.clone().flavor(Flavor::Anthropic).body();
        assert_eq!(b["error"]["type"], "rate_limit_error");
        assert_eq!(b["type"], "error");
        let b = e.body();
        assert_eq!(b["error"]["code"], "rate_limit_exceeded");
    }
}
