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
        }
        self.len = len;
    }

    /// Bytes held by the cache's tensors.
    pub fn size_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.len() + l.v.len()) * 4)
            .sum()
    }
}
