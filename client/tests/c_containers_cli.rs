//! The colibri C engine's containers through `coli`: `coli plan` and `coli doctor` report
//! the formats per tensor class and the load notes (a GLM-5 container without its DSA
//! indexer runs dense attention, one without MTP layers does not draft), and the daemon
//! carries the same notes into `coli load` and `coli status`.

mod common;

use common::{coli_in, ensure_daemon_binary, fixtures, ok_stdout};
use serde_json::Value;

const DSA_NOTE: &str = "DSA indexer absent: dense attention; outputs differ from the reference beyond index_topk (8) tokens";

/// The GLM-5 container of the C converter's main pass only (no indexer, no MTP layer).
fn glm_main_pass() -> tempfile::TempDir {
    let src = fixtures().join("c_containers/glm_moe_dsa");
    let d = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "out-00000.safetensors",
    ] {
        std::fs::copy(src.join(f), d.path().join(f)).unwrap();
    }
    d
}

#[test]
fn plan_reports_formats_per_class_and_the_notes() {
    let m = glm_main_pass();
    let state = tempfile::tempdir().unwrap();
    let dir = m.path().to_str().unwrap();
    let text = ok_stdout(&coli_in(&["plan", "--model", dir], state.path()));
    assert!(text.contains("colibri C layout"), "{text}");
    assert!(text.contains("  attention: int8 (15 tensors"), "{text}");
    assert!(
        text.contains("  routed experts: int4-g32 (32 tensors"),
        "{text}"
    );
    assert!(text.contains("  routers: f32 (2 tensors"), "{text}");
    assert!(text.contains(&format!("note: {DSA_NOTE}")), "{text}");
    let j: Value = serde_json::from_str(&ok_stdout(&coli_in(
        &["plan", "--model", dir, "--json"],
        state.path(),
    )))
    .unwrap();
    assert_eq!(j["layout"], "colibri C layout (U8 + .qs scales)");
    assert!(j["notes"].as_array().unwrap().iter().any(|n| n == DSA_NOTE));
    let classes = j["weight_classes"].as_array().unwrap();
    assert!(classes
        .iter()
        .any(|c| c["class"] == "embeddings" && c["format"] == "int8" && c["tensors"] == 1));
}

#[test]
fn doctor_warns_about_the_missing_indexer_and_mtp_layers() {
    ensure_daemon_binary();
    let m = glm_main_pass();
    let state = tempfile::tempdir().unwrap();
    let o = coli_in(
        &[
            "doctor",
            "--model",
            m.path().to_str().unwrap(),
            "--output",
            "json",
        ],
        state.path(),
    );
    let j: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&o.stdout));
    });
    let checks = j["checks"].as_array().unwrap();
    let dsa = checks
        .iter()
        .find(|c| c["detail"] == DSA_NOTE)
        .expect("a check for the DSA note");
    assert_eq!(dsa["status"], "warn");
    assert!(dsa["fix"].as_str().unwrap().contains("--indexer"));
    assert!(checks.iter().any(
        |c| c["status"] == "warn" && c["detail"].as_str().unwrap().starts_with("no MTP layers")
    ));
    let formats = checks.iter().find(|c| c["name"] == "formats").unwrap();
    assert!(formats["detail"]
        .as_str()
        .unwrap()
        .contains("routed experts: int4-g32 (32 tensors"));
}

#[test]
fn the_daemon_tells_the_notes_at_load_and_in_status() {
    ensure_daemon_binary();
    let m = glm_main_pass();
    let state = tempfile::tempdir().unwrap();
    let sock = state.path().join("c.sock");
    let s = sock.to_str().unwrap();
    let dir = m.path().to_str().unwrap();
    let load = ok_stdout(&coli_in(
        &["--socket", s, "load", "--model", dir],
        state.path(),
    ));
    assert!(load.contains(&format!("note: {DSA_NOTE}")), "{load}");
    let status = ok_stdout(&coli_in(&["--socket", s, "status"], state.path()));
    assert!(status.contains(DSA_NOTE), "{status}");
    assert!(status.contains("routed experts: int4-g32"), "{status}");
    let j: Value = serde_json::from_str(&ok_stdout(&coli_in(
        &["--socket", s, "status", "--output", "json"],
        state.path(),
    )))
    .unwrap();
    let info = &j["models"][0]["info"];
    assert!(info["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n == DSA_NOTE));
    assert_eq!(info["layout"], "colibri C layout (U8 + .qs scales)");
    let _ = coli_in(&["--socket", s, "stop", "--timeout", "30"], state.path());
}

#[test]
fn local_runs_say_the_notes_once_on_stderr() {
    let state = tempfile::tempdir().unwrap();
    let dir = fixtures().join("c_containers/deepseek_v3_mixed");
    let o = coli_in(
        &[
            "run",
            "--local",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "--output",
            "ids",
        ],
        state.path(),
    );
    ok_stdout(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("note: no MTP layers").count(), 1, "{err}");
}
