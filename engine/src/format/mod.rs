//! The ground floor: the vocabulary of weight formats and the byte layouts that both the
//! kernels and the quantizers (and the containers above them) read and write. It imports
//! nothing of the crate: every other module may import it.

pub mod ct_int4;
pub mod int5;
pub mod lowbit;
pub mod mxfp4;
pub mod rows8;
mod weight;

pub use weight::{block_range, ScaleType, WeightFormat, QBLOCK};
