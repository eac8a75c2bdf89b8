//! What the daemon buys: time to first token of `coli run` against a warm `colibrid`, versus
//! a process that already holds the model (in-process warm), versus `coli run --local` (a
//! cold start: new process, model load, prefill); and the aggregate decode speed of 4
//! concurrent sessions versus 1 (the scheduler batches their decode steps into one forward).
//!
//! ```text
//! cargo build --release -p colibri-daemon -p colibri-client --bins
//! coli synth --like olmoe-1b-7b --layers 4 --output /tmp/synth-olmoe
//! cargo run --release -p colibri-daemon --example daemon_bench -- --model /tmp/synth-olmoe
//! ```
//! `colibrid` and `coli` are taken from the directory above this example's executable
//! (target/release), or from COLIBRID_BIN / COLI_BIN.

use colibri_engine::{GenerateRequest, Generation, Model, SamplingParams};
use colibri_proto::v1 as pb;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Opts {
    model: PathBuf,
    prompt: usize,
    tokens: u32,
    reps: usize,
    concurrent: usize,
    evict: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        model: PathBuf::new(),
        prompt: 8,
        tokens: 32,
        reps: 5,
        concurrent: 4,
        evict: true,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--model" => o.model = PathBuf::from(v),
            "--prompt" => o.prompt = v.parse().expect("--prompt N"),
            "--tokens" => o.tokens = v.parse().expect("--tokens N"),
            "--reps" => o.reps = v.parse().expect("--reps N"),
            "--concurrent" => o.concurrent = v.parse().expect("--concurrent N"),
            "--no-evict" => {
                o.evict = false;
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}; see the file's doc comment"),
        }
        i += 2;
    }
    assert!(!o.model.as_os_str().is_empty(), "--model DIR is required");
    o
}

fn bin(name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(format!("{}_BIN", name.to_uppercase())) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/examples/daemon_bench -> target/<profile>/<name>
    let p = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        p.exists(),
        "{} missing: cargo build --release --bins first",
        p.display()
    );
    p
}

/// Drops the model's files from the page cache, so the next load reads the disk as after a
/// reboot (what a cold start costs).
fn evict(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let Ok(f) = std::fs::File::open(e.path()) else {
            continue;
        };
        let _ = f.sync_all();
        #[cfg(target_os = "linux")]
        // SAFETY: advisory call on an fd we own.
        unsafe {
            use std::os::fd::AsRawFd;
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn prompt_ids(n: usize, salt: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + salt * 104729 + 11) % vocab)
        .collect()
}

/// Wall time of one `coli run` process producing one token.
fn coli_run(socket: Option<&Path>, model: &Path, ids: &[u32]) -> f64 {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let mut cmd = Command::new(bin("coli"));
    if let Some(s) = socket {
        cmd.arg("--socket").arg(s);
    }
    cmd.arg("run").arg("--model").arg(model);
    if socket.is_none() {
        cmd.arg("--local");
    }
    cmd.args([
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        "1",
        "--temperature",
        "0",
        "--output",
        "ids",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let t = Instant::now();
    let out = cmd.output().expect("run coli");
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "coli failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    secs
}

async fn generate(
    socket: &Path,
    model: &str,
    ids: Vec<u32>,
    tokens: u32,
) -> (Instant, Instant, u32, f64) {
    let mut c = colibri_proto::connect::client(socket).await.unwrap();
    let req = pb::GenerateRequest {
        model: model.to_string(),
        prompt_ids: ids,
        options: Some(pb::GenerationOptions {
            max_tokens: tokens,
            ignore_eos: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut s = c.generate(req).await.unwrap().into_inner();
    let mut first = None;
    let mut stats = None;
    while let Some(ev) = s.message().await.unwrap() {
        match ev.event {
            Some(pb::generate_event::Event::Tokens(_)) => {
                first.get_or_insert_with(Instant::now);
            }
            Some(pb::generate_event::Event::Finished(f)) => stats = f.stats,
            _ => {}
        }
    }
    let stats = stats.expect("finished");
    (
        first.unwrap(),
        Instant::now(),
        stats.generated_tokens,
        stats.decode_tokens_per_second,
    )
}

#[tokio::main]
async fn main() {
    let o = parse();
    let model_dir = o.model.canonicalize().expect("model directory");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bench.sock");

    let vocab = Model::load(&model_dir).expect("load model").info.vocab_size as u32;
    let ids = prompt_ids(o.prompt, 0, vocab);

    // A true cold start: the model's files are not in the page cache. (Measured first: pages
    // that the daemon or this process map cannot be dropped.)
    let mut cold_disk = Vec::new();
    if o.evict {
        for _ in 0..o.reps.min(3) {
            evict(&model_dir);
            cold_disk.push(coli_run(None, &model_dir, &ids));
        }
    }

    // The daemon, warm: the model is loaded once; each `coli run` is a new client process.
    let mut daemon = Command::new(bin("colibrid"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("COLIBRID_LOG", "warn")
        .spawn()
        .expect("start colibrid");
    let t = Instant::now();
    let mut c = loop {
        match colibri_proto::connect::client(&socket).await {
            Ok(c) => break c,
            Err(_) if t.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            Err(e) => panic!("colibrid did not start: {e}"),
        }
    };
    let mut s = c
        .load_model(pb::LoadModelRequest {
            model: model_dir.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    while s.message().await.unwrap().is_some() {}

    // In-process warm: this process holds the model; time from request to first token.
    let model = Model::load(&model_dir).unwrap();
    let local_first_token = || {
        let t = Instant::now();
        let req = GenerateRequest {
            prompt: ids.clone(),
            max_tokens: 1,
            sampling: SamplingParams::default(),
            ignore_eos: true,
            ..Default::default()
        };
        let mut g = Generation::new(&model, model.new_cache(), req).unwrap();
        g.run(&model, 512, |_| {}).unwrap();
        t.elapsed().as_secs_f64()
    };

    // One untimed round warms page cache and code; then the three are measured in turns so
    // that load from other processes on the machine hits them alike.
    coli_run(None, &model_dir, &ids);
    coli_run(Some(&socket), &model_dir, &ids);
    local_first_token();
    let (mut cold, mut warm_local, mut warm_daemon) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..o.reps {
        cold.push(coli_run(None, &model_dir, &ids));
        warm_local.push(local_first_token());
        warm_daemon.push(coli_run(Some(&socket), &model_dir, &ids));
    }
    drop(model);

    // Decode: 1 session, then N at once.
    let id = model_dir.display().to_string();
    let short = 8;
    let (f, e, n, solo_rate) = generate(&socket, &id, prompt_ids(short, 1, vocab), o.tokens).await;
    let solo_wall = n.saturating_sub(1) as f64 / (e - f).as_secs_f64();
    let runs: Vec<_> = (0..o.concurrent)
        .map(|k| {
            let (socket, id) = (socket.clone(), id.clone());
            tokio::spawn(async move {
                generate(
                    &socket,
                    &id,
                    prompt_ids(short, 2 + k as u32, vocab),
                    o.tokens,
                )
                .await
            })
        })
        .collect();
    let mut results = Vec::new();
    for r in runs {
        results.push(r.await.unwrap());
    }
    let start = results.iter().map(|r| r.0).max().unwrap();
    let end = results.iter().map(|r| r.1).max().unwrap();
    let total: u32 = results.iter().map(|r| r.2.saturating_sub(1)).sum();
    let aggregate = total as f64 / (end - start).as_secs_f64();
    let per_request: Vec<f64> = results.iter().map(|r| r.3).collect();
    let _ = c.shutdown(pb::ShutdownRequest {}).await;
    let _ = daemon.wait();

    let ms = |v: f64| v * 1e3;
    println!(
        "model {} ({} prompt tokens, median of {} runs)",
        model_dir.display(),
        o.prompt,
        o.reps
    );
    println!("time to first token:");
    println!(
        "  coli run, warm daemon                       {:9.1} ms",
        ms(median(warm_daemon))
    );
    println!(
        "  in-process, model loaded                    {:9.1} ms",
        ms(median(warm_local))
    );
    println!(
        "  coli run --local (new process, files cached) {:9.1} ms",
        ms(median(cold))
    );
    if !cold_disk.is_empty() {
        println!(
            "  coli run --local (page cache dropped first) {:9.1} ms",
            ms(median(cold_disk))
        );
    }
    println!("decode ({} tokens each):", o.tokens);
    println!(
        "  1 session                    {solo_wall:9.2} tok/s (daemon's own figure {solo_rate:.2})"
    );
    println!(
        "  {} sessions at once           {aggregate:9.2} tok/s aggregate ({:.2}x), per session {:?}",
        o.concurrent,
        aggregate / solo_wall,
        per_request.iter().map(|r| (r * 100.0).round() / 100.0).collect::<Vec<_>>()
    );
}
