//! The origin policy of the HTTP API against the real daemon (docs/http.md "Web pages cannot
//! drive the API"): the header matrix — no browser headers, the daemon's own origin, an
//! allowed origin, a foreign origin, `Origin: null`, `Sec-Fetch-Site` values — on each
//! endpoint group (API, dashboard API, metrics, event stream, page, health), and the
//! JSON-only rule for bodies (text/plain, form and multipart refused). The same attack from a
//! real browser page is in tools/web_e2e.py.

use colibri_tests::daemon::{http_addr, load_model, Daemon};
use colibri_tests::fixture;
use colibri_tests::http::{self, request};
use serde_json::json;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const ALLOWED: &str = "http://ui.example:3000";

struct Served {
    _daemon: Daemon,
    addr: SocketAddr,
    model: String,
    _dir: tempfile::TempDir,
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        &dir.path().join("run").join("c.sock"),
        &dir.path().join("state"),
        &["--http", "127.0.0.1:0", "--http-cors-origin", ALLOWED],
    );
    let mut c = daemon.client().await;
    let model = load_model(&mut c, &fixture("olmoe").display().to_string(), None)
        .await
        .id;
    let addr = http_addr(&mut c).await;
    Served {
        _daemon: daemon,
        addr,
        model,
        _dir: dir,
    }
}

/// The status of a request, reading no more than the head (event streams never end).
fn status_of(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(&http::request_bytes(addr, method, path, headers, body))
        .unwrap();
    let mut r = BufReader::new(s);
    let (status, head) = http::read_head(&mut r);
    let streaming = head
        .iter()
        .any(|(k, v)| k == "content-type" && v.starts_with("text/event-stream"));
    let body = if streaming || method == "HEAD" {
        String::new()
    } else {
        let resp = http::read_body(&mut r, &head);
        String::from_utf8_lossy(&resp).into_owned()
    };
    (status, body)
}

fn counter(addr: SocketAddr, name: &str) -> f64 {
    let m = request(addr, "GET", "/metrics", &[], b"").text();
    m.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_requests_from_other_origins_are_refused_on_every_endpoint() {
    let s = serve().await;
    let addr = s.addr;
    let own = format!("http://{addr}");
    let chat = json!({"model": s.model, "max_tokens": 1, "temperature": 0,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let messages = json!({"model": s.model, "max_tokens": 1,
                          "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let keep = json!({"model": s.model, "keep_alive": 300}).to_string();
    // (method, path, body) per endpoint group; the bodies are valid JSON for that endpoint.
    let endpoints: Vec<(&str, &str, String)> = vec![
        ("POST", "/v1/chat/completions", chat.clone()),
        ("POST", "/v1/messages", messages),
        (
            "POST",
            "/v1/messages/count_tokens",
            json!({"model": s.model, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        ),
        ("GET", "/v1/models", String::new()),
        ("GET", "/api/status", String::new()),
        ("POST", "/api/models/keep_alive", keep),
        ("GET", "/metrics", String::new()),
        ("GET", "/api/experts/events", String::new()),
        ("GET", "/", String::new()),
        ("GET", "/health", String::new()),
    ];
    let prompt_before = counter(addr, "colibri_prompt_tokens_total");

    let foreign: Vec<Vec<(&str, &str)>> = vec![
        vec![("origin", "http://evil.example.com")],
        vec![("origin", "http://127.0.0.1:1")], // another local server's page
        vec![("origin", "null")],
        vec![
            ("origin", "http://evil.example.com"),
            ("sec-fetch-site", "cross-site"),
        ],
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
    ];
    for (method, path, body) in &endpoints {
        for h in &foreign {
            // Sec-Fetch-Site without Origin only happens on GETs.
            if *method == "POST" && !h.iter().any(|(k, _)| *k == "origin") {
                continue;
            }
            let (status, text) = status_of(addr, method, path, h, body.as_bytes());
            assert_eq!(status, 403, "{method} {path} {h:?}: {text}");
            // OpenAI's error shape names the code; Anthropic's its permission_error type.
            assert!(
                text.contains("--http-cors-origin")
                    && (text.contains("origin_not_allowed") || text.contains("permission_error")),
                "{method} {path} {h:?}: {text}"
            );
        }
    }
    assert_eq!(
        counter(addr, "colibri_prompt_tokens_total"),
        prompt_before,
        "a refused request generated"
    );

    // No browser headers, the own origin, an allowed origin, same-origin / none: served.
    let fine: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
        vec![("origin", ALLOWED)],
        vec![("sec-fetch-site", "same-origin")],
        vec![("sec-fetch-site", "none")],
    ];
    for (method, path, body) in &endpoints {
        for h in &fine {
            if *method == "POST"
                && h.iter().any(|(k, _)| *k == "sec-fetch-site")
                && !h.iter().any(|(k, _)| *k == "origin")
            {
                continue;
            }
            let (status, text) = status_of(addr, method, path, h, body.as_bytes());
            assert_eq!(status, 200, "{method} {path} {h:?}: {text}");
        }
    }
    // Following a link from another site to the dashboard shows the page, nothing else.
    let nav = [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-mode", "navigate"),
    ];
    assert_eq!(status_of(addr, "GET", "/", &nav, b"").0, 200);
    assert_eq!(status_of(addr, "GET", "/api/status", &nav, b"").0, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_json_are_refused_on_v1_and_api() {
    let s = serve().await;
    let addr = s.addr;
    let chat = json!({"model": s.model, "max_tokens": 1,
                      "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let prompt_before = counter(addr, "colibri_prompt_tokens_total");
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/api/models/keep_alive",
    ] {
        for ct in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=xyz",
        ] {
            // The body is JSON all the same: what a page sends as "text/plain".
            let (status, text) =
                status_of(addr, "POST", path, &[("content-type", ct)], chat.as_bytes());
            assert_eq!(status, 415, "{path} {ct}: {text}");
            assert!(text.contains("application/json"), "{path} {ct}: {text}");
        }
    }
    assert_eq!(counter(addr, "colibri_prompt_tokens_total"), prompt_before);
    // application/json with a charset is JSON.
    let (status, text) = status_of(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json; charset=utf-8")],
        chat.as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    // The counters are updated as the answer's stream ends, just after the body is sent.
    let t = std::time::Instant::now();
    while counter(addr, "colibri_prompt_tokens_total") <= prompt_before {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the served request was not counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
