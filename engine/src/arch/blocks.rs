//! Blocks shared by the model families, written once: RMSNorm, rotary embeddings, the SiLU
//! MLP, softmax, and the weight-loading helpers that check shapes against the config.

use crate::container::Checkpoint;
use crate::error::Result;
use crate::tensor::{Blob, Linear, Matrix};
use std::sync::{Arc, RwLock};

/// RMSNorm: `x / sqrt(mean(x²) + eps) * weight`, the sum of squares accumulated in f64 so
/// the result sits as close to the exact value as torch's reduction does.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub weight: Vec<f32>,
    pub eps: f32,
}

impl RmsNorm {
    pub fn width(&self) -> usize {
        self.weight.len()
    }

    /// Normalises one vector of `width()` floats in place.
    pub fn apply(&self, x: &mut [f32]) {
        let ss = super::simd::sum_squares_f64(x);
        let mean = (ss / x.len() as f64) as f32;
        let r = 1.0 / (mean + self.eps).sqrt();
        for (v, w) in x.iter_mut().zip(&self.weight) {
            *v = *w * (*v * r);
        }
    }

    /// Normalises every `width()`-float chunk of `x` in place (rows, or heads within rows).
    pub fn apply_chunks(&self, x: &mut [f32]) {
        for c in x.chunks_mut(self.width()) {
            self.apply(c);
        }
    }

    /// A normalised copy of `n` rows.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut out = x.to_vec();
        self.apply_chunks(&mut out);
        out
    }
}

/// How the rotary dimensions of a head are paired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Element i pairs with i + d/2 (`rotate_half`, Llama/OLMoE/Qwen/Mixtral).
    HalfSplit,
    /// Element 2i pairs with 2i + 1 (GPT-J style).
    Interleaved,
}

/// cos and sin per position, filled as positions are reached (`rotary_dim / 2` cos then as
/// many sin per position, times `attention_scaling`): computed once, shared by every row,
/// head and step instead of recomputed per layer and row.
#[derive(Default)]
pub struct RopeTable(RwLock<Vec<f32>>);

impl std::fmt::Debug for RopeTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.read().map_or(0, |t| t.len());
        write!(f, "RopeTable({n} floats)")
    }
}

/// Rotary position embedding over the first `rotary_dim` dimensions of each head.
#[derive(Clone, Debug)]
pub struct Rope {
    /// Per pair frequency, `rotary_dim / 2` values.
    pub inv_freq: Vec<f32>,
    pub rotary_dim: usize,
    pub layout: RopeLayout,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    pub attention_scaling: f32,
    /// Precomputed angles (see [`RopeTable`]); shared by clones.
    pub table: Arc<RopeTable>,
}

impl Rope {
    /// Plain RoPE: `inv_freq[i] = theta^(-2i/dim)`, computed in f32 as transformers does.
    pub fn new(theta: f64, rotary_dim: usize, layout: RopeLayout) -> Rope {
        let inv_freq = (0..rotary_dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / rotary_dim as f32;
                1.0f32 / (theta as f32).powf(exponent)
            })
            .collect();
        Rope {
            inv_freq,
            rotary_dim,
            layout,
            attention_scaling: 1.0,
            table: Default::default(),
        }
    }

    /// Rotates every head (`head_dim` floats each) of one position's vector `x` in place.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, pos: usize) {
        let (cos, sin) = self.cos_sin(pos);
        self.rotate(x, head_dim, &cos, &sin);
    }

    /// cos and sin of every pair's angle at `pos`, times `attention_scaling`. Computed once
    /// per position and shared by every head (and, for MLA, by q, k and the DSA indexer).
    pub fn cos_sin(&self, pos: usize) -> (Vec<f32>, Vec<f32>) {
        let half = self.rotary_dim / 2;
        let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
        self.cos_sin_into(pos, &mut cos, &mut sin);
        (cos, sin)
    }

    /// [`cos_sin`](Self::cos_sin) into caller buffers of `rotary_dim / 2` floats, from the
    /// table (extended to twice its size when `pos` is past its end).
    pub fn cos_sin_into(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let half = self.rotary_dim / 2;
        if half == 0 {
            return;
        }
        {
            let t = self.table.0.read().unwrap_or_else(|e| e.into_inner());
            if (pos + 1) * 2 * half <= t.len() {
                let row = &t[pos * 2 * half..(pos + 1) * 2 * half];
                cos.copy_from_slice(&row[..half]);
                sin.copy_from_slice(&row[half..]);
                return;
            }
        }
        let mut t = self.table.0.write().unwrap_or_else(|e| e.into_inner());
        let have = t.len() / (2 * half);
        let want = (pos + 1).max(2 * have).max(64);
        for p in have..want {
            for i in 0..half {
                // torch computes the angle as f32(inv_freq * pos).
                let a = self.inv_freq[i] * p as f32;
                t.push(a.cos() * self.attention_scaling);
            }
            for i in 0..half {
                let a = self.inv_freq[i] * p as f32;
                t.push(a.sin() * self.attention_scaling);
            }
        }
        let row = &t[pos * 2 * half..(pos + 1) * 2 * half];
        cos.copy_from_slice(&row[..half]);
        sin.copy_from_slice(&row[half..]);
    }

    /// Rotates the first `rotary_dim` dims of every `head_dim` chunk of `x` with angles from
    /// [`cos_sin`](Self::cos_sin); the rest of each chunk passes through.
    pub fn rotate(&self, x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        self.rotate_as(self.layout, x, head_dim, cos, sin);
    }

    /// [`rotate`](Self::rotate) with another pairing of the dims (same angles): DeepSeek-V3.2's
    /// indexer splits its rope dims in halves where the MLA it sits in interleaves them.
    pub fn rotate_as(
        &self,
        layout: RopeLayout,
        x: &mut [f32],
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
    ) {
        let half = self.rotary_dim / 2;
        for h in x.chunks_mut(head_dim) {
            match layout {
                RopeLayout::HalfSplit => {
                    for i in 0..half {
                        let (a, b) = (h[i], h[i + half]);
                        h[i] = a * cos[i] - b * sin[i];
                        h[i + half] = b * cos[i] + a * sin[i];
                    }
                }
                // transformers de-interleaves the output ([evens ‖ odds]); keeping the pairs in
                // place instead permutes q and k alike, so every dot product is the same.
                RopeLayout::Interleaved => {
                    for i in 0..half {
                        let (a, b) = (h[2 * i], h[2 * i + 1]);
                        h[2 * i] = a * cos[i] - b * sin[i];
                        h[2 * i + 1] = b * cos[i] + a * sin[i];
                    }
                }
            }
        }
    }
}

/// torch's `nn.LayerNorm` with weight and bias: `(x - mean) / sqrt(var + eps) * w + b`, the
/// biased variance, moments accumulated in f64.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub eps: f32,
}

impl LayerNorm {
    /// Normalises every `weight.len()`-float chunk of `x` in place.
    pub fn apply_chunks(&self, x: &mut [f32]) {
        let w = self.weight.len();
        for c in x.chunks_mut(w) {
            let mean = c.iter().map(|v| *v as f64).sum::<f64>() / w as f64;
            let var = c.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / w as f64;
            let r = 1.0 / (var as f32 + self.eps).sqrt();
            let mean = mean as f32;
            for ((v, g), b) in c.iter_mut().zip(&self.weight).zip(&self.bias) {
                *v = (*v - mean) * r * g + b;
            }
        }
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// In-place softmax (max-subtracted, f32 like torch's `softmax(dtype=float32)`).
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// The gated SiLU MLP: `down(silu(gate(x)) * up(x))`. Used for dense layers, routed experts
/// and shared experts alike; `glu` says where it differs (gpt-oss: biases, interleaved
/// gate/up rows in one matrix, the clamped SwiGLU).
#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
    pub glu: super::glu::Glu,
}

impl Mlp {
    /// The plain SiLU MLP of three matrices.
    pub fn silu(gate: Matrix, up: Matrix, down: Matrix) -> Mlp {
        Mlp {
            gate,
            up,
            down,
            glu: Default::default(),
        }
    }

    pub fn intermediate(&self) -> usize {
        self.down.cols
    }

    pub fn size_bytes(&self) -> usize {
        self.gate.size_bytes() + self.up.size_bytes() + self.down.size_bytes()
    }
}

/// Loads weights by name from a checkpoint, checking each shape against the config and
/// naming the family in a missing-tensor error.
pub struct Loader<'a> {
    pub ckpt: &'a Checkpoint,
    pub family: &'static str,
    /// Told as each decoder layer is loaded.
    pub progress: &'a super::load::LoadHook<'a>,
}

impl<'a> Loader<'a> {
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let t = self.ckpt.require(name, self.family)?;
        let m = Matrix::from_tensor(t, rows, cols)?;
        // The census tells the format of the files: an int4 matrix interleaved in RAM at
        // load counts as the row-major int4 its file holds.
        let stored = if t.file.repacked_at(t.start) {
            m.format.row_major()
        } else {
            m.format
        };
        self.progress.record_matrix_as(name, &m, stored);
        Ok(m)
    }

    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.ckpt.require(name, self.family)?;
        t.expect_shape(&[len])?;
        t.to_f32_vec()
    }

    pub fn norm(&self, name: &str, width: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: self.vector(name, width)?,
            eps,
        })
    }

    /// `{prefix}.weight` `[out, in]` and, when `bias`, `{prefix}.bias` `[out]`.
    pub fn linear(&self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
        Ok(Linear {
            weight: self.matrix(&format!("{prefix}.weight"), out, inp)?,
            bias: if bias {
                Some(self.vector(&format!("{prefix}.bias"), out)?)
            } else {
                None
            },
        })
    }

    /// `{prefix}.weight` and `{prefix}.bias`, both `[width]`: a LayerNorm.
    pub fn layer_norm(&self, prefix: &str, width: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.vector(&format!("{prefix}.weight"), width)?,
            bias: self.vector(&format!("{prefix}.bias"), width)?,
            eps,
        })
    }

    /// A gated MLP whose three projections are `{prefix}.{gate|up|down}.weight`, or, in the
    /// C engine's merged expert layout, one `{prefix}.merged_weight` holding all three.
    pub fn mlp(&self, prefix: &str, names: [&str; 3], hidden: usize, inter: usize) -> Result<Mlp> {
        let [g, u, d] = names;
        if self.ckpt.get(&format!("{prefix}.{g}.weight")).is_none() {
            let merged = format!("{prefix}.{}", crate::container::MERGED_WEIGHT);
            if let Some(t) = self.ckpt.get(&merged) {
                let [gate, up, down] = crate::container::split_merged_expert(t, hidden, inter)?;
                for m in [&gate, &up, &down] {
                    self.progress.record_matrix(&merged, m);
                }
                return Ok(Mlp::silu(gate, up, down));
            }
        }
        Ok(Mlp::silu(
            self.matrix(&format!("{prefix}.{g}.weight"), inter, hidden)?,
            self.matrix(&format!("{prefix}.{u}.weight"), inter, hidden)?,
            self.matrix(&format!("{prefix}.{d}.weight"), hidden, inter)?,
        ))
    }
}

/// Rows `r0..r1` of `m` as a matrix of their own, in the same format. Memory-mapped bytes are
/// shared (no copy); owned bytes are copied once. Used to split a fused projection (MLA's
/// `kv_b_proj`) into per-head blocks at load time.
pub fn row_block(m: &Matrix, r0: usize, r1: usize) -> Matrix {
    assert!(
        r0 <= r1 && r1 <= m.rows,
        "row block {r0}..{r1} of {} rows",
        m.rows
    );
    // Interleaved rows come apart only at whole groups of 8.
    let aligned = |r: usize| r.is_multiple_of(crate::rows8::ROWS);
    if m.format.interleaved() && !(aligned(r0) && aligned(r1)) {
        return row_block(&m.to_row_major(), r0, r1);
    }
    let slice = |blob: &Blob, row_bytes: usize| -> Blob {
        let (a, b) = (r0 * row_bytes, r1 * row_bytes);
        match blob {
            Blob::Mapped { file, start, .. } => Blob::Mapped {
                file: file.clone(),
                start: start + a,
                end: start + b,
            },
            other => Blob::Owned(Arc::new(other.bytes()[a..b].to_vec())),
        }
    };
    let data = slice(&m.data, m.format.row_bytes(m.cols));
    let scales = m
        .scales
        .as_ref()
        .map(|s| slice(s, m.format.scale_row_bytes(m.cols)));
    let mut out = Matrix::quantized(r1 - r0, m.cols, m.format, data, scales)
        .expect("a row block of a valid matrix has valid sizes");
    out.int8_act = m.int8_act;
    out
}
