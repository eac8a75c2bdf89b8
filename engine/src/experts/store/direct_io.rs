//! The system calls under the reads: positioned reads, O_DIRECT opens, read-ahead and page
//! cache advice, per platform.

use std::fs::File;
use std::path::Path;

#[cfg(unix)]
pub(super) const EINVAL: i32 = libc::EINVAL;
#[cfg(not(unix))]
pub(super) const EINVAL: i32 = 22;

/// Reads into `dst` from `offset` until at least `need` bytes are in (direct reads ask for
/// whole blocks and may get fewer at the end of the file).
pub(super) fn read_fully(
    f: &File,
    dst: &mut [u8],
    offset: u64,
    need: usize,
) -> std::io::Result<()> {
    let mut got = 0usize;
    while got < need {
        match read_at(f, &mut dst[got..], offset + got as u64) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "file ends {} bytes into a {need}-byte read at {offset}",
                        got
                    ),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(unix)]
pub(super) fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, offset)
}

#[cfg(windows)]
pub(super) fn read_at(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, offset)
}

#[cfg(target_os = "linux")]
pub(super) fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

#[cfg(target_os = "macos")]
pub(super) fn open_direct(path: &Path) -> std::io::Result<File> {
    use std::os::unix::io::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: fcntl on a descriptor we own, with an integer argument.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(f)
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub(super) fn open_direct(_path: &Path) -> std::io::Result<File> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "not on this platform",
    ))
}

/// Turns off the kernel's read-ahead for this descriptor.
pub(super) fn advise_random(f: &File) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: advisory call on a descriptor we own; failure only loses the hint.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM);
        }
    }
    let _ = f;
}

/// Drops the page-cache copy of bytes just read: the expert cache holds them already.
pub(super) fn drop_cached(f: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: advisory call on a descriptor we own; failure only loses the hint.
        unsafe {
            libc::posix_fadvise(
                f.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    let _ = (f, offset, len);
}
