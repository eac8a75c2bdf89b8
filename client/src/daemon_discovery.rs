//! Finding colibrid: the socket path (`--socket`, `COLI_SOCKET`, else the daemon's own
//! default), connecting over it, and starting the daemon detached when nobody answers.

use crate::args::Global;
use crate::progress;
use anyhow::{anyhow, Context};
use colibri_proto::v1::colibri_client::ColibriClient;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

pub type Client = ColibriClient<Channel>;

/// How long a freshly started daemon may take to answer its health check.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest message coli accepts: `score` returns positions × vocab floats.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

pub fn socket_path(global: &Global) -> PathBuf {
    global
        .socket
        .clone()
        .unwrap_or_else(colibri_daemon::transport::default_socket_path)
}

pub fn state_dir(global: &Global) -> PathBuf {
    global
        .state_dir
        .clone()
        .unwrap_or_else(colibri_daemon::state::default_state_dir)
}

/// A runtime for one command: coli does one thing at a time, a single thread is enough.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Opens a channel to the socket; fails at once when nothing listens there.
pub async fn connect(socket: &Path) -> anyhow::Result<Channel> {
    // A daemon that accepts but never answers must not hang coli.
    let channel = tokio::time::timeout(
        Duration::from_secs(5),
        colibri_proto::connect::channel(socket),
    )
    .await
    .map_err(|_| anyhow!("{} accepted no connection within 5 s", socket.display()))??;
    Ok(channel)
}

pub fn client(channel: Channel) -> Client {
    ColibriClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// True when the daemon behind `channel` reports SERVING on grpc.health.v1.
pub async fn healthy(channel: Channel) -> bool {
    let mut h = HealthClient::new(channel);
    let req = HealthCheckRequest {
        service: String::new(),
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), h.check(req)).await,
        Ok(Ok(r)) if r.get_ref().status == ServingStatus::Serving as i32
    )
}

/// A client of a running, healthy daemon, or None when nothing usable answers.
pub async fn try_connect(socket: &Path) -> Option<Client> {
    let channel = connect(socket).await.ok()?;
    healthy(channel.clone()).await.then(|| client(channel))
}

/// A client of the daemon, starting it detached first when none answers.
pub async fn ensure(global: &Global) -> anyhow::Result<Client> {
    let socket = socket_path(global);
    if let Some(c) = try_connect(&socket).await {
        return Ok(c);
    }
    if global.no_autostart {
        anyhow::bail!(
            "colibrid is not running on {} (start it with `colibrid --socket {}`, or drop --no-autostart)",
            socket.display(),
            socket.display()
        );
    }
    start_daemon(global, &socket).await
}

/// The colibrid binary: next to this coli (an install or a cargo target folder), else PATH.
pub fn daemon_binary() -> PathBuf {
    let name = format!("colibrid{}", std::env::consts::EXE_SUFFIX);
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(&name)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

async fn start_daemon(global: &Global, socket: &Path) -> anyhow::Result<Client> {
    let state = state_dir(global);
    colibri_daemon::state::create_private_dir(&state)
        .with_context(|| format!("creating the state folder {}", state.display()))?;
    let log_path = state.join("colibrid.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening the daemon log {}", log_path.display()))?;
    let bin = daemon_binary();
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("--socket").arg(socket);
    if global.state_dir.is_some() {
        cmd.arg("--state-dir").arg(&state);
    }
    // Its output goes to a file: no terminal colour codes.
    cmd.env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().context("duplicating the log handle")?)
        .stderr(log);
    detach(&mut cmd);
    let pb = progress::spinner(format!("starting colibrid on {}", socket.display()));
    let mut child = cmd.spawn().with_context(|| {
        format!(
            "starting {} (is colibrid installed next to coli?)",
            bin.display()
        )
    })?;
    let start = Instant::now();
    let mut wait = Duration::from_millis(20);
    let result = loop {
        if let Some(c) = try_connect(socket).await {
            break Ok(c);
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Another coli may have started a daemon at the same time: ours then refuses to
            // start, and theirs is the one to use.
            if let Some(c) = try_connect(socket).await {
                break Ok(c);
            }
            break Err(anyhow!(
                "colibrid exited ({status}) before answering on {}: {}",
                socket.display(),
                log_tail(&log_path)
            ));
        }
        if start.elapsed() > START_TIMEOUT {
            break Err(anyhow!(
                "colibrid did not answer on {} within {} s (see {})",
                socket.display(),
                START_TIMEOUT.as_secs(),
                log_path.display()
            ));
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(250));
    };
    pb.finish_and_clear();
    result
}

/// Runs the daemon in its own process group (session on Windows) so that Ctrl-C in this
/// terminal does not reach it and it outlives coli.
fn detach(cmd: &mut std::process::Command) {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    #[cfg(windows)]
    {
        use std::os::windows::process::CommandExt;
        const DETACHED_PROCESS: u32 = 0x0000_0008;
        const CREATE_NEW_PROCESS_GROUP: u32 = 0x0000_0200;
        cmd.creation_flags(DETACHED_PROCESS | CREATE_NEW_PROCESS_GROUP);
        keep_std_handles_to_ourselves();
    }
}

/// Makes coli's own standard handles non-inheritable. Windows children inherit every
/// inheritable handle (Rust spawns with bInheritHandles), and a parent that captures coli's
/// output hands coli inheritable pipe ends: the daemon, which outlives coli, would hold
/// them open, and whoever reads coli's output (a script's `$(coli run ...)`, Python's
/// subprocess) would wait for the daemon to exit. The daemon gets its own standard handles
/// (the log file) explicitly; a later child given `Stdio::inherit()` gets a duplicate.
#[cfg(windows)]
fn keep_std_handles_to_ourselves() {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Foundation::{SetHandleInformation, HANDLE_FLAG_INHERIT};
    let handles = [
        std::io::stdin().as_raw_handle(),
        std::io::stdout().as_raw_handle(),
        std::io::stderr().as_raw_handle(),
    ];
    for h in handles.into_iter().filter(|h| !h.is_null()) {
        // SAFETY: a standard handle of this process; only its inherit flag changes. A
        // console pseudo-handle may refuse: nothing to leak then.
        unsafe { SetHandleInformation(h.cast(), HANDLE_FLAG_INHERIT, 0) };
    }
}

/// The last meaningful line of the daemon log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| format!("{} (log: {})", l.trim(), path.display()))
        .unwrap_or_else(|| format!("see {}", path.display()))
}

/// A gRPC status as a one-line error: the daemon's message, with the code when the
/// message alone does not say what kind of failure it was.
pub fn status_error(s: tonic::Status) -> anyhow::Error {
    use tonic::Code;
    match s.code() {
        Code::InvalidArgument
        | Code::NotFound
        | Code::FailedPrecondition
        | Code::ResourceExhausted
        | Code::AlreadyExists
        | Code::OutOfRange => anyhow!("{}", s.message()),
        Code::Unavailable => anyhow!("the daemon is unavailable: {}", s.message()),
        code => anyhow!("{code:?}: {}", s.message()),
    }
}

/// `?`-friendly conversion of RPC results.
pub trait RpcResult<T> {
    fn rpc(self) -> anyhow::Result<T>;
}

impl<T> RpcResult<T> for Result<tonic::Response<T>, tonic::Status> {
    fn rpc(self) -> anyhow::Result<T> {
        self.map(tonic::Response::into_inner).map_err(status_error)
    }
}
