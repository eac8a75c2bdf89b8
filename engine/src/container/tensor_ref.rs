//! A tensor of an opened folder: where its bytes lie, its quantized storage if any, and the
//! matrix it loads as.

use super::{DType, MappedFile};
use crate::error::{Error, Result};
use crate::format::WeightFormat;
use crate::kernels;
use crate::tensor::{Blob, Matrix};
use std::sync::Arc;

/// A tensor inside a mapped file: dtype, shape and the absolute byte range, already checked
/// to lie inside the file and to match `shape × dtype size`.
#[derive(Clone, Debug)]
pub struct TensorRef {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub file: Arc<MappedFile>,
    pub start: usize,
    pub end: usize,
    /// Quantized storage (converted container or C layout); `None` for plain arrays.
    pub quant: Option<Arc<QuantAttach>>,
}

impl TensorRef {
    pub fn bytes(&self) -> &[u8] {
        self.file.range(self.start, self.end)
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bad(&self, msg: impl Into<String>) -> Error {
        Error::BadTensor {
            file: self.file.path.clone(),
            tensor: self.name.clone(),
            msg: msg.into(),
        }
    }
    /// Checks the shape (and that the dtype is one the dense f32 path can read).
    pub fn expect_shape(&self, shape: &[usize]) -> Result<()> {
        if self.shape != shape {
            return Err(self.bad(format!(
                "shape {:?} does not match the configuration, which needs {:?}",
                self.shape, shape
            )));
        }
        Ok(())
    }
    /// The tensor converted to f32 (for small vectors: norms, biases, router bias).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let b = self.bytes();
        Ok(match self.dtype {
            DType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            DType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => {
                return Err(self.bad(format!("dtype {other:?} where f32, bf16 or f16 is needed")))
            }
        })
    }
}

/// Storage of a tensor that is not a plain f32/bf16/f16 array, attached by the loader.
#[derive(Clone, Debug)]
pub struct QuantAttach {
    /// `Some` for a converted container (from its record); `None` for the C layout, whose
    /// format follows from the shape the config asks for.
    pub format: Option<WeightFormat>,
    /// Logical shape from the record (C layout: empty).
    pub shape: Vec<usize>,
    pub scales: Option<Blob>,
    /// Number of scale values (C layout).
    pub scale_count: usize,
    /// A routed expert's weight (int8 activations may apply, see `kernels`).
    pub routed_expert: bool,
    /// Row-major int4 of a shape the 8-row kernels take may be rearranged into `int4-rows8`
    /// where it lies (its codes and scales are in a RAM copy, `COLIBRI_REPACK` is not 0, it
    /// is not a routed expert that will be streamed). Decided when the folder is opened.
    pub repack: bool,
    /// Once rearranged: the `[rows, cols]` it was loaded as and its format since.
    pub(super) repacked: std::sync::OnceLock<(usize, usize, WeightFormat)>,
}

// Loading a matrix is the container's job: `Matrix` itself sits below the containers (they
// build matrices), so this constructor lives with the tensors it reads.
impl Matrix {
    /// A `[rows, cols]` weight, borrowed from its memory map: f32/bf16/f16 as stored, or a
    /// quantized tensor of a converted container (its format and scales attached by the
    /// container loader, see [`crate::container::QuantAttach`]).
    pub fn from_tensor(t: &TensorRef, rows: usize, cols: usize) -> Result<Matrix> {
        if let Some(q) = &t.quant {
            let format = q.format_for(t, rows, cols)?;
            let mut m = Matrix::quantized(
                rows,
                cols,
                format,
                Blob::Mapped {
                    file: t.file.clone(),
                    start: t.start,
                    end: t.end,
                },
                q.scales.clone(),
            )
            .map_err(|msg| t.bad(msg))?;
            m.int8_act = kernels::int8_act_for(format) && kernels::q8_supported(format, cols);
            return Ok(m);
        }
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
            scales: None,
            int8_act: false,
        })
    }
}
