//! gpt-oss through `coli`: `coli plan` and `coli doctor` name the family and report its
//! routed experts as the MXFP4 they are published in (read in place, no conversion).

mod common;

use common::{coli_in, ensure_daemon_binary, fixtures, ok_stdout};
use serde_json::Value;

#[test]
fn plan_names_gpt_oss_and_its_mxfp4_experts() {
    let dir = fixtures().join("gpt_oss");
    let state = tempfile::tempdir().unwrap();
    let text = ok_stdout(&coli_in(
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
    let o = coli_in(
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
