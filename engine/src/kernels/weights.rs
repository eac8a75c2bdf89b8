//! A weight matrix as every kernel takes it: borrowed bytes, shape, format.

use crate::format::WeightFormat;

/// A weight matrix as the kernels see it: `rows` packed rows of `cols` elements and their
/// scales, and whether its activations are quantized to int8.
#[derive(Clone, Copy, Debug)]
pub struct Weights<'a> {
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    pub scales: &'a [u8],
    /// int8 activations (honoured where [`q8_supported`](super::q8_supported)).
    pub int8: bool,
    /// int4-g32/g64 with int8 activations on the 8-row kernels (`avx2_rows8.rs`, the scalar
    /// reference's bits) rather than the row kernel and tiles of `avx2.rs` ([`super::int4_rows8`]).
    pub rows8: bool,
}

impl Weights<'_> {
    #[inline]
    pub(super) fn row(&self, r: usize) -> &[u8] {
        let b = self.format.row_bytes(self.cols);
        &self.data[r * b..(r + 1) * b]
    }

    #[inline]
    pub(super) fn srow(&self, r: usize) -> &[u8] {
        let b = self.format.scale_row_bytes(self.cols);
        &self.scales[r * b..(r + 1) * b]
    }

    /// Bytes of weights and scales.
    pub(super) fn bytes(&self) -> usize {
        self.data.len() + self.scales.len()
    }
}
