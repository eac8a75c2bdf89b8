//! End-to-end tests of the HTTP API: the real `colibrid --http 127.0.0.1:0`, driven over
//! loopback with a raw HTTP/1.1 client (tests/src/http.rs) so that every byte is the test's.
//! The official Python SDKs drive the same daemon in tools/http_sdk_test.py (CI).

use colibri_engine::{GenerateRequest, Generation, Model, SamplingParams};
use colibri_proto::v1 as pb;
use colibri_tests::daemon::{http_addr, load_model, Daemon};
use colibri_tests::fixture;
use colibri_tests::http::{self, get, post_json, request};
use pb::colibri_client::ColibriClient;
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

struct Served {
    _daemon: Daemon,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// colibrid with the HTTP API on a free loopback port and `models` loaded.
async fn serve(args: &[&str], models: &[&str]) -> (Served, ColibriClient<Channel>) {
    serve_env(args, models, &[]).await
}

async fn serve_env(
    args: &[&str],
    models: &[&str],
    env: &[(&str, &str)],
) -> (Served, ColibriClient<Channel>) {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["--http", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let daemon = Daemon::start_with_env(
        &dir.path().join("run").join("c.sock"),
        &dir.path().join("state"),
        &all,
        env,
    );
    let mut c = daemon.client().await;
    for m in models {
        load(&mut c, &fixture(m)).await;
    }
    let addr = http_addr(&mut c).await;
    (
        Served {
            _daemon: daemon,
            addr,
            _dir: dir,
        },
        c,
    )
}

async fn load(c: &mut ColibriClient<Channel>, dir: &Path) -> String {
    load_model(c, &dir.display().to_string(), None).await.id
}

/// Runs blocking socket I/O off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

fn local_greedy(dir: &Path, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let model = Model::load(dir).unwrap();
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..Default::default()
    };
    let mut g = Generation::new(&model, model.new_cache(), req).unwrap();
    g.run(&model, 64, |_| {}).unwrap();
    g.generated().to_vec()
}

/// The gRPC Chat answer (text) for the same messages, greedy.
async fn grpc_chat(c: &mut ColibriClient<Channel>, model: &str, user: &str, max: u32) -> String {
    let mut s = c
        .chat(pb::ChatRequest {
            model: model.into(),
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: user.into(),
                ..Default::default()
            }],
            options: Some(pb::GenerationOptions {
                max_tokens: max,
                sampling: Some(pb::SamplingParams {
                    temperature: Some(0.0),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut text = String::new();
    while let Some(ev) = s.message().await.unwrap() {
        if let Some(pb::generate_event::Event::Tokens(t)) = ev.event {
            text.push_str(&t.text);
        }
    }
    text
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_through_http_equals_local_and_grpc() {
    let families = ["olmoe", "qwen3_moe"];
    let (s, mut c) = serve(&[], &families).await;
    let addr = s.addr;
    let models = blocking(move || get(addr, "/v1/models")).await;
    assert_eq!(models.status, 200, "{}", models.text());
    let names: Vec<String> = models.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, families);
    for family in families {
        let prompt: Vec<u32> = vec![1, 17, 42, 99, 7, 3];
        let want = local_greedy(&fixture(family), &prompt, 12);
        // /v1/completions with token ids, non-streamed and streamed.
        let body = json!({"model": family, "prompt": prompt, "max_tokens": 12,
                          "temperature": 0, "ignore_eos": true, "return_token_ids": true});
        let b2 = body.clone();
        let r = blocking(move || post_json(addr, "/v1/completions", &b2)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(ids_of(&v["choices"][0]["token_ids"]), want, "{family}");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["usage"]["prompt_tokens"], 6);
        assert_eq!(v["usage"]["completion_tokens"], 12);
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let r = blocking(move || post_json(addr, "/v1/completions", &sb)).await;
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        let mut ids = Vec::new();
        let events = r.events();
        assert_eq!(events.last().unwrap().1, "[DONE]");
        for (_, d) in &events[..events.len() - 1] {
            let v: Value = serde_json::from_str(d).unwrap();
            assert_eq!(v["object"], "text_completion");
            if let Some(t) = v["choices"][0].get("token_ids") {
                ids.extend(ids_of(t));
            }
        }
        assert_eq!(ids, want, "{family} streamed");

        // Chat: the same text as the gRPC Chat call, streamed and not.
        let grpc = grpc_chat(
            &mut c,
            &fixture(family).display().to_string(),
            "Tell me about the sea",
            10,
        )
        .await;
        let body = json!({"model": family, "max_tokens": 10, "temperature": 0,
                          "messages": [{"role": "user", "content": "Tell me about the sea"}]});
        let b2 = body.clone();
        let r = blocking(move || post_json(addr, "/v1/chat/completions", &b2)).await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], family);
        assert_eq!(v["choices"][0]["message"]["role"], "assistant");
        assert_eq!(v["choices"][0]["message"]["content"], grpc.as_str());
        assert!(r.header("x-request-id").is_some());
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        sb["stream_options"] = json!({"include_usage": true});
        let r = blocking(move || post_json(addr, "/v1/chat/completions", &sb)).await;
        let events = r.events();
        let chunks: Vec<Value> = events
            .iter()
            .filter(|(n, d)| n == "message" && d != "[DONE]")
            .map(|(_, d)| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(events.last().unwrap().1, "[DONE]");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, grpc, "{family} streamed chat");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 10);
        assert_eq!(
            chunks[n - 1]["usage"]["total_tokens"],
            v["usage"]["total_tokens"]
        );
        assert!(chunks[..n - 1].iter().all(|c| c["usage"].is_null()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_streamed_counted_and_stopped() {
    let (s, mut c) = serve(&[], &["olmoe"]).await;
    let addr = s.addr;
    let grpc = grpc_chat(
        &mut c,
        &fixture("olmoe").display().to_string(),
        "Hello there",
        8,
    )
    .await;
    let body = json!({"model": "olmoe", "max_tokens": 8, "temperature": 0,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]});
    let b2 = body.clone();
    let r = blocking(move || {
        request(
            addr,
            "POST",
            "/v1/messages",
            &[("anthropic-version", "2023-06-01")],
            b2.to_string().as_bytes(),
        )
    })
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["content"][0]["text"], grpc.as_str());
    assert_eq!(v["usage"]["output_tokens"], 8);

    // count_tokens equals what the template renders (the Tokenize RPC).
    let t = c
        .tokenize(pb::TokenizeRequest {
            model: fixture("olmoe").display().to_string(),
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: "Hello there".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let b3 = body.clone();
    let r = blocking(move || post_json(addr, "/v1/messages/count_tokens", &b3)).await;
    assert_eq!(r.json(), json!({"input_tokens": t.ids.len()}));
    // input_tokens are those not read from the prefix cache (an earlier request may have
    // left this prompt's KV there).
    let u = &v["usage"];
    assert_eq!(
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(),
        t.ids.len() as u64
    );

    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let r = blocking(move || post_json(addr, "/v1/messages", &sb)).await;
    let events = r.events();
    let names: Vec<&str> = events
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "ping")
        .collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[1], "content_block_start");
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let text: String = events
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| {
            serde_json::from_str::<Value>(d).unwrap()["delta"]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, grpc);
    let delta: Value =
        serde_json::from_str(&events.iter().find(|(n, _)| n == "message_delta").unwrap().1)
            .unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 8);

    // A stop sequence taken from the greedy text: stop_reason and the sequence itself.
    let cut = grpc.chars().skip(3).take(2).collect::<String>();
    if !cut.trim().is_empty() {
        let mut sb = body.clone();
        sb["stop_sequences"] = json!([cut]);
        let r = blocking(move || post_json(addr, "/v1/messages", &sb)).await;
        let v = r.json();
        assert_eq!(v["stop_reason"], "stop_sequence", "{v}");
        assert_eq!(v["stop_sequence"], cut.as_str());
        let got = v["content"][0]["text"].as_str().unwrap_or("");
        assert!(
            grpc.starts_with(got) && !got.contains(&cut),
            "{got:?} / {grpc:?}"
        );
    }

    // The Anthropic model list shape when asked with anthropic-version.
    let r = blocking(move || {
        request(
            addr,
            "GET",
            "/v1/models",
            &[("anthropic-version", "2023-06-01")],
            b"",
        )
    })
    .await;
    let v = r.json();
    assert_eq!(v["data"][0]["type"], "model");
    assert_eq!(v["data"][0]["id"], "olmoe");
    assert_eq!(v["has_more"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_apis_error_shapes() {
    let (s, _c) = serve(&["--http-body-limit", "4096"], &["olmoe"]).await;
    let addr = s.addr;
    let cases: Vec<(&str, String, u16, &str, Option<&str>)> = vec![
        (
            "/v1/chat/completions",
            "{not json".into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"olmoe","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#
                .into(),
            400,
            "invalid_request_error",
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"olmoe","messages":[{"role":"user","content":"x"}],"temperature":-1}"#
                .into(),
            400,
            "invalid_request_error",
            Some("temperature"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"olmoe","messages":[{"role":"user","content":"x"}],"n":3}"#.into(),
            400,
            "invalid_request_error",
            Some("n"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"olmoe","messages":[]}"#.into(),
            400,
            "invalid_request_error",
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#.into(),
            404,
            "invalid_request_error",
            Some("model"),
        ),
        (
            "/v1/completions",
            r#"{"model":"olmoe","prompt":[1,2,99999]}"#.into(),
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            "/v1/completions",
            format!(r#"{{"model":"olmoe","prompt":{:?}}}"#, vec![5u32; 300]),
            400,
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            "/v1/messages",
            r#"{"model":"olmoe","messages":[{"role":"user","content":"x"}]}"#.into(),
            400,
            "invalid_request_error",
            None,
        ),
        (
            "/v1/messages",
            r#"{"model":"gone","max_tokens":3,"messages":[{"role":"user","content":"x"}]}"#.into(),
            404,
            "not_found_error",
            None,
        ),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"model":"olmoe","messages":[{{"role":"user","content":"{}"}}]}}"#,
                "x".repeat(5000)
            ),
            413,
            "invalid_request_error",
            None,
        ),
        (
            "/v1/messages",
            format!(
                r#"{{"model":"olmoe","max_tokens":3,"messages":[{{"role":"user","content":"{}"}}]}}"#,
                "x".repeat(5000)
            ),
            413,
            "request_too_large",
            None,
        ),
        (
            "/v1/nothing",
            "{}".into(),
            404,
            "invalid_request_error",
            None,
        ),
    ];
    for (path, body, status, kind, param) in cases {
        let r = blocking(move || request(addr, "POST", path, &[], body.as_bytes())).await;
        assert_eq!(r.status, status, "{path}: {}", r.text());
        let v = r.json();
        if path.starts_with("/v1/messages") {
            assert_eq!(v["type"], "error", "{v}");
            assert_eq!(v["error"]["type"], kind, "{v}");
        } else {
            assert_eq!(v["error"]["type"], kind, "{v}");
            if let Some(p) = param {
                assert_eq!(v["error"]["param"], p, "{v}");
            }
        }
    }
    // A prompt longer than the context: context_length_exceeded, never a truncation.
    let long = json!({"model": "olmoe", "prompt": vec![5u32; 300]});
    let r = blocking(move || post_json(addr, "/v1/completions", &long)).await;
    assert_eq!(
        r.json()["error"]["code"],
        "context_length_exceeded",
        "{}",
        r.text()
    );
    let full = json!({"model": "olmoe", "prompt": vec![5u32; 256], "stream": true});
    let r = blocking(move || post_json(addr, "/v1/completions", &full)).await;
    assert_eq!(
        r.status,
        400,
        "the status waits for the prompt's acceptance: {}",
        r.text()
    );
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    // A max_tokens far past the context is clamped to the room left.
    let big = json!({"model": "olmoe", "prompt": vec![5u32; 250], "max_tokens": 100000,
                     "temperature": 0, "ignore_eos": true});
    let r = blocking(move || post_json(addr, "/v1/completions", &big)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 6);
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");

    // DNS rebinding: a page under another name that resolves to 127.0.0.1 is refused.
    let r = blocking(move || {
        request(
            addr,
            "GET",
            "/v1/models",
            &[("host", "evil.example:80")],
            b"",
        )
    })
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let r =
        blocking(move || request(addr, "GET", "/v1/models", &[("host", "localhost:1")], b"")).await;
    assert_eq!(r.status, 200);
    // No CORS unless allowed: a preflight gets no allow-origin.
    let r = blocking(move || {
        request(
            addr,
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("origin", "http://page.example"),
                ("access-control-request-method", "POST"),
            ],
            b"",
        )
    })
    .await;
    assert!(
        r.header("access-control-allow-origin").is_none(),
        "{:?}",
        r.headers
    );

    // The daemon carried on.
    let r = blocking(move || get(addr, "/health")).await;
    assert_eq!(r.json()["status"], "ok");
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_cors_and_non_loopback_refusal() {
    let (s, _c) = serve_env(
        &["--http-cors-origin", "http://ui.example"],
        &["olmoe"],
        &[("COLIBRI_API_KEY", "sekret-123")],
    )
    .await;
    let addr = s.addr;
    let r = blocking(move || get(addr, "/v1/models")).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = blocking(move || {
        request(
            addr,
            "GET",
            "/v1/models",
            &[("authorization", "Bearer wrong")],
            b"",
        )
    })
    .await;
    assert_eq!(r.status, 401);
    let r = blocking(move || {
        request(
            addr,
            "POST",
            "/v1/messages",
            &[("x-api-key", "nope")],
            b"{}",
        )
    })
    .await;
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (401, Some("authentication_error"))
    );
    for h in [
        ("authorization", "Bearer sekret-123"),
        ("x-api-key", "sekret-123"),
    ] {
        let r = blocking(move || request(addr, "GET", "/v1/models", &[h], b"")).await;
        assert_eq!(r.status, 200, "{h:?}");
    }
    // Health needs no key.
    assert_eq!(blocking(move || get(addr, "/health")).await.status, 200);
    // The allowed origin gets CORS headers on a preflight (before any key is checked).
    let r = blocking(move || {
        request(
            addr,
            "OPTIONS",
            "/v1/chat/completions",
            &[
                ("origin", "http://ui.example"),
                ("access-control-request-method", "POST"),
                ("access-control-request-headers", "authorization"),
            ],
            b"",
        )
    })
    .await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://ui.example")
    );

    // Any address other machines can reach needs a key: refused at start, clearly.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("d.log");
    let mut child = Daemon::spawn(
        &dir.path().join("c.sock"),
        &dir.path().join("state"),
        &["--http", "0.0.0.0:0"],
        &log,
    );
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "colibrid kept running"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("no API key is set"), "{text}");
}

/// Reads a streamed answer's head and its first data chunk, then returns the open
/// connection so the caller can drop it.
fn open_stream(
    addr: SocketAddr,
    path: &str,
    body: &Value,
) -> (u16, BufReader<std::net::TcpStream>, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(&http::request_bytes(
        addr,
        "POST",
        path,
        &[],
        body.to_string().as_bytes(),
    ))
    .unwrap();
    let mut r = BufReader::new(s);
    let (status, _) = http::read_head(&mut r);
    let first = http::read_chunk(&mut r)
        .map(|c| String::from_utf8_lossy(&c).into_owned())
        .unwrap_or_default();
    (status, r, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_frees_its_slot_and_a_full_queue_is_429() {
    // A 2 ms pause after each engine step (the daemon's test hook), so that the long
    // generation below holds its slot for seconds, not the few milliseconds the tiny
    // fixture needs, whatever the machine's load.
    let (s, _c) = serve_env(
        &["--max-batch", "1", "--queue", "0"],
        &["olmoe"],
        &[("COLIBRI_STEP_PAUSE_MS", "2")],
    )
    .await;
    let addr = s.addr;
    // A long generation (up to the context) holds the only slot.
    let long = json!({"model": "olmoe", "prompt": [1, 2, 3], "stream": true,
                      "temperature": 0, "ignore_eos": true});
    let (status, conn, first) = blocking(move || open_stream(addr, "/v1/completions", &long)).await;
    assert_eq!(status, 200, "{first}");
    let busy = json!({"model": "olmoe", "prompt": [1, 2, 3], "max_tokens": 2});
    let b2 = busy.clone();
    let r = blocking(move || post_json(addr, "/v1/completions", &b2)).await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    // The client goes away: the generation is cancelled and the slot is free again soon
    // (within a step; the bound here is only for a loaded CI machine).
    drop(conn);
    let t = Instant::now();
    loop {
        let b2 = busy.clone();
        let r = blocking(move || post_json(addr, "/v1/completions", &b2)).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 429);
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the slot was not freed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The gauges move as an answer's stream ends, just after its body is sent: the request
    // that got the slot may still count as active for a moment.
    let t = Instant::now();
    let m = loop {
        let m = blocking(move || get(addr, "/metrics")).await.text();
        if gauge(&m, "colibri_active_generations{") == 0.0 || t.elapsed() > Duration::from_secs(10)
        {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        m.contains("colibri_generations_total{model=\"olmoe\",reason=\"cancelled\"} 1"),
        "{m}"
    );
    assert_eq!(gauge(&m, "colibri_active_generations{"), 0.0);
    assert!(
        m.contains("colibri_http_requests_total{route=\"/v1/completions\",code=\"429\"}"),
        "{m}"
    );
    assert!(
        m.contains("# TYPE colibri_time_to_first_token_seconds histogram"),
        "{m}"
    );
    // The request that got the freed slot finished with a first token.
    assert!(gauge(&m, "colibri_time_to_first_token_seconds_count{") >= 1.0);
    assert!(gauge(&m, "colibri_generated_tokens_total{") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_a_long_prefill_alive() {
    // One prompt token per step, a 3 ms pause after every step (the scheduler's test hook)
    // and a ping after 2 ms of silence: the prefill of a 250-token prompt takes many pings'
    // time however fast the machine is. Without the pause the fixture's steps are tens of
    // microseconds, and on a loaded machine the whole prefill could end before the ping
    // timer ran.
    let (s, _c) = serve_env(
        &["--solo-prefill-chunk", "1", "--http-ping", "0.002"],
        &["olmoe"],
        &[("COLIBRI_STEP_PAUSE_MS", "3")],
    )
    .await;
    let addr = s.addr;
    let body = json!({"model": "olmoe", "max_tokens": 2, "stream": true,
                      "messages": [{"role": "user", "content": "sea ".repeat(60)}]});
    let r = blocking(move || post_json(addr, "/v1/messages", &body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let names: Vec<String> = r.events().into_iter().map(|(n, _)| n).collect();
    let start = names.iter().position(|n| n == "message_start").unwrap();
    let pings = names[start..]
        .iter()
        .take_while(|n| *n == "message_start" || *n == "ping")
        .count()
        - 1;
    assert!(
        pings >= 1,
        "no ping between message_start and the content: {names:?}"
    );
    assert_eq!(names.last().unwrap(), "message_stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_named_by_folder_and_found_by_path() {
    let (s, _c) = serve(&[], &["olmoe"]).await;
    let addr = s.addr;
    let path: PathBuf = std::fs::canonicalize(fixture("olmoe")).unwrap();
    let p = path.display().to_string();
    let r = blocking(move || get(addr, "/v1/models/olmoe")).await;
    assert_eq!(r.json()["id"], "olmoe");
    assert_eq!(r.json()["path"], p.as_str());
    let p2 = p.clone();
    let r = blocking(move || get(addr, &format!("/v1/models{p2}"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = blocking(move || get(addr, "/")).await;
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(r.text().contains("<td>olmoe</td>"), "{}", r.text());
    let r = blocking(move || get(addr, "/v1/models/missing")).await;
    assert_eq!(
        (r.status, r.json()["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    // The full path works as a model id in requests too.
    let body = json!({"model": p, "prompt": "hi", "max_tokens": 2});
    let r = blocking(move || post_json(addr, "/v1/completions", &body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "olmoe");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coli_serve_loads_the_model_and_starts_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run").join("c.sock");
    // A daemon started without --http: `coli serve` asks it to listen (ServeHttp).
    let daemon = Daemon::start(&sock, &dir.path().join("state"), &[]);
    let serve = |args: &[&str]| {
        let out = std::process::Command::new(colibri_tests::daemon::workspace_bin("coli"))
            .arg("--socket")
            .arg(&sock)
            .args(["--no-autostart", "serve", "--model"])
            .arg(fixture("olmoe"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let v: Value =
        serde_json::from_str(&serve(&["--http", "127.0.0.1:0", "--output", "json"])).unwrap();
    assert_eq!(v["started"], true);
    assert_eq!(v["models"][0]["name"], "olmoe");
    let url = v["url"].as_str().unwrap().to_string();
    let addr: SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .parse()
        .unwrap();
    let r = blocking(move || get(addr, "/v1/models")).await;
    assert_eq!(r.json()["data"][0]["id"], "olmoe");
    // Again: already serving; the text form prints the URL first.
    let text = serve(&[]);
    assert_eq!(text.lines().next(), Some(url.as_str()), "{text}");
    assert!(text.contains("serving \"olmoe\""), "{text}");
    let mut c = daemon.client().await;
    let st = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(st.http_url, url);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_an_unload_ends_with_an_error_event() {
    // One prompt token per step: the unload arrives while the long prompt is prefilled.
    // With a 2 ms pause after each step (the daemon's test hook) the prefill takes ~0.2 s
    // whatever the machine's load, so the unload cannot come after the stream ended.
    let (s, mut c) = serve_env(
        &["--solo-prefill-chunk", "1"],
        &["olmoe"],
        &[("COLIBRI_STEP_PAUSE_MS", "2")],
    )
    .await;
    let addr = s.addr;
    let long = "sea ".repeat(100);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"model": "olmoe", "stream": true, "ignore_eos": true,
            "messages": [{"role": "user", "content": long}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "olmoe", "stream": true, "max_tokens": 100000,
            "messages": [{"role": "user", "content": long}]}),
        ),
    ] {
        load(&mut c, &fixture("olmoe")).await;
        let b = body.clone();
        let (status, mut conn, _) = blocking(move || open_stream(addr, path, &b)).await;
        assert_eq!(status, 200);
        c.unload_model(pb::UnloadModelRequest {
            model: fixture("olmoe").display().to_string(),
        })
        .await
        .unwrap();
        let rest = blocking(move || {
            let mut text = String::new();
            while let Some(chunk) = http::read_chunk(&mut conn) {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            text
        })
        .await;
        let events = http::sse_events(&rest);
        let (name, data) = events
            .last()
            .unwrap_or_else(|| panic!("{path}: nothing after the unload"));
        let v: Value = serde_json::from_str(data).unwrap();
        if path == "/v1/messages" {
            assert_eq!(name, "error", "{rest}");
            assert_eq!(v["error"]["type"], "overloaded_error", "{v}");
        } else {
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("cancelled"),
                "{v}"
            );
        }
    }
}

/// Kimi-K2.5 through the HTTP API: its greedy ids as transformers' (the tiktoken prompt ids),
/// a chat rendered by its template and tokenized by its tiktoken file, both APIs; an image
/// part is refused with 400 and a message naming it, on both APIs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kimi_k25_greedy_chat_and_image_refusal() {
    let (s, _c) = serve(&[], &["kimi_k25"]).await;
    let addr = s.addr;
    let r = colibri_tests::Reference::load("kimi_k25");
    let body = json!({"model": "kimi_k25", "prompt": r.prompt_ids, "max_tokens": r.greedy_ids.len(),
                      "temperature": 0, "ignore_eos": true, "return_token_ids": true});
    let resp = blocking(move || post_json(addr, "/v1/completions", &body)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        ids_of(&resp.json()["choices"][0]["token_ids"]),
        r.greedy_ids
    );

    let body = json!({"model": "kimi_k25", "max_tokens": 6, "temperature": 0,
                      "messages": [{"role": "user", "content": "你好 🙂 x=3.14"}]});
    let resp = blocking(move || post_json(addr, "/v1/chat/completions", &body)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let v = resp.json();
    // The prompt is the template's (system prompt, thinking opened) in tiktoken ids.
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 20, "{v}");
    let body = json!({"model": "kimi_k25", "max_tokens": 6,
                      "messages": [{"role": "user", "content": "hi"}]});
    let resp = blocking(move || post_json(addr, "/v1/messages", &body)).await;
    assert_eq!(resp.status, 200, "{}", resp.text());

    let img = json!({"model": "kimi_k25", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]});
    let resp = blocking(move || post_json(addr, "/v1/chat/completions", &img)).await;
    assert_eq!(resp.status, 400, "{}", resp.text());
    let e = resp.json();
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("image_url"),
        "{e}"
    );
    let img = json!({"model": "kimi_k25", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "What is this?"}]}]});
    let resp = blocking(move || post_json(addr, "/v1/messages", &img)).await;
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert!(resp.text().contains("image"), "{}", resp.text());
}
