//! Where colibrid listens: a Unix domain socket (a named pipe on Windows), private to the
//! user who runs it.
//!
//! Unix:
//! - default path `$XDG_RUNTIME_DIR/colibri/colibrid.sock`, else `~/.colibri/run/colibrid.sock`;
//! - a directory the daemon creates is 0700, the socket is 0600, and every accepted
//!   connection's peer uid (SO_PEERCRED / getpeereid) must equal the daemon's uid;
//! - `<socket>.lock` (flock) makes "one daemon per socket" race-free: a second daemon finds
//!   the lock held and refuses to start; with the lock held, an existing socket file is
//!   stale and is replaced;
//! - systemd socket activation: a listening socket passed as fd 3 (LISTEN_FDS/LISTEN_PID)
//!   is used as is.
//!
//! Windows: `\\.\pipe\colibri-<user>-colibrid` (or `--socket`), first instance exclusive,
//! remote clients rejected; the pipe's default security gives write access only to the
//! creating user, SYSTEM and administrators.

use std::io;
use std::path::{Path, PathBuf};

/// Why the daemon could not start listening.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error(
        "another colibrid is already running on {0} (stop it with `coli stop`, or pass a different --socket)"
    )]
    AlreadyRunning(PathBuf),
    #[error("{path}: {msg}")]
    Unusable { path: PathBuf, msg: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ListenError + '_ {
    move |source| ListenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The default endpoint for this user.
pub fn default_socket_path() -> PathBuf {
    #[cfg(windows)]
    {
        let user = std::env::var("USERNAME").unwrap_or_else(|_| "user".into());
        let user: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        PathBuf::from(format!(r"\\.\pipe\colibri-{user}-colibrid"))
    }
    #[cfg(not(windows))]
    {
        match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d).join("colibri").join("colibrid.sock"),
            None => crate::state::home_dir()
                .join(".colibri")
                .join("run")
                .join("colibrid.sock"),
        }
    }
}

#[cfg(unix)]
pub use unix::*;

#[cfg(unix)]
mod unix {
    use super::*;
    use crate::authority::FixAuthority;
    use std::fs;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use tokio::net::{UnixListener, UnixStream};
    use tokio_stream::wrappers::ReceiverStream;

    /// A bound, listening socket plus what must be cleaned up when the daemon exits.
    pub struct Endpoint {
        /// Blocking-mode std listener: bound before the async runtime starts, turned into a
        /// tokio listener by [`incoming`].
        pub listener: std::os::unix::net::UnixListener,
        pub path: PathBuf,
        /// False for a socket inherited from systemd: systemd owns that file.
        pub owns_path: bool,
        /// Held (flock) for the daemon's lifetime.
        _lock: Option<fs::File>,
        /// (device, inode) of the socket file this daemon created.
        identity: Option<(u64, u64)>,
    }

    impl Endpoint {
        /// Removes the socket file (when this daemon created it and it is still ours).
        pub fn cleanup(&self) {
            if self.owns_path && !self.socket_gone() {
                let _ = fs::remove_file(&self.path);
            }
        }

        /// True once the socket file this daemon created is gone or replaced: nobody can
        /// reach the daemon any more (its folder was deleted, e.g. a test's temporary
        /// folder), so it should save its state and exit rather than live on unreachable.
        /// Always false for a socket systemd owns.
        pub fn socket_gone(&self) -> bool {
            let Some(id) = self.identity else {
                return false;
            };
            match fs::symlink_metadata(&self.path) {
                Ok(md) => (md.dev(), md.ino()) != id,
                Err(e) => e.kind() == io::ErrorKind::NotFound,
            }
        }
    }

    pub fn current_uid() -> u32 {
        // SAFETY: getuid has no preconditions and cannot fail.
        unsafe { libc::getuid() }
    }

    /// A listening socket inherited through systemd socket activation, if any.
    fn inherited_listener() -> Option<std::os::unix::net::UnixListener> {
        const SD_LISTEN_FDS_START: RawFd = 3;
        let pid: u32 = std::env::var("LISTEN_PID").ok()?.trim().parse().ok()?;
        let fds: u32 = std::env::var("LISTEN_FDS").ok()?.trim().parse().ok()?;
        if pid != std::process::id() || fds < 1 {
            return None;
        }
        // These describe this process only; children must not pick them up.
        std::env::remove_var("LISTEN_PID");
        std::env::remove_var("LISTEN_FDS");
        std::env::remove_var("LISTEN_FDNAMES");
        let fd = SD_LISTEN_FDS_START;
        // SAFETY: fstat on an fd number only reads; the result is checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 || (st.st_mode & libc::S_IFMT) != libc::S_IFSOCK
        {
            tracing::warn!("LISTEN_FDS set but fd 3 is not a socket; ignoring it");
            return None;
        }
        // SAFETY: systemd handed us fd 3 for this process (LISTEN_PID matched) and nothing
        // else in the daemon owns it.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            Some(std::os::unix::net::UnixListener::from(
                OwnedFd::from_raw_fd(fd),
            ))
        }
    }

    /// Takes `<socket>.lock`; Err(AlreadyRunning) when another daemon holds it.
    fn take_lock(path: &Path) -> Result<fs::File, ListenError> {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        let _ = f.set_permissions(fs::Permissions::from_mode(0o600));
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Err(ListenError::AlreadyRunning(path.to_path_buf()));
            }
            return Err(io_err(&lock_path)(e));
        }
        Ok(f)
    }

    /// Creates the socket's directory 0700 when it is missing; warns when an existing one
    /// is open to others (the socket's own mode and the uid check still protect it).
    fn prepare_dir(path: &Path) -> Result<(), ListenError> {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.exists() {
            crate::state::create_private_dir(dir).map_err(io_err(dir))?;
            return Ok(());
        }
        let md = fs::metadata(dir).map_err(io_err(dir))?;
        if md.uid() == current_uid()
            && md.mode() & 0o077 != 0
            && path == super::default_socket_path()
        {
            // Our own default directory: make it private again.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io_err(dir))?;
        } else if md.mode() & 0o077 != 0 {
            tracing::warn!(
                "{} is accessible to other users (mode {:o}); the socket is 0600 and peers are uid-checked",
                dir.display(),
                md.mode() & 0o777
            );
        }
        Ok(())
    }

    /// Binds the daemon's socket (or takes the one systemd passed). Call before starting
    /// threads: it reads and clears the socket-activation environment variables.
    pub fn bind(path: &Path) -> Result<Endpoint, ListenError> {
        if let Some(listener) = inherited_listener() {
            listener.set_nonblocking(true).map_err(io_err(path))?;
            let path = listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_path_buf))
                .unwrap_or_else(|| path.to_path_buf());
            tracing::info!("using the socket passed by systemd: {}", path.display());
            return Ok(Endpoint {
                listener,
                path,
                owns_path: false,
                _lock: None,
                identity: None,
            });
        }
        prepare_dir(path)?;
        let lock = take_lock(path)?;
        match fs::symlink_metadata(path) {
            Ok(md) if md.file_type().is_socket() => {
                // With the lock ours, nobody should answer; if someone does (a daemon of a
                // build without the lock), do not steal its socket.
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(ListenError::AlreadyRunning(path.to_path_buf()));
                }
                tracing::info!("removing stale socket {}", path.display());
                fs::remove_file(path).map_err(io_err(path))?;
            }
            Ok(_) => {
                return Err(ListenError::Unusable {
                    path: path.to_path_buf(),
                    msg: "exists and is not a socket; refusing to replace it".into(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(path)(e)),
        }
        let listener = std::os::unix::net::UnixListener::bind(path).map_err(io_err(path))?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(io_err(path))?;
        listener.set_nonblocking(true).map_err(io_err(path))?;
        let md = fs::symlink_metadata(path).map_err(io_err(path))?;
        Ok(Endpoint {
            listener,
            path: path.to_path_buf(),
            owns_path: true,
            _lock: Some(lock),
            identity: Some((md.dev(), md.ino())),
        })
    }

    /// The accepted connections whose peer runs as this daemon's uid; others are closed
    /// at once and logged.
    /// Must run inside the tokio runtime.
    pub fn incoming(
        listener: std::os::unix::net::UnixListener,
    ) -> io::Result<ReceiverStream<io::Result<FixAuthority<UnixStream>>>> {
        let listener = UnixListener::from_std(listener)?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let uid = current_uid();
        tokio::spawn(async move {
            loop {
                let (stream, _) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!("accept: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                match stream.peer_cred() {
                    Ok(c) if c.uid() == uid => {
                        // C-core clients' socket-path :authority is made acceptable to h2.
                        if tx.send(Ok(FixAuthority::new(stream))).await.is_err() {
                            return;
                        }
                    }
                    Ok(c) => tracing::warn!(
                        "refused a connection from uid {} (pid {:?}): only uid {uid} may use this daemon",
                        c.uid(),
                        c.pid()
                    ),
                    Err(e) => tracing::warn!("refused a connection whose peer is unknown: {e}"),
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }
}

#[cfg(windows)]
pub use windows::*;

#[cfg(windows)]
mod windows {
    use super::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};
    use tokio_stream::wrappers::ReceiverStream;

    /// One client connection on the named pipe.
    pub struct PipeConn(NamedPipeServer);

    impl tonic::transport::server::Connected for PipeConn {
        type ConnectInfo = ();
        fn connect_info(&self) -> Self::ConnectInfo {}
    }

    impl AsyncRead for PipeConn {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for PipeConn {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
        }
        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_flush(cx)
        }
        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
        }
    }

    pub struct Endpoint {
        pub path: PathBuf,
    }

    impl Endpoint {
        pub fn cleanup(&self) {}
        /// A named pipe has no file that could be deleted under the daemon.
        pub fn socket_gone(&self) -> bool {
            false
        }
    }

    /// Named pipes need the async runtime to be created; the real work is in [`incoming`].
    pub fn bind(path: &Path) -> Result<Endpoint, ListenError> {
        Ok(Endpoint {
            path: path.to_path_buf(),
        })
    }

    /// Creates the first instance of the pipe (failing when another daemon owns the name),
    /// then yields connected clients; a fresh instance is created before each hand-off so
    /// a new client can always connect. Must run inside the tokio runtime.
    pub fn incoming(ep: &Endpoint) -> Result<ReceiverStream<io::Result<PipeConn>>, ListenError> {
        let path = ep.path.clone();
        let first = ServerOptions::new()
            .first_pipe_instance(true)
            .reject_remote_clients(true)
            .create(&path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::PermissionDenied {
                    ListenError::AlreadyRunning(path.clone())
                } else {
                    io_err(&path)(e)
                }
            })?;
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut server = first;
            loop {
                if let Err(e) = server.connect().await {
                    tracing::warn!("named pipe connect: {e}");
                    continue;
                }
                let next = match ServerOptions::new()
                    .reject_remote_clients(true)
                    .create(&path)
                {
                    Ok(n) => n,
                    Err(e) => {
                        tracing::error!("named pipe: cannot create the next instance: {e}");
                        return;
                    }
                };
                let connected = std::mem::replace(&mut server, next);
                if tx.send(Ok(PipeConn(connected))).await.is_err() {
                    return;
                }
            }
        });
        Ok(ReceiverStream::new(rx))
    }
}
