//! Giving memory back after large requests.
//!
//! glibc's malloc keeps freed memory in its arenas: after a burst of multi-megabyte request
//! messages (one arena per thread that touched them) the daemon's RSS stayed hundreds of MiB
//! above its steady state. Measured with `cargo run --release --example soak` (docs/daemon.md,
//! "Memory"), the policy here is:
//!
//! - allocations of 256 KiB and more are always served by mmap and unmapped when freed
//!   (glibc otherwise raises this threshold up to 32 MiB after the first large free, so that
//!   later message buffers land in arenas and stay there);
//! - a watcher trims the arenas (`malloc_trim`) in the seconds after a large input and
//!   whenever RSS has grown by 16 MiB since its last trim, at most once a second.
//!
//! `COLIBRID_MALLOC` chooses another policy for measurements: `glibc` (untouched), `mmap`
//! (the threshold only), `trim` (the watcher only), `mmap+trim` (the default).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub fixed_mmap_threshold: bool,
    pub trim: bool,
}

/// Allocations at least this large bypass the arenas.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 256 << 10;

/// RSS growth that triggers a trim.
const TRIM_AFTER_GROWTH: u64 = 16 << 20;

impl Policy {
    pub fn from_env() -> Policy {
        let v = std::env::var("COLIBRID_MALLOC").unwrap_or_default();
        match v.as_str() {
            "glibc" => Policy {
                fixed_mmap_threshold: false,
                trim: false,
            },
            "mmap" => Policy {
                fixed_mmap_threshold: true,
                trim: false,
            },
            "trim" => Policy {
                fixed_mmap_threshold: false,
                trim: true,
            },
            _ => Policy {
                fixed_mmap_threshold: true,
                trim: true,
            },
        }
    }
}

/// Applies the allocator settings; call first thing in `main`, before threads start.
pub fn configure(p: Policy) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if p.fixed_mmap_threshold {
        // SAFETY: mallopt only changes malloc's tunables; called before other threads exist.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = p;
}

/// The process's resident set in bytes (0 where unknown).
pub fn rss_bytes() -> u64 {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map(|pages| pages * page_size())
            .unwrap_or(0)
    }
    #[cfg(not(target_os = "linux"))]
    0
}

#[cfg(target_os = "linux")]
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Returns free arena memory to the system now. Returns whether anything was released.
pub fn trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim is thread-safe (it takes each arena's lock).
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// Large inputs seen since the watcher last looked (see [`note_large`]).
static LARGE_SEEN: AtomicBool = AtomicBool::new(false);

/// Inputs at least this large make the watcher trim after them.
pub const LARGE_INPUT: usize = 1 << 20;

/// Tells the watcher that a request of `bytes` went through (the shared limit checks call
/// it for every text): large ones are followed by trims once their buffers are freed.
pub fn note_large(bytes: usize) {
    if bytes >= LARGE_INPUT {
        LARGE_SEEN.store(true, Ordering::Relaxed);
    }
}

/// The trimming watcher (a tokio task); does nothing unless the policy trims. It trims in
/// the three seconds after a large input (its buffers are freed when its request ends), and
/// whenever RSS has grown by 16 MiB since the last trim.
pub async fn watch(p: Policy) {
    if !p.trim || cfg!(not(all(target_os = "linux", target_env = "gnu"))) {
        return;
    }
    let mut base = rss_bytes();
    let mut pending = 0u32;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if LARGE_SEEN.swap(false, Ordering::Relaxed) {
            pending = 3;
        }
        let now = rss_bytes();
        if pending > 0 || now > base + TRIM_AFTER_GROWTH {
            pending = pending.saturating_sub(1);
            trim();
            base = rss_bytes();
        } else if now < base {
            base = now;
        }
    }
}
