//! Who may drive the API from a browser: the origin policy and the JSON-only rule.
//!
//! The API listens on loopback without a key, so any page open in the user's browser can
//! send it requests. CORS alone does not stop that: a "simple" request (a form POST, or
//! `fetch(url, {mode: "no-cors", body})` with a text/plain body) is sent cross-site without
//! a preflight, and the page only loses the answer — the model still generates. So every
//! request that a browser marks as coming from another site is refused before any handler
//! runs (403), and a `/v1/*` body must be `application/json`, which a page cannot send to
//! another origin without a preflight that CORS then refuses (415 otherwise).
//!
//! Browsers mark requests two ways: `Origin` (on every POST, and on CORS GETs) and
//! `Sec-Fetch-Site` (on every request of current browsers). A request with neither header
//! comes from an SDK, curl or an agent, and is unaffected.

use super::app::{flavor_of, App};
use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Why a request was refused, as the message its 403 or 415 carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A browser request from another origin (403).
    ForeignOrigin(String),
    /// A body on /v1/* that is not JSON (415).
    NotJson(String),
}

impl Refusal {
    /// The message a client sees; it names the flag that changes the verdict.
    pub fn message(&self) -> String {
        match self {
            Refusal::ForeignOrigin(from) => format!(
                "a browser request from {from} may not use this API: only pages served by this \
                 daemon and the origins allowed with colibrid --http-cors-origin ORIGIN (or \
                 coli serve --http-cors-origin) may (a protection against web pages driving \
                 the local model)"
            ),
            Refusal::NotJson(got) => format!(
                "this endpoint takes a JSON body: send it with content-type: application/json \
                 (got {got})"
            ),
        }
    }
}

/// `scheme://host[:port]` lower-cased, with the scheme's default port dropped, so that two
/// spellings of one origin compare equal.
fn normalize_origin(origin: &str) -> Option<String> {
    let origin = origin.trim();
    let (scheme, rest) = origin.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let rest = rest.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => "",
    };
    let authority = if !default_port.is_empty() && rest.ends_with(default_port) {
        &rest[..rest.len() - default_port.len()]
    } else {
        &rest
    };
    Some(format!("{scheme}://{authority}"))
}

/// Whether `origin` is the daemon's own: the page was served by the host the request is
/// addressed to (the daemon serves plain HTTP).
fn is_own_origin(origin: &str, host: Option<&str>) -> bool {
    match (normalize_origin(origin), host) {
        (Some(o), Some(h)) => normalize_origin(&format!("http://{h}")).is_some_and(|own| own == o),
        _ => false,
    }
}

/// Whether `origin` was allowed with --http-cors-origin ("*" allows every origin).
fn is_allowed_origin(origin: &str, allowed: &[String]) -> bool {
    let Some(o) = normalize_origin(origin) else {
        // "null" (sandboxed frames, file: pages) is allowed only by "*" or by name.
        return allowed.iter().any(|a| a == "*" || a == origin.trim());
    };
    allowed
        .iter()
        .any(|a| a == "*" || normalize_origin(a).is_some_and(|a| a == o))
}

/// Whether a top-level navigation may load a page of the dashboard: following a link to it
/// from elsewhere only shows the page (it changes nothing), and the page's own requests
/// are then same-origin.
fn is_page_navigation(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    let navigate = headers
        .get("sec-fetch-mode")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|m| m.eq_ignore_ascii_case("navigate"));
    let page = path == "/" || path.starts_with("/assets/");
    navigate && page && (method == Method::GET || method == Method::HEAD)
}

/// The origin verdict on one request: Ok, or the refusal (403).
pub fn check_origin(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    allowed: &[String],
) -> Result<(), Refusal> {
    let host = headers.get("host").and_then(|v| v.to_str().ok());
    if let Some(origin) = headers.get("origin") {
        let origin = origin.to_str().unwrap_or("\u{fffd}");
        if is_own_origin(origin, host) || is_allowed_origin(origin, allowed) {
            return Ok(());
        }
        return Err(Refusal::ForeignOrigin(format!("the origin {origin}")));
    }
    // No Origin: a GET or HEAD (browsers send Origin on every other method). Sec-Fetch-Site
    // says whether another site asked for it; "same-site" is another port of this host
    // (another local web server's page), which is another origin all the same.
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(str::to_ascii_lowercase);
    match site.as_deref() {
        Some("cross-site") | Some("same-site") if !is_page_navigation(method, path, headers) => {
            Err(Refusal::ForeignOrigin(format!(
                "another site (Sec-Fetch-Site: {})",
                site.as_deref().unwrap_or_default()
            )))
        }
        _ => Ok(()),
    }
}

/// The JSON-only rule: a request to /v1/* or /api/* that carries a body (every POST there
/// does) must say `content-type: application/json` (parameters such as charset allowed).
pub fn check_json_body(method: &Method, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
    let takes_body = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if !takes_body || !(path.starts_with("/v1/") || path.starts_with("/api/")) {
        return Ok(());
    }
    let content_type = headers
        .get("content-type")
        .map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let essence = content_type
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    if essence == "application/json" {
        Ok(())
    } else {
        Err(Refusal::NotJson(match content_type {
            Some(c) => format!("content-type: {c}"),
            None => "no content-type".into(),
        }))
    }
}

/// The layer in front of every route (inside the Host check, outside CORS): a request the
/// policy refuses never reaches a handler, so nothing is generated, loaded or changed.
pub async fn guard(State(app): State<App>, req: Request, next: Next) -> Response {
    let (method, path, headers) = (req.method(), req.uri().path(), req.headers());
    let refused = check_origin(method, path, headers, &app.cfg.cors_origins)
        .map_err(|r| (StatusCode::FORBIDDEN, "origin_not_allowed", r))
        .and_then(|()| {
            check_json_body(method, path, headers).map_err(|r| {
                (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    r,
                )
            })
        });
    match refused {
        Ok(()) => next.run(req).await,
        Err((status, code, why)) => ApiError::new(status, why.message())
            .with_code(code)
            .flavor(flavor_of(path, headers))
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const HOST: (&str, &str) = ("host", "127.0.0.1:11435");

    #[test]
    fn requests_without_browser_headers_pass() {
        for path in ["/v1/chat/completions", "/api/models/load", "/metrics", "/"] {
            assert_eq!(
                check_origin(&Method::POST, path, &headers(&[HOST]), &[]),
                Ok(())
            );
            assert_eq!(
                check_origin(&Method::GET, path, &HeaderMap::new(), &[]),
                Ok(())
            );
        }
    }

    #[test]
    fn the_own_origin_passes_in_any_spelling() {
        for origin in ["http://127.0.0.1:11435", "HTTP://127.0.0.1:11435"] {
            let h = headers(&[HOST, ("origin", origin), ("sec-fetch-site", "same-origin")]);
            assert_eq!(check_origin(&Method::POST, "/v1/messages", &h, &[]), Ok(()));
        }
        let h = headers(&[("host", "localhost"), ("origin", "http://localhost:80")]);
        assert_eq!(check_origin(&Method::POST, "/api/pins", &h, &[]), Ok(()));
        let h = headers(&[("host", "[::1]:8080"), ("origin", "http://[::1]:8080")]);
        assert_eq!(check_origin(&Method::POST, "/api/pins", &h, &[]), Ok(()));
    }

    #[test]
    fn foreign_origins_are_refused_unless_allowed() {
        for origin in [
            "http://evil.example.com",
            "http://127.0.0.1:8000",   // another local server's page
            "https://127.0.0.1:11435", // another scheme is another origin
            "null",
            "garbage",
        ] {
            let h = headers(&[HOST, ("origin", origin)]);
            for path in [
                "/v1/chat/completions",
                "/v1/models",
                "/api/status",
                "/metrics",
            ] {
                let got = check_origin(&Method::POST, path, &h, &[]);
                assert!(
                    matches!(got, Err(Refusal::ForeignOrigin(_))),
                    "{origin} {path}"
                );
            }
            assert_eq!(
                check_origin(&Method::POST, "/v1/messages", &h, &["*".into()]),
                Ok(())
            );
        }
        let h = headers(&[HOST, ("origin", "https://app.example.com")]);
        let allowed = vec!["https://app.example.com:443".to_string()];
        assert_eq!(
            check_origin(&Method::POST, "/v1/messages", &h, &allowed),
            Ok(())
        );
        let other = vec!["https://other.example.com".to_string()];
        assert!(check_origin(&Method::POST, "/v1/messages", &h, &other).is_err());
        let msg = check_origin(&Method::POST, "/v1/messages", &h, &other)
            .unwrap_err()
            .message();
        assert!(msg.contains("--http-cors-origin"), "{msg}");
    }

    #[test]
    fn sec_fetch_site_speaks_when_there_is_no_origin() {
        for (site, ok) in [
            ("same-origin", true),
            ("none", true),
            ("cross-site", false),
            ("same-site", false),
            ("CROSS-SITE", false),
        ] {
            let h = headers(&[HOST, ("sec-fetch-site", site)]);
            for path in ["/metrics", "/api/experts/events", "/v1/models"] {
                assert_eq!(
                    check_origin(&Method::GET, path, &h, &[]).is_ok(),
                    ok,
                    "{site} {path}"
                );
            }
        }
        // Following a link to the dashboard only shows it.
        let h = headers(&[
            HOST,
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
        ]);
        assert_eq!(check_origin(&Method::GET, "/", &h, &[]), Ok(()));
        assert!(check_origin(&Method::GET, "/api/status", &h, &[]).is_err());
        assert!(check_origin(&Method::GET, "/metrics", &h, &[]).is_err());
    }

    #[test]
    fn bodies_must_be_json() {
        let json = headers(&[("content-type", "application/json")]);
        let charset = headers(&[("content-type", "Application/JSON; charset=utf-8")]);
        for h in [&json, &charset] {
            assert_eq!(
                check_json_body(&Method::POST, "/v1/chat/completions", h),
                Ok(())
            );
        }
        for ct in [
            Some("text/plain"),
            Some("text/plain;charset=UTF-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            Some("application/jsonp"),
            None,
        ] {
            let h = match ct {
                Some(c) => headers(&[("content-type", c)]),
                None => HeaderMap::new(),
            };
            for path in [
                "/v1/chat/completions",
                "/v1/messages/count_tokens",
                "/api/models/load",
            ] {
                let got = check_json_body(&Method::POST, path, &h);
                assert!(matches!(got, Err(Refusal::NotJson(_))), "{ct:?} {path}");
            }
            // Reads carry no body; pages outside the API are not bodies' targets.
            assert_eq!(check_json_body(&Method::GET, "/v1/models", &h), Ok(()));
        }
        let msg = check_json_body(&Method::POST, "/v1/messages", &HeaderMap::new())
            .unwrap_err()
            .message();
        assert!(msg.contains("application/json"), "{msg}");
    }
}
