//! The versioned snapshot bytes of a [`KvCache`] (session persistence): [`KvCache::to_bytes`],
//! [`KvCache::from_bytes`], and the check that a restored cache fits the model.

use super::{KvBuf, KvCache, KvDtype, LayerKv};
use half::f16;

// The dtype codes of the layer table: the snapshot format is their one user.
impl KvDtype {
    fn code(self) -> u32 {
        match self {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
        }
    }

    fn from_code(c: u32) -> Option<KvDtype> {
        match c {
            0 => Some(KvDtype::F32),
            1 => Some(KvDtype::F16),
            _ => None,
        }
    }
}

/// Leading bytes of a serialized [`KvCache`].
const KV_MAGIC: &[u8; 8] = b"COLIKV\0\0";
/// Bumped whenever the byte layout below changes. Version 3 added the per-layer dtype (f16
/// caches); version 2 snapshots (f32, no dtype) are still read.
const KV_FORMAT_VERSION: u32 = 3;
const KV_OLDEST_READ: u32 = 2;

impl KvCache {
    /// Serializes the cache (see [`write_to`](Self::write_to) for the layout).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.serialized_len());
        self.write_to(&mut out)
            .expect("writing to a Vec cannot fail");
        out
    }

    /// Bytes [`to_bytes`](Self::to_bytes) produces.
    pub fn serialized_len(&self) -> usize {
        8 + 4 + 4 + 8 + 8 + self.layers.len() * 16 + self.len * self.bytes_per_position()
    }

    /// Writes the cache as: magic `COLIKV\0\0`, u32 format version, u32 layer count,
    /// u64 positions, u64 capacity, per layer (u32 k_width, u32 v_width, u32 extra_width,
    /// u32 dtype: 0 f32, 1 f16), then per layer its `len × k_width` keys and `len × v_width`
    /// values in that dtype and `len × extra_width` side floats (f32). All little-endian.
    /// Only the first `len` positions are written, so a cache always round-trips exactly.
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        w.write_all(KV_MAGIC)?;
        w.write_all(&KV_FORMAT_VERSION.to_le_bytes())?;
        w.write_all(&(self.layers.len() as u32).to_le_bytes())?;
        w.write_all(&(self.len as u64).to_le_bytes())?;
        w.write_all(&(self.capacity as u64).to_le_bytes())?;
        for l in &self.layers {
            w.write_all(&(l.k_width as u32).to_le_bytes())?;
            w.write_all(&(l.v_width as u32).to_le_bytes())?;
            w.write_all(&(l.extra_width as u32).to_le_bytes())?;
            // One dtype per layer: keys and values are always created alike.
            w.write_all(&l.k.dtype().code().to_le_bytes())?;
        }
        let mut buf = Vec::with_capacity(1 << 16);
        for l in &self.layers {
            for (part, n) in [(&l.k, self.len * l.k_width), (&l.v, self.len * l.v_width)] {
                match part {
                    KvBuf::F32(v) => write_f32s(w, &v[..n], &mut buf)?,
                    KvBuf::F16(v) => {
                        for chunk in v[..n].chunks(1 << 14) {
                            buf.clear();
                            for x in chunk {
                                buf.extend_from_slice(&x.to_le_bytes());
                            }
                            w.write_all(&buf)?;
                        }
                    }
                }
            }
            write_f32s(w, &l.extra[..self.len * l.extra_width], &mut buf)?;
        }
        Ok(())
    }

    /// Parses bytes written by [`write_to`](Self::write_to) (or by version 2, all f32).
    /// Every length is checked against the bytes actually present before anything is
    /// allocated, so a truncated or hostile input is an error, never a panic or an
    /// oversized allocation.
    pub fn from_bytes(bytes: &[u8]) -> crate::Result<KvCache> {
        let bad = |msg: String| crate::Error::CorruptFile {
            file: std::path::PathBuf::from("<KV cache snapshot>"),
            msg,
        };
        let mut r = ByteReader { bytes, pos: 0 };
        if r.take(8)
            .ok_or_else(|| bad("shorter than its header".into()))?
            != KV_MAGIC
        {
            return Err(bad("not a colibri KV cache (bad magic)".into()));
        }
        let version = r.u32().ok_or_else(|| bad("truncated header".into()))?;
        if !(KV_OLDEST_READ..=KV_FORMAT_VERSION).contains(&version) {
            return Err(bad(format!(
                "format version {version}, this build reads versions {KV_OLDEST_READ} to {KV_FORMAT_VERSION}"
            )));
        }
        let n_layers = r.u32().ok_or_else(|| bad("truncated header".into()))? as usize;
        let len = r.u64().ok_or_else(|| bad("truncated header".into()))?;
        let capacity = r.u64().ok_or_else(|| bad("truncated header".into()))?;
        if len > capacity {
            return Err(bad(format!(
                "{len} positions exceed the capacity of {capacity}"
            )));
        }
        let len = usize::try_from(len).map_err(|_| bad("length does not fit in memory".into()))?;
        let capacity =
            usize::try_from(capacity).map_err(|_| bad("capacity does not fit in memory".into()))?;
        let entry = if version >= 3 { 16 } else { 12 };
        if n_layers > (bytes.len() - r.pos) / entry {
            return Err(bad(format!(
                "{n_layers} layers do not fit in {} bytes",
                bytes.len()
            )));
        }
        let mut widths = Vec::with_capacity(n_layers);
        let mut expected: usize = 0;
        for _ in 0..n_layers {
            let k = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let v = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let x = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let dtype = if version >= 3 {
                let c = r.u32().ok_or_else(|| bad("truncated layer table".into()))?;
                KvDtype::from_code(c).ok_or_else(|| bad(format!("unknown KV dtype code {c}")))?
            } else {
                KvDtype::F32
            };
            expected = (k + v)
                .checked_mul(dtype.size())
                .and_then(|b| b.checked_add(x.checked_mul(4)?))
                .and_then(|b| b.checked_mul(len))
                .and_then(|b| b.checked_add(expected))
                .ok_or_else(|| bad("sizes overflow".into()))?;
            widths.push((k, v, x, dtype));
        }
        let rest = bytes.len() - r.pos;
        if rest != expected {
            return Err(bad(format!(
                "{rest} bytes of tensors, the header describes {expected}"
            )));
        }
        let mut layers = Vec::with_capacity(n_layers);
        for &(k_width, v_width, extra_width, dtype) in &widths {
            let k = r.buf(dtype, len * k_width);
            let v = r.buf(dtype, len * v_width);
            let extra = r.f32s(len * extra_width);
            layers.push(LayerKv {
                k,
                v,
                k_width,
                v_width,
                extra,
                extra_width,
            });
        }
        Ok(KvCache {
            layers,
            len,
            capacity,
        })
    }

    /// Whether `self` has the shape of `expected` (a fresh cache from the model that is to
    /// continue it): same layers, same widths, same capacity. The dtypes may differ: a
    /// cache continues in the dtype it was saved in (attention reads either).
    pub fn same_layout(&self, expected: &KvCache) -> bool {
        self.capacity == expected.capacity
            && self.layers.len() == expected.layers.len()
            && self.layers.iter().zip(&expected.layers).all(|(a, b)| {
                a.k_width == b.k_width && a.v_width == b.v_width && a.extra_width == b.extra_width
            })
    }
}

fn write_f32s(w: &mut impl std::io::Write, v: &[f32], buf: &mut Vec<u8>) -> std::io::Result<()> {
    for chunk in v.chunks(1 << 14) {
        buf.clear();
        for x in chunk {
            buf.extend_from_slice(&x.to_le_bytes());
        }
        w.write_all(buf)?;
    }
    Ok(())
}

struct ByteReader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl ByteReader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// `n` floats; the caller has checked that they are present.
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        let raw = self.take(n * 4).unwrap_or_default();
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
    /// `n` elements of `dtype`; the caller has checked that they are present.
    fn buf(&mut self, dtype: KvDtype, n: usize) -> KvBuf {
        match dtype {
            KvDtype::F32 => KvBuf::F32(self.f32s(n)),
            KvDtype::F16 => {
                let raw = self.take(n * 2).unwrap_or_default();
                KvBuf::F16(
                    raw.chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dtype: KvDtype) -> KvCache {
        let mut c = KvCache::with_dtype(&[(4, 2), (3, 3)], 16, dtype);
        c.len = 5;
        for (i, l) in c.layers.iter_mut().enumerate() {
            let k: Vec<f32> = (0..5 * l.k_width)
                .map(|x| x as f32 * 0.5 + i as f32)
                .collect();
            let v: Vec<f32> = (0..5 * l.v_width).map(|x| -(x as f32) - 0.25).collect();
            l.k.extend_from_f32(&k);
            l.v.extend_from_f32(&v);
        }
        c.layers[1].extra_width = 2;
        c.layers[1].extra = (0..10).map(|x| x as f32 / 3.0).collect();
        c
    }

    #[test]
    fn kv_bytes_round_trip_exactly() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let c = sample(dtype);
            let b = c.to_bytes();
            assert_eq!(b.len(), c.serialized_len());
            let d = KvCache::from_bytes(&b).unwrap();
            assert_eq!(d.len, 5);
            assert_eq!(d.capacity, 16);
            assert!(d.same_layout(&c));
            for (a, b) in c.layers.iter().zip(&d.layers) {
                assert_eq!(b.k.dtype(), dtype);
                assert_eq!(a.k.to_f32_vec(), b.k.to_f32_vec());
                assert_eq!(a.v.to_f32_vec(), b.v.to_f32_vec());
                assert_eq!(a.extra, b.extra);
            }
        }
        // f16 halves the key and value bytes.
        assert_eq!(
            sample(KvDtype::F16).size_bytes() - 40,
            (sample(KvDtype::F32).size_bytes() - 40) / 2
        );
    }

    /// A version-2 snapshot (f32, no dtype in the layer table) still reads, as f32.
    #[test]
    fn kv_version_2_snapshots_still_read() {
        let c = sample(KvDtype::F32);
        let mut v2 = Vec::new();
        v2.extend_from_slice(KV_MAGIC);
        v2.extend_from_slice(&2u32.to_le_bytes());
        v2.extend_from_slice(&2u32.to_le_bytes());
        v2.extend_from_slice(&5u64.to_le_bytes());
        v2.extend_from_slice(&16u64.to_le_bytes());
        for l in &c.layers {
            for w in [l.k_width, l.v_width, l.extra_width] {
                v2.extend_from_slice(&(w as u32).to_le_bytes());
            }
        }
        for l in &c.layers {
            for x in
                l.k.to_f32_vec()
                    .iter()
                    .chain(&l.v.to_f32_vec())
                    .chain(&l.extra)
            {
                v2.extend_from_slice(&x.to_le_bytes());
            }
        }
        let d = KvCache::from_bytes(&v2).unwrap();
        assert!(d.same_layout(&c));
        assert_eq!(d.layers[1].k.dtype(), KvDtype::F32);
        assert_eq!(d.layers[1].v.to_f32_vec(), c.layers[1].v.to_f32_vec());
        assert_eq!(d.layers[1].extra, c.layers[1].extra);
    }

    #[test]
    fn kv_bytes_damage_is_an_error() {
        let b = sample(KvDtype::F16).to_bytes();
        // Every truncation is refused.
        for n in [0, 7, 8, 20, 40, b.len() - 1] {
            assert!(KvCache::from_bytes(&b[..n]).is_err(), "truncated to {n}");
        }
        // A trailing byte, a bad magic, a future version, a huge length, a bad dtype.
        let mut longer = b.clone();
        longer.push(0);
        assert!(KvCache::from_bytes(&longer).is_err());
        let mut m = b.clone();
        m[0] ^= 1;
        assert!(KvCache::from_bytes(&m).is_err());
        let mut v = b.clone();
        v[8] = 9;
        assert!(KvCache::from_bytes(&v).is_err());
        let mut huge = b.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(KvCache::from_bytes(&huge).is_err());
        let mut dt = b.clone();
        dt[44..48].copy_from_slice(&7u32.to_le_bytes());
        assert!(KvCache::from_bytes(&dt).is_err());
        let mut layers = b;
        layers[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(KvCache::from_bytes(&layers).is_err());
    }
}
