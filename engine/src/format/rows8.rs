//! The `int4-rows8` layout ([`WeightFormat::I4Rows8`]): int4 rows interleaved by 8, as
//! `coli convert` writes them (docs/FORMAT.md).
//!
//! Why: the 8-row kernels (`kernels/avx2_rows8.rs`) keep row `i` of a group in lane `i` of
//! every vector. On row-major int4 they interleave the rows as they go: prefill transposes a
//! chunk of rows into a buffer, and decode, which cannot afford 8 short streams, reads rows
//! one by one and transposes their block sums instead. Written interleaved, one contiguous
//! stream already has the rows in the lanes: no transposes at all, in decode or prefill.
//!
//! Layout, for rows × cols with a scale per `group` ∈ {32, 64} elements (rows a multiple of
//! 8, cols of 64; a "pair" is 64 columns, 32 bytes of a row):
//! - codes: group `G` (rows `8G..8G + 8`), pair `p`, word `u` (0..8) at byte
//!   `(G · pairs + p) · 256 + u · 32 + i · 4`: bytes `4u..4u + 4` of row `8G + i`'s pair;
//! - scales: group `G`, scale unit `k` (0..cols/group) at value `(G · units + k) · 8 + i`.
//!
//! Both hold the same bytes as [`WeightFormat::I4`], only moved, so every product is the
//! same; rows are taken out with [`gather_row`] where a kernel wants one row.

use super::WeightFormat;

/// Rows per interleaved group.
pub const ROWS: usize = 8;
/// Bytes of one row's pair of 32-element blocks.
const PAIR_ROW_BYTES: usize = 32;
/// Bytes of a word: 8 codes of one row.
const WORD: usize = 4;

/// Whether a `rows × cols` int4 matrix with scale groups of `group` can be interleaved.
pub fn fits(rows: usize, cols: usize, group: u32) -> bool {
    matches!(group, 32 | 64) && rows.is_multiple_of(ROWS) && cols > 0 && cols.is_multiple_of(64)
}

/// `format` as written for a `rows × cols` matrix: [`WeightFormat::I4Rows8`] for int4 that
/// [`fits`], else `format` unchanged.
pub fn for_shape(format: WeightFormat, rows: usize, cols: usize) -> WeightFormat {
    match format {
        WeightFormat::I4 { group, scale } if fits(rows, cols, group) => {
            WeightFormat::I4Rows8 { group, scale }
        }
        f => f,
    }
}

/// Where byte `b` of row `r`'s codes lies in the interleaved codes.
#[inline]
fn code_at(r: usize, b: usize, pairs: usize) -> usize {
    let (g, i) = (r / ROWS, r % ROWS);
    let (p, u, k) = (b / PAIR_ROW_BYTES, (b % PAIR_ROW_BYTES) / WORD, b % WORD);
    (g * pairs + p) * ROWS * PAIR_ROW_BYTES + u * ROWS * WORD + i * WORD + k
}

/// Where scale unit `k` of row `r` lies (in values) in the interleaved scales.
#[inline]
fn scale_at(r: usize, k: usize, units: usize) -> usize {
    ((r / ROWS) * units + k) * ROWS + r % ROWS
}

/// The interleaved codes and scales of a row-major int4 matrix (`format` is its
/// [`WeightFormat::I4`], the shape [`fits`]), byte by byte from the layout's definition: the
/// reference the tests hold [`interleave_in_place`] (what convert and the loader run) to.
#[cfg(test)]
pub fn interleave(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    codes: &[u8],
    scales: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let WeightFormat::I4 { group, scale } = format else {
        panic!("rows8::interleave: {format:?} is not int4")
    };
    assert!(fits(rows, cols, group), "rows8::interleave: shape");
    let (rb, pairs) = (cols / 2, cols / 64);
    let (ss, units) = (scale.size(), cols / group as usize);
    assert_eq!(codes.len(), rows * rb);
    assert_eq!(scales.len(), rows * units * ss);
    let mut c = vec![0u8; codes.len()];
    let mut s = vec![0u8; scales.len()];
    for r in 0..rows {
        for b in (0..rb).step_by(WORD) {
            let at = code_at(r, b, pairs);
            c[at..at + WORD].copy_from_slice(&codes[r * rb + b..r * rb + b + WORD]);
        }
        for k in 0..units {
            let at = scale_at(r, k, units) * ss;
            s[at..at + ss].copy_from_slice(&scales[(r * units + k) * ss..(r * units + k + 1) * ss]);
        }
    }
    (c, s)
}

/// Rearranges a row-major int4 matrix (`format` its [`WeightFormat::I4`], the shape [`fits`])
/// into the interleaved layout where it lies, and returns [`WeightFormat::I4Rows8`]: the
/// converter's and the loader's repack (docs/FORMAT.md, "Repacked at load"). Group `G` of 8 rows
/// occupies the same bytes in both layouts (its codes `8 · cols / 2` bytes from
/// `G · 8 · cols / 2`, its scales likewise), so each group is moved through a scratch copy
/// of itself, the groups in parallel on rayon. The result equals [`interleave`]'s.
pub fn interleave_in_place(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) -> WeightFormat {
    use rayon::prelude::*;
    let WeightFormat::I4 { group, scale } = format else {
        panic!("rows8::interleave_in_place: {format:?} is not int4")
    };
    assert!(fits(rows, cols, group), "rows8::interleave_in_place: shape");
    let (rb, ss, units) = (cols / 2, scale.size(), cols / group as usize);
    assert_eq!(codes.len(), rows * rb);
    assert_eq!(scales.len(), rows * units * ss);
    let (gc, gs) = (ROWS * rb, ROWS * units * ss);
    // About 64 KiB of codes per rayon task: small matrices stay on one thread.
    let min_len = (64 << 10) / gc + 1;
    codes
        .par_chunks_mut(gc)
        .zip(scales.par_chunks_mut(gs))
        .with_min_len(min_len)
        .for_each_init(
            || (vec![0u8; gc], vec![0u8; gs]),
            |(tc, ts), (c, s)| {
                // Codes: word `w` (4 bytes) of row `i` goes to word `w · 8 + i`.
                tc.copy_from_slice(c);
                let words = rb / WORD;
                for (w, out) in c.chunks_exact_mut(ROWS * WORD).enumerate() {
                    for (i, o) in out.chunks_exact_mut(WORD).enumerate() {
                        let at = (i * words + w) * WORD;
                        o.copy_from_slice(&tc[at..at + WORD]);
                    }
                }
                // Scales: unit `k` of row `i` goes to value `k · 8 + i`.
                ts.copy_from_slice(s);
                for (k, out) in s.chunks_exact_mut(ROWS * ss).enumerate() {
                    for (i, o) in out.chunks_exact_mut(ss).enumerate() {
                        let at = (i * units + k) * ss;
                        o.copy_from_slice(&ts[at..at + ss]);
                    }
                }
            },
        );
    WeightFormat::I4Rows8 { group, scale }
}

/// Row `r` of an interleaved matrix (`format` [`WeightFormat::I4Rows8`]) as row-major int4:
/// its codes into `codes` (`cols / 2` bytes) and its scales into `scales`.
pub fn gather_row(
    format: WeightFormat,
    cols: usize,
    data: &[u8],
    scale_bytes: &[u8],
    r: usize,
    codes: &mut [u8],
    scales: &mut [u8],
) {
    let WeightFormat::I4Rows8 { group, scale } = format else {
        panic!("rows8::gather_row: {format:?} is not int4-rows8")
    };
    let (rb, pairs) = (cols / 2, cols / 64);
    let (ss, units) = (scale.size(), cols / group as usize);
    for b in (0..rb).step_by(WORD) {
        let at = code_at(r, b, pairs);
        codes[b..b + WORD].copy_from_slice(&data[at..at + WORD]);
    }
    for k in 0..units {
        let at = scale_at(r, k, units) * ss;
        scales[k * ss..(k + 1) * ss].copy_from_slice(&scale_bytes[at..at + ss]);
    }
}

/// The row-major codes and scales of a whole interleaved matrix (tests, the fallback of
/// levels without the 8-row kernels).
pub fn deinterleave(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    data: &[u8],
    scale_bytes: &[u8],
) -> (Vec<u8>, Vec<u8>) {
    let (rb, sb) = (format.row_bytes(cols), format.scale_row_bytes(cols));
    let mut c = vec![0u8; rows * rb];
    let mut s = vec![0u8; rows * sb];
    for r in 0..rows {
        gather_row(
            format,
            cols,
            data,
            scale_bytes,
            r,
            &mut c[r * rb..(r + 1) * rb],
            &mut s[r * sb..(r + 1) * sb],
        );
    }
    (c, s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ScaleType;

    #[test]
    fn interleaving_moves_bytes_and_gathering_restores_them() {
        for (group, scale) in [(32, ScaleType::F16), (64, ScaleType::F32)] {
            let (rows, cols) = (16, 192);
            let f = WeightFormat::I4 { group, scale };
            let codes: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 7 % 251) as u8).collect();
            let scales: Vec<u8> = (0..rows * f.scale_row_bytes(cols))
                .map(|i| (i * 13 % 241) as u8)
                .collect();
            let (c, s) = interleave(f, rows, cols, &codes, &scales);
            let r8 = for_shape(f, rows, cols);
            assert_eq!(r8, WeightFormat::I4Rows8 { group, scale });
            // Row 9's first word sits in lane 1 of group 1's first word.
            let g1 = cols / 64 * 256;
            assert_eq!(&c[g1 + 4..g1 + 8], &codes[9 * cols / 2..9 * cols / 2 + 4]);
            // Its word 1 (bytes 4..8) is the group's second word, lane 1.
            assert_eq!(
                &c[g1 + 36..g1 + 40],
                &codes[9 * cols / 2 + 4..9 * cols / 2 + 8]
            );
            let (dc, ds) = deinterleave(r8, rows, cols, &c, &s);
            assert_eq!((dc, ds), (codes, scales));
        }
    }

    #[test]
    fn interleaving_in_place_gives_the_bytes_of_interleave() {
        for (rows, cols, group, scale) in [
            (16, 192, 32, ScaleType::F16),
            (8, 64, 64, ScaleType::F32),
            (200, 2048, 64, ScaleType::F16),
            (1024, 128, 32, ScaleType::F32),
        ] {
            let f = WeightFormat::I4 { group, scale };
            let codes: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 7 % 251) as u8).collect();
            let scales: Vec<u8> = (0..rows * f.scale_row_bytes(cols))
                .map(|i| (i * 13 % 241) as u8)
                .collect();
            let want = interleave(f, rows, cols, &codes, &scales);
            let (mut c, mut s) = (codes.clone(), scales.clone());
            let r8 = interleave_in_place(f, rows, cols, &mut c, &mut s);
            assert_eq!(r8, for_shape(f, rows, cols));
            assert!((c == want.0) && (s == want.1), "{rows}x{cols} g{group}");
        }
    }

    #[test]
    fn only_whole_groups_of_eight_rows_and_64_columns_fit() {
        let f = |group| WeightFormat::I4 {
            group,
            scale: ScaleType::F16,
        };
        assert_eq!(for_shape(f(64), 12, 128), f(64));
        assert_eq!(for_shape(f(64), 16, 96), f(64));
        assert_eq!(for_shape(f(128), 16, 128), f(128));
        assert!(for_shape(f(32), 16, 128).interleaved());
        assert_eq!(for_shape(WeightFormat::I8Row, 16, 128), WeightFormat::I8Row);
    }
}
