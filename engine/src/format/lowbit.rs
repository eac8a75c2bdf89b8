//! The colibri C engine's sub-4-bit layouts (docs/FORMAT.md, "The colibri C container
//! layout"): int3 in groups of 64 ([`WeightFormat::I3G64`](super::WeightFormat::I3G64)) and
//! plain int2 rows ([`WeightFormat::I2Plain`](super::WeightFormat::I2Plain)). Both keep their
//! 2-bit codes in the same plain order (element `j` of a run in bits `2(j%4)` of byte `j/4`);
//! the codes are read here for the reference kernels and packed here for the quantizers
//! (`quant/lowbit.rs`).

/// Elements per int3 group and the bytes one group takes.
pub const I3_GROUP: usize = 64;
pub const I3_GROUP_BYTES: usize = 24;

/// The stored code (0..8) of element `j` of an int3-g64 row.
#[inline(always)]
pub fn i3_code(w: &[u8], j: usize) -> u8 {
    let (base, e) = ((j / I3_GROUP) * I3_GROUP_BYTES, j % I3_GROUP);
    let lo = (w[base + e / 4] >> (2 * (e % 4))) & 3;
    let hi = (w[base + 16 + e / 8] >> (e % 8)) & 1;
    lo | (hi << 2)
}

/// The stored code (0..4) of element `j` of a plain int2 row.
#[inline(always)]
pub fn i2p_code(w: &[u8], j: usize) -> u8 {
    (w[j / 4] >> (2 * (j % 4))) & 3
}

/// Packs 2-bit codes plainly, four per byte, lowest bits first (appending).
pub fn pack_plain2(codes: &[u8], out: &mut Vec<u8>) {
    for quad in codes.chunks(4) {
        let mut byte = 0u8;
        for (i, c) in quad.iter().enumerate() {
            byte |= (c & 3) << (2 * i);
        }
        out.push(byte);
    }
}

/// Packs the int3 codes (0..8) of one row, groups of 64 padded with code 4 (value 0).
pub fn pack_i3(codes: &[u8], out: &mut Vec<u8>) {
    for group in codes.chunks(I3_GROUP) {
        let mut c = [4u8; I3_GROUP];
        c[..group.len()].copy_from_slice(group);
        let start = out.len();
        pack_plain2(&c, out);
        debug_assert_eq!(out.len() - start, 16);
        for eight in c.chunks(8) {
            out.push(
                eight
                    .iter()
                    .enumerate()
                    .fold(0u8, |b, (i, v)| b | (((v >> 2) & 1) << i)),
            );
        }
    }
}
