//! gpt-oss through `coli`: `coli plan` and `coli doctor` name the family and report its
//! routed experts as the MXFP4 they are published in (read in place, no conversion).

mod common;

use common::{ensure_daemon_binary, fixtures};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn coli(args: &[&str], state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env("COLIBRI_STATE_DIR", state)
        .env_remove("COLI_SOCKET")
        .env_remove("COLI_NO_AUTOSTART")
        .output()
        .expect("spawn coli")
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "coli failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn plan_names_gpt_oss_and_its_mxfp4_experts() {
    let dir = fixtures().join("gpt_oss");
    let state = tempfile::tempdir().unwrap();
    let text = ok(&coli(
        &["plan", "--model", dir.to_str().unwrap()],
        state.path(),
    ));
    assert!(text.contains(": gpt_oss ("), "{text}");
    // 4 layers × 8 experts × (gate_up, down).
    assert!(
        text.contains("  routed experts: mxfp4 (64 tensors"),
        "{text}"
    );
    assert!(text.contains("  routers: bf16 (4 tensors"), "{text}");
    assert!(text.contains("  attention: bf16 (16 tensors"), "{text}");
}

#[test]
fn doctor_names_gpt_oss() {
    ensure_daemon_binary();
    let dir = fixtures().join("gpt_oss");
    let state = tempfile::tempdir().unwrap();
    let o = coli(
        &[
            "doctor",
            "--model",
            dir.to_str().unwrap(),
            "--output",
            "json",
        ],
        state.path(),
    );
    let j: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)));
    let checks = j["checks"].as_array().unwrap();
    let model = checks.iter().find(|c| c["name"] == "model").unwrap();
    assert_eq!(model["status"], "ok", "{model}");
    assert!(model["detail"]
        .as_str()
        .unwrap()
        .contains(": gpt_oss (4 layers, vocab 512"));
    let formats = checks.iter().find(|c| c["name"] == "formats").unwrap();
    assert!(formats["detail"]
        .as_str()
        .unwrap()
        .contains("routed experts: mxfp4 (64 tensors"));
}
