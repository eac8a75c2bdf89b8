//! `coli` through the daemon: the first command on a fresh socket starts `colibrid`
//! detached, generation and scoring through it equal the in-process path exactly, and
//! `coli stop` shuts it down.
//!
//! The daemon binary is found next to `coli` (as in an install); when it is missing there
//! (e.g. `cargo test -p colibri-client` alone), it is built first.

mod common;

use common::{csv, families, fixtures, ids_of, local, reference, Daemon};
use serde_json::Value;
use std::process::Command;

#[test]
fn run_through_the_daemon_equals_local_and_transformers() {
    let d = Daemon::new();
    assert!(!d.socket().exists());
    for (family, dir) in families() {
        let r = reference(&dir);
        let want = ids_of(&r["greedy_ids"]);
        let prompt = csv(&ids_of(&r["prompt_ids"]));
        let n = want.len().to_string();
        let model = dir.to_str().unwrap();
        let args = [
            "run",
            "--model",
            model,
            "--prompt-ids",
            &prompt,
            "--max-tokens",
            &n,
            "--temperature",
            "0",
            "--output",
            "ids",
        ];
        // The first call starts the daemon on the private socket.
        let remote = d.ok(&args);
        let mut local_args = args.to_vec();
        local_args.insert(1, "--local");
        let in_process = local(&local_args);
        assert_eq!(remote, in_process, "{family}: daemon and --local differ");
        let got: Vec<u32> = remote
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(
            got, want,
            "{family}: daemon output differs from transformers"
        );
    }
    assert!(
        d.socket().exists(),
        "the daemon was started on the given socket"
    );
    // The daemon kept every model loaded between the calls.
    let status: Value = serde_json::from_str(&d.ok(&["status", "--output", "json"])).unwrap();
    assert_eq!(status["running"], true);
    assert_eq!(
        status["models"].as_array().unwrap().len(),
        families().len(),
        "{status}"
    );
    assert_eq!(status["socket"], d.socket().to_str().unwrap());
}

#[test]
fn text_prompt_and_score_through_the_daemon_equal_local() {
    let d = Daemon::new();
    let (_, dir) = families().remove(0);
    let model = dir.to_str().unwrap();
    for extra in [&[][..], &["--raw"][..]] {
        let mut args = vec![
            "run",
            "--model",
            model,
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--ignore-eos",
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        args.push("Tell me about the sea");
        let remote: Value = serde_json::from_str(&d.ok(&args)).unwrap();
        args.insert(1, "--local");
        let in_process: Value = serde_json::from_str(&local(&args)).unwrap();
        assert_eq!(remote["ids"], in_process["ids"], "{extra:?}");
        assert_eq!(remote["text"], in_process["text"], "{extra:?}");
        assert_eq!(remote["finish_reason"], "length");
        assert_eq!(
            remote["stats"]["prompt_tokens"], in_process["stats"]["prompt_tokens"],
            "the daemon templates and tokenizes like the in-process path"
        );
    }

    // Sampling with a seed is reproducible across the two paths too.
    let sampled = [
        "run",
        "--model",
        model,
        "--prompt-ids",
        "5,6,7",
        "--max-tokens",
        "10",
        "--temperature",
        "0.9",
        "--top-p",
        "0.9",
        "--seed",
        "42",
        "--ignore-eos",
        "--output",
        "ids",
    ];
    let remote = d.ok(&sampled);
    let mut local_args = sampled.to_vec();
    local_args.insert(1, "--local");
    assert_eq!(remote, local(&local_args));

    let ids = csv(&ids_of(&reference(&dir)["input_ids"]));
    let remote: Value = serde_json::from_str(
        &d.ok(&["score", "--model", model, "--ids", &ids, "--output", "json"]),
    )
    .unwrap();
    let in_process: Value = serde_json::from_str(&local(&[
        "score", "--local", "--model", model, "--ids", &ids, "--output", "json",
    ]))
    .unwrap();
    assert_eq!(remote["argmax"], in_process["argmax"]);
    assert_eq!(remote["logits"], in_process["logits"]);
    assert_eq!(
        d.ok(&["score", "--model", model, "--ids", &ids, "--output", "ids"]),
        local(&["score", "--local", "--model", model, "--ids", &ids, "--output", "ids"])
    );
}

#[test]
fn daemon_errors_are_one_line_and_the_daemon_carries_on() {
    let d = Daemon::new();
    let (_, dir) = families().remove(0);
    let model = dir.to_str().unwrap();
    for (args, needle) in [
        (
            vec![
                "run",
                "--model",
                model,
                "--prompt-ids",
                "1,99999999",
                "--output",
                "ids",
            ],
            "vocabulary",
        ),
        (
            vec![
                "run",
                "--model",
                model,
                "--prompt-ids",
                "1,2",
                "--max-tokens",
                "100000",
            ],
            "max_tokens",
        ),
        (
            vec!["run", "--model", "/nonexistent/model", "--prompt-ids", "1"],
            "nonexistent",
        ),
    ] {
        let o = d.coli(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(needle),
            "{args:?}: {err}"
        );
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Still serving.
    d.ok(&[
        "run",
        "--model",
        model,
        "--prompt-ids",
        "1,2",
        "--max-tokens",
        "2",
        "--output",
        "ids",
    ]);
}

#[test]
fn stop_shuts_the_daemon_down_and_no_autostart_is_honoured() {
    let d = Daemon::new();
    // Nothing running and autostart off: a clear error, nothing started.
    let o = d.coli(&["--no-autostart", "status"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not running"));
    assert!(!d.socket().exists());

    let status: Value = serde_json::from_str(&d.ok(&["status", "--output", "json"])).unwrap();
    let pid = status["pid"].as_u64().unwrap();
    assert!(pid > 0);
    d.ok(&["stop"]);
    assert!(!d.socket().exists(), "the daemon removed its socket");
    let o = d.coli(&["--no-autostart", "ps"]);
    assert_eq!(o.status.code(), Some(1), "the daemon is gone");
    // Stopping again is not an error.
    d.ok(&["stop"]);
}

#[test]
fn chat_session_is_reattached_after_a_daemon_restart() {
    let d = Daemon::new();
    let (_, dir) = families().remove(0);
    let model = dir.to_str().unwrap();
    let chat = |input: &str, extra: &[&str]| {
        use std::io::Write;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_coli"));
        cmd.arg("--socket")
            .arg(d.socket())
            .args(["chat", "--max-tokens", "6", "--temperature", "0"])
            .args(extra)
            .env("COLIBRI_STATE_DIR", d.dir.path().join("state"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "chat failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = chat("hello\n/stats\n", &["--model", model, "--new"]);
    assert!(err.contains("tokens"), "a footer after the reply: {err}");
    let sessions: Value = serde_json::from_str(&d.ok(&["sessions", "--output", "json"])).unwrap();
    let id = sessions["sessions"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(sessions["sessions"][0]["messages"], 2);

    d.ok(&["stop"]);
    // No --model: coli re-attaches to the most recent session, restored from disk.
    let err = chat("again\n", &[]);
    assert!(err.contains(&format!("resumed session {id}")), "{err}");
    assert!(err.contains("restored from disk"), "{err}");
    let sessions: Value = serde_json::from_str(&d.ok(&["sessions", "--output", "json"])).unwrap();
    assert_eq!(sessions["sessions"][0]["id"], id.as_str());
    assert_eq!(sessions["sessions"][0]["messages"], 4);
}

/// The expert-cache lines of `coli run --stats` (from "experts:" to the store's report's
/// end), with every number replaced by `#` so runs compare despite their timings.
fn expert_block(stderr: &str) -> Vec<String> {
    let lines: Vec<&str> = stderr.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("experts: "))
        .unwrap_or_else(|| panic!("no expert statistics in:\n{stderr}"));
    lines[start..]
        .iter()
        .take_while(|l| !l.starts_with("speculation:"))
        .map(|l| {
            let mut out = String::new();
            for c in l.chars() {
                if !c.is_ascii_digit() {
                    out.push(c);
                } else if !out.ends_with('#') {
                    out.push('#');
                }
            }
            out
        })
        .collect()
}

/// `coli run --stats` with streamed experts prints the same expert statistics through the
/// daemon as in-process (the daemon sends the store's statistics; the client prints them
/// with the engine's own report), and `coli status` shows each model's key figures.
#[test]
fn run_stats_print_the_same_expert_block_through_the_daemon_as_local() {
    let d = Daemon::new();
    let dir = fixtures().join("olmoe");
    let r = reference(&dir);
    let prompt = ids_of(&r["prompt_ids"]);
    let args = [
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &csv(&prompt),
        "--max-tokens",
        "8",
        "--temperature",
        "0",
        "--ignore-eos",
        "--output",
        "ids",
        "--stats",
        "--expert-cache",
        "0",
    ];
    let remote = d.coli(&args);
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    let remote_err = String::from_utf8_lossy(&remote.stderr).into_owned();
    let state = tempfile::tempdir().unwrap();
    let mut local_args = args.to_vec();
    local_args.insert(1, "--local");
    let local = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(&local_args)
        .env("COLI_SOCKET", "/nonexistent/colibri-test.sock")
        .env("XDG_STATE_HOME", state.path())
        .env("HOME", state.path())
        .output()
        .unwrap();
    assert!(local.status.success());
    assert_eq!(remote.stdout, local.stdout, "streamed tokens differ");
    let block = expert_block(&remote_err);
    assert_eq!(
        block,
        expert_block(&String::from_utf8_lossy(&local.stderr)),
        "daemon:\n{remote_err}"
    );
    let first = &block[0];
    for want in [
        "experts: hit #.#%",
        "#.# MB/token",
        "disk #.# GB/s",
        "prefetch recall #%",
        "waited #.# s on reads",
    ] {
        assert!(first.contains(want), "{want:?} missing: {remote_err}");
    }
    // Budget 0: nothing is kept, every request is read.
    assert!(
        remote_err.contains("hit 0.0%") && remote_err.contains("hit rate 0.0%"),
        "{remote_err}"
    );
    assert!(
        block.iter().any(|l| l.starts_with("requests #: hit rate")),
        "{block:?}"
    );

    let status = d.ok(&["status"]);
    let line = status
        .lines()
        .find(|l| l.starts_with("experts of "))
        .unwrap_or_else(|| panic!("no expert cache figures in:\n{status}"));
    for want in ["hit 0.0%", "MB/token", "GB/s", "prefetch recall"] {
        assert!(line.contains(want), "{want:?} missing: {line}");
    }
    let json: Value = serde_json::from_str(&d.ok(&["status", "--output", "json"])).unwrap();
    let cache = &json["models"][0]["expert_cache"];
    assert_eq!(cache["streamed"], true, "{cache}");
    // The prompt and every generated token but the last went through the MoE layers.
    assert_eq!(cache["tokens"], prompt.len() as u64 + 7, "{cache}");
    assert_eq!(cache["hits"], 0, "{cache}");
    assert!(cache["misses"].as_u64().unwrap() > 0, "{cache}");
}
