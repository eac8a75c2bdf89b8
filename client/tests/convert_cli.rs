//! `coli convert`, `coli synth` and `coli bench` as a user runs them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn dir_bytes(d: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn convert_cmd(out: &Path) -> Command {
    let mut c = coli();
    c.args(["convert", "--input"])
        .arg(fixture("mixtral"))
        .arg("--output")
        .arg(out)
        .args(["--experts", "int4", "--group-size", "32"]);
    c
}

#[test]
fn convert_killed_mid_way_then_rerun_gives_identical_bytes() {
    let whole = tempfile::tempdir().unwrap();
    let st = convert_cmd(whole.path()).status().unwrap();
    assert!(st.success());
    let want = dir_bytes(whole.path());

    let cut = tempfile::tempdir().unwrap();
    let mut child = convert_cmd(cut.path())
        .env("COLIBRI_CONVERT_PAUSE_MS", "400")
        .spawn()
        .unwrap();
    // Wait until at least one part is recorded, then kill -9.
    let manifest = cut.path().join(".colibri-convert.json");
    let t = std::time::Instant::now();
    while !manifest.exists() && t.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(manifest.exists(), "the converter recorded no part in 30 s");
    assert!(
        !cut.path().join("model.safetensors.index.json").exists(),
        "killed too late"
    );
    assert!(
        cut.path().join(".colibri-convert.lock").exists(),
        "the kill should leave the lock"
    );

    let out = convert_cmd(cut.path()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains(" 0 already done"),
        "nothing was resumed: {err}"
    );
    assert_eq!(dir_bytes(cut.path()), want);
}

#[test]
fn convert_reports_bad_input_clearly() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = coli()
        .args(["convert", "--input", "/nonexistent/model", "--output"])
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model"), "{err}");
    let out = coli()
        .args(["convert", "--input"])
        .arg(fixture("olmoe"))
        .arg("--output")
        .arg(out_dir.path())
        .args(["--group-size", "48"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("48"));
}

#[test]
fn synth_writes_a_loadable_full_shape_model() {
    let out = tempfile::tempdir().unwrap();
    let st = coli()
        .args([
            "synth",
            "--like",
            "olmoe-1b-7b",
            "--layers",
            "1",
            "--output",
        ])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(st.success());
    let ck = colibri_engine::container::Checkpoint::open(out.path()).unwrap();
    assert!(ck.is_container);
    // 64 experts in layer 0, each one aligned extent holding its three matrices and scales.
    assert_eq!(ck.expert_extents.len(), 64);
    for (name, (_, e)) in &ck.expert_extents {
        assert_eq!(e.offset % 4096, 0, "{name}");
        assert_eq!(e.length % 4096, 0, "{name}");
        assert!(e.length as usize >= 3 * 2048 * 1024 / 2, "{name}");
    }
    let m = colibri_engine::Model::load(out.path()).unwrap();
    assert_eq!(m.info.vocab_size, 50304);
    let logits = m.score(&[1, 2, 3]).unwrap();
    assert_eq!(logits.len(), 3 * 50304);
    assert!(logits.iter().all(|v| v.is_finite()));
    // Fully random routers: different tokens pick different experts.
    let out = coli()
        .args(["bench", "--model"])
        .arg(out.path())
        .args(["--threads", "2", "--prompt", "4", "--tokens", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("decode") && s.contains("peak RSS") && s.contains("read bandwidth"),
        "{s}"
    );
}
