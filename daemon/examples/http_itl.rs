//! Inter-token latency through the HTTP API against gRPC, in one run: the same daemon, the
//! same model and prompt, greedy, requests alternating between the two doors. Each token's
//! arrival time is taken at the client as its bytes arrive (gRPC: a `Tokens` message; HTTP:
//! an SSE `data:` event of `/v1/completions` with `stream: true`, one per token); the gaps
//! between consecutive tokens of a request are pooled per door, and their p50 and p90 are
//! printed, with the time to first token.
//!
//! ```text
//! cargo build --release -p colibri-daemon -p colibri-client --bins
//! coli synth --like olmoe-1b-7b --layers 4 --output /tmp/synth-olmoe   # or any model folder
//! cargo run --release -p colibri-daemon --example http_itl -- --model /tmp/synth-olmoe \
//!     [--tokens 64] [--reps 10] [--prompt 16]
//! ```
//! `colibrid` is taken from target/release (or COLIBRID_BIN).

use colibri_proto::v1 as pb;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin(name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(format!("{}_BIN", name.to_uppercase())) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        p.exists(),
        "{} missing: cargo build --release --bins first",
        p.display()
    );
    p
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Token arrival times of one streamed gRPC Generate, from the call.
async fn grpc_run(
    c: &mut pb::colibri_client::ColibriClient<tonic::transport::Channel>,
    model: &str,
    prompt: &[u32],
    tokens: u32,
) -> Vec<f64> {
    let t = Instant::now();
    let mut s = c
        .generate(pb::GenerateRequest {
            model: model.into(),
            prompt_ids: prompt.to_vec(),
            options: Some(pb::GenerationOptions {
                max_tokens: tokens,
                ignore_eos: true,
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
    let mut at = Vec::new();
    while let Some(ev) = s.message().await.unwrap() {
        if let Some(pb::generate_event::Event::Tokens(tk)) = ev.event {
            at.extend(std::iter::repeat_n(t.elapsed().as_secs_f64(), tk.ids.len()));
        }
    }
    at
}

/// Token arrival times of one streamed POST /v1/completions (a plain socket; one chunk of
/// the chunked body per SSE event).
fn http_run(addr: &str, name: &str, prompt: &[u32], tokens: u32) -> Vec<f64> {
    let body = serde_json::json!({"model": name, "prompt": prompt, "max_tokens": tokens,
        "temperature": 0, "ignore_eos": true, "stream": true, "return_token_ids": true})
    .to_string();
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
    }
    let mut at = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        let mut chunk = vec![0; n + 2];
        r.read_exact(&mut chunk).unwrap();
        let now = t.elapsed().as_secs_f64();
        for ev in String::from_utf8_lossy(&chunk).split("\n\n") {
            let Some(d) = ev.trim().strip_prefix("data: ") else {
                continue;
            };
            if d == "[DONE]" {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(d).unwrap();
            let k = v["choices"][0]["token_ids"]
                .as_array()
                .map_or(0, |a| a.len());
            at.extend(std::iter::repeat_n(now, k));
        }
    }
    at
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str, d: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| d.to_string())
    };
    let model = get("--model", "");
    assert!(!model.is_empty(), "--model DIR is required");
    let tokens: u32 = get("--tokens", "64").parse().unwrap();
    let reps: usize = get("--reps", "10").parse().unwrap();
    let plen: usize = get("--prompt", "16").parse().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let mut child = Command::new(bin("colibrid"))
        .arg("--socket")
        .arg(&sock)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--http", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..300 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = colibri_proto::connect::client(&sock).await.unwrap();
    let mut s = c
        .load_model(pb::LoadModelRequest {
            model: std::fs::canonicalize(&model).unwrap().display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut info = None;
    while let Some(p) = s.message().await.unwrap() {
        info = p.info.or(info);
    }
    let info = info.expect("the model loaded");
    let served = c
        .serve_http(pb::ServeHttpRequest::default())
        .await
        .unwrap()
        .into_inner();
    let addr = served
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let name = served.models[0].name.clone();
    let prompt: Vec<u32> = (0..plen as u32)
        .map(|i| (i * 7919 + 11) % info.vocab_size)
        .collect();
    let (mut g_gaps, mut h_gaps, mut g_first, mut h_first) = (vec![], vec![], vec![], vec![]);
    // One warm-up each, then alternate.
    grpc_run(&mut c, &info.id, &prompt, tokens).await;
    let (a2, n2, p2) = (addr.clone(), name.clone(), prompt.clone());
    tokio::task::spawn_blocking(move || http_run(&a2, &n2, &p2, tokens))
        .await
        .unwrap();
    for _ in 0..reps {
        let g = grpc_run(&mut c, &info.id, &prompt, tokens).await;
        let (a2, n2, p2) = (addr.clone(), name.clone(), prompt.clone());
        let h = tokio::task::spawn_blocking(move || http_run(&a2, &n2, &p2, tokens))
            .await
            .unwrap();
        assert_eq!(g.len(), tokens as usize);
        assert_eq!(h.len(), tokens as usize);
        g_first.push(g[0] * 1e3);
        h_first.push(h[0] * 1e3);
        g_gaps.extend(g.windows(2).map(|w| (w[1] - w[0]) * 1e3));
        h_gaps.extend(h.windows(2).map(|w| (w[1] - w[0]) * 1e3));
    }
    println!(
        "model {} ({}), prompt {plen} tokens, {tokens} tokens x {reps} requests per door, alternating",
        info.id, info.model_type
    );
    println!(
        "gRPC: inter-token p50 {:.3} ms, p90 {:.3} ms; time to first token p50 {:.2} ms",
        pct(&mut g_gaps, 0.5),
        pct(&mut g_gaps, 0.9),
        pct(&mut g_first, 0.5)
    );
    println!(
        "HTTP: inter-token p50 {:.3} ms, p90 {:.3} ms; time to first token p50 {:.2} ms",
        pct(&mut h_gaps, 0.5),
        pct(&mut h_gaps, 0.9),
        pct(&mut h_first, 0.5)
    );
    println!(
        "HTTP / gRPC inter-token p50: {:.3}",
        pct(&mut h_gaps, 0.5) / pct(&mut g_gaps, 0.5)
    );
    let _ = c.shutdown(pb::ShutdownRequest {}).await;
    let _ = child.wait();
}
