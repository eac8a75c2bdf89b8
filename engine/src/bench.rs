//! Kernel throughput against the machine's memory read bandwidth, measured in the same run
//! (`coli bench --kernels`, `coli bench --model`).
//!
//! Bandwidth yardstick: a sum of a large buffer with several AVX2 accumulators, split over
//! the same threads the kernels use. A naive scalar sum is compute-bound far below the
//! memory's speed, so it would flatter the kernels.

use crate::kernels;
use crate::tensor::{Blob, Matrix, ScaleType, WeightFormat};
use rayon::prelude::*;
use std::sync::Arc;
use std::time::Instant;

/// One measured kernel.
#[derive(Clone, Debug)]
pub struct KernelResult {
    pub name: String,
    /// Weight + scale bytes streamed per matvec.
    pub bytes: usize,
    /// Best-of-`reps` bytes per second.
    pub bytes_per_s: f64,
}

/// The whole report: bandwidth and each kernel's share of it.
#[derive(Clone, Debug)]
pub struct KernelReport {
    pub threads: usize,
    pub level: &'static str,
    pub buffer_bytes: usize,
    pub bandwidth: f64,
    pub kernels: Vec<KernelResult>,
}

fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    f(); // warm-up: page faults, caches
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Random bytes, fast (xorshift), in parallel.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; n];
    v.par_chunks_mut(1 << 20).enumerate().for_each(|(i, c)| {
        let mut s = (seed ^ (i as u64).wrapping_mul(0x9E3779B97F4A7C15)) | 1;
        for w in c.chunks_mut(8) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let b = s.to_le_bytes();
            w.copy_from_slice(&b[..w.len()]);
        }
    });
    v
}

/// Memory read bandwidth (bytes/s) over `buf` with the current rayon pool.
pub fn read_bandwidth(buf: &[u8], reps: usize) -> f64 {
    let threads = rayon::current_num_threads().max(1);
    let chunk = buf.len().div_ceil(threads * 4).next_multiple_of(4096);
    let t = best_of(reps, || {
        let s: f32 = buf.par_chunks(chunk).map(kernels::sum_bytes_as_f32).sum();
        std::hint::black_box(s);
    });
    buf.len() as f64 / t
}

/// A random `rows × cols` matrix in `format` (valid codes, sane scales), built from bytes so
/// a gigabyte takes a second, not a quantizer's minute.
pub fn random_matrix(rows: usize, cols: usize, format: WeightFormat, seed: u64) -> Matrix {
    let mut data = random_bytes(rows * format.row_bytes(cols), seed);
    if matches!(format, WeightFormat::BF16) {
        // Magnitudes between 2^-7 and 2: no NaN, no subnormals (which trap into slow microcode).
        data.par_chunks_mut(2)
            .for_each(|c| c[1] = (c[1] & 0x83) | 0x3C);
    }
    let n_scales = rows * format.groups_per_row(cols);
    let scales = format.scale_type().map(|st| {
        let mut s = Vec::with_capacity(n_scales * st.size());
        for i in 0..n_scales {
            let v = 0.001 + (i % 97) as f32 * 1e-5;
            match st {
                ScaleType::F32 => s.extend_from_slice(&v.to_le_bytes()),
                ScaleType::F16 => s.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            }
        }
        Blob::Owned(Arc::new(s))
    });
    Matrix::quantized(rows, cols, format, Blob::Owned(Arc::new(data)), scales)
        .expect("sizes computed from the format")
}

/// Measures bandwidth and matvec throughput of the main formats over ~`bytes` of weights,
/// with `threads` threads, best of `reps`.
pub fn kernel_report(bytes: usize, threads: usize, reps: usize) -> KernelReport {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool");
    pool.install(|| {
        let buf = random_bytes(bytes, 1);
        let bandwidth = read_bandwidth(&buf, reps);
        drop(buf);
        let cols = 4096;
        let cases: Vec<(String, WeightFormat, bool)> = vec![
            ("int8 (f32 act)".into(), WeightFormat::I8Row, false),
            ("int8 (int8 act)".into(), WeightFormat::I8Row, true),
            (
                "int4-g64 (f32 act)".into(),
                WeightFormat::I4 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                false,
            ),
            (
                "int4-g64 (int8 act)".into(),
                WeightFormat::I4 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int2-g64 (int8 act)".into(),
                WeightFormat::I2 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
            ("bf16".into(), WeightFormat::BF16, false),
        ];
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let mut kernels = Vec::new();
        for (name, format, int8) in cases {
            let row = format.row_bytes(cols) + format.scale_row_bytes(cols);
            let rows = (bytes / row).max(1);
            let mut m = random_matrix(rows, cols, format, 7);
            m.int8_act = int8;
            let mut out = vec![0f32; rows];
            let t = best_of(reps, || {
                m.matmul(&x, 1, &mut out);
                std::hint::black_box(&out);
            });
            kernels.push(KernelResult {
                name,
                bytes: m.size_bytes(),
                bytes_per_s: m.size_bytes() as f64 / t,
            });
        }
        KernelReport {
            threads,
            level: kernels::level().name(),
            buffer_bytes: bytes,
            bandwidth,
            kernels,
        }
    })
}

impl std::fmt::Display for KernelReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "kernels: {} · {} threads · {:.0} MiB per matrix",
            self.level,
            self.threads,
            self.buffer_bytes as f64 / (1 << 20) as f64
        )?;
        writeln!(
            f,
            "memory read bandwidth (AVX2 multi-accumulator sum): {:.1} GB/s",
            self.bandwidth / 1e9
        )?;
        for k in &self.kernels {
            writeln!(
                f,
                "  {:<22} {:>6.1} GB/s  {:>5.1}% of bandwidth",
                k.name,
                k.bytes_per_s / 1e9,
                100.0 * k.bytes_per_s / self.bandwidth
            )?;
        }
        Ok(())
    }
}
