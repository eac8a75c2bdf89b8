//! The cache itself: [`KvCache`] per sequence, [`LayerKv`] per layer, and the stored
//! element type ([`KvDtype`], [`KvBuf`]).

use half::f16;

/// Element type of the stored keys and values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    /// The dtype `COLIBRI_KV=f32|f16` forces on every layer of new caches (read once);
    /// `None`: each attention kind's default.
    pub fn from_env() -> Option<KvDtype> {
        static D: std::sync::OnceLock<Option<KvDtype>> = std::sync::OnceLock::new();
        *D.get_or_init(|| match std::env::var("COLIBRI_KV").as_deref() {
            Ok("f32") | Ok("F32") => Some(KvDtype::F32),
            Ok("f16") | Ok("F16") => Some(KvDtype::F16),
            _ => None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        }
    }
}

/// Stored keys or values of one layer, `len × width`, row-major by position.
#[derive(Clone, Debug)]
pub enum KvBuf {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl Default for KvBuf {
    fn default() -> Self {
        KvBuf::F32(Vec::new())
    }
}

/// f32 → f16 without infinities: a value past f16's range is stored as ±65504.
#[inline]
fn to_f16(x: f32) -> f16 {
    f16::from_f32(x.clamp(-65504.0, 65504.0))
}

impl KvBuf {
    pub fn new(dtype: KvDtype) -> KvBuf {
        match dtype {
            KvDtype::F32 => KvBuf::F32(Vec::new()),
            KvDtype::F16 => KvBuf::F16(Vec::new()),
        }
    }

    pub fn dtype(&self) -> KvDtype {
        match self {
            KvBuf::F32(_) => KvDtype::F32,
            KvBuf::F16(_) => KvDtype::F16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvBuf::F32(v) => v.len(),
            KvBuf::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }

    pub fn truncate(&mut self, n: usize) {
        match self {
            KvBuf::F32(v) => v.truncate(n),
            KvBuf::F16(v) => v.truncate(n),
        }
    }

    /// Appends f32 values, converted to the stored type.
    pub fn extend_from_f32(&mut self, x: &[f32]) {
        match self {
            KvBuf::F32(v) => v.extend_from_slice(x),
            KvBuf::F16(v) => v.extend(x.iter().map(|&a| to_f16(a))),
        }
    }
}

/// Keys and values of one attention layer, `len × width` each, row-major by position.
#[derive(Clone, Debug, Default)]
pub struct LayerKv {
    pub k: KvBuf,
    pub v: KvBuf,
    /// Floats per position in `k` (kv heads × key head dim).
    pub k_width: usize,
    /// Floats per position in `v` (kv heads × value head dim).
    pub v_width: usize,
    /// Per-position side data some attention kinds keep (the DSA indexer's keys, f32 always),
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
    /// A cache with f32 keys and values (see [`with_dtype`](Self::with_dtype)).
    pub fn new(widths: &[(usize, usize)], capacity: usize) -> KvCache {
        Self::with_dtype(widths, capacity, KvDtype::F32)
    }

    pub fn with_dtype(widths: &[(usize, usize)], capacity: usize, dtype: KvDtype) -> KvCache {
        KvCache {
            layers: widths
                .iter()
                .map(|&(k_width, v_width)| LayerKv {
                    k: KvBuf::new(dtype),
                    v: KvBuf::new(dtype),
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
            .map(|l| {
                l.k_width * l.k.dtype().size() + l.v_width * l.v.dtype().size() + l.extra_width * 4
            })
            .sum()
    }

    /// Bytes held by the cache's tensors.
    pub fn size_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.k.size_bytes() + l.v.size_bytes() + l.extra.len() * 4)
            .sum()
    }
}
