//! Helpers the `coli` integration tests share (each test file uses a subset).
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// Every fixture family present (each has ref.json), by name.
pub fn families() -> Vec<(String, PathBuf)> {
    let mut f: Vec<_> = std::fs::read_dir(fixtures())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|d| d.join("ref.json").exists())
        .map(|d| (d.file_name().unwrap().to_string_lossy().into_owned(), d))
        .collect();
    f.sort();
    assert!(!f.is_empty(), "no fixtures under {}", fixtures().display());
    f
}

/// A fixture's ref.json (transformers' prompt, greedy ids, logits).
pub fn reference(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("ref.json")).unwrap()).unwrap()
}

pub fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Ids as `--prompt-ids` takes them.
pub fn csv(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The daemon binary is found next to `coli` (as in an install); when it is missing there
/// (e.g. `cargo test -p colibri-client` alone), it is built first, in the same profile.
pub fn ensure_daemon_binary() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let coli = Path::new(env!("CARGO_BIN_EXE_coli"));
        let daemon = coli.with_file_name(format!("colibrid{}", std::env::consts::EXE_SUFFIX));
        if daemon.is_file() {
            return;
        }
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "colibri-daemon", "--bin", "colibrid"]);
        if coli.parent().unwrap().ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build for colibrid");
        assert!(
            status.success() && daemon.is_file(),
            "could not build {}",
            daemon.display()
        );
    });
}
