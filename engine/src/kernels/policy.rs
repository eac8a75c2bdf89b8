//! Which path a matrix's products take, per process: int8 activations or f32
//! (`COLIBRI_INT8_ACT`), the 8-row int4 kernels (`COLIBRI_INT4_ROWS8`), and which formats and
//! groups the tiles and the int8 activations can take at all.

use crate::format::{WeightFormat, QBLOCK};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// When quantized matrices get int8 activations (per 32-element block) and integer dot
/// products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Act {
    /// Never: exact f32 activations everywhere.
    Off,
    /// Routed experts in int4 and int2, and dense matrices in grouped int8 (the default).
    /// Measured on every fixture family, it moves the mean KL divergence from
    /// transformers by under 1% of what the int4 weights themselves cost, and it is what
    /// lets int4 matvec run at memory speed (docs/FORMAT.md). Per-row int8 keeps f32
    /// activations: there it doubles the (small) divergence.
    SubByte,
    /// For every quantized matrix, per-row int8 too.
    All,
}

// 0 = not yet read from the environment, else 1 + the mode's index.
static INT8_ACT: AtomicU8 = AtomicU8::new(0);

/// The int8-activation policy: `COLIBRI_INT8_ACT=0|1|subbyte` (off, all, the default) or
/// [`set_int8_activations`]. Read when a model is loaded.
pub fn int8_act_mode() -> Int8Act {
    let modes = [Int8Act::Off, Int8Act::SubByte, Int8Act::All];
    match INT8_ACT.load(Ordering::Relaxed) {
        0 => {
            let m = match std::env::var("COLIBRI_INT8_ACT").as_deref() {
                Ok("0") | Ok("off") | Ok("false") => Int8Act::Off,
                Ok("1") | Ok("all") | Ok("true") => Int8Act::All,
                _ => Int8Act::SubByte,
            };
            set_int8_act_mode(m);
            m
        }
        v => modes[(v - 1) as usize],
    }
}

pub fn set_int8_act_mode(m: Int8Act) {
    let v = match m {
        Int8Act::Off => 1,
        Int8Act::SubByte => 2,
        Int8Act::All => 3,
    };
    INT8_ACT.store(v, Ordering::Relaxed);
}

/// `true`: int8 activations for every quantized matrix; `false`: none.
pub fn set_int8_activations(on: bool) {
    set_int8_act_mode(if on { Int8Act::All } else { Int8Act::Off });
}

/// Whether int4 with a scale per 32 or 64 elements and int8 activations runs on the 8-row
/// kernels (`avx2_rows8.rs`): `COLIBRI_INT4_ROWS8=0` turns them off, read once.
///
/// They compute the scalar reference's bits and prefill 1.3–1.9× faster (8 rows in the lanes
/// of a vector keep a block's sums in int16); their decode streams the same bytes about 9%
/// slower than the one-row kernel of `avx2.rs` on the OLMoE-1B-7B synth (docs/PERFORMANCE.md).
/// Off, that kernel and the tiles run, in their own summation order. Either way decode,
/// batched decode and prefill agree bit for bit: the choice is per process, never per call.
pub fn int4_rows8() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        !matches!(
            std::env::var("COLIBRI_INT4_ROWS8").as_deref(),
            Ok("0") | Ok("off") | Ok("false")
        )
    })
}

/// Whether a matrix stored in `format` gets int8 activations under the policy. Routed
/// experts and dense matrices are treated alike: what decides is the format (int4, int2 and
/// grouped int8 were quantized with int8 activations in mind; per-row int8 was not). MXFP4 is
/// how gpt-oss is published, so by default it computes what transformers computes on its
/// dequantized weights (f32 activations); `COLIBRI_INT8_ACT=1` puts it on int8 activations
/// (measured on the gpt_oss fixture: max |Δlogit| 0.011 against transformers).
pub fn int8_act_for(format: WeightFormat) -> bool {
    let format = format.row_major();
    if !q8_supported(format, QBLOCK) {
        return false;
    }
    match int8_act_mode() {
        Int8Act::Off => false,
        Int8Act::All => format.is_quantized(),
        Int8Act::SubByte => matches!(
            format,
            WeightFormat::I4 { .. }
                | WeightFormat::I5 { .. }
                | WeightFormat::I2 { .. }
                | WeightFormat::I8 { .. }
                | WeightFormat::I3G64
                | WeightFormat::I2Plain
        ),
    }
}

/// Whether int8 activations can be used with `format` on rows of `cols`: quantized weights
/// whose scale groups are whole 32-element blocks (or one group per row).
/// compressed-tensors int4 takes f32 activations only: its values are rounded per element,
/// which no integer block sum expresses.
pub fn q8_supported(format: WeightFormat, cols: usize) -> bool {
    format.is_quantized()
        && !matches!(format, WeightFormat::I4Ct { .. })
        && format
            .group_len(cols)
            .is_some_and(|g| g % QBLOCK == 0 || g >= cols)
}

/// Whether `format` with rows of `cols` has register tiles (else its products run on the
/// per-row kernels). The tiles take one scale per 32-element block or wider, so a group of a
/// multiple of 32 or one group per row; the C layout's int4 with 16-element groups is not.
pub(super) fn tiled(format: WeightFormat, cols: usize) -> bool {
    !matches!(
        format,
        WeightFormat::I3G64
            | WeightFormat::I2Plain
            | WeightFormat::I5 { .. }
            | WeightFormat::Mxfp4
            | WeightFormat::I4Ct { .. }
    ) && format
        .group_len(cols)
        .is_none_or(|g| g.is_multiple_of(QBLOCK) || g >= cols)
}
