//! Property tests: every SIMD path against the scalar reference, on random shapes (odd
//! column counts, row counts and batch sizes included), random codes (every code value,
//! e.g. int4's -8 and int8's -128) and random scales; batch independence bit for bit.

use super::isa::requested;
use super::*;
use crate::tensor::{Blob, Matrix, ScaleType, WeightFormat};
use std::sync::Arc;

pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(super) fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn formats() -> Vec<WeightFormat> {
    let mut v = vec![
        WeightFormat::F32,
        WeightFormat::BF16,
        WeightFormat::F16,
        WeightFormat::I8Row,
        WeightFormat::I3G64,
        WeightFormat::I2Plain,
        WeightFormat::Mxfp4,
    ];
    for scale in [ScaleType::F32, ScaleType::F16] {
        for group in [0, 32, 64, 96, 128] {
            v.push(WeightFormat::I4 { group, scale });
            v.push(WeightFormat::I5 { group, scale });
            v.push(WeightFormat::I2 { group, scale });
            v.push(WeightFormat::I8 { group, scale });
        }
        // Groups narrower than a 32-element block (the C layout's int4-g16) or not a
        // multiple of one: the per-row kernels, not the tiles.
        for group in [16, 48] {
            v.push(WeightFormat::I4 { group, scale });
            v.push(WeightFormat::I5 { group, scale });
            v.push(WeightFormat::I2 { group, scale });
        }
    }
    v
}

/// A random row: random bytes are valid codes for the integer formats; float formats get
/// encoded random values (random bytes could be NaN).
fn random_row(format: WeightFormat, cols: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>) {
    let w: Vec<u8> = match format {
        WeightFormat::F32 => (0..cols).flat_map(|_| rng.f().to_le_bytes()).collect(),
        WeightFormat::BF16 => (0..cols)
            .flat_map(|_| half::bf16::from_f32(rng.f()).to_le_bytes())
            .collect(),
        WeightFormat::F16 => (0..cols)
            .flat_map(|_| half::f16::from_f32(rng.f()).to_le_bytes())
            .collect(),
        _ => (0..format.row_bytes(cols))
            .map(|_| rng.next() as u8)
            .collect(),
    };
    let mut s = Vec::new();
    for _ in 0..format.groups_per_row(cols) {
        let v = 0.01 + rng.f().abs();
        match format.scale_type() {
            Some(ScaleType::F16) => s.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            Some(ScaleType::E8M0) => s.push(118 + (rng.next() % 16) as u8),
            _ => s.extend_from_slice(&v.to_le_bytes()),
        }
    }
    (w, s)
}

fn random_matrix(format: WeightFormat, rows: usize, cols: usize, rng: &mut Rng) -> Matrix {
    let (mut w, mut s) = (Vec::new(), Vec::new());
    for _ in 0..rows {
        let (a, b) = random_row(format, cols, rng);
        w.extend(a);
        s.extend(b);
    }
    let scales = (!s.is_empty()).then(|| Blob::Owned(Arc::new(s)));
    Matrix::quantized(rows, cols, format, Blob::Owned(Arc::new(w)), scales).unwrap()
}

/// Column counts: tiny, whole blocks, odd tails, and rows long enough to be cut into
/// several chunks by the prefill kernels (their accumulators carried between chunks).
fn random_cols(rng: &mut Rng) -> usize {
    match rng.below(6) {
        0 => 1 + rng.below(40),
        1 => 32 * (1 + rng.below(12)),
        2 => 64 * (1 + rng.below(6)) + 1 + 2 * rng.below(31),
        3 => 64 * (1 + rng.below(40)),
        4 => 32 * (100 + rng.below(80)) + [0, 1, 17, 33][rng.below(4)],
        _ => 1 + rng.below(700),
    }
}

/// Scale of the sum: |dot| may cancel, so compare against sum |w||x|.
fn magnitude(format: WeightFormat, w: &[u8], s: &[u8], x: &[f32]) -> f32 {
    let mut d = vec![0f32; x.len()];
    decode_row(format, w, s, &mut d);
    d.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-3
}

fn row_of(m: &Matrix, r: usize) -> (&[u8], &[u8]) {
    let w = m.weights();
    let rb = m.format.row_bytes(m.cols);
    let sb = m.format.scale_row_bytes(m.cols);
    (
        &w.data[r * rb..(r + 1) * rb],
        &w.scales[r * sb..(r + 1) * sb],
    )
}

#[test]
fn the_level_follows_the_cpu_unless_forced() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && std::env::var("COLIBRI_KERNELS").is_err()
        && std::env::var("COLIBRI_ISA").is_err()
    {
        let vnni = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        assert_eq!(level(), if vnni { Level::Avx512Vnni } else { Level::Avx2 });
    }
    assert_eq!(requested(Some("scalar"), None).0, Some(Level::Scalar));
    assert_eq!(requested(Some("AVX2"), None).0, Some(Level::Avx2));
    assert_eq!(requested(Some("avx512"), None).0, Some(Level::Avx512Vnni));
    assert!(Level::Avx2.runs_under(Level::Avx512Vnni));
    assert!(Level::Scalar.runs_under(Level::Avx2));
    assert!(!Level::Avx512Vnni.runs_under(Level::Avx2));
    assert_eq!(requested(Some("auto"), Some("scalar")), (None, None));
    assert_eq!(requested(None, Some("scalar")).0, Some(Level::Scalar));
    assert_eq!(requested(None, None), (None, None));
    let (l, note) = requested(Some("sse9"), None);
    assert!(l.is_none() && note.unwrap().contains("not one of"));
    assert!(isa_report().starts_with("kernels "));
}

#[test]
fn fast_paths_match_the_scalar_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut checked = 0;
    for format in formats() {
        for _ in 0..30 {
            let cols = random_cols(&mut rng);
            let rows = 1 + rng.below(11);
            let n = 1 + rng.below(9);
            let m = random_matrix(format, rows, cols, &mut rng);
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 3.0).collect();
            for (int8, rows8) in [(false, true), (true, true), (true, false)] {
                let input = Input::new(&x, n);
                let mut w = m.weights();
                w.int8 = int8;
                w.rows8 = rows8;
                let mut out = vec![0f32; n * rows];
                matmul(&w, &input, &mut out);
                let int8 = int8 && q8_supported(format, cols);
                for r in 0..rows {
                    let (wr, sr) = row_of(&m, r);
                    for t in 0..n {
                        let act = input.act(t, int8);
                        let reference = scalar::dot_row(format, wr, sr, &act);
                        let mag = magnitude(format, wr, sr, act.x);
                        let fast = out[t * rows + r];
                        assert!(
                            (fast - reference).abs() <= 2e-5 * mag,
                            "{format:?} {rows}x{cols} n {n} row {r} token {t} int8 {int8}: fast {fast} vs reference {reference} (scale {mag})"
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

/// `m.matmul`, with int4-g32/g64 on the 8-row kernels or not ([`int4_rows8`]).
fn mm(m: &Matrix, x: &[f32], n: usize, out: &mut [f32], rows8: bool) {
    let mut w = m.weights();
    w.rows8 = rows8;
    matmul(&w, &Input::new(x, n), out);
}

/// `all` (the product of `m` with the tokens of `x`) holds, for each token, the bits that
/// token gets alone.
fn assert_each_token_alone_gives(m: &Matrix, x: &[f32], all: &[f32], what: &str, rows8: bool) {
    let (rows, cols) = (m.rows, m.cols);
    let n = x.len() / cols;
    for i in 0..n {
        let mut one = vec![0f32; rows];
        mm(m, &x[i * cols..(i + 1) * cols], 1, &mut one, rows8);
        assert_eq!(
            &all[i * rows..(i + 1) * rows],
            &one[..],
            "{what} {rows}x{cols}: token {i} of {n}"
        );
    }
}

#[test]
fn matmul_is_the_same_for_any_batch() {
    let mut rng = Rng(5);
    for format in formats() {
        for (k, int8) in [false, true, false, true].into_iter().enumerate() {
            // Half the cases with rows long enough for several chunks.
            let cols = if k >= 2 {
                32 * (100 + rng.below(80)) + [0, 1, 17][rng.below(3)]
            } else {
                random_cols(&mut rng)
            };
            let (rows, n) = (4 + rng.below(30), 2 + rng.below(11));
            let mut m = random_matrix(format, rows, cols, &mut rng);
            m.int8_act = int8;
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            for rows8 in [true, false] {
                let what = format!("{format:?} int8 {int8} rows8 {rows8}");
                let mut all = vec![0f32; n * rows];
                mm(&m, &x, n, &mut all, rows8);
                // Every token alone, and every window of 3 tokens, gives the same bits.
                assert_each_token_alone_gives(&m, &x, &all, &what, rows8);
                for s in 0..n.saturating_sub(2) {
                    let mut three = vec![0f32; 3 * rows];
                    mm(&m, &x[s * cols..(s + 3) * cols], 3, &mut three, rows8);
                    assert_eq!(&all[s * rows..(s + 3) * rows], &three[..], "{what}");
                }
                // A row computed as part of a row block gives the same bits as in the whole.
                let r0 = 1 + rng.below(rows - 1);
                let sub = crate::arch::blocks::row_block(&m, r0, rows);
                let mut part = vec![0f32; n * (rows - r0)];
                mm(&sub, &x, n, &mut part, rows8);
                for t in 0..n {
                    assert_eq!(
                        &all[t * rows + r0..(t + 1) * rows],
                        &part[t * (rows - r0)..(t + 1) * (rows - r0)],
                        "{what}: rows {r0}.. token {t}"
                    );
                }
            }
        }
    }
}

/// A batched decode step (2–8 tokens: int4-g32/g64 on the row kernel, int8-g32 and per-row
/// int8 on the tiles) gives each token the bits it gets alone, and the bits the prefill tiles
/// give it in a longer batch; rows with more than 8 pairs and with pairs left over after the
/// last 8 included.
#[test]
fn batched_decode_rows_equal_one_token_at_a_time() {
    let mut rng = Rng(23);
    let mut formats = vec![WeightFormat::I8Row];
    for scale in [ScaleType::F16, ScaleType::F32] {
        formats.push(WeightFormat::I4 { group: 32, scale });
        formats.push(WeightFormat::I4 { group: 64, scale });
        formats.push(WeightFormat::I8 { group: 32, scale });
    }
    for format in formats {
        for cols in [64, 576, 1088, 2048] {
            let rows = 5 + rng.below(20);
            let mut m = random_matrix(format, rows, cols, &mut rng);
            m.int8_act = true;
            let x: Vec<f32> = (0..12 * cols).map(|_| rng.f()).collect();
            for rows8 in [true, false] {
                let mut long = vec![0f32; 12 * rows];
                mm(&m, &x, 12, &mut long, rows8);
                for n in 2..=8 {
                    let what = format!("{format:?} {cols} cols, {n} tokens, rows8 {rows8}");
                    let mut all = vec![0f32; n * rows];
                    mm(&m, &x[..n * cols], n, &mut all, rows8);
                    assert_eq!(&all[..], &long[..n * rows], "{what}");
                    assert_each_token_alone_gives(&m, &x[..n * cols], &all, &what, rows8);
                }
            }
        }
    }
}

#[test]
fn several_matrices_in_one_region_equal_one_by_one() {
    let mut rng = Rng(11);
    let cols = 4096 + 32;
    let n = 3;
    let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
    let fmts = [
        WeightFormat::BF16,
        WeightFormat::I4 {
            group: 64,
            scale: ScaleType::F16,
        },
        WeightFormat::I8 {
            group: 32,
            scale: ScaleType::F16,
        },
    ];
    let ms: Vec<Matrix> = fmts
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut m = random_matrix(*f, 40 + 7 * i, cols, &mut rng);
            m.int8_act = i > 0;
            m
        })
        .collect();
    let input = Input::new(&x, n);
    let mut outs: Vec<Vec<f32>> = ms.iter().map(|m| vec![0f32; n * m.rows]).collect();
    {
        let mut jobs: Vec<(Weights, &mut [f32])> = ms
            .iter()
            .zip(outs.iter_mut())
            .map(|(m, o)| (m.weights(), o.as_mut_slice()))
            .collect();
        matmul_many(&mut jobs, &input);
    }
    for (m, o) in ms.iter().zip(&outs) {
        let mut one = vec![0f32; n * m.rows];
        m.matmul(&x, n, &mut one);
        assert_eq!(o, &one, "{:?}", m.format);
    }
}

#[test]
fn simd_quantizer_gives_the_reference_bytes() {
    let mut rng = Rng(3);
    for _ in 0..200 {
        let cols = random_cols(&mut rng);
        let scale = [1e-3f32, 1.0, 300.0][rng.below(3)];
        let mut x: Vec<f32> = (0..cols).map(|_| rng.f() * scale).collect();
        // exact ties and zero blocks
        if cols > 40 {
            x[3] = 0.5 * x[7].abs().max(1e-3);
            x[32..40.min(cols)].iter_mut().for_each(|v| *v = 0.0);
        }
        let nb = cols.div_ceil(QBLOCK);
        let (mut q1, mut d1, mut s1) = (vec![0i8; cols], vec![0f32; nb], vec![0i32; nb]);
        let (mut q2, mut d2, mut s2) = (vec![0i8; cols], vec![0f32; nb], vec![0i32; nb]);
        quantize_row(&x, &mut q1, &mut d1, &mut s1);
        scalar::quantize_row(&x, &mut q2, &mut d2, &mut s2);
        assert_eq!(q1, q2, "{cols}");
        assert_eq!(d1, d2);
        assert_eq!(s1, s2);
    }
}

#[test]
fn reference_dot_equals_decoded_dot() {
    let mut rng = Rng(77);
    for format in formats() {
        for cols in [1, 31, 33, 64, 95, 200, 257] {
            let (w, s) = random_row(format, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let mut d = vec![0f32; cols];
            decode_row(format, &w, &s, &mut d);
            let want: f64 = d.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = scalar::dot(format, &w, &s, &x) as f64;
            let mag = magnitude(format, &w, &s, &x) as f64;
            assert!(
                (got - want).abs() <= 1e-5 * mag,
                "{format:?} {cols}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn int8_activations_stay_close_to_f32() {
    let mut rng = Rng(99);
    for format in formats().into_iter().filter(|f| q8_supported(*f, 256)) {
        let (w, s) = random_row(format, 256, &mut rng);
        let x: Vec<f32> = (0..256).map(|_| rng.f()).collect();
        let exact = scalar::dot(format, &w, &s, &x);
        let input = Input::new(&x, 1);
        let q = scalar::dot_row(format, &w, &s, &input.act(0, true));
        let mag = magnitude(format, &w, &s, &x);
        // Activation rounding error is at most half a step (amax/254) per element.
        assert!(
            (exact - q).abs() <= mag / 127.0,
            "{format:?}: {exact} vs {q}"
        );
    }
}

#[test]
fn the_per_row_api_agrees_with_the_input_rows() {
    // `prepare` (per-row kernels, fallback levels) and `Input` quantize the same bytes, so
    // the reference gives the same value through either.
    let mut rng = Rng(21);
    for format in formats() {
        for cols in [7, 64, 200, 1000] {
            let (w, s) = random_row(format, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            let input = Input::new(&x, 1);
            for int8 in [false, true] {
                let int8 = int8 && q8_supported(format, cols);
                let a = prepare(format, &x, int8);
                assert_eq!(
                    scalar::dot_act(format, &w, &s, &a),
                    scalar::dot_row(format, &w, &s, &input.act(0, int8)),
                    "{format:?} {cols}"
                );
            }
        }
    }
}

#[test]
fn per_row_fast_paths_match_the_scalar_reference() {
    let mut rng = Rng(0x5eed_1234);
    let mut checked = 0;
    for format in formats() {
        for _ in 0..40 {
            let cols = random_cols(&mut rng);
            let (w, s) = random_row(format, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
            let mag = magnitude(format, &w, &s, &x);
            for int8 in [false, true] {
                let act = prepare(format, &x, int8);
                let fast = dot_act(format, &w, &s, &act);
                let reference = scalar::dot_act(format, &w, &s, &act);
                assert!(
                    (fast - reference).abs() <= 2e-5 * mag,
                    "{format:?} cols {cols} int8 {int8}: fast {fast} vs reference {reference}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000);
}

/// The outputs of `avx2_rows8.rs` run directly on `w` × `input` (int8 activations), whatever
/// level runs: AVX2 and, where the CPU has it, AVX-512 VNNI; none on other CPUs.
fn rows8_kernels_directly(w: &Weights, input: &Input) -> Vec<(&'static str, Vec<f32>)> {
    #[allow(unused_mut)]
    let mut outs = Vec::new();
    #[cfg(target_arch = "x86_64")]
    for vnni in [false, true] {
        if !Level::Avx2.runs_under(level()) || (vnni && level() != Level::Avx512Vnni) {
            continue;
        }
        input.prepare_for(w.format, true);
        let mut o = vec![0f32; input.n * w.rows];
        // SAFETY: the level checks above; the input is prepared.
        unsafe {
            super::avx2_rows8::matmul_rows(w, input, 0..w.rows, o.as_mut_ptr(), w.rows, vnni)
        };
        outs.push((if vnni { "vnni" } else { "avx2" }, o));
    }
    outs
}

/// int4 with a scale per 32 or 64 elements and int8 activations (8 rows interleaved on
/// AVX2) gives the scalar reference's bits exactly, in decode (1 token), batched decode
/// (2–8) and prefill (more): groups short of 8 rows, rows cut into several column chunks,
/// row chunks of a prefill beyond the first.
#[test]
fn interleaved_int4_gives_the_reference_bits() {
    let mut rng = Rng(77);
    for scale in [ScaleType::F16, ScaleType::F32] {
        for group in [32, 64] {
            let format = WeightFormat::I4 { group, scale };
            for (rows, cols) in [
                (1, 64),
                (7, 128),
                (13, 1088),
                (24, 2048),
                (9, 3136),
                (203, 2048),
            ] {
                let mut m = random_matrix(format, rows, cols, &mut rng);
                m.int8_act = true;
                for n in [1, 2, 3, 5, 8, 9, 13] {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 2.0).collect();
                    let input = Input::new(&x, n);
                    let mut w = m.weights();
                    w.rows8 = true;
                    let mut out = vec![0f32; n * rows];
                    matmul(&w, &input, &mut out);
                    let mut outs = vec![("level", out)];
                    outs.extend(rows8_kernels_directly(&w, &input));
                    for (path, out) in &outs {
                        for t in 0..n {
                            let act = input.act(t, true);
                            for r in 0..rows {
                                let (wr, sr) = row_of(&m, r);
                                let want = scalar::dot_row(format, wr, sr, &act);
                                assert_eq!(
                                    out[t * rows + r].to_bits(),
                                    want.to_bits(),
                                    "{path}: {format:?} {rows}x{cols} n {n} row {r} token {t}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// int4 stored with its rows interleaved by 8 (`int4-rows8`, `crate::rows8`) gives the same
/// bits as the same codes stored row after row: with int8 activations on every level and on
/// the 8-row kernels directly (the scalar reference's bits), with the 8-row kernels turned
/// off or f32 activations (the per-row kernels on rows taken out), and row by row
/// (`row_dot`, `row_to_f32`); decode, batched decode and prefill token counts.
#[test]
fn rows8_layout_gives_the_bits_of_row_major_int4() {
    let mut rng = Rng(78);
    for scale in [ScaleType::F16, ScaleType::F32] {
        for group in [32, 64] {
            let format = WeightFormat::I4 { group, scale };
            for (rows, cols) in [(8, 64), (16, 128), (24, 2048), (208, 1088), (40, 3136)] {
                let mut m = random_matrix(format, rows, cols, &mut rng);
                m.int8_act = true;
                let f8 = crate::rows8::for_shape(format, rows, cols);
                assert!(f8.interleaved());
                let w0 = m.weights();
                let (c, sc) = crate::rows8::interleave(format, rows, cols, w0.data, w0.scales);
                let mut m8 = Matrix::quantized(
                    rows,
                    cols,
                    f8,
                    Blob::Owned(Arc::new(c)),
                    Some(Blob::Owned(Arc::new(sc))),
                )
                .unwrap();
                m8.int8_act = true;
                let x1: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
                let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
                for r in [0, rows / 2 + 1, rows - 1] {
                    assert_eq!(m8.row_dot(r, &x1).to_bits(), m.row_dot(r, &x1).to_bits());
                    m.row_to_f32(r, &mut a);
                    m8.row_to_f32(r, &mut b);
                    assert_eq!(a, b);
                }
                for n in [1, 2, 3, 4, 5, 8, 9, 13, 40] {
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 2.0).collect();
                    let input = Input::new(&x, n);
                    let mut outs = Vec::new();
                    for (rows8, int8) in [(true, true), (false, true), (true, false)] {
                        let mut w = m8.weights();
                        (w.rows8, w.int8) = (rows8, int8);
                        let mut out = vec![0f32; n * rows];
                        matmul(&w, &input, &mut out);
                        outs.push((rows8, int8, "level", out));
                    }
                    for (path, o) in rows8_kernels_directly(&m8.weights(), &input) {
                        outs.push((true, true, path, o));
                    }
                    for (rows8, int8, path, out) in &outs {
                        let acts = input.acts(format, *int8);
                        for t in 0..n {
                            let act = input.act(t, *int8);
                            for r in 0..rows {
                                let (wr, sr) = row_of(&m, r);
                                // The 8-row kernels give the scalar reference's bits; the
                                // fallback gives the per-row kernels' bits on the same row.
                                let want = if *rows8 && *int8 {
                                    scalar::dot_row(format, wr, sr, &act)
                                } else {
                                    super::dot_act(format, wr, sr, &acts[t])
                                };
                                assert_eq!(
                                    out[t * rows + r].to_bits(),
                                    want.to_bits(),
                                    "{path} rows8 {rows8} int8 {int8}: {format:?} {rows}x{cols} \
                                     n {n} row {r} token {t}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The AVX-512 BF16 kernels (bf16 weights × bf16-rounded activations) give their
/// reference's bits (`avx512_bf16::dot_ref`, the instruction's arithmetic), in every tile
/// shape, odd sizes included; run directly wherever the CPU has them, whatever
/// `COLIBRI_BF16_ACT` says.
#[test]
#[cfg(target_arch = "x86_64")]
fn bf16_activations_give_the_reference_bits() {
    if !bf16_act_supported() {
        eprintln!("skipped: no AVX-512 BF16 on the avx512-vnni level here");
        return;
    }
    let mut rng = Rng(91);
    for (rows, cols) in [(1, 16), (3, 7), (5, 33), (9, 100), (13, 512), (70, 2048)] {
        let m = random_matrix(WeightFormat::BF16, rows, cols, &mut rng);
        for n in [1, 2, 3, 4, 5, 8, 9] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f() * 2.0).collect();
            let input = Input::new(&x, n);
            let w = m.weights();
            let mut out = vec![0f32; n * rows];
            // SAFETY: `bf16_act_supported` checked the CPU; the weights are bf16.
            unsafe { super::avx512_bf16::matmul_rows(&w, &input, 0..rows, out.as_mut_ptr(), rows) };
            let (xb, x_row) = input.x_bf16();
            for t in 0..n {
                for r in 0..rows {
                    let (wr, _) = row_of(&m, r);
                    let want = super::avx512_bf16::dot_ref(wr, &xb[t * x_row..], cols);
                    assert_eq!(
                        out[t * rows + r].to_bits(),
                        want.to_bits(),
                        "{rows}x{cols} n {n} row {r} token {t}: {} against {want}",
                        out[t * rows + r]
                    );
                    // And within the activations' rounding (2⁻⁹ of each product's size) of
                    // the f32 product.
                    let exact = scalar::dot_row(WeightFormat::BF16, wr, &[], &input.act(t, false));
                    let size: f32 = (0..cols)
                        .map(|c| {
                            let wc = half::bf16::from_le_bytes([wr[2 * c], wr[2 * c + 1]]);
                            (wc.to_f32() * x[t * cols + c]).abs()
                        })
                        .sum();
                    assert!(
                        (want - exact).abs() <= size / 256.0 + 1e-6,
                        "{rows}x{cols} row {r} token {t}: {want} against f32 {exact} (size {size})"
                    );
                }
            }
        }
    }
}
