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
//! Windows: `\\.\pipe\colibri-<user>-colibrid` (or `--socket`, a `\\.\pipe\NAME`):
//! - every instance carries an explicit DACL with one entry, full access for the user the
//!   daemon runs as (`windows::security`); remote clients are rejected;
//! - one daemon per pipe: a session-local mutex named after the pipe (the counterpart of the
//!   `.lock` file), a probe that opens the pipe as a client, and FILE_FLAG_FIRST_PIPE_INSTANCE
//!   on the first instance (Wine ignores that flag: the other two still refuse there);
//! - packaging/windows/README.md has the whole model and what Wine cannot test.

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

/// What a Windows endpoint name must look like, and the name of the lock that keeps one daemon
/// per pipe. Plain string logic: compiled (and unit-tested) on every platform.
pub mod pipe_name {
    /// The prefix of a local named pipe's name.
    pub const PREFIX: &str = r"\\.\pipe\";

    /// Why `name` cannot be a local named pipe's name, if it cannot: Windows has no socket
    /// files, so `--socket` takes `\\.\pipe\NAME` (NAME without backslashes, at most 256
    /// characters in all, the limit of CreateNamedPipe).
    pub fn check(name: &str) -> Result<(), String> {
        let rest = name
            .get(..PREFIX.len())
            .filter(|p| p.eq_ignore_ascii_case(PREFIX))
            .map(|_| &name[PREFIX.len()..])
            .ok_or_else(|| {
                format!("a named pipe's name starts with {PREFIX} (e.g. {PREFIX}colibri-mine)")
            })?;
        if rest.is_empty() {
            return Err(format!("a named pipe needs a name after {PREFIX}"));
        }
        if rest.contains('\\') || rest.contains('/') {
            // Windows allows backslashes in pipe names, but a `/` usually means a Unix socket
            // path was passed; both are refused to keep the lock name one-to-one.
            return Err("a named pipe's name has no further \\ or / after \\\\.\\pipe\\".into());
        }
        if name.encode_utf16().count() > 256 {
            return Err("a named pipe's name is at most 256 characters".into());
        }
        Ok(())
    }

    /// The session-local mutex held by the daemon serving `name` (pipe names are
    /// case-insensitive, so is this): `Local\colibri-pipe-<fnv1a64 of the lowercase name>`.
    pub fn lock_name(name: &str) -> String {
        let lower = name.to_lowercase();
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in lower.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!(r"Local\colibri-pipe-{h:016x}")
    }

    /// What a client's attempt to open the pipe says about it: `Ok` (an instance was free)
    /// or ERROR_PIPE_BUSY (231: all instances are connected) mean a server is there;
    /// ERROR_FILE_NOT_FOUND (2) means nobody serves the name; anything else is unknown and is
    /// left to CreateNamedPipe's own refusal.
    pub fn probe_says_served(open: Result<(), Option<i32>>) -> bool {
        const ERROR_PIPE_BUSY: i32 = 231;
        match open {
            Ok(()) => true,
            Err(code) => code == Some(ERROR_PIPE_BUSY),
        }
    }

    /// Whether CreateNamedPipe's error on the first instance means another server owns the
    /// name: ERROR_ACCESS_DENIED (5, the FILE_FLAG_FIRST_PIPE_INSTANCE refusal, or a pipe
    /// whose DACL is not ours) or ERROR_PIPE_BUSY (231: all its instances are taken).
    pub fn create_error_means_taken(code: Option<i32>) -> bool {
        matches!(code, Some(5) | Some(231))
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

    /// The pipe's security: a DACL with one entry, full access for the user this process
    /// runs as, protected from inheritance. Nobody else (not other users, not
    /// administrators or SYSTEM unless they take ownership first) may open the pipe: the
    /// Windows counterpart of the 0600 socket and the SO_PEERCRED check.
    pub mod security {
        use std::io;
        use std::mem::size_of;
        use windows_sys::Win32::Foundation::{CloseHandle, HANDLE};
        use windows_sys::Win32::Security::{
            AddAccessAllowedAce, CopySid, EqualSid, GetAce, GetKernelObjectSecurity, GetLengthSid,
            GetSecurityDescriptorDacl, GetTokenInformation, InitializeAcl,
            InitializeSecurityDescriptor, SetSecurityDescriptorControl, SetSecurityDescriptorDacl,
            TokenUser, ACCESS_ALLOWED_ACE, ACE_HEADER, ACL, ACL_REVISION,
            DACL_SECURITY_INFORMATION, PSID, SECURITY_ATTRIBUTES, SECURITY_DESCRIPTOR,
            SE_DACL_PROTECTED, TOKEN_QUERY, TOKEN_USER,
        };
        use windows_sys::Win32::System::SystemServices::SECURITY_DESCRIPTOR_REVISION;
        use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

        /// FILE_ALL_ACCESS: connect, read, write, and create further instances.
        pub const PIPE_ACCESS: u32 = 0x001F_01FF;
        const ACCESS_ALLOWED_ACE_TYPE: u8 = 0;

        fn check(ok: i32) -> io::Result<()> {
            if ok == 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }

        /// The SID of the user this process runs as (its token's user), copied.
        pub fn current_user_sid() -> io::Result<Vec<u64>> {
            let mut token: HANDLE = std::ptr::null_mut();
            // SAFETY: the pseudo-handle of this process; `token` receives a handle we close.
            check(unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) })?;
            let result = (|| {
                let mut len = 0u32;
                // SAFETY: a size query (null buffer, length 0); it fails with
                // ERROR_INSUFFICIENT_BUFFER and sets `len`.
                unsafe { GetTokenInformation(token, TokenUser, std::ptr::null_mut(), 0, &mut len) };
                let mut buf = vec![0u64; (len as usize).div_ceil(8).max(1)];
                // SAFETY: `buf` has `len` bytes, 8-aligned (TOKEN_USER's alignment).
                check(unsafe {
                    GetTokenInformation(
                        token,
                        TokenUser,
                        buf.as_mut_ptr().cast(),
                        (buf.len() * 8) as u32,
                        &mut len,
                    )
                })?;
                // SAFETY: GetTokenInformation filled a TOKEN_USER at the buffer's start; its
                // SID points into the same buffer.
                let sid = unsafe { (*buf.as_ptr().cast::<TOKEN_USER>()).User.Sid };
                let sid_len = unsafe { GetLengthSid(sid) };
                let mut out = vec![0u64; (sid_len as usize).div_ceil(8)];
                // SAFETY: `out` holds `sid_len` bytes.
                check(unsafe { CopySid(sid_len, out.as_mut_ptr().cast(), sid) })?;
                Ok(out)
            })();
            // SAFETY: `token` was opened above.
            unsafe { CloseHandle(token) };
            result
        }

        /// SECURITY_ATTRIBUTES for CreateNamedPipe, with the buffers they point into.
        pub struct PipeSecurity {
            sid: Vec<u64>,
            _acl: Vec<u64>,
            _sd: Box<SECURITY_DESCRIPTOR>,
            attrs: Box<SECURITY_ATTRIBUTES>,
        }

        // SAFETY: the raw pointers point into heap buffers this value owns and never
        // changes after `owner_only` built them; Windows only reads them.
        unsafe impl Send for PipeSecurity {}
        unsafe impl Sync for PipeSecurity {}

        impl PipeSecurity {
            /// Full access for the current user, nothing for anyone else.
            pub fn owner_only() -> io::Result<PipeSecurity> {
                let sid = current_user_sid()?;
                let psid: PSID = sid.as_ptr() as PSID;
                // SAFETY: `psid` is a valid SID (copied by CopySid).
                let sid_len = unsafe { GetLengthSid(psid) } as usize;
                let acl_len = (size_of::<ACL>() + size_of::<ACCESS_ALLOWED_ACE>()
                    - size_of::<u32>()
                    + sid_len)
                    .next_multiple_of(4);
                let mut acl = vec![0u64; acl_len.div_ceil(8)];
                let pacl: *mut ACL = acl.as_mut_ptr().cast();
                // SAFETY (this block): every pointer is to a buffer of the size passed and
                // lives in `PipeSecurity` as long as the descriptor does.
                let mut sd: Box<SECURITY_DESCRIPTOR> = Box::new(unsafe { std::mem::zeroed() });
                let psd = (&mut *sd as *mut SECURITY_DESCRIPTOR).cast();
                unsafe {
                    check(InitializeAcl(pacl, acl_len as u32, ACL_REVISION))?;
                    check(AddAccessAllowedAce(pacl, ACL_REVISION, PIPE_ACCESS, psid))?;
                    check(InitializeSecurityDescriptor(
                        psd,
                        SECURITY_DESCRIPTOR_REVISION,
                    ))?;
                    check(SetSecurityDescriptorDacl(psd, 1, pacl, 0))?;
                    check(SetSecurityDescriptorControl(
                        psd,
                        SE_DACL_PROTECTED,
                        SE_DACL_PROTECTED,
                    ))?;
                }
                let attrs = Box::new(SECURITY_ATTRIBUTES {
                    nLength: size_of::<SECURITY_ATTRIBUTES>() as u32,
                    lpSecurityDescriptor: psd,
                    bInheritHandle: 0,
                });
                Ok(PipeSecurity {
                    sid,
                    _acl: acl,
                    _sd: sd,
                    attrs,
                })
            }

            /// For `ServerOptions::create_with_security_attributes_raw`.
            pub fn as_raw(&self) -> *mut core::ffi::c_void {
                (&*self.attrs as *const SECURITY_ATTRIBUTES)
                    .cast_mut()
                    .cast()
            }

            pub fn sid(&self) -> PSID {
                self.sid.as_ptr() as PSID
            }
        }

        /// One entry of an object's DACL: its type, access mask and whether its SID is the
        /// current user's.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Entry {
            pub ace_type: u8,
            pub mask: u32,
            pub is_current_user: bool,
        }

        /// The DACL of a kernel object (None: no DACL at all, i.e. open to everyone).
        pub fn dacl_of(
            object: &impl std::os::windows::io::AsRawHandle,
        ) -> io::Result<Option<Vec<Entry>>> {
            let handle: HANDLE = object.as_raw_handle().cast();
            let me = current_user_sid()?;
            let mut need = 0u32;
            // SAFETY: a size query; sets `need`.
            unsafe {
                GetKernelObjectSecurity(
                    handle,
                    DACL_SECURITY_INFORMATION,
                    std::ptr::null_mut(),
                    0,
                    &mut need,
                )
            };
            let mut buf = vec![0u64; (need as usize).div_ceil(8).max(1)];
            // SAFETY: `buf` holds `need` bytes.
            check(unsafe {
                GetKernelObjectSecurity(
                    handle,
                    DACL_SECURITY_INFORMATION,
                    buf.as_mut_ptr().cast(),
                    (buf.len() * 8) as u32,
                    &mut need,
                )
            })?;
            let (mut present, mut defaulted) = (0, 0);
            let mut dacl: *mut ACL = std::ptr::null_mut();
            // SAFETY: `buf` holds the self-relative descriptor just read.
            check(unsafe {
                GetSecurityDescriptorDacl(
                    buf.as_mut_ptr().cast(),
                    &mut present,
                    &mut dacl,
                    &mut defaulted,
                )
            })?;
            if present == 0 || dacl.is_null() {
                return Ok(None);
            }
            // SAFETY: `dacl` points into `buf`; each ACE GetAce returns lies within it.
            let count = unsafe { (*dacl).AceCount };
            let mut out = Vec::new();
            for i in 0..count as u32 {
                let mut ace: *mut core::ffi::c_void = std::ptr::null_mut();
                check(unsafe { GetAce(dacl, i, &mut ace) })?;
                let header = unsafe { *ace.cast::<ACE_HEADER>() };
                let (mask, is_current_user) =
                    if header.AceType == ACCESS_ALLOWED_ACE_TYPE || header.AceType == 1 {
                        // ACCESS_ALLOWED_ACE and ACCESS_DENIED_ACE share a layout.
                        let a = ace.cast::<ACCESS_ALLOWED_ACE>();
                        let sid = unsafe { std::ptr::addr_of_mut!((*a).SidStart) }.cast();
                        (unsafe { (*a).Mask }, unsafe {
                            EqualSid(sid, me.as_ptr() as PSID) != 0
                        })
                    } else {
                        (0, false)
                    };
                out.push(Entry {
                    ace_type: header.AceType,
                    mask,
                    is_current_user,
                });
            }
            Ok(Some(out))
        }
    }

    /// The named pipe's endpoint: its name and the lock that makes it ours.
    pub struct Endpoint {
        pub path: PathBuf,
        /// The session-local mutex `pipe_name::lock_name(path)`, held for the daemon's
        /// lifetime (the counterpart of `<socket>.lock`); closed by Windows when it exits.
        _lock: OwnedMutex,
    }

    struct OwnedMutex(windows_sys::Win32::Foundation::HANDLE);
    // SAFETY: a kernel handle, only closed (once) in Drop.
    unsafe impl Send for OwnedMutex {}
    unsafe impl Sync for OwnedMutex {}
    impl Drop for OwnedMutex {
        fn drop(&mut self) {
            // SAFETY: the handle CreateMutexW returned.
            unsafe { windows_sys::Win32::Foundation::CloseHandle(self.0) };
        }
    }

    impl Endpoint {
        pub fn cleanup(&self) {}
        /// A named pipe has no file that could be deleted under the daemon.
        pub fn socket_gone(&self) -> bool {
            false
        }
    }

    /// Takes the pipe's lock: Err(AlreadyRunning) when another daemon of this session holds it.
    fn take_lock(path: &Path) -> Result<OwnedMutex, ListenError> {
        use windows_sys::Win32::Foundation::{GetLastError, ERROR_ALREADY_EXISTS};
        use windows_sys::Win32::System::Threading::CreateMutexW;
        let name: Vec<u16> = pipe_name::lock_name(&path.to_string_lossy())
            .encode_utf16()
            .chain([0])
            .collect();
        // SAFETY: `name` is NUL-terminated; default security, not initially owned (the
        // mutex is never waited on: its existence is the lock).
        let h = unsafe { CreateMutexW(std::ptr::null(), 0, name.as_ptr()) };
        if h.is_null() {
            return Err(io_err(path)(io::Error::last_os_error()));
        }
        let lock = OwnedMutex(h);
        // SAFETY: no other call in between.
        if unsafe { GetLastError() } == ERROR_ALREADY_EXISTS {
            return Err(ListenError::AlreadyRunning(path.to_path_buf()));
        }
        Ok(lock)
    }

    /// True when a server answers on the pipe (a client could open it, or every instance
    /// is busy). Opening and closing an instance costs the server one empty connection.
    pub fn served(path: &Path) -> bool {
        let open = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map(drop)
            .map_err(|e| e.raw_os_error());
        pipe_name::probe_says_served(open)
    }

    /// Checks the name, takes the pipe's lock and makes sure nobody serves the name yet:
    /// a second daemon fails here, fast and clearly. The pipe itself needs the async
    /// runtime; it is created by [`incoming`].
    pub fn bind(path: &Path) -> Result<Endpoint, ListenError> {
        pipe_name::check(&path.to_string_lossy()).map_err(|msg| ListenError::Unusable {
            path: path.to_path_buf(),
            msg,
        })?;
        let lock = take_lock(path)?;
        // Another session's daemon (or an older build without the lock) on the same name.
        if served(path) {
            return Err(ListenError::AlreadyRunning(path.to_path_buf()));
        }
        Ok(Endpoint {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// Creates one instance of the pipe with the owner-only DACL; `first`: fail when the
    /// name exists already (FILE_FLAG_FIRST_PIPE_INSTANCE).
    pub fn create_instance(
        path: &Path,
        sec: &security::PipeSecurity,
        first: bool,
    ) -> io::Result<NamedPipeServer> {
        // SAFETY: `sec` outlives the call and holds a valid SECURITY_ATTRIBUTES.
        unsafe {
            ServerOptions::new()
                .first_pipe_instance(first)
                .reject_remote_clients(true)
                .create_with_security_attributes_raw(path, sec.as_raw())
        }
    }

    /// Creates the first instance of the pipe (failing when another daemon owns the name),
    /// then yields connected clients; a fresh instance is created before each hand-off so
    /// a new client can always connect. Must run inside the tokio runtime.
    pub fn incoming(ep: &Endpoint) -> Result<ReceiverStream<io::Result<PipeConn>>, ListenError> {
        let path = ep.path.clone();
        let sec = security::PipeSecurity::owner_only().map_err(io_err(&path))?;
        let first = create_instance(&path, &sec, true).map_err(|e| {
            if pipe_name::create_error_means_taken(e.raw_os_error()) {
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
                    // A client that opened and closed the instance before it was waited on
                    // (ERROR_NO_DATA) leaves it unusable: replace it, never retry it (that
                    // would spin and leave nothing for the next client to open).
                    tracing::debug!("named pipe connect: {e}");
                    match create_instance(&path, &sec, false) {
                        Ok(n) => server = n,
                        Err(e) => {
                            tracing::warn!("named pipe: cannot create a new instance: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                    }
                    continue;
                }
                let next = match create_instance(&path, &sec, false) {
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

#[cfg(test)]
mod tests {
    use super::pipe_name;

    #[test]
    fn pipe_names_are_checked() {
        assert!(pipe_name::check(r"\\.\pipe\colibri-root-colibrid").is_ok());
        assert!(pipe_name::check(r"\\.\PIPE\Mixed-Case ü 模型").is_ok());
        // A Unix socket path or a file path is not a pipe name.
        assert!(pipe_name::check("/tmp/colibri/colibrid.sock").is_err());
        assert!(pipe_name::check(r"C:\Users\me\colibrid.sock").is_err());
        assert!(pipe_name::check(r"\\.\pipe\").is_err());
        assert!(pipe_name::check(r"\\.\pipe\a\b").is_err());
        assert!(pipe_name::check(r"\\server\pipe\remote").is_err());
        assert!(pipe_name::check(&format!(r"\\.\pipe\{}", "x".repeat(247))).is_ok());
        assert!(pipe_name::check(&format!(r"\\.\pipe\{}", "x".repeat(248))).is_err());
        // Shorter than the prefix, or a prefix cut inside a multi-byte character.
        assert!(pipe_name::check("").is_err());
        assert!(pipe_name::check("ü\\.\\pipe\\x").is_err());
    }

    #[test]
    fn one_lock_per_pipe_whatever_the_letter_case() {
        let a = pipe_name::lock_name(r"\\.\pipe\colibri-root-colibrid");
        assert_eq!(a, pipe_name::lock_name(r"\\.\PIPE\Colibri-Root-Colibrid"));
        assert_ne!(a, pipe_name::lock_name(r"\\.\pipe\colibri-root-colibrid2"));
        assert!(a.starts_with(r"Local\colibri-pipe-") && !a[6..].contains('\\'));
    }

    #[test]
    fn a_probe_or_a_refused_create_means_another_daemon() {
        assert!(pipe_name::probe_says_served(Ok(())));
        assert!(pipe_name::probe_says_served(Err(Some(231)))); // every instance busy
        assert!(!pipe_name::probe_says_served(Err(Some(2)))); // nobody serves the name
        assert!(!pipe_name::probe_says_served(Err(Some(5)))); // not ours: CreateNamedPipe says
        assert!(!pipe_name::probe_says_served(Err(None)));
        assert!(pipe_name::create_error_means_taken(Some(5)));
        assert!(pipe_name::create_error_means_taken(Some(231)));
        assert!(!pipe_name::create_error_means_taken(Some(123))); // ERROR_INVALID_NAME
        assert!(!pipe_name::create_error_means_taken(None));
    }
}

/// The named pipe itself: these run on Windows, and under Wine in CI (tools/windows_e2e.sh runs
/// the cross-built test binary).
#[cfg(all(test, windows))]
mod windows_tests {
    use super::windows::security::{self, Entry, PIPE_ACCESS};
    use super::windows::*;
    use super::ListenError;
    use std::path::PathBuf;
    use std::time::Duration;

    fn unique(tag: &str) -> PathBuf {
        PathBuf::from(
            format!(
                r"\\.\pipe\colibri-test-{tag}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            )
            .replace([' ', ':', '{', '}', ','], "_"),
        )
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_pipe_dacl_allows_only_the_current_user() {
        let path = unique("dacl");
        rt().block_on(async {
            let sec = security::PipeSecurity::owner_only().unwrap();
            let server = create_instance(&path, &sec, true).unwrap();
            let dacl = security::dacl_of(&server).unwrap();
            assert_eq!(
                dacl,
                Some(vec![Entry {
                    ace_type: 0,
                    mask: PIPE_ACCESS,
                    is_current_user: true
                }]),
                "one entry: full access for this user, nobody else"
            );
            // Further instances (one per client) carry the same DACL.
            let next = create_instance(&path, &sec, false).unwrap();
            assert_eq!(security::dacl_of(&next).unwrap(), dacl);
        });
    }

    #[test]
    fn a_second_daemon_on_the_same_pipe_is_refused() {
        let path = unique("second");
        let first = bind(&path).unwrap();
        // The lock: same name in another letter case is the same pipe.
        let upper = PathBuf::from(path.to_string_lossy().to_uppercase());
        assert!(matches!(bind(&upper), Err(ListenError::AlreadyRunning(_))));
        let rt = rt();
        rt.block_on(async {
            let _incoming = incoming(&first).unwrap();
            assert!(served(&path), "a probe finds the daemon");
            // Without the lock (another session, an older build): the probe refuses...
            drop(first);
            assert!(matches!(bind(&path), Err(ListenError::AlreadyRunning(_))));
        });
    }

    #[test]
    fn first_pipe_instance_is_exclusive() {
        // What FILE_FLAG_FIRST_PIPE_INSTANCE promises on Windows; Wine 8 does not keep it
        // (packaging/windows/README.md), which is why bind() also takes a lock and probes.
        let path = unique("first");
        rt().block_on(async {
            let sec = security::PipeSecurity::owner_only().unwrap();
            let _a = create_instance(&path, &sec, true).unwrap();
            let b = create_instance(&path, &sec, true);
            if std::env::var_os("WINEPREFIX").is_some() {
                eprintln!(
                    "under Wine: a second first instance {}",
                    match &b {
                        Ok(_) =>
                            "was created (Wine ignores FILE_FLAG_FIRST_PIPE_INSTANCE)".to_string(),
                        Err(e) => format!("was refused: {e}"),
                    }
                );
                return;
            }
            let e = b.expect_err("a second first instance must fail");
            assert!(
                super::pipe_name::create_error_means_taken(e.raw_os_error()),
                "{e}"
            );
        });
    }

    #[test]
    fn a_client_that_leaves_before_it_is_accepted_does_not_block_the_next() {
        let path = unique("leave");
        let ep = bind(&path).unwrap();
        let rt = rt();
        rt.block_on(async {
            use tokio_stream::StreamExt;
            let mut incoming = incoming(&ep).unwrap();
            for _ in 0..20 {
                // Open and close at once, as bind()'s probe does.
                drop(
                    std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&path),
                );
            }
            let p = path.clone();
            let client = tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(10), async {
                    loop {
                        match tokio::net::windows::named_pipe::ClientOptions::new().open(&p) {
                            Ok(c) => return c,
                            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                        }
                    }
                })
                .await
                .expect("a client can still connect")
            });
            let _c = client.await.unwrap();
            let got = tokio::time::timeout(Duration::from_secs(10), async {
                // The probes' connections come first (some may be dropped); any connection
                // accepted after them proves the loop goes on.
                incoming.next().await
            })
            .await
            .expect("the accept loop still hands out connections");
            assert!(got.is_some());
        });
    }
}
