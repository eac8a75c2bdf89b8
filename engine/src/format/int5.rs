//! int5 rows ([`WeightFormat::I5`](super::WeightFormat::I5)): code `c` in 0..32 meaning
//! `(c - 16) * scale`; the layout the quantizer writes and the kernels (`kernels/int5.rs`)
//! read.
//!
//! A row is two planes: the codes' low 4 bits (two per byte), then their high bits (eight
//! per byte). Both are laid out per step of 8 blocks of 32 elements (256 elements) so that
//! lane `b` of a vector of 8 int32 sums is block `b` ([`place`]): byte `4b + k` of a 32-byte
//! word holds element `4u + k` of block `b` in its low nibble and element `16 + 4u + k` in
//! its high nibble (word `u` of 4), and the 32 high bits of each of the 8 code vectors a
//! step unpacks follow the same lanes. Elements after the last whole step are stored
//! plainly.
//!
//! Why a fifth bit: decode reads the whole output head for every token (16% of a lean
//! OLMoE container's bytes). int4 there costs accuracy (docs/FORMAT.md); int5 with f16
//! scales per 32 takes 5.5 bits a weight against grouped int8's 8.5, below the 6.56 of the
//! Q6_K head llama.cpp gives its Q4_0 models.

use super::QBLOCK;

/// Blocks of one step: one vector of int32 sums.
pub const STEP_BLOCKS: usize = 8;
/// Elements of one step.
pub const STEP: usize = STEP_BLOCKS * QBLOCK;

/// Where element `j` of a row of `cols` lies: (byte of the nibble plane, whether it is the
/// high nibble, position in the high-bit plane). In a whole step it is also the element's
/// lane in the step's code vectors: `(position % 256)` = 32 × vector + 4 × block + k.
#[inline(always)]
pub fn place(j: usize, cols: usize) -> (usize, bool, usize) {
    let whole = cols / STEP * STEP;
    if j >= whole {
        let t = j - whole;
        return (whole / 2 + t / 2, t % 2 == 1, j);
    }
    let (s, e) = (j / STEP, j % STEP);
    let (b, i) = (e / QBLOCK, e % QBLOCK);
    let (half, u, k) = (i / 16, (i % 16) / 4, i % 4);
    let byte = 128 * s + 32 * u + 4 * b + k;
    let vector = 4 * half + u;
    (byte, half == 1, STEP * s + 32 * vector + 4 * b + k)
}

/// The stored code (0..32) of element `j` of an int5 row of `cols` elements.
#[inline(always)]
pub fn code(w: &[u8], j: usize, cols: usize) -> u8 {
    let (byte, high, bit) = place(j, cols);
    let low = if high { w[byte] >> 4 } else { w[byte] & 0x0F };
    let hi = (w[cols.div_ceil(2) + bit / 8] >> (bit % 8)) & 1;
    low | (hi << 4)
}

/// Packs one row's codes (0..32), appending its nibble plane and then its high-bit plane.
pub fn pack(codes: &[u8], out: &mut Vec<u8>) {
    let cols = codes.len();
    let start = out.len();
    let nibbles = cols.div_ceil(2);
    out.resize(start + nibbles + cols.div_ceil(8), 0);
    let row = &mut out[start..];
    for (j, c) in codes.iter().enumerate() {
        let (byte, high, bit) = place(j, cols);
        row[byte] |= if high { (c & 0x0F) << 4 } else { c & 0x0F };
        row[nibbles + bit / 8] |= ((c >> 4) & 1) << (bit % 8);
    }
}
