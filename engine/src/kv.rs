//! Per-sequence KV caches. One [`KvCache`] holds every layer's keys and values for the
//! positions a sequence has seen so far; the forward pass appends to it.

/// Keys and values of one attention layer, `len × width` each, row-major by position.
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Floats per position in `k` (kv heads × key head dim).
    pub k_width: usize,
    /// Floats per position in `v` (kv heads × value head dim).
    pub v_width: usize,
    /// Per-position side data some attention kinds keep (the DSA indexer's keys),
    /// `len × extra_width`; empty for plain attention.
    pub extra: Vec<f32>,
    pub extra_width: usize,
}

#[derive(Clone, Debug, Default)]
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    /// Positions held (the next token's position).
    pub len: usize,
    /// Positions this cache may hold at most (the model's context).
    pub capacity: usize,
}

impl KvCache {
    pub fn new(widths: &[(usize, usize)], capacity: usize) -> KvCache {
        KvCache {
            layers: widths
                .iter()
                .map(|&(k_width, v_width)| LayerKv {
                    k: Vec::new(),
                    v: Vec::new(),
                    k_width,
                    v_width,
                    extra: Vec::new(),
                    extra_width: 0,
                })
                .collect(),
            len: 0,
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops every position from `len` on (used to rewind a rejected speculative draft or
    /// to reset a conversation).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        for l in &mut self.layers {
            l.k.truncate(len * l.k_width);
            l.v.truncate(len * l.v_width);
            l.extra.truncate(len * l.extra_width);
        }
        self.len = len;
    }

    /// Bytes one more position adds.
    pub fn bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k_width + l.v_width + l.extra_width) * 4)
            .sum()
    }

    /// Bytes held by the cache's tensors.
    pub fn size_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.len() + l.v.len() + l.extra.len()) * 4)
            .sum()
    }
}

/// Leading bytes of a serialized [`KvCache`].
const KV_MAGIC: &[u8; 8] = b"COLIKV\0\0";
/// Bumped whenever the byte layout below changes; older snapshots are then refused.
const KV_FORMAT_VERSION: u32 = 2;

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
        8 + 4 + 4 + 8 + 8 + self.layers.len() * 12 + self.size_bytes()
    }

    /// Writes the cache as: magic `COLIKV\0\0`, u32 format version, u32 layer count,
    /// u64 positions, u64 capacity, per layer (u32 k_width, u32 v_width, u32 extra_width),
    /// then per layer its `len × k_width` key floats, `len × v_width` value floats and
    /// `len × extra_width` side floats. All little-endian.
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
        }
        let mut buf = Vec::with_capacity(1 << 16);
        for l in &self.layers {
            for part in [
                &l.k[..self.len * l.k_width],
                &l.v[..self.len * l.v_width],
                &l.extra[..self.len * l.extra_width],
            ] {
                for chunk in part.chunks(1 << 14) {
                    buf.clear();
                    for x in chunk {
                        buf.extend_from_slice(&x.to_le_bytes());
                    }
                    w.write_all(&buf)?;
                }
            }
        }
        Ok(())
    }

    /// Parses bytes written by [`write_to`](Self::write_to). Every length is checked against
    /// the bytes actually present before anything is allocated, so a truncated or hostile
    /// input is an error, never a panic or an oversized allocation.
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
        if version != KV_FORMAT_VERSION {
            return Err(bad(format!(
                "format version {version}, this build reads version {KV_FORMAT_VERSION}"
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
        if n_layers > (bytes.len() - r.pos) / 12 {
            return Err(bad(format!(
                "{n_layers} layers do not fit in {} bytes",
                bytes.len()
            )));
        }
        let mut widths = Vec::with_capacity(n_layers);
        let mut floats: usize = 0;
        for _ in 0..n_layers {
            let k = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let v = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            let x = r.u32().ok_or_else(|| bad("truncated layer table".into()))? as usize;
            floats = (k + v + x)
                .checked_mul(len)
                .and_then(|n| n.checked_add(floats))
                .ok_or_else(|| bad("sizes overflow".into()))?;
            widths.push((k, v, x));
        }
        let expected = floats
            .checked_mul(4)
            .ok_or_else(|| bad("sizes overflow".into()))?;
        let rest = bytes.len() - r.pos;
        if rest != expected {
            return Err(bad(format!(
                "{rest} bytes of tensors, the header describes {expected}"
            )));
        }
        let mut layers = Vec::with_capacity(n_layers);
        for &(k_width, v_width, extra_width) in &widths {
            let k = r.f32s(len * k_width);
            let v = r.f32s(len * v_width);
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
    /// continue it): same layers, same widths, same capacity.
    pub fn same_layout(&self, expected: &KvCache) -> bool {
        self.capacity == expected.capacity
            && self.layers.len() == expected.layers.len()
            && self.layers.iter().zip(&expected.layers).all(|(a, b)| {
                a.k_width == b.k_width && a.v_width == b.v_width && a.extra_width == b.extra_width
            })
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KvCache {
        let mut c = KvCache::new(&[(4, 2), (3, 3)], 16);
        c.len = 5;
        for (i, l) in c.layers.iter_mut().enumerate() {
            l.k = (0..5 * l.k_width)
                .map(|x| x as f32 * 0.5 + i as f32)
                .collect();
            l.v = (0..5 * l.v_width).map(|x| -(x as f32) - 0.25).collect();
        }
        c
    }

    #[test]
    fn kv_bytes_round_trip_exactly() {
        let c = sample();
        let b = c.to_bytes();
        assert_eq!(b.len(), c.serialized_len());
        let d = KvCache::from_bytes(&b).unwrap();
        assert_eq!(d.len, 5);
        assert_eq!(d.capacity, 16);
        assert!(d.same_layout(&c));
        for (a, b) in c.layers.iter().zip(&d.layers) {
            assert_eq!(a.k, b.k);
            assert_eq!(a.v, b.v);
        }
    }

    #[test]
    fn kv_bytes_damage_is_an_error() {
        let b = sample().to_bytes();
        // Every truncation is refused.
        for n in [0, 7, 8, 20, 40, b.len() - 1] {
            assert!(KvCache::from_bytes(&b[..n]).is_err(), "truncated to {n}");
        }
        // A trailing byte, a bad magic, a future version, a huge length.
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
        let mut layers = b;
        layers[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(KvCache::from_bytes(&layers).is_err());
    }
}
