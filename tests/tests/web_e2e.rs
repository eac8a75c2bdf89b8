//! End-to-end tests of the dashboard's server side (`coli web`, daemon/src/http/web): the
//! page and its files, the expert grid's snapshot and its live deltas checked against the
//! routing the model really did, the models/pins/keep-alive/sessions API, and `coli web`
//! opening the page. The real `colibrid --http 127.0.0.1:0` over loopback with the raw
//! client of tests/src/http.rs. The page itself runs in a real Chromium in
//! tools/web_e2e.py (CI).

use colibri_proto::v1 as pb;
use colibri_tests::daemon::{http_addr, load_model, workspace_bin, Daemon};
use colibri_tests::fixture;
use colibri_tests::http::{self, get, post_json, request};
use pb::colibri_client::ColibriClient;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

struct Served {
    daemon: Daemon,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn serve(args: &[&str]) -> (Served, ColibriClient<Channel>) {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["--http", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let daemon = Daemon::start(
        &dir.path().join("run").join("c.sock"),
        &dir.path().join("state"),
        &all,
    );
    let mut c = daemon.client().await;
    let addr = http_addr(&mut c).await;
    (
        Served {
            daemon,
            addr,
            _dir: dir,
        },
        c,
    )
}

async fn load(c: &mut ColibriClient<Channel>, dir: &Path, cache: Option<u64>) {
    load_model(c, &dir.display().to_string(), cache).await;
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn get_json(addr: SocketAddr, path: &str) -> Value {
    let p = path.to_string();
    let r = blocking(move || get(addr, &p)).await;
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    r.json()
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> http::Response {
    let p = path.to_string();
    blocking(move || post_json(addr, &p, &body)).await
}

/// A live server-sent event stream read as it arrives.
struct Events {
    r: BufReader<TcpStream>,
    buf: String,
}

impl Events {
    fn open(addr: SocketAddr, path: &str) -> Events {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(&http::request_bytes(addr, "GET", path, &[], b""))
            .unwrap();
        let mut r = BufReader::new(s);
        let (status, headers) = http::read_head(&mut r);
        assert_eq!(status, 200, "GET {path}");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "content-type" && v == "text/event-stream"),
            "{headers:?}"
        );
        Events {
            r,
            buf: String::new(),
        }
    }

    /// The next event: (name, data as JSON); None when the stream ended.
    fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                if let Some((name, data)) = http::sse_events(&block)
                    .into_iter()
                    .find(|(n, _)| n != "comment")
                {
                    return Some((name, serde_json::from_str(&data).unwrap()));
                }
                continue;
            }
            let chunk = http::read_chunk(&mut self.r)?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

fn digits(cells: &Value) -> Vec<u8> {
    cells.as_str().unwrap().bytes().map(|b| b - b'0').collect()
}

fn nums(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// A greedy completion of `n` tokens; (prompt tokens fed, generated tokens).
async fn complete(addr: SocketAddr, model: &str, n: u32) -> (u64, u64) {
    let r = post(
        addr,
        "/v1/completions",
        json!({"model": model, "prompt": [5, 6, 7, 8, 9], "max_tokens": n,
               "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let u = &r.json()["usage"];
    let cached = u["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    (
        u["prompt_tokens"].as_u64().unwrap() - cached,
        u["completion_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_files_are_served_with_a_strict_policy() {
    let (s, mut c) = serve(&[]).await;
    load(&mut c, &fixture("olmoe"), None).await;
    let addr = s.addr;
    let r = blocking(move || get(addr, "/")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = r.header("content-security-policy").unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let page = r.text();
    assert!(page.contains("<canvas id=\"grid\""), "{page}");
    // Without script: the status table, as the page's plain predecessor showed it.
    assert!(page.contains("<td>olmoe</td>"), "{page}");
    for (path, kind) in [
        ("/assets/app.js", "text/javascript; charset=utf-8"),
        ("/assets/app.css", "text/css; charset=utf-8"),
        ("/assets/icon.svg", "image/svg+xml"),
    ] {
        let r = blocking(move || get(addr, path)).await;
        assert_eq!((r.status, r.header("content-type")), (200, Some(kind)));
        assert!(!r.body.is_empty());
    }
    let r = blocking(move || get(addr, "/assets/missing.js")).await;
    assert_eq!(r.status, 404);

    // With an API key: the page loads (it holds no data) but shows no models, and its API
    // answers only with the key.
    let (s, mut c) = serve(&["--api-key", "k3y"]).await;
    load(&mut c, &fixture("olmoe"), None).await;
    let addr = s.addr;
    let r = blocking(move || get(addr, "/")).await;
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("<td>olmoe</td>"));
    assert!(r.text().contains("needs an API key"));
    let r = blocking(move || get(addr, "/api/status")).await;
    assert_eq!(r.status, 401, "{}", r.text());
    let r = blocking(move || {
        request(
            addr,
            "GET",
            "/api/status",
            &[("authorization", "Bearer k3y")],
            b"",
        )
    })
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["models"][0]["name"], "olmoe");
    let r = blocking(move || request(addr, "GET", "/", &[("x-api-key", "k3y")], b"")).await;
    assert!(r.text().contains("<td>olmoe</td>"));
}

/// The grid against what the model did: every row fed through a MoE layer is counted for
/// its top-k experts, the deltas of the live stream add up to the final snapshot, and the
/// cached cells are exactly the experts the daemon's ExpertStats calls resident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expert_grid_follows_the_routing_live() {
    let (s, mut c) = serve(&[]).await;
    // qwen3_moe (3 layers, the middle one dense; 8 experts) streamed with room for about 5
    // of its 16 experts; olmoe resident.
    load(&mut c, &fixture("qwen3_moe"), Some(5 * 16384)).await;
    load(&mut c, &fixture("olmoe"), None).await;
    let addr = s.addr;
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("qwen3_moe").join("config.json")).unwrap(),
    )
    .unwrap();
    let (layers, experts, top_k) = (
        cfg["num_hidden_layers"].as_u64().unwrap() as usize,
        cfg["num_local_experts"].as_u64().unwrap() as usize,
        cfg["num_experts_per_tok"].as_u64().unwrap(),
    );
    let dense: Vec<usize> = cfg["mlp_only_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(dense, [1]);
    let moe_layers = (layers - dense.len()) as u64;

    let snap = get_json(addr, "/api/experts?model=qwen3_moe").await;
    let g = &snap["grid"];
    assert_eq!(
        (g["layers"].as_u64(), g["experts"].as_u64()),
        (Some(layers as u64), Some(experts as u64))
    );
    let cells0 = digits(&g["cells"]);
    assert_eq!(cells0.len(), layers * experts);
    for (i, &c) in cells0.iter().enumerate() {
        let want = if dense.contains(&(i / experts)) { 0 } else { 1 };
        assert_eq!(
            c, want,
            "dense layers have no cells, the rest are on disk: {cells0:?}"
        );
    }
    assert!(nums(&g["uses"]).iter().all(|&u| u == 0));
    assert_eq!(snap["model"]["streamed"], true);
    let cap = snap["model"]["cache"]["capacity_experts"].as_u64().unwrap() as usize;
    let eb = snap["model"]["cache"]["expert_bytes"].as_u64().unwrap();
    assert_eq!(cap as u64, 5 * 16384 / eb);
    assert!((1..16).contains(&cap), "some of the 16 experts fit: {cap}");

    // The live stream: a snapshot first, then deltas as a generation runs.
    let mut ev =
        blocking(move || Events::open(addr, "/api/experts/events?model=qwen3_moe&interval_ms=100"))
            .await;
    let (first, ev) = blocking(move || {
        let f = ev.next().unwrap();
        (f, ev)
    })
    .await;
    assert_eq!(first.0, "snapshot");
    let mut cells = digits(&first.1["grid"]["cells"]);
    let mut uses = nums(&first.1["grid"]["uses"]);
    let (fed, generated) = complete(addr, "qwen3_moe", 12).await;
    // Rows through the MoE layers: the prompt, then each generated token but the last.
    let rows = fed + generated - 1;
    let want = rows * top_k * moe_layers;
    // Applies the stream's deltas until `done` says the rebuilt grid is complete.
    fn follow(
        ev: &mut Events,
        cells: &mut [u8],
        uses: &mut [u64],
        last: &mut Value,
        done: &dyn Fn(&[u8], &[u64]) -> bool,
    ) {
        while !done(cells, uses) {
            let (name, d) = ev.next().expect("the stream ended");
            assert_eq!(name, "delta", "{d}");
            if d["grid"].is_null() {
                continue;
            }
            for p in nums(&d["grid"]["cells"]).chunks(2) {
                cells[p[0] as usize] = p[1] as u8;
            }
            for p in nums(&d["grid"]["uses"]).chunks(2) {
                uses[p[0] as usize] = p[1];
            }
            if !d["grid"]["last"].is_null() {
                *last = d["grid"]["last"].clone();
            }
        }
    }
    let (mut uses, mut cells, mut last, mut ev) = blocking(move || {
        let mut ev = ev;
        let mut last = Value::Null;
        follow(&mut ev, &mut cells, &mut uses, &mut last, &|_, u| {
            u.iter().sum::<u64>() >= want
        });
        (uses, cells, last, ev)
    })
    .await;
    assert_eq!(uses.iter().sum::<u64>(), want, "{uses:?}");
    // In each MoE layer the last token went to top_k experts.
    for (i, l) in last.as_array().unwrap().iter().enumerate() {
        let n = if dense.contains(&i) { 0 } else { top_k };
        assert_eq!(l.as_array().unwrap().len() as u64, n, "{last}");
    }
    // Once the reads still in flight (prefetches) have landed, the stream's deltas rebuild
    // exactly the snapshot the endpoint gives.
    let now = loop {
        let now = get_json(addr, "/api/experts?model=qwen3_moe").await;
        if !digits(&now["grid"]["cells"]).contains(&2) {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (want_cells, want_uses) = (digits(&now["grid"]["cells"]), nums(&now["grid"]["uses"]));
    assert_eq!(want_uses, uses);
    (cells, uses, last, ev) = blocking(move || {
        let (wc, wu) = (want_cells.clone(), want_uses.clone());
        follow(&mut ev, &mut cells, &mut uses, &mut last, &move |c, u| {
            c == &wc[..] && u == &wu[..]
        });
        (cells, uses, last, ev)
    })
    .await;
    let _ = &last;
    // The cached cells are the experts the daemon reports resident (gRPC ExpertStats).
    let st = c
        .expert_stats(pb::ExpertStatsRequest {
            model: fixture("qwen3_moe").display().to_string(),
            top: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let resident: BTreeSet<usize> = st
        .experts
        .iter()
        .filter(|e| e.resident)
        .map(|e| e.layer as usize * experts + e.expert as usize)
        .collect();
    let cached: BTreeSet<usize> = cells
        .iter()
        .enumerate()
        .filter(|(_, &c)| c == 3)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(cached, resident);
    assert!(!cached.is_empty() && cached.len() <= cap, "{cached:?}");
    // Every expert the store ever served was routed to (and the grid counted it).
    for e in &st.experts {
        assert!(
            uses[e.layer as usize * experts + e.expert as usize] > 0,
            "{e:?}"
        );
    }

    // A resident model: every cell resident, uses counted all the same.
    let snap = get_json(addr, "/api/experts?model=olmoe").await;
    assert!(digits(&snap["grid"]["cells"]).iter().all(|&c| c == 6));
    assert_eq!(snap["model"]["streamed"], false);
    let (fed, generated) = complete(addr, "olmoe", 6).await;
    let snap = get_json(addr, "/api/experts?model=olmoe").await;
    assert_eq!(
        nums(&snap["grid"]["uses"]).iter().sum::<u64>(),
        (fed + generated - 1) * 2 * 2,
        "olmoe: 2 MoE layers, top-2"
    );

    // Unloading ends the live stream with `gone`.
    c.unload_model(pb::UnloadModelRequest {
        model: fixture("qwen3_moe").display().to_string(),
    })
    .await
    .unwrap();
    let gone = blocking(move || loop {
        let (name, d) = ev.next().expect("the stream ended without 'gone'");
        if name == "gone" {
            break d;
        }
    })
    .await;
    assert_eq!(gone["model"], "qwen3_moe");
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_pins_keep_alive_and_sessions_through_the_dashboard_api() {
    let (s, _c) = serve(&[]).await;
    let addr = s.addr;
    let dir = std::fs::canonicalize(fixture("olmoe")).unwrap();

    // Load, with progress as events and a size string for the cache.
    let body = json!({"model": dir.display().to_string(), "expert_cache": "48K"});
    let r = post(addr, "/api/models/load", body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.events();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.last(), Some(&"ready"), "{events:?}");
    assert!(names.contains(&"progress"), "{names:?}");
    let ready: Value = serde_json::from_str(&events.last().unwrap().1).unwrap();
    assert_eq!(ready["model"], "olmoe");
    let st = get_json(addr, "/api/status").await;
    let m = &st["models"][0];
    assert_eq!(
        (m["name"].as_str(), m["streamed"].as_bool()),
        (Some("olmoe"), Some(true))
    );
    assert_eq!(m["cache"]["budget_bytes"], 48 << 10);
    assert!(st["memory"]["total_bytes"].as_u64().unwrap() > 0);
    // A folder that is no model: a clean 4xx.
    let r = post(
        addr,
        "/api/models/load",
        json!({"model": "/nonexistent/model"}),
    )
    .await;
    assert_eq!(r.status, 404, "{}", r.text());

    // Changes must be JSON from this origin.
    let r = blocking(move || {
        request(
            addr,
            "POST",
            "/api/unpin",
            &[("content-type", "text/plain")],
            b"{\"all\":true}",
        )
    })
    .await;
    assert_eq!(r.status, 415, "{}", r.text());
    let r = blocking(move || {
        request(
            addr,
            "POST",
            "/api/unpin",
            &[("origin", "http://evil.example")],
            b"{\"all\":true}",
        )
    })
    .await;
    assert_eq!(r.status, 403, "{}", r.text());
    let own = format!("http://{addr}");
    let r = blocking(move || {
        request(
            addr,
            "POST",
            "/api/unpin",
            &[("origin", own.as_str())],
            b"{\"all\":true}",
        )
    })
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // A conversation: a session, two turns through the OpenAI endpoint's session_id; the
    // second reuses the first's cache.
    let r = post(addr, "/api/sessions", json!({"model": "olmoe"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let sid = r.json()["id"].as_str().unwrap().to_string();
    let mut replies = Vec::new();
    let mut cached = Vec::new();
    for (turn, text) in ["Tell me about the sea", "And the sky?"].iter().enumerate() {
        let body = json!({"model": "olmoe", "session_id": sid, "max_tokens": 5, "temperature": 0,
                          "messages": [{"role": "user", "content": text}],
                          "stream": true, "stream_options": {"include_usage": true}});
        let r = post(addr, "/v1/chat/completions", body).await;
        assert_eq!(r.status, 200, "turn {turn}: {}", r.text());
        let mut reply = String::new();
        let mut usage = Value::Null;
        let mut timings = Value::Null;
        for (_, d) in r.events() {
            if d == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(&d).unwrap();
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                reply.push_str(t);
            }
            if !v["usage"].is_null() {
                usage = v["usage"].clone();
                timings = v["timings"].clone();
            }
        }
        assert_eq!(
            timings["predicted_n"], usage["completion_tokens"],
            "{timings}"
        );
        assert!(timings["time_to_first_token_ms"].as_f64().unwrap() > 0.0);
        cached.push(
            usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
        replies.push(reply);
    }
    assert!(
        cached[1] > cached[0],
        "the second turn reuses the session: {cached:?}"
    );
    let r = get_json(addr, &format!("/api/sessions/{sid}")).await;
    let msgs: Vec<(String, String)> = r["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().into(),
                m["content"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        msgs,
        [
            ("user".to_string(), "Tell me about the sea".to_string()),
            ("assistant".to_string(), replies[0].clone()),
            ("user".to_string(), "And the sky?".to_string()),
            ("assistant".to_string(), replies[1].clone()),
        ]
    );
    let st = get_json(addr, "/api/status").await;
    let listed = st["sessions"].as_array().unwrap();
    assert!(listed
        .iter()
        .any(|x| x["id"] == sid.as_str() && x["messages"] == 4 && x["model_name"] == "olmoe"));
    let p = format!("/api/sessions/{sid}");
    let r = blocking(move || request(addr, "DELETE", &p, &[], b"")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let st = get_json(addr, "/api/status").await;
    assert!(st["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["id"] != sid.as_str()));

    // Pins: the hottest by usage, shown in the grid; unpinned again.
    let r = post(addr, "/api/pins", json!({"model": "olmoe", "hottest": 3})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["pinned"].as_array().unwrap().len(), 3);
    let g = get_json(addr, "/api/experts").await;
    let pinned = digits(&g["grid"]["cells"])
        .iter()
        .filter(|&&c| c == 4 || c == 5)
        .count();
    assert_eq!(pinned, 3);
    assert_eq!(g["model"]["cache"]["pinned_experts"], 3);
    let r = post(addr, "/api/unpin", json!({"model": "olmoe", "all": true})).await;
    assert_eq!(r.json()["pinned"], json!([]));

    // Keep-alive: bad values refused; 1 s unloads the idle model (the daemon has none).
    let r = post(
        addr,
        "/api/models/keep_alive",
        json!({"model": "olmoe", "seconds": -1}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("seconds"))
    );
    let r = post(
        addr,
        "/api/models/keep_alive",
        json!({"model": "olmoe", "seconds": 0}),
    )
    .await;
    assert_eq!(r.json()["keep_alive_seconds"], 0.0);
    assert_eq!(r.json()["keep_alive_own"], true);
    let r = post(
        addr,
        "/api/models/keep_alive",
        json!({"model": "olmoe", "seconds": 1}),
    )
    .await;
    assert_eq!(r.json()["keep_alive_seconds"], 1.0);
    let t = Instant::now();
    loop {
        let st = get_json(addr, "/api/status").await;
        if st["models"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "not unloaded: {st}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Loaded again, then unloaded from the page's API.
    let body = json!({"model": dir.display().to_string()});
    let r = post(addr, "/api/models/load", body).await;
    assert!(r.text().contains("event: ready"), "{}", r.text());
    let r = post(addr, "/api/models/unload", json!({"model": "olmoe"})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "olmoe");
    let st = get_json(addr, "/api/status").await;
    assert!(st["models"].as_array().unwrap().is_empty());
    let r = blocking(move || get(addr, "/api/experts")).await;
    assert_eq!(r.status, 404);
    drop(s.daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coli_web_loads_the_model_and_opens_the_page() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("run").join("c.sock");
    // A daemon started without --http: `coli web` has it listen.
    let _daemon = Daemon::start(&sock, &dir.path().join("state"), &[]);
    // The "browser": a script that writes down what it was asked to open.
    let opened = dir.path().join("opened.txt");
    let browser = dir.path().join("browser.sh");
    std::fs::write(
        &browser,
        format!("#!/bin/sh\necho \"$1\" > {}\n", opened.display()),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&browser, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let web = |args: &[&str], env: &[(&str, &std::path::Path)]| {
        let out = std::process::Command::new(workspace_bin("coli"))
            .arg("--socket")
            .arg(&sock)
            .args(["--no-autostart", "web", "--model"])
            .arg(fixture("olmoe"))
            .args(args)
            .env_remove("BROWSER")
            .env_remove("COLIBRI_API_KEY")
            .envs(env.iter().map(|(k, v)| (k, v.as_os_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (out, _) = web(
        &["--http", "127.0.0.1:0", "--no-open", "--output", "json"],
        &[],
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["opened"].as_bool(), v["started"].as_bool()),
        (Some(false), Some(true))
    );
    assert_eq!(v["models"][0]["name"], "olmoe");
    let page = v["url"].as_str().unwrap().to_string();
    assert!(
        page.ends_with('/') && v["api"].as_str().unwrap().ends_with("/v1"),
        "{v}"
    );
    let addr: SocketAddr = page
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let r = blocking(move || get(addr, "/")).await;
    assert!(r.text().contains("<td>olmoe</td>"));
    // Again, with a browser to open: the page's address (with the key in its fragment).
    let (out, err) = web(&["--api-key", "s3cret"], &[("BROWSER", browser.as_path())]);
    assert_eq!(out.lines().next(), Some(page.as_str()), "{out}");
    assert!(err.contains("opened the dashboard"), "{err}");
    let t = Instant::now();
    while !opened.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the browser was not run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        std::fs::read_to_string(&opened).unwrap().trim(),
        format!("{page}#key=s3cret")
    );
}
