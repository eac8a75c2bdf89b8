//! The per-model usage histogram: how often each routed expert was needed, remembered across
//! runs so the next start can pin and preload the hottest experts.
//!
//! File format (little-endian), validated on read:
//!
//! ```text
//! magic "COLIHIST" | version u32 = 1 | n_layers u32 | n_experts u32 | reserved u32 = 0
//! counts u64 × (n_layers · n_experts), layer-major | crc32 (IEEE) of everything before it
//! ```
//!
//! Written atomically (temp file, fsync, rename, fsync of the folder). A file that fails any
//! check, or that describes another shape of model, is renamed to `*.bad` and reported; the
//! run continues with an empty histogram.

use super::Key;
use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"COLIHIST";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 * 4;

/// The histogram's file name inside a model's state folder.
pub const FILE_NAME: &str = "expert-usage.bin";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageHistogram {
    pub n_layers: usize,
    pub n_experts: usize,
    counts: Vec<u64>,
}

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    pub hist: UsageHistogram,
    /// Whether a valid file was read (false: missing or damaged, `hist` is empty).
    pub from_file: bool,
    /// Set when a damaged file was set aside: say it to the user.
    pub warning: Option<String>,
}

impl UsageHistogram {
    pub fn new(n_layers: usize, n_experts: usize) -> UsageHistogram {
        UsageHistogram {
            n_layers,
            n_experts,
            counts: vec![0; n_layers * n_experts],
        }
    }

    fn index(&self, k: Key) -> Option<usize> {
        let (l, e) = (k.layer as usize, k.expert as usize);
        (l < self.n_layers && e < self.n_experts).then(|| l * self.n_experts + e)
    }

    /// Counts `n` uses of `k` (ignored when `k` is outside the shape).
    pub fn add(&mut self, k: Key, n: u64) {
        if let Some(i) = self.index(k) {
            self.counts[i] = self.counts[i].saturating_add(n);
        }
    }

    pub fn get(&self, k: Key) -> u64 {
        self.index(k).map_or(0, |i| self.counts[i])
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Every expert with a non-zero count.
    pub fn nonzero(&self) -> Vec<(Key, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (Key::new(i / self.n_experts, i % self.n_experts), c))
            .collect()
    }

    /// Adds another histogram of the same shape.
    pub fn merge(&mut self, other: &UsageHistogram) {
        if other.n_layers == self.n_layers && other.n_experts == self.n_experts {
            for (a, b) in self.counts.iter_mut().zip(&other.counts) {
                *a = a.saturating_add(*b);
            }
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER + self.counts.len() * 8 + 4);
        b.extend_from_slice(MAGIC);
        for v in [VERSION, self.n_layers as u32, self.n_experts as u32, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for c in &self.counts {
            b.extend_from_slice(&c.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks a file's bytes against the expected shape.
    pub fn from_bytes(
        b: &[u8],
        n_layers: usize,
        n_experts: usize,
    ) -> std::result::Result<UsageHistogram, String> {
        if b.len() < HEADER + 4 {
            return Err(format!("{} bytes is shorter than the header", b.len()));
        }
        if &b[..8] != MAGIC {
            return Err("not a colibri usage histogram (bad magic)".into());
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let version = u32_at(8);
        if version != VERSION {
            return Err(format!("version {version} (this build reads {VERSION})"));
        }
        let (l, e) = (u32_at(12) as usize, u32_at(16) as usize);
        let n = l
            .checked_mul(e)
            .and_then(|n| n.checked_mul(8))
            .and_then(|n| n.checked_add(HEADER + 4))
            .ok_or("shape overflows")?;
        if b.len() != n {
            return Err(format!(
                "{} bytes, but a {l}×{e} histogram takes {n}",
                b.len()
            ));
        }
        let body = b.len() - 4;
        if crc32fast::hash(&b[..body]) != u32_at(body) {
            return Err("checksum mismatch".into());
        }
        if (l, e) != (n_layers, n_experts) {
            return Err(format!(
                "made for {l} layers × {e} experts, this model has {n_layers} × {n_experts}"
            ));
        }
        let counts = b[HEADER..body]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Ok(UsageHistogram {
            n_layers: l,
            n_experts: e,
            counts,
        })
    }

    /// Loads `path`. Missing: an empty histogram. Unreadable or invalid: the file is renamed
    /// to `*.bad` and an empty histogram comes back with a warning.
    pub fn load(path: &Path, n_layers: usize, n_experts: usize) -> Loaded {
        let empty = UsageHistogram::new(n_layers, n_experts);
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Loaded {
                    hist: empty,
                    from_file: false,
                    warning: None,
                }
            }
            Err(e) => {
                return Loaded {
                    hist: empty,
                    from_file: false,
                    warning: Some(format!(
                        "{}: cannot read the expert usage history: {e}",
                        path.display()
                    )),
                }
            }
        };
        match UsageHistogram::from_bytes(&bytes, n_layers, n_experts) {
            Ok(hist) => Loaded {
                hist,
                from_file: true,
                warning: None,
            },
            Err(why) => {
                let bad = bad_path(path);
                let moved = match std::fs::rename(path, &bad) {
                    Ok(()) => format!("set aside as {}", bad.display()),
                    Err(e) => format!("could not be set aside ({e})"),
                };
                Loaded {
                    hist: empty,
                    from_file: false,
                    warning: Some(format!(
                        "{}: damaged expert usage history ({why}); {moved}; starting from an empty one",
                        path.display()
                    )),
                }
            }
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomic(path, &self.to_bytes())
    }
}

fn bad_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".bad");
    PathBuf::from(s)
}

/// Writes `bytes` to `path` atomically: a temp file in the same folder, fsync, rename over
/// `path`, fsync of the folder. Creates the folder if needed. A crash leaves either the old
/// file or the new one, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)?;
        // The rename is durable once the folder's entry is.
        #[cfg(unix)]
        std::fs::File::open(&dir)?.sync_all()?;
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// The state folder colibri uses when no `--state-dir` is given, the same as the daemon's:
/// `$XDG_STATE_HOME/colibri`, else `~/.local/state/colibri` (`%LOCALAPPDATA%\colibri` on
/// Windows).
pub fn default_state_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if cfg!(windows) {
        if let Some(d) = env("LOCALAPPDATA") {
            return Some(d.join("colibri"));
        }
    }
    if let Some(d) = env("XDG_STATE_HOME") {
        return Some(d.join("colibri"));
    }
    env("HOME")
        .or_else(|| env("USERPROFILE"))
        .map(|h| h.join(".local").join("state").join("colibri"))
}

/// The state folder of one model under a state root: `ROOT/models/<16 hex digits>`, the
/// FNV-1a hash of the model folder's canonical path. The daemon keys its per-model files
/// (pins) the same way, so a model's history and pins sit side by side.
pub fn model_state_dir(root: &Path, model_dir: &Path) -> PathBuf {
    let canon = model_dir
        .canonicalize()
        .unwrap_or_else(|_| model_dir.to_path_buf());
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canon.to_string_lossy().bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    root.join("models").join(format!("{h:016x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> UsageHistogram {
        let mut h = UsageHistogram::new(3, 5);
        h.add(Key::new(0, 1), 7);
        h.add(Key::new(2, 4), 1 << 40);
        h.add(Key::new(9, 9), 5); // outside: ignored
        h
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub").join(FILE_NAME);
        sample().save(&p).unwrap();
        let l = UsageHistogram::load(&p, 3, 5);
        assert!(l.from_file && l.warning.is_none());
        assert_eq!(l.hist, sample());
        assert_eq!(l.hist.get(Key::new(2, 4)), 1 << 40);
        assert_eq!(
            l.hist.nonzero(),
            vec![(Key::new(0, 1), 7), (Key::new(2, 4), 1 << 40)]
        );
        // No temp file left behind.
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE_NAME)]);
    }

    #[test]
    fn missing_file_is_empty_without_warning() {
        let dir = tempfile::tempdir().unwrap();
        let l = UsageHistogram::load(&dir.path().join("none"), 2, 2);
        assert!(!l.from_file && l.warning.is_none());
        assert_eq!(l.hist.total(), 0);
    }

    /// Every kind of damage is caught, the file set aside as `.bad`, and a warning given.
    #[test]
    fn damage_is_set_aside() {
        let good = sample().to_bytes();
        let mut flipped = good.clone();
        flipped[HEADER + 3] ^= 0x10; // a count bit: only the checksum notices
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        let mut bad_version = good.clone();
        bad_version[8] = 2;
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("truncated", good[..good.len() - 5].to_vec(), "bytes"),
            ("flipped", flipped, "checksum"),
            ("magic", bad_magic, "magic"),
            ("version", bad_version, "version"),
            ("empty", Vec::new(), "shorter"),
        ];
        for (what, bytes, needle) in cases {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join(FILE_NAME);
            std::fs::write(&p, &bytes).unwrap();
            let l = UsageHistogram::load(&p, 3, 5);
            let w = l.warning.unwrap_or_else(|| panic!("{what}: no warning"));
            assert!(w.contains(needle) && w.contains(".bad"), "{what}: {w}");
            assert!(!l.from_file && l.hist.total() == 0, "{what}");
            assert!(!p.exists(), "{what}: damaged file still in place");
            assert_eq!(std::fs::read(bad_path(&p)).unwrap(), bytes, "{what}");
            // The next save works and the next load is clean.
            sample().save(&p).unwrap();
            assert!(UsageHistogram::load(&p, 3, 5).from_file);
        }
    }

    #[test]
    fn another_models_shape_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE_NAME);
        sample().save(&p).unwrap();
        let l = UsageHistogram::load(&p, 3, 6);
        assert!(l.warning.unwrap().contains("3 × 6"));
        assert!(bad_path(&p).exists());
    }

    #[test]
    fn state_dirs_differ_per_model_path() {
        let root = Path::new("/state");
        let a = model_state_dir(root, Path::new("/models/a b"));
        let b = model_state_dir(root, Path::new("/other/a b"));
        assert_ne!(a, b);
        assert!(a.starts_with("/state/models"));
        // FNV-1a of the path, as the daemon names its per-model folders.
        let mut h: u64 = 0xcbf29ce484222325;
        for c in "/models/a b".bytes() {
            h = (h ^ c as u64).wrapping_mul(0x100000001b3);
        }
        assert_eq!(
            a.file_name().unwrap().to_string_lossy(),
            format!("{h:016x}")
        );
    }
}
