//! Session snapshots: a session's KV cache, token history and chat messages in one file,
//! so a conversation survives a daemon restart without re-prefilling its prompt.
//!
//! Layout of `<state>/sessions/<id>.kv` (little-endian):
//! ```text
//! magic    8 bytes  "COLISESS"
//! version  u32      SNAPSHOT_VERSION
//! flags    u32      0
//! meta_len u64      then meta_len bytes of JSON (SessionMeta)
//! kv_len   u64      then kv_len bytes of KvCache::to_bytes
//! crc32    u32      CRC-32 of every byte before it
//! ```
//! A reader trusts nothing: lengths are checked against the file size before allocating,
//! the checksum covers the whole file, the KV cache must have the model's exact layout and
//! its length must agree with the token history.

use crate::state::write_atomic_with;
use colibri_engine::KvCache;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"COLISESS";
pub const SNAPSHOT_VERSION: u32 = 1;
/// Bytes before the metadata: magic, version, flags, meta_len.
const HEAD: usize = 8 + 4 + 4 + 8;
/// Metadata larger than this is refused (a conversation's JSON is far smaller).
const MAX_META: u64 = 256 << 20;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SnapshotMessage {
    pub role: String,
    pub content: String,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct SessionMeta {
    pub id: String,
    /// Canonical model directory.
    pub model: String,
    pub model_type: String,
    pub vocab_size: usize,
    pub created_unix_ms: i64,
    pub last_used_unix_ms: i64,
    /// Every token of the conversation; the first `kv.len` are in the cache.
    pub tokens: Vec<u32>,
    pub messages: Vec<SnapshotMessage>,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The bytes are not a valid snapshot (or not for this model).
    #[error("damaged snapshot: {0}")]
    Damaged(String),
}

fn damaged(msg: impl Into<String>) -> SnapshotError {
    SnapshotError::Damaged(msg.into())
}

/// A writer that feeds a CRC-32 with everything it passes on.
struct CrcWriter<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a snapshot atomically (temp file, fsync, rename, fsync directory).
pub fn save(path: &Path, meta: &SessionMeta, kv: &KvCache) -> io::Result<()> {
    let meta_json = serde_json::to_vec(meta).map_err(io::Error::other)?;
    write_atomic_with(path, |f| {
        let mut w = CrcWriter {
            inner: io::BufWriter::with_capacity(1 << 20, f),
            crc: crc32fast::Hasher::new(),
        };
        w.write_all(MAGIC)?;
        w.write_all(&SNAPSHOT_VERSION.to_le_bytes())?;
        w.write_all(&0u32.to_le_bytes())?;
        w.write_all(&(meta_json.len() as u64).to_le_bytes())?;
        w.write_all(&meta_json)?;
        w.write_all(&(kv.serialized_len() as u64).to_le_bytes())?;
        kv.write_to(&mut w)?;
        let crc = w.crc.clone().finalize();
        let mut inner = w.inner;
        inner.write_all(&crc.to_le_bytes())?;
        inner.flush()
    })
}

/// What a listing needs from a snapshot, read from its first few hundred bytes.
pub struct Summary {
    pub meta: SessionMeta,
    pub cached_tokens: u64,
    pub kv_bytes: u64,
}

/// The metadata and the KV cache's size, without reading the cache: enough to list a
/// session. Does not verify the checksum (see [`load`]).
pub fn read_summary(path: &Path) -> Result<Summary, SnapshotError> {
    let mut f = std::fs::File::open(path)?;
    let size = f.metadata()?.len();
    let mut head = [0u8; HEAD];
    f.read_exact(&mut head)
        .map_err(|_| damaged("shorter than its header"))?;
    let meta_len = check_head(&head, size)?;
    let mut meta = vec![0u8; meta_len as usize];
    f.read_exact(&mut meta)
        .map_err(|_| damaged("truncated metadata"))?;
    let meta = parse_meta(&meta)?;
    // kv_len, then the KV header: magic 8, version 4, layers 4, len 8.
    let mut kv_head = [0u8; 8 + 24];
    f.read_exact(&mut kv_head)
        .map_err(|_| damaged("truncated KV header"))?;
    let kv_len = u64::from_le_bytes(kv_head[..8].try_into().expect("8 bytes"));
    let cached_tokens = u64::from_le_bytes(kv_head[24..32].try_into().expect("8 bytes"));
    if cached_tokens > meta.tokens.len() as u64 {
        return Err(damaged("more cached positions than tokens of history"));
    }
    Ok(Summary {
        meta,
        cached_tokens,
        kv_bytes: kv_len,
    })
}

/// Summaries of every `*.kv` file in `dir`, with the path of each.
pub fn scan(dir: &Path) -> Vec<(std::path::PathBuf, Result<Summary, SnapshotError>)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "kv"))
        .map(|p| {
            let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
            let r = read_summary(&p).and_then(|s| {
                if Some(&s.meta.id) == stem.as_ref() {
                    Ok(s)
                } else {
                    Err(damaged(format!(
                        "holds session '{}', not its file name's",
                        s.meta.id
                    )))
                }
            });
            (p, r)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn check_head(head: &[u8], file_size: u64) -> Result<u64, SnapshotError> {
    if &head[..8] != MAGIC {
        return Err(damaged("not a colibri session snapshot (bad magic)"));
    }
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if version != SNAPSHOT_VERSION {
        return Err(damaged(format!(
            "format version {version}; this colibrid reads version {SNAPSHOT_VERSION}"
        )));
    }
    let meta_len = u64::from_le_bytes(head[16..24].try_into().expect("8 bytes"));
    // Header, metadata, kv_len and crc must all fit in the file.
    if meta_len > MAX_META || HEAD as u64 + meta_len + 8 + 4 > file_size {
        return Err(damaged(format!(
            "metadata length {meta_len} does not fit the file"
        )));
    }
    Ok(meta_len)
}

fn parse_meta(bytes: &[u8]) -> Result<SessionMeta, SnapshotError> {
    serde_json::from_slice(bytes).map_err(|e| damaged(format!("metadata: {e}")))
}

/// Reads and fully validates a snapshot against the model that is to continue it:
/// checksum, metadata, KV layout (`expected_layout` = a fresh cache of that model),
/// model id and vocabulary, and the history/cache agreement.
pub fn load(
    path: &Path,
    model_id: &str,
    expected_layout: &KvCache,
) -> Result<(SessionMeta, KvCache), SnapshotError> {
    let bytes = std::fs::read(path)?;
    decode(&bytes, model_id, expected_layout)
}

pub fn decode(
    bytes: &[u8],
    model_id: &str,
    expected_layout: &KvCache,
) -> Result<(SessionMeta, KvCache), SnapshotError> {
    if bytes.len() < HEAD + 12 {
        return Err(damaged("shorter than its header"));
    }
    let meta_len = check_head(&bytes[..HEAD], bytes.len() as u64)? as usize;
    let body = bytes.len() - 4;
    let stored = u32::from_le_bytes(bytes[body..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..body]) != stored {
        return Err(damaged("checksum mismatch (truncated or corrupted)"));
    }
    let meta = parse_meta(&bytes[HEAD..HEAD + meta_len])?;
    let at = HEAD + meta_len;
    let kv_len = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    if kv_len != (body - at - 8) as u64 {
        return Err(damaged(format!(
            "KV length {kv_len} disagrees with the file ({} bytes)",
            body - at - 8
        )));
    }
    let kv = KvCache::from_bytes(&bytes[at + 8..body]).map_err(|e| damaged(e.to_string()))?;
    if meta.model != model_id {
        return Err(damaged(format!(
            "belongs to model {}, not {model_id}",
            meta.model
        )));
    }
    if !kv.same_layout(expected_layout) {
        return Err(damaged("the KV cache's layout does not match the model"));
    }
    if kv.len > meta.tokens.len() {
        return Err(damaged(format!(
            "{} cached positions but only {} tokens of history",
            kv.len,
            meta.tokens.len()
        )));
    }
    if meta.tokens.len() > expected_layout.capacity {
        return Err(damaged("history longer than the model's context"));
    }
    if let Some(t) = meta.tokens.iter().find(|&&t| t as usize >= meta.vocab_size) {
        return Err(damaged(format!("token {t} outside the vocabulary")));
    }
    Ok((meta, kv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (SessionMeta, KvCache) {
        let mut kv = KvCache::with_dtype(&[(4, 4), (4, 4)], 32, colibri_engine::kv::KvDtype::F16);
        kv.len = 3;
        for l in &mut kv.layers {
            l.k.extend_from_f32(&(0..12).map(|x| x as f32 / 7.0).collect::<Vec<_>>());
            l.v.extend_from_f32(&(0..12).map(|x| -(x as f32)).collect::<Vec<_>>());
        }
        let meta = SessionMeta {
            id: "s1".into(),
            model: "/models/m".into(),
            model_type: "olmoe".into(),
            vocab_size: 100,
            created_unix_ms: 1,
            last_used_unix_ms: 2,
            tokens: vec![5, 6, 7, 8],
            messages: vec![SnapshotMessage {
                role: "user".into(),
                content: "hi".into(),
            }],
        };
        (meta, kv)
    }

    #[test]
    fn snapshot_round_trip_and_every_damage_is_caught() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s1.kv");
        let (meta, kv) = sample();
        let layout = KvCache::new(&[(4, 4), (4, 4)], 32);
        save(&p, &meta, &kv).unwrap();
        let (m2, kv2) = load(&p, "/models/m", &layout).unwrap();
        assert_eq!(m2, meta);
        assert_eq!(kv2.len, 3);
        assert_eq!(kv2.layers[1].k.to_f32_vec(), kv.layers[1].k.to_f32_vec());
        let sum = read_summary(&p).unwrap();
        assert_eq!(sum.meta, meta);
        assert_eq!(sum.cached_tokens, 3);

        let bytes = std::fs::read(&p).unwrap();
        // Flipping any single byte is detected.
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode(&b, "/models/m", &layout).is_err(), "flip at {i}");
        }
        // Truncation at any point is detected.
        for n in (0..bytes.len()).step_by(5) {
            assert!(
                decode(&bytes[..n], "/models/m", &layout).is_err(),
                "cut at {n}"
            );
        }
        // Another model or another layout is refused.
        assert!(decode(&bytes, "/models/other", &layout).is_err());
        assert!(decode(&bytes, "/models/m", &KvCache::new(&[(4, 4)], 32)).is_err());
    }
}
