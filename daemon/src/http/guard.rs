//! What stands in front of the handlers: the Host allowlist against DNS rebinding, CORS,
//! the API key, and the per-route request counters of /metrics.

use super::app::{flavor_of, App};
use super::error::ApiError;
use crate::serving::HttpConfig;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

/// Whether a Host header may reach the API. A DNS-rebinding page reaches a loopback
/// listener under its own domain name, so names are refused unless allowed; IP literals and
/// `localhost` cannot be rebound.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        match rest.split_once(']') {
            Some((ip, _)) => return ip.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        }
    } else {
        host.rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map(|(h, _)| h)
            .unwrap_or(host)
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed
            .iter()
            .any(|a| a == "*" || a.trim_end_matches('.').eq_ignore_ascii_case(&name))
}

/// A label for /metrics without one series per probed path.
fn route_label(path: &str) -> &'static str {
    match path {
        "/v1/models" => "/v1/models",
        p if p.starts_with("/v1/models/") => "/v1/models/{id}",
        "/v1/chat/completions" => "/v1/chat/completions",
        "/v1/completions" => "/v1/completions",
        "/v1/messages" => "/v1/messages",
        "/v1/messages/count_tokens" => "/v1/messages/count_tokens",
        "/health" => "/health",
        "/metrics" => "/metrics",
        "/" => "/",
        p if p.starts_with("/api/") => "/api",
        p if p.starts_with("/assets/") => "/assets",
        _ => "other",
    }
}

/// Outermost layer: refuses a Host that is not allowed (403), counts every answer.
pub async fn host_and_count(State(app): State<App>, req: Request, next: Next) -> Response {
    let route = route_label(req.uri().path());
    let host = req
        .headers()
        .get("host")
        .map(|h| h.to_str().unwrap_or("\u{fffd}").to_string());
    let response = match host {
        Some(h) if !host_allowed(&h, &app.cfg.allowed_hosts) => {
            let flavor = flavor_of(req.uri().path(), req.headers());
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "the Host '{h}' is not allowed: only IP addresses, localhost and the names \
                     given with colibrid --http-allow-host reach this API (a protection \
                     against DNS rebinding)"
                ),
            )
            .with_code("host_not_allowed")
            .flavor(flavor)
            .into_response()
        }
        _ => next.run(req).await,
    };
    app.daemon
        .metrics
        .http_request(route, response.status().as_u16());
    response
}

/// The key a request presents: `Authorization: Bearer KEY` (OpenAI) or `x-api-key: KEY`
/// (Anthropic).
fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers
        .get("authorization")
        .map(HeaderValue::as_bytes)
        .and_then(|v| {
            let (scheme, rest) = v.split_at(v.iter().position(|&b| b == b' ')?);
            scheme
                .eq_ignore_ascii_case(b"bearer")
                .then(|| rest.trim_ascii())
        });
    bearer.or_else(|| headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii()))
}

/// Whether a request may use the API: no key is configured, or it carries the key
/// (compared in constant time).
pub fn authorized(cfg: &HttpConfig, headers: &HeaderMap) -> bool {
    match cfg.api_key.as_deref() {
        None => true,
        Some(key) => presented_key(headers).is_some_and(|p| bool::from(p.ct_eq(key.as_bytes()))),
    }
}

/// 401 unless the request carries the configured key.
pub async fn api_key(State(app): State<App>, req: Request, next: Next) -> Response {
    if authorized(&app.cfg, req.headers()) {
        return next.run(req).await;
    }
    let flavor = flavor_of(req.uri().path(), req.headers());
    let msg = if presented_key(req.headers()).is_some() {
        "invalid API key"
    } else {
        "an API key is required: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
    };
    ApiError::new(StatusCode::UNAUTHORIZED, msg)
        .with_code("invalid_api_key")
        .flavor(flavor)
        .into_response()
}

/// Cross-origin access: none unless origins were allowed (`--http-cors-origin`, "*" = any).
pub fn cors(cfg: &HttpConfig) -> CorsLayer {
    let origins = if cfg.cors_origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            cfg.cors_origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok()),
        )
    };
    CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers(Any)
        .max_age(std::time::Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let none: Vec<String> = vec![];
        for ok in [
            "127.0.0.1:11435",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:11435",
            "10.1.2.3",
            "app.localhost:1",
        ] {
            assert!(host_allowed(ok, &none), "{ok}");
        }
        for bad in [
            "evil.example:11435",
            "example.com",
            "[::1",
            "127.0.0.1.evil.com",
        ] {
            assert!(!host_allowed(bad, &none), "{bad}");
        }
        let allowed = vec!["box.lan".to_string()];
        assert!(host_allowed("Box.LAN:11435", &allowed));
        assert!(host_allowed("anything", &["*".to_string()]));
    }

    #[test]
    fn keys_from_either_header() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h), None);
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        assert_eq!(presented_key(&h), Some(&b"k1"[..]));
        h.insert("authorization", HeaderValue::from_static("Bearer  k2 "));
        assert_eq!(presented_key(&h), Some(&b"k2"[..]));
        h.insert("authorization", HeaderValue::from_static("Basic abc"));
        assert_eq!(presented_key(&h), Some(&b"k1"[..]));
    }
}
