//! Helpers the `coli` integration tests share (each test file uses a subset).
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
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

/// A daemon endpoint private to one test: its socket and state folder live in a temporary
/// folder, and the daemon is stopped when the test ends (even on failure).
pub struct Daemon {
    pub dir: tempfile::TempDir,
}

impl Daemon {
    pub fn new() -> Daemon {
        ensure_daemon_binary();
        Daemon {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run").join("colibrid.sock")
    }

    pub fn coli(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_coli"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .env("COLIBRI_STATE_DIR", self.dir.path().join("state"))
            .env_remove("COLI_SOCKET")
            .env_remove("COLI_NO_AUTOSTART")
            .output()
            .expect("spawn coli")
    }

    /// Runs coli and returns stdout, failing the test on a non-zero exit.
    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.coli(args);
        assert!(
            o.status.success(),
            "coli {args:?} failed: {}\ndaemon log: {}",
            String::from_utf8_lossy(&o.stderr),
            std::fs::read_to_string(self.dir.path().join("state/colibrid.log")).unwrap_or_default()
        );
        String::from_utf8(o.stdout).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.coli(&["stop", "--timeout", "30"]);
    }
}

/// Runs coli in-process (`--local` in `args`), never touching a daemon.
pub fn local(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env("COLI_SOCKET", "/nonexistent/colibri-test.sock")
        .output()
        .expect("spawn coli");
    assert!(
        o.status.success(),
        "coli {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// `coli ARGS` with its own state folder and no daemon socket from the environment
/// (`coli` may start a daemon of its own there).
pub fn coli_in(args: &[&str], state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_coli"))
        .args(args)
        .env("COLIBRI_STATE_DIR", state)
        .env_remove("COLI_SOCKET")
        .env_remove("COLI_NO_AUTOSTART")
        .output()
        .expect("spawn coli")
}

/// Its stdout, asserting it succeeded (stderr in the failure).
pub fn ok_stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "coli failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}
