//! Weight matrices as the forward pass sees them: `rows × cols`, row-major, in whatever
//! storage format the checkpoint holds, multiplied against f32 activations.
//!
//! Storage is borrowed from the memory map where possible so a bf16 checkpoint costs its
//! file size in RAM, not twice that in f32.

use crate::container::MappedFile;
use crate::kernels;
use std::sync::Arc;

// The formats' old home: their paths through `tensor` stay valid.
pub use crate::format::{ScaleType, WeightFormat};

/// Where a matrix's bytes live.
#[derive(Clone)]
pub enum Blob {
    /// A byte range of a memory-mapped file.
    Mapped {
        file: Arc<MappedFile>,
        start: usize,
        end: usize,
    },
    /// Bytes owned in RAM (converted, dequantised or read from disk).
    Owned(Arc<Vec<u8>>),
    /// A byte range of a buffer owned elsewhere (a routed expert read into the expert
    /// cache), alive as long as any matrix uses it.
    Shared {
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        start: usize,
        end: usize,
    },
}

impl std::fmt::Debug for Blob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blob({} bytes)", self.bytes().len())
    }
}

impl Blob {
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        match self {
            Blob::Mapped { file, start, end } => file.range(*start, *end),
            Blob::Owned(v) => v,
            Blob::Shared { owner, start, end } => &(**owner).as_ref()[*start..*end],
        }
    }
}

#[derive(Clone)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub format: WeightFormat,
    pub data: Blob,
    /// Scales of a quantized format, `rows × groups_per_row` values of its `ScaleType`.
    pub scales: Option<Blob>,
    /// Quantize activations to int8 (per 32-element block) and use integer dot products.
    /// Lossy, so off unless asked for (routed experts only; see docs/FORMAT.md).
    pub int8_act: bool,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({}x{} {:?})", self.rows, self.cols, self.format)
    }
}

impl Matrix {
    /// A matrix in any format from its packed bytes, checking both sizes (the message says
    /// which is wrong; callers wrap it in an error naming file and tensor).
    pub fn quantized(
        rows: usize,
        cols: usize,
        format: WeightFormat,
        data: Blob,
        scales: Option<Blob>,
    ) -> std::result::Result<Matrix, String> {
        let want = rows
            .checked_mul(format.row_bytes(cols))
            .ok_or_else(|| format!("shape [{rows}, {cols}] overflows"))?;
        if data.bytes().len() != want {
            return Err(format!(
                "{} bytes of weights, but [{rows}, {cols}] in {} needs {want}",
                data.bytes().len(),
                format.name()
            ));
        }
        let want_s = rows * format.scale_row_bytes(cols);
        let got_s = scales.as_ref().map_or(0, |s| s.bytes().len());
        if got_s != want_s {
            return Err(format!(
                "{got_s} bytes of scales, but [{rows}, {cols}] in {} needs {want_s}",
                format.name()
            ));
        }
        Ok(Matrix {
            rows,
            cols,
            format,
            data,
            scales: if want_s == 0 { None } else { scales },
            int8_act: false,
        })
    }

    /// An owned f32 matrix (tests, derived weights).
    pub fn from_f32(rows: usize, cols: usize, values: &[f32]) -> Matrix {
        assert_eq!(values.len(), rows * cols);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Matrix {
            rows,
            cols,
            format: WeightFormat::F32,
            data: Blob::Owned(Arc::new(bytes)),
            scales: None,
            int8_act: false,
        }
    }

    /// An owned matrix quantized from f32 values (tests, benchmarks, synthetic weights).
    pub fn quantize_f32(rows: usize, cols: usize, format: WeightFormat, values: &[f32]) -> Matrix {
        let p = crate::quant::quantize(format, rows, cols, values);
        let scales = (!p.scales.is_empty()).then(|| Blob::Owned(Arc::new(p.scales)));
        Matrix::quantized(rows, cols, format, Blob::Owned(Arc::new(p.data)), scales)
            .expect("the quantizer produces the sizes the format needs")
    }

    /// Bytes of weights and scales.
    pub fn size_bytes(&self) -> usize {
        self.data.bytes().len() + self.scales.as_ref().map_or(0, |s| s.bytes().len())
    }

    #[inline]
    fn row_bytes(&self, r: usize) -> &[u8] {
        let w = self.format.row_bytes(self.cols);
        &self.data.bytes()[r * w..(r + 1) * w]
    }

    #[inline]
    fn row_scales(&self, r: usize) -> &[u8] {
        match &self.scales {
            Some(s) => {
                let w = self.format.scale_row_bytes(self.cols);
                &s.bytes()[r * w..(r + 1) * w]
            }
            None => &[],
        }
    }

    /// Row `r`'s codes and scales taken out of an interleaved matrix ([`crate::rows8`]).
    fn gathered_row(&self, r: usize) -> (Vec<u8>, Vec<u8>) {
        let mut c = vec![0u8; self.format.row_bytes(self.cols)];
        let mut s = vec![0u8; self.format.scale_row_bytes(self.cols)];
        let scales = self.scales.as_ref().map_or(&[][..], |s| s.bytes());
        crate::format::rows8::gather_row(
            self.format,
            self.cols,
            self.data.bytes(),
            scales,
            r,
            &mut c,
            &mut s,
        );
        (c, s)
    }

    /// Row `r` converted (dequantized) to f32 into `out` (length `cols`).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        if self.format.interleaved() {
            let (c, s) = self.gathered_row(r);
            return kernels::decode_row(self.format.row_major(), &c, &s, out);
        }
        kernels::decode_row(self.format, self.row_bytes(r), self.row_scales(r), out);
    }

    /// `dot(row r, x)` with f32 activations (reference kernel: tests, one-off dots).
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        if self.format.interleaved() {
            let (c, s) = self.gathered_row(r);
            return kernels::dot(self.format.row_major(), &c, &s, x);
        }
        kernels::dot(self.format, self.row_bytes(r), self.row_scales(r), x)
    }

    /// The same matrix with its rows one after another (owned): an interleaved matrix
    /// ([`crate::rows8`]) as [`WeightFormat::I4`], any other as it is.
    pub fn to_row_major(&self) -> Matrix {
        if !self.format.interleaved() {
            return self.clone();
        }
        let scales = self.scales.as_ref().map_or(&[][..], |s| s.bytes());
        let (c, s) = crate::format::rows8::deinterleave(
            self.format,
            self.rows,
            self.cols,
            self.data.bytes(),
            scales,
        );
        let mut m = Matrix::quantized(
            self.rows,
            self.cols,
            self.format.row_major(),
            Blob::Owned(Arc::new(c)),
            Some(Blob::Owned(Arc::new(s))),
        )
        .expect("the same sizes");
        m.int8_act = self.int8_act;
        m
    }

    /// The matrix as the kernels see it (borrowed bytes).
    pub fn weights(&self) -> kernels::Weights<'_> {
        kernels::Weights {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            data: self.data.bytes(),
            scales: self.scales.as_ref().map_or(&[], |s| s.bytes()),
            int8: self.int8_act && kernels::q8_supported(self.format, self.cols),
            rows8: kernels::int4_rows8(),
        }
    }

    /// `out[i][r] = dot(row r, x[i])` for `n` input rows `x` (`n × cols`, row-major);
    /// `out` is `n × rows`. Runs as register tiles of weight rows × input rows on the
    /// thread team, so a batch reads the weights once; every (row, input) pair is computed
    /// the same way whatever `n` is, so a sequence's logits do not depend on what it was
    /// batched with.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        self.matmul_input(&kernels::Input::with_cols(x, n, self.cols), out);
    }

    /// As [`Matrix::matmul`] on activations prepared once ([`kernels::Input`]) and shared
    /// with other matrices that read the same input.
    pub fn matmul_input(&self, input: &kernels::Input, out: &mut [f32]) {
        kernels::matmul(&self.weights(), input, out);
    }

    /// Several matrices that read the same input (q/k/v, gate/up), in one parallel region:
    /// `outs[i]` is `input.n × mats[i].rows`.
    pub fn matmul_many(mats: &[&Matrix], input: &kernels::Input, outs: &mut [&mut [f32]]) {
        assert_eq!(mats.len(), outs.len(), "one output per matrix");
        let mut jobs: Vec<(kernels::Weights, &mut [f32])> = mats
            .iter()
            .zip(outs.iter_mut())
            .map(|(m, o)| (m.weights(), &mut **o))
            .collect();
        kernels::matmul_many(&mut jobs, input);
    }
}

/// A linear layer: weight `[out, in]` and an optional bias.
#[derive(Clone, Debug)]
pub struct Linear {
    pub weight: Matrix,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn out_features(&self) -> usize {
        self.weight.rows
    }
    pub fn in_features(&self) -> usize {
        self.weight.cols
    }
    /// `y = x Wᵀ + b` for `n` rows.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * self.weight.rows];
        self.weight.matmul(x, n, &mut out);
        self.add_bias(&mut out);
        out
    }

    /// Adds the bias (if any) to every row of `y` (rows of `out_features`).
    pub fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in y.chunks_mut(self.weight.rows) {
                for (o, bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
    }
}
