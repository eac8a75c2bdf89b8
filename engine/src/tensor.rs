//! Weight matrices as the forward pass sees them: `rows × cols`, row-major, in whatever
//! storage format the checkpoint holds, multiplied against f32 activations.
//!
//! Storage is borrowed from the memory map where possible so a bf16 checkpoint costs its
//! file size in RAM, not twice that in f32.

use crate::container::{DType, MappedFile, TensorRef};
use crate::error::Result;
use crate::kernels;
use rayon::prelude::*;
use std::sync::Arc;

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
}

impl Blob {
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        match self {
            Blob::Mapped { file, start, end } => &file.bytes()[*start..*end],
            Blob::Owned(v) => v,
        }
    }
}

/// Element format of a dense matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    F32,
    BF16,
    F16,
}

impl WeightFormat {
    pub fn bytes_per_element(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::BF16 | WeightFormat::F16 => 2,
        }
    }
}

#[derive(Clone)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub format: WeightFormat,
    pub data: Blob,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix({}x{} {:?})", self.rows, self.cols, self.format)
    }
}

impl Matrix {
    /// A `[rows, cols]` tensor of f32/bf16/f16, borrowed from its memory map.
    pub fn from_tensor(t: &TensorRef, rows: usize, cols: usize) -> Result<Matrix> {
        t.expect_shape(&[rows, cols])?;
        let format = match t.dtype {
            DType::F32 => WeightFormat::F32,
            DType::BF16 => WeightFormat::BF16,
            DType::F16 => WeightFormat::F16,
            other => {
                return Err(t.bad(format!(
                    "dtype {} is not a dense weight format (f32, bf16, f16)",
                    other.name()
                )))
            }
        };
        Ok(Matrix {
            rows,
            cols,
            format,
            data: Blob::Mapped {
                file: t.file.clone(),
                start: t.start,
                end: t.end,
            },
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
        }
    }

    pub fn size_bytes(&self) -> usize {
        self.data.bytes().len()
    }

    #[inline]
    fn row_bytes(&self, r: usize) -> &[u8] {
        let w = self.cols * self.format.bytes_per_element();
        &self.data.bytes()[r * w..(r + 1) * w]
    }

    /// Row `r` converted to f32 into `out` (length `cols`).
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        kernels::decode_row(self.format, self.row_bytes(r), out);
    }

    /// `dot(row r, x)`.
    #[inline]
    pub fn row_dot(&self, r: usize, x: &[f32]) -> f32 {
        kernels::dot(self.format, self.row_bytes(r), x)
    }

    /// `out[i][r] = dot(row r, x[i])` for `n` input rows `x` (`n × cols`, row-major);
    /// `out` is `n × rows`. Parallel over blocks of output rows; each weight row is decoded
    /// once and applied to every input row, so a batch reads the weights once.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        debug_assert_eq!(x.len(), n * self.cols);
        debug_assert_eq!(out.len(), n * self.rows);
        if n == 1 {
            // One input row: output rows are contiguous, no transpose needed.
            out.par_chunks_mut(64).enumerate().for_each(|(b, chunk)| {
                for (j, o) in chunk.iter_mut().enumerate() {
                    *o = self.row_dot(b * 64 + j, x);
                }
            });
            return;
        }
        // Output computed transposed (rows × n) so each thread writes a contiguous block.
        let mut t = vec![0f32; self.rows * n];
        const BLOCK: usize = 16;
        t.par_chunks_mut(BLOCK * n)
            .enumerate()
            .for_each_init(
                || vec![0f32; self.cols],
                |wrow, (b, chunk)| {
                    for (j, orow) in chunk.chunks_mut(n).enumerate() {
                        let r = b * BLOCK + j;
                        if self.format == WeightFormat::F32 {
                            for (i, o) in orow.iter_mut().enumerate() {
                                *o = self.row_dot(r, &x[i * self.cols..(i + 1) * self.cols]);
                            }
                        } else {
                            self.row_to_f32(r, wrow);
                            for (i, o) in orow.iter_mut().enumerate() {
                                *o = kernels::dot_f32(wrow, &x[i * self.cols..(i + 1) * self.cols]);
                            }
                        }
                    }
                },
            );
        for r in 0..self.rows {
            for i in 0..n {
                out[i * self.rows + r] = t[r * n + i];
            }
        }
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
        if let Some(b) = &self.bias {
            for row in out.chunks_mut(self.weight.rows) {
                for (o, bv) in row.iter_mut().zip(b) {
                    *o += bv;
                }
            }
        }
        out
    }
}
