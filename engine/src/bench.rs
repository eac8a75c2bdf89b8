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
        // The yardstick is measured before and after the kernels and the better one kept, so
        // a burst of load from other processes cannot flatter the kernels' share.
        let buf = random_bytes(bytes, 1);
        let mut bandwidth = read_bandwidth(&buf, reps);
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
            ("int3-g64 (f32 act)".into(), WeightFormat::I3G64, false),
            ("int3-g64 (int8 act)".into(), WeightFormat::I3G64, true),
            ("int2-plain (int8 act)".into(), WeightFormat::I2Plain, true),
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
        let buf = random_bytes(bytes, 2);
        bandwidth = bandwidth.max(read_bandwidth(&buf, reps));
        drop(buf);
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

/// `coli bench --model`: prefill and decode speed of a model in RAM, its peak RSS, and the
/// weight bytes a decode step streams per second next to the measured read bandwidth.
#[derive(Clone, Debug)]
pub struct ModelBench {
    pub threads: usize,
    pub load_s: f64,
    pub prompt_tokens: usize,
    pub prefill_tok_s: f64,
    pub decode_tokens: usize,
    pub decode_tok_s: f64,
    pub peak_rss_bytes: u64,
    /// Weight bytes one decode step reads: everything resident but the embedding table,
    /// with only `top_k` routed experts per MoE layer.
    pub bytes_per_token: u64,
    pub bandwidth: f64,
}

/// Peak resident set size of this process (`VmHWM`), in bytes.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn decode_bytes(net: &crate::arch::Network) -> u64 {
    let mut b = net.weight_bytes() as u64 - net.embed.size_bytes() as u64;
    if std::ptr::eq(&net.embed, &net.lm_head) {
        b += net.lm_head.size_bytes() as u64;
    }
    for l in &net.layers {
        if let crate::arch::Ffn::Moe(m) = &l.ffn {
            let all: u64 = m.experts.iter().map(|e| e.size_bytes() as u64).sum();
            let per = all / m.experts.len().max(1) as u64;
            b = b - all + per * m.top_k as u64;
        }
    }
    b
}

/// Loads `dir`, prefills `prompt` pseudo-random tokens, decodes `gen` tokens greedily, with
/// `threads` threads; then measures the read bandwidth with the same threads.
pub fn model_bench(
    dir: &std::path::Path,
    threads: usize,
    prompt: usize,
    gen: usize,
) -> crate::Result<ModelBench> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| crate::Error::invalid("threads", e.to_string()))?;
    pool.install(|| {
        let t = Instant::now();
        let model = crate::Model::load(dir)?;
        let load_s = t.elapsed().as_secs_f64();
        let vocab = model.info.vocab_size as u64;
        let need = prompt + gen;
        if need > model.info.max_context {
            return Err(crate::Error::ContextOverflow {
                needed: need,
                max: model.info.max_context,
            });
        }
        let mut s = 0x2545F4914F6CDD1Du64;
        let ids: Vec<u32> = (0..prompt.max(1))
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % vocab) as u32
            })
            .collect();
        let mut cache = model.new_cache();
        let t = Instant::now();
        let mut logits = model.step(&mut cache, &ids)?;
        let prefill_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..gen {
            let next =
                (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b }) as u32;
            logits = model.step(&mut cache, &[next])?;
        }
        let decode_s = t.elapsed().as_secs_f64();
        let bytes_per_token = decode_bytes(&model.net);
        let peak_rss_bytes = peak_rss();
        drop(model);
        let buf = random_bytes(1 << 30, 3);
        let bandwidth = read_bandwidth(&buf, 3);
        Ok(ModelBench {
            threads,
            load_s,
            prompt_tokens: ids.len(),
            prefill_tok_s: ids.len() as f64 / prefill_s,
            decode_tokens: gen,
            decode_tok_s: gen as f64 / decode_s,
            peak_rss_bytes,
            bytes_per_token,
            bandwidth,
        })
    })
}

impl std::fmt::Display for ModelBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kernel = self.bytes_per_token as f64 * self.decode_tok_s;
        writeln!(
            f,
            "threads {} · kernels {} · load {:.1} s",
            self.threads,
            kernels::level().name(),
            self.load_s
        )?;
        writeln!(
            f,
            "prefill  {:>8.1} tok/s  ({} tokens)",
            self.prefill_tok_s, self.prompt_tokens
        )?;
        writeln!(
            f,
            "decode   {:>8.2} tok/s  ({} tokens)",
            self.decode_tok_s, self.decode_tokens
        )?;
        writeln!(
            f,
            "peak RSS {:>8.2} GiB",
            self.peak_rss_bytes as f64 / (1u64 << 30) as f64
        )?;
        writeln!(
            f,
            "decode streams {:.1} MB of weights per token: {:.1} GB/s of {:.1} GB/s read bandwidth ({:.0}%)",
            self.bytes_per_token as f64 / 1e6,
            kernel / 1e9,
            self.bandwidth / 1e9,
            100.0 * kernel / self.bandwidth
        )
    }
}
