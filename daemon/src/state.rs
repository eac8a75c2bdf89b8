//! The daemon's state directory and how files in it are written.
//!
//! Layout (`--state-dir`, default `$XDG_STATE_HOME/colibri` or `~/.local/state/colibri`):
//! ```text
//! sessions/<id>.kv          session snapshots (see snapshot.rs)
//! sessions/<id>.kv.*.bad    snapshots found damaged, set aside for inspection
//! models/<key>/pins.json    experts pinned for a model (<key> = hash of its canonical path)
//! colibrid.log              written by `coli` when it starts the daemon detached
//! ```
//! Every file is written with [`write_atomic`]; a crash leaves either the old file, the new
//! one, or a `*.tmp` file that the next start removes.

use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct StateDir {
    pub root: PathBuf,
}

/// The default state directory for this user: `%LOCALAPPDATA%\colibri` on Windows (else
/// `%USERPROFILE%\AppData\Local\colibri`), `$XDG_STATE_HOME/colibri` or
/// `~/.local/state/colibri` elsewhere.
pub fn default_state_dir() -> PathBuf {
    state_dir_from(cfg!(windows), |k| std::env::var_os(k))
}

/// [`default_state_dir`] from an environment (`var`) and the platform: plain logic, tested on
/// every platform.
fn state_dir_from(windows: bool, var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    let var = |k: &str| var(k).filter(|d| !d.is_empty()).map(PathBuf::from);
    if windows {
        if let Some(d) = var("LOCALAPPDATA") {
            return d.join("colibri");
        }
        if let Some(d) = var("USERPROFILE") {
            return d.join("AppData").join("Local").join("colibri");
        }
    }
    if let Some(d) = var("XDG_STATE_HOME") {
        return d.join("colibri");
    }
    var("HOME")
        .or_else(|| var("USERPROFILE"))
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".local")
        .join("state")
        .join("colibri")
}

pub fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Creates `dir` (and parents) and makes `dir` itself private to this user.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

impl StateDir {
    /// Opens (creating it 0700) the state directory, removes temp files a crash left
    /// behind, and checks that it is writable.
    pub fn open(root: PathBuf) -> io::Result<StateDir> {
        create_private_dir(&root)?;
        let s = StateDir { root };
        fs::create_dir_all(s.sessions_dir())?;
        fs::create_dir_all(s.root.join("models"))?;
        for dir in [s.sessions_dir(), s.root.join("models")] {
            remove_temp_files(&dir);
        }
        // Fail at start, not at the first snapshot, when the folder is read-only.
        write_atomic(&s.root.join(".writable"), b"ok\n")?;
        Ok(s)
    }

    pub fn sessions_dir(&self) -> PathBuf {
        self.root.join("sessions")
    }

    pub fn session_path(&self, id: &str) -> PathBuf {
        self.sessions_dir().join(format!("{id}.kv"))
    }

    /// Per-model folder: a stable hash of the canonical model path keeps names short and
    /// free of path separators.
    pub fn model_dir(&self, model_id: &str) -> PathBuf {
        self.root
            .join("models")
            .join(format!("{:016x}", fnv1a64(model_id.as_bytes())))
    }

    pub fn pins_path(&self, model_id: &str) -> PathBuf {
        self.model_dir(model_id).join("pins.json")
    }
}

/// Removes `*.tmp` files in `dir` and one level below: the leftovers of a write that was
/// interrupted before its rename. A temp file names its writer's process id
/// (`NAME.PID.tmp`, see [`write_atomic_with`]); one whose writer is another process still
/// running is a write in flight (a second daemon on another socket sharing this folder, a
/// `coli` writing pins), not a leftover, and stays.
fn remove_temp_files(dir: &Path) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            remove_temp_files(&p);
        } else if p.extension().is_some_and(|x| x == "tmp") {
            if writer_pid(&p).is_some_and(|pid| pid != std::process::id() && process_alive(pid)) {
                continue;
            }
            tracing::warn!("removing {} (left by an interrupted write)", p.display());
            let _ = fs::remove_file(&p);
        }
    }
}

/// The writer's process id a temp file's name carries (`NAME.PID.tmp`).
fn writer_pid(tmp: &Path) -> Option<u32> {
    let stem = tmp.file_stem()?.to_str()?;
    stem.rsplit_once('.')?.1.parse().ok()
}

/// Whether a process with this id runs now (signal 0 checks without sending anything; EPERM
/// means it runs under another user).
#[cfg(unix)]
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Elsewhere one daemon per user holds the folder (its pipe is single-instance): every
/// temp file at start is a leftover.
#[cfg(not(unix))]
fn process_alive(_pid: u32) -> bool {
    false
}

/// Writes `path` so that readers see the old or the new content, never a mix: a temp file
/// in the same directory, fsync, rename over `path`, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_with(path, |f| f.write_all(bytes))
}

/// [`write_atomic`] with the content produced by `fill` (for large files written in pieces).
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Moves a damaged file aside as `<name>.<unix seconds>.bad` and returns the new path.
pub fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let to = path.with_file_name(format!("{name}.{secs}.bad"));
    fs::rename(path, &to)?;
    Ok(to)
}

/// FNV-1a, 64 bits: a stable name for a model folder (not a security boundary).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// Experts pinned for one model, as saved in `models/<key>/pins.json`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PinsFile {
    pub version: u32,
    pub model: String,
    /// (layer, expert) pairs.
    pub pinned: Vec<(u32, u32)>,
}

pub const PINS_VERSION: u32 = 1;

impl StateDir {
    /// Reads the pins saved for `model_id`; a damaged file is set aside and ignored.
    pub fn load_pins(&self, model_id: &str) -> Vec<(u32, u32)> {
        let path = self.pins_path(model_id);
        let Ok(text) = fs::read(&path) else {
            return Vec::new();
        };
        match serde_json::from_slice::<PinsFile>(&text) {
            Ok(p) if p.version == PINS_VERSION && p.model == model_id => p.pinned,
            Ok(p) => {
                tracing::warn!(
                    "{}: for model '{}' version {}, expected '{}' version {}; ignored",
                    path.display(),
                    p.model,
                    p.version,
                    model_id,
                    PINS_VERSION
                );
                Vec::new()
            }
            Err(e) => {
                let aside = set_aside(&path).map(|p| p.display().to_string());
                tracing::warn!(
                    "{}: damaged ({e}); set aside as {:?}",
                    path.display(),
                    aside
                );
                Vec::new()
            }
        }
    }

    pub fn save_pins(&self, model_id: &str, pinned: &[(u32, u32)]) -> io::Result<()> {
        let file = PinsFile {
            version: PINS_VERSION,
            model: model_id.to_string(),
            pinned: pinned.to_vec(),
        };
        fs::create_dir_all(self.model_dir(model_id))?;
        let bytes = serde_json::to_vec_pretty(&file).map_err(io::Error::other)?;
        write_atomic(&self.pins_path(model_id), &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn open_removes_temp_files_and_pins_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("state");
        let s = StateDir::open(root.clone()).unwrap();
        // No process has an id above pid_max (at most 2^22 on Linux).
        let leftover = s.sessions_dir().join("abc.kv.4000000000.tmp");
        fs::write(&leftover, b"half").unwrap();
        let no_pid = s.sessions_dir().join("def.kv.tmp");
        fs::write(&no_pid, b"half").unwrap();
        // A write in flight by another running process (our parent, the test runner's).
        #[cfg(unix)]
        let in_flight = {
            let parent = std::os::unix::process::parent_id();
            let p = s.sessions_dir().join(format!("ghi.kv.{parent}.tmp"));
            fs::write(&p, b"half").unwrap();
            p
        };
        let s = StateDir::open(root).unwrap();
        assert!(!leftover.exists());
        assert!(!no_pid.exists());
        #[cfg(unix)]
        assert!(
            in_flight.exists(),
            "another live process's write is left alone"
        );
        s.save_pins("/m", &[(0, 3), (1, 2)]).unwrap();
        assert_eq!(s.load_pins("/m"), vec![(0, 3), (1, 2)]);
        assert!(s.load_pins("/other").is_empty());
        fs::write(s.pins_path("/m"), b"{not json").unwrap();
        assert!(s.load_pins("/m").is_empty());
        assert!(!s.pins_path("/m").exists(), "damaged pins are set aside");
    }

    #[test]
    fn the_default_state_folder_per_platform() {
        fn env<'a>(
            pairs: &'a [(&'a str, &'a str)],
        ) -> impl Fn(&str) -> Option<std::ffi::OsString> + 'a {
            move |k| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        }
        let win = [
            ("LOCALAPPDATA", r"C:\Users\Zoë Ünïcødé\AppData\Local"),
            ("USERPROFILE", r"C:\Users\Zoë Ünïcødé"),
            ("XDG_STATE_HOME", "/ignored/on/windows"),
        ];
        assert_eq!(
            state_dir_from(true, env(&win)),
            Path::new(win[0].1).join("colibri")
        );
        // No (or an empty) LOCALAPPDATA: the same folder under the profile.
        let profile_only = [("LOCALAPPDATA", ""), ("USERPROFILE", r"C:\Users\me")];
        assert_eq!(
            state_dir_from(true, env(&profile_only)),
            Path::new(r"C:\Users\me")
                .join("AppData")
                .join("Local")
                .join("colibri")
        );
        // Elsewhere LOCALAPPDATA means nothing.
        let unix = [
            ("LOCALAPPDATA", "x"),
            ("XDG_STATE_HOME", "/s"),
            ("HOME", "/h"),
        ];
        assert_eq!(state_dir_from(false, env(&unix)), Path::new("/s/colibri"));
        let home = [("HOME", "/h")];
        assert_eq!(
            state_dir_from(false, env(&home)),
            Path::new("/h/.local/state/colibri")
        );
    }
}
