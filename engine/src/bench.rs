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
    /// Prefill products (64 tokens): name, multiply-accumulates per second.
    pub gemm: Vec<(String, f64)>,
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

/// CPU seconds used by this process so far: with one thread at work, immune to the time
/// other processes take the core (the development machines are shared). Wall-clock seconds
/// since the first call where the platform has no process CPU clock.
pub fn cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    #[cfg(not(unix))]
    {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    }
}

/// The least [`cpu_seconds`] one call of `f` took over `reps` calls.
pub fn best_cpu_seconds(reps: usize, f: &mut dyn FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps.max(1) {
        let c = cpu_seconds();
        f();
        best = best.min(cpu_seconds() - c);
    }
    best
}

/// The read bandwidth a model's decode is measured against (bytes/s): a 1 GiB buffer, best
/// of 3, on the current rayon pool.
pub fn yardstick() -> f64 {
    let buf = random_bytes(1 << 30, 3);
    read_bandwidth(&buf, 3)
}

/// [`yardstick`] on `threads` threads alone (`coli bench --bandwidth`: the same measure next
/// to another engine's run).
pub fn bandwidth(threads: usize) -> crate::Result<f64> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| crate::Error::invalid("threads", e.to_string()))?;
    Ok(pool.install(yardstick))
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
                ScaleType::E8M0 => s.push(118 + (i % 5) as u8),
                ScaleType::BF16 => s.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
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
                "int8-g32 (int8 act)".into(),
                WeightFormat::I8 {
                    group: 32,
                    scale: ScaleType::F16,
                },
                true,
            ),
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
                "int5-g32 (int8 act)".into(),
                WeightFormat::I5 {
                    group: 32,
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
        // Prefill: 64 tokens through an 8 MiB matrix (compute-bound: the weights stay in
        // cache), as multiply-accumulates per second.
        let mut gemm = Vec::new();
        let n = 64;
        let xs: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        for (name, format, int8) in [
            ("bf16", WeightFormat::BF16, false),
            (
                "int8-g32 (int8 act)",
                WeightFormat::I8 {
                    group: 32,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int4-g64 (int8 act)",
                WeightFormat::I4 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
        ] {
            let row = format.row_bytes(cols) + format.scale_row_bytes(cols);
            let rows = ((8 << 20) / row).max(1);
            let mut m = random_matrix(rows, cols, format, 9);
            m.int8_act = int8;
            let mut out = vec![0f32; rows * n];
            let t = best_of(reps, || {
                m.matmul(&xs, n, &mut out);
                std::hint::black_box(&out);
            });
            gemm.push((name.to_string(), (rows * cols * n) as f64 / t));
        }
        KernelReport {
            threads,
            level: kernels::level().name(),
            buffer_bytes: bytes,
            bandwidth,
            kernels,
            gemm,
        }
    })
}

impl std::fmt::Display for KernelReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} · {} threads · {:.0} MiB per matrix",
            kernels::isa_report(),
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
        writeln!(f, "prefill products (64 tokens, 8 MiB matrix in cache):")?;
        for (name, macs) in &self.gemm {
            writeln!(f, "  {:<22} {:>6.1} GMAC/s", name, macs / 1e9)?;
        }
        Ok(())
    }
}

/// `coli bench --model`: prefill and decode speed of a model in RAM, where the time goes,
/// its peak RSS, and the bytes a decode step reads per second next to the measured read
/// bandwidth.
#[derive(Clone, Debug)]
pub struct ModelBench {
    pub threads: usize,
    pub load_s: f64,
    pub prompt_tokens: usize,
    /// Positions already in the cache when the timed prefill and decode start
    /// (`llama-bench -d`).
    pub depth: usize,
    /// Tokens per second of each run.
    pub prefill_runs: Vec<f64>,
    pub decode_tokens: usize,
    pub decode_runs: Vec<f64>,
    /// Seconds per phase ([`crate::arch::profile::PHASES`] order, then glue: the rest of the
    /// wall time) per prefill run and per decoded token, averaged over the runs.
    pub prefill_phases: [f64; 7],
    pub decode_phases: [f64; 7],
    pub peak_rss_bytes: u64,
    /// Weight bytes one decode step reads: everything resident but the embedding table,
    /// with only `top_k` routed experts per MoE layer.
    pub bytes_per_token: u64,
    /// KV cache bytes one decode step reads, on average over the timed decode.
    pub kv_bytes_per_token: u64,
    pub kv_dtype: &'static str,
    pub bandwidth: f64,
}

/// What `coli bench --model` runs.
#[derive(Clone, Debug)]
pub struct ModelBenchOptions {
    pub threads: usize,
    /// Prompt tokens prefilled in one step.
    pub prompt: usize,
    /// Tokens decoded one at a time.
    pub gen: usize,
    /// Positions filled (untimed) before each timed prefill and decode.
    pub depth: usize,
    /// Runs of each; the report gives the mean and the range.
    pub reps: usize,
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

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32
}

/// Loads `dir`; `reps` times: fills `depth` positions (untimed), prefills `prompt`
/// pseudo-random tokens in one step, rewinds to `depth` and decodes `gen` tokens greedily
/// (as `llama-bench -d` runs its pp and tg tests from the same depth); with `threads`
/// threads. Then measures the read bandwidth with the same threads.
pub fn model_bench(dir: &std::path::Path, o: &ModelBenchOptions) -> crate::Result<ModelBench> {
    use crate::arch::profile;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(o.threads)
        .build()
        .map_err(|e| crate::Error::invalid("threads", e.to_string()))?;
    pool.install(|| {
        let t = Instant::now();
        let model = crate::Model::load(dir)?;
        let load_s = t.elapsed().as_secs_f64();
        let vocab = model.info.vocab_size as u64;
        let prompt = o.prompt.max(1);
        let need = o.depth + prompt.max(o.gen);
        if need > model.info.max_context {
            return Err(crate::Error::ContextOverflow {
                needed: need,
                max: model.info.max_context,
            });
        }
        let mut s = 0x2545F4914F6CDD1Du64;
        let mut ids = |n: usize| -> Vec<u32> {
            (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % vocab) as u32
                })
                .collect()
        };
        let reps = o.reps.max(1);
        let (mut prefill_runs, mut decode_runs) = (Vec::new(), Vec::new());
        let (mut pre_ph, mut dec_ph) = ([0f64; 7], [0f64; 7]);
        let mut kv_bytes = 0u64;
        let add = |acc: &mut [f64; 7], wall: f64, div: f64| {
            let ns = profile::take();
            let mut sum = 0.0;
            for (a, n) in acc.iter_mut().zip(ns) {
                *a += n as f64 * 1e-9 / div;
                sum += n as f64 * 1e-9;
            }
            acc[6] += (wall - sum).max(0.0) / div;
        };
        for _ in 0..reps {
            let mut cache = model.new_cache();
            let mut last = vec![0f32; model.info.vocab_size];
            if o.depth > 0 {
                last = model.step(&mut cache, &ids(o.depth))?;
            }
            let p = ids(prompt);
            profile::take();
            profile::enable(true);
            let t = Instant::now();
            let logits = model.step(&mut cache, &p)?;
            let prefill_s = t.elapsed().as_secs_f64();
            add(&mut pre_ph, prefill_s, reps as f64);
            prefill_runs.push(p.len() as f64 / prefill_s);
            if o.depth == 0 {
                last = logits;
            }
            cache.truncate(o.depth);
            let before = cache.size_bytes() as u64;
            profile::take();
            let t = Instant::now();
            for _ in 0..o.gen {
                last = model.step(&mut cache, &[argmax(&last)])?;
            }
            let decode_s = t.elapsed().as_secs_f64();
            profile::enable(false);
            add(&mut dec_ph, decode_s, (reps * o.gen.max(1)) as f64);
            decode_runs.push(o.gen as f64 / decode_s);
            // Step j reads the cache as it is after appending its own position.
            let per_pos = cache.bytes_per_position() as u64;
            kv_bytes = before + per_pos * (o.gen as u64 + 1) / 2;
        }
        let bytes_per_token = decode_bytes(&model.net);
        let kv_dtype = model
            .new_cache()
            .layers
            .first()
            .map_or("-", |l| l.k.dtype().name());
        let peak_rss_bytes = peak_rss();
        drop(model);
        let bandwidth = yardstick();
        Ok(ModelBench {
            threads: o.threads,
            load_s,
            prompt_tokens: prompt,
            depth: o.depth,
            prefill_runs,
            decode_tokens: o.gen,
            decode_runs,
            prefill_phases: pre_ph,
            decode_phases: dec_ph,
            peak_rss_bytes,
            bytes_per_token,
            kv_bytes_per_token: kv_bytes,
            kv_dtype,
            bandwidth,
        })
    })
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn range(v: &[f64]) -> String {
    if v.len() < 2 {
        return String::new();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(0f64, f64::max);
    format!(", {} runs: {lo:.2}–{hi:.2}", v.len())
}

fn phases(p: &[f64; 7], scale: f64, unit: &str) -> String {
    let total: f64 = p.iter().sum();
    let names = crate::arch::profile::PHASES
        .iter()
        .map(|p| p.name())
        .chain(["glue"]);
    let parts: Vec<String> = names
        .zip(p)
        .map(|(n, v)| {
            format!(
                "{n} {:.2}{unit} ({:.0}%)",
                v * scale,
                100.0 * v / total.max(1e-12)
            )
        })
        .collect();
    parts.join(" · ")
}

impl std::fmt::Display for ModelBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let decode = mean(&self.decode_runs);
        let reads = (self.bytes_per_token + self.kv_bytes_per_token) as f64;
        let kernel = reads * decode;
        writeln!(
            f,
            "threads {} · {} · KV cache {} · load {:.1} s",
            self.threads,
            kernels::isa_report(),
            self.kv_dtype,
            self.load_s
        )?;
        writeln!(
            f,
            "prefill  {:>8.1} tok/s  ({} tokens at depth {}{})",
            mean(&self.prefill_runs),
            self.prompt_tokens,
            self.depth,
            range(&self.prefill_runs)
        )?;
        writeln!(
            f,
            "decode   {:>8.2} tok/s  ({} tokens at depth {}{})",
            decode,
            self.decode_tokens,
            self.depth,
            range(&self.decode_runs)
        )?;
        writeln!(
            f,
            "prefill phases (ms per prefill): {}",
            phases(&self.prefill_phases, 1e3, " ms")
        )?;
        writeln!(
            f,
            "decode phases (ms per token): {}",
            phases(&self.decode_phases, 1e3, " ms")
        )?;
        writeln!(
            f,
            "peak RSS {:>8.2} GiB",
            self.peak_rss_bytes as f64 / (1u64 << 30) as f64
        )?;
        writeln!(
            f,
            "decode reads {:.1} MB per token ({:.1} MB weights + {:.1} MB KV cache): {:.1} GB/s of {:.1} GB/s read bandwidth ({:.0}%)",
            reads / 1e6,
            self.bytes_per_token as f64 / 1e6,
            self.kv_bytes_per_token as f64 / 1e6,
            kernel / 1e9,
            self.bandwidth / 1e9,
            100.0 * kernel / self.bandwidth
        )
    }
}
