//! Property tests: every SIMD path against the scalar reference, on random shapes (odd
//! column counts included), random codes (every code value, e.g. int4's -8 and int8's -128)
//! and random scales.

use super::*;
use crate::tensor::{ScaleType, WeightFormat};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn formats() -> Vec<WeightFormat> {
    let mut v = vec![
        WeightFormat::F32,
        WeightFormat::BF16,
        WeightFormat::F16,
        WeightFormat::I8Row,
    ];
    for scale in [ScaleType::F32, ScaleType::F16] {
        for group in [0, 32, 64, 128] {
            v.push(WeightFormat::I4 { group, scale });
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
            _ => s.extend_from_slice(&v.to_le_bytes()),
        }
    }
    (w, s)
}

/// Scale of the sum: |dot| may cancel, so compare against sum |w||x|.
fn magnitude(format: WeightFormat, w: &[u8], s: &[u8], x: &[f32]) -> f32 {
    let mut d = vec![0f32; x.len()];
    decode_row(format, w, s, &mut d);
    d.iter().zip(x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-3
}

#[test]
fn fast_paths_match_the_scalar_reference() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && std::env::var("COLIBRI_KERNELS").is_err()
    {
        assert_eq!(level(), Level::Avx2);
    }
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut checked = 0;
    for format in formats() {
        for _ in 0..60 {
            let cols = match rng.below(4) {
                0 => 1 + rng.below(40),
                1 => 32 * (1 + rng.below(12)),
                2 => 64 * (1 + rng.below(6)) + 1 + 2 * rng.below(31),
                _ => 1 + rng.below(700),
            };
            let (w, s) = random_row(format, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
            let mag = magnitude(format, &w, &s, &x);
            for int8 in [false, true] {
                let act = prepare(format, &x, int8);
                let fast = dot_act(format, &w, &s, &act);
                let reference = scalar::dot_act(format, &w, &s, &act);
                assert!(
                    (fast - reference).abs() <= 2e-5 * mag,
                    "{format:?} cols {cols} int8 {int8}: fast {fast} vs reference {reference} (scale {mag})"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000);
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
        let q = scalar::dot_act(format, &w, &s, &prepare(format, &x, true));
        let mag = magnitude(format, &w, &s, &x);
        // Activation rounding error is at most half a step (amax/254) per element.
        assert!(
            (exact - q).abs() <= mag / 127.0,
            "{format:?}: {exact} vs {q}"
        );
    }
}

#[test]
fn matmul_is_the_same_for_any_batch() {
    let mut rng = Rng(5);
    for format in [
        WeightFormat::BF16,
        WeightFormat::I8Row,
        WeightFormat::I4 {
            group: 64,
            scale: ScaleType::F16,
        },
        WeightFormat::I2 {
            group: 32,
            scale: ScaleType::F32,
        },
    ] {
        let (rows, cols, n) = (37, 161, 5);
        let vals: Vec<f32> = (0..rows * cols).map(|_| rng.f()).collect();
        let m = crate::tensor::Matrix::quantize_f32(rows, cols, format, &vals);
        let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
        let mut all = vec![0f32; n * rows];
        m.matmul(&x, n, &mut all);
        for i in 0..n {
            let mut one = vec![0f32; rows];
            m.matmul(&x[i * cols..(i + 1) * cols], 1, &mut one);
            assert_eq!(
                &all[i * rows..(i + 1) * rows],
                &one[..],
                "{format:?} row {i}"
            );
            for (r, v) in one.iter().enumerate() {
                assert_eq!(*v, m.row_dot(r, &x[i * cols..(i + 1) * cols]));
            }
        }
    }
}
