//! Running the real `colibrid` for end-to-end tests.
//!
//! Cargo only builds a package's binaries for that package's own integration tests, so
//! tests in this crate build `colibrid` (and `coli`) with a nested `cargo build` into the
//! same target directory and profile as the running test (once per test process), unless
//! `COLIBRID_BIN` / `COLI_BIN` point at a prebuilt binary.

use colibri_proto::v1 as pb;
use colibri_proto::v1::colibri_client::ColibriClient;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// Path of the workspace binary `bin`, built for this test run's profile.
pub fn workspace_bin(bin: &str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let var = format!("{}_BIN", bin.to_uppercase());
    if let Some(p) = std::env::var_os(&var) {
        return PathBuf::from(p);
    }
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(bin) {
        return p.clone();
    }
    // The test executable is <target>/<profile dir>/deps/<name>-<hash>.
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("<target>/<profile>/deps");
    let target_dir = profile_dir.parent().expect("<target>");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // Build every workspace binary, not just this package's, so `colibrid` and `coli` come
    // from the same build as the test (after `cargo test --workspace` a no-op). A daemon
    // built alone was once seen to differ in the last bit; rechecked since, a `colibrid`
    // built alone gives the same bits on every fixture (only libc's `extra_traits` feature
    // differs between the two builds). The difference was most likely engine source
    // changed between the two builds in a shared tree.
    cmd.args(["build", "--quiet", "--workspace", "--bins"])
        .args(if release {
            ["--profile", "release"]
        } else {
            ["--profile", "test"]
        })
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running cargo to build {bin}: {e}"));
    assert!(
        status.success(),
        "cargo build --workspace --bins (for {bin}) failed"
    );
    let path = profile_dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.exists(), "{} missing after the build", path.display());
    built.insert(bin.to_string(), path.clone());
    path
}

pub fn colibrid_bin() -> PathBuf {
    workspace_bin("colibrid")
}

/// A `colibrid` child process on a private socket and state directory.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `colibrid --socket SOCKET --state-dir STATE ARGS..` and waits until it answers.
    pub fn start(socket: &Path, state_dir: &Path, args: &[&str]) -> Daemon {
        Self::start_with_env(socket, state_dir, args, &[])
    }

    /// [`start`](Self::start) with extra environment variables (test hooks of the daemon).
    pub fn start_with_env(
        socket: &Path,
        state_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let log = state_dir.with_extension(format!("{}.log", std::process::id()));
        let child = Self::spawn_with_env(socket, state_dir, args, &log, env);
        let mut d = Daemon {
            child,
            socket: socket.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            log,
        };
        d.wait_ready();
        d
    }

    /// Spawns without waiting (for tests of refusals).
    pub fn spawn(socket: &Path, state_dir: &Path, args: &[&str], log: &Path) -> Child {
        Self::spawn_with_env(socket, state_dir, args, log, &[])
    }

    fn spawn_with_env(
        socket: &Path,
        state_dir: &Path,
        args: &[&str],
        log: &Path,
        env: &[(&str, &str)],
    ) -> Child {
        let log_file = std::fs::File::create(log).expect("daemon log file");
        Command::new(colibrid_bin())
            .arg("--socket")
            .arg(socket)
            .arg("--state-dir")
            .arg(state_dir)
            .args(args)
            .env("COLIBRID_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log fd"))
            .stderr(log_file)
            .spawn()
            .expect("spawn colibrid")
    }

    fn wait_ready(&mut self) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("colibrid exited early ({st}):\n{}", self.log_text());
            }
            #[cfg(unix)]
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "colibrid did not start listening within 60 s:\n{}",
            self.log_text()
        );
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn client(&self) -> ColibriClient<Channel> {
        colibri_proto::connect::client(&self.socket)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e:?}", self.socket.display()))
    }

    /// Sends SIGTERM and waits (at most 60 s) for the exit status.
    #[cfg(unix)]
    pub fn terminate(&mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        self.wait_exit(Duration::from_secs(60))
    }

    /// SIGKILL: no chance to clean up.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                panic!(
                    "colibrid did not exit within {limit:?}:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Loads `model` (a folder, or an id the daemon knows) through LoadModel, reads its progress
/// to the end and returns the loaded model's info (the last message must say Ready).
pub async fn load_model(
    c: &mut ColibriClient<Channel>,
    model: &str,
    expert_cache_bytes: Option<u64>,
) -> pb::ModelInfo {
    let mut s = c
        .load_model(pb::LoadModelRequest {
            model: model.to_string(),
            expert_cache_bytes,
        })
        .await
        .unwrap_or_else(|e| panic!("LoadModel {model}: {e}"))
        .into_inner();
    let mut last = None;
    while let Some(p) = s.message().await.unwrap() {
        last = Some(p);
    }
    let last = last.expect("LoadModel sent progress");
    assert_eq!(
        last.stage,
        pb::load_model_progress::Stage::Ready as i32,
        "LoadModel {model} ended before Ready"
    );
    last.info
        .expect("the Ready message carries the model's info")
}

/// The loopback address of the daemon's HTTP listener, from `Status.http_url`
/// (`http://ADDR/v1`).
pub async fn http_addr(c: &mut ColibriClient<Channel>) -> std::net::SocketAddr {
    let url = c
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner()
        .http_url;
    url.strip_prefix("http://")
        .and_then(|u| u.strip_suffix("/v1"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("Status.http_url {url:?}"))
}
