//! Kernel throughput per format: matrix × `n` activation rows, best of several runs.
//!
//! cargo run --release -p colibri-engine --example kernel_bench -- [MIB] [THREADS] [N,N,...] [REPS]
//!
//! MIB is the weight bytes per matrix (8: in cache, compute-bound; 1024: streams from RAM),
//! N the activation rows (1 = decode's matvec; 8..512 = prefill). Prints GB/s of weights and
//! GMAC/s, and the read bandwidth measured in the same run for MIB >= 64.

use colibri_engine::bench::{cpu_seconds as cpu_s, random_bytes, random_matrix, read_bandwidth};
use colibri_engine::kernels;
use colibri_engine::tensor::{ScaleType, WeightFormat};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(8);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ns: Vec<usize> = args
        .get(3)
        .map(|s| s.split(',').filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 64]);
    let reps: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(7);
    let only: Option<String> = args.get(5).cloned();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        println!(
            "{} · {threads} threads · {mib} MiB per matrix · {}",
            kernels::isa_report(),
            if threads == 1 {
                "CPU time"
            } else {
                "wall time"
            }
        );
        if mib >= 64 {
            let buf = random_bytes(mib << 20, 1);
            println!("read bandwidth {:.1} GB/s", read_bandwidth(&buf, 5) / 1e9);
        }
        // Row width: 4096 by default; KB_COLS=1024 or 2048 gives an expert's shape.
        let cols: usize = std::env::var("KB_COLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(4096);
        let cases: Vec<(&str, WeightFormat, bool)> = vec![
            ("bf16", WeightFormat::BF16, false),
            ("int8 row, f32 act", WeightFormat::I8Row, false),
            ("int8 row, int8 act", WeightFormat::I8Row, true),
            (
                "int8-g32, int8 act",
                WeightFormat::I8 {
                    group: 32,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int8-g64, int8 act",
                WeightFormat::I8 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int4-g64, f32 act",
                WeightFormat::I4 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                false,
            ),
            (
                "int4-g64, int8 act",
                WeightFormat::I4 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int4-g32, int8 act",
                WeightFormat::I4 {
                    group: 32,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int4-g64-rows8, int8 act",
                WeightFormat::I4Rows8 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int4-g32-rows8, int8 act",
                WeightFormat::I4Rows8 {
                    group: 32,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int5-g32, int8 act",
                WeightFormat::I5 {
                    group: 32,
                    scale: ScaleType::F16,
                },
                true,
            ),
            (
                "int2-g64, int8 act",
                WeightFormat::I2 {
                    group: 64,
                    scale: ScaleType::F16,
                },
                true,
            ),
        ];
        for (name, format, int8) in cases {
            if only.as_deref().is_some_and(|o| !name.contains(o)) {
                continue;
            }
            let row = format.row_bytes(cols) + format.scale_row_bytes(cols);
            let rows = ((mib << 20) / row).max(16) / 8 * 8;
            let mut m = random_matrix(rows, cols, format, 7);
            m.int8_act = int8;
            let mut line = format!("{name:<20}");
            for &n in &ns {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                    .collect();
                let mut out = vec![0f32; n * rows];
                // Few reps for big products, at least 0.2 s of work overall.
                let mut best = f64::INFINITY;
                let t_all = Instant::now();
                let mut k = 0;
                while k < reps || (t_all.elapsed().as_secs_f64() < 0.2 && k < 200) {
                    let (t, c) = (Instant::now(), cpu_s());
                    m.matmul(&x, n, &mut out);
                    std::hint::black_box(&out);
                    let dt = if threads == 1 {
                        cpu_s() - c
                    } else {
                        t.elapsed().as_secs_f64()
                    };
                    best = best.min(dt);
                    k += 1;
                }
                let gbs = m.size_bytes() as f64 / best / 1e9;
                let gmacs = (rows * cols * n) as f64 / best / 1e9;
                line.push_str(&format!("  n={n}: {gbs:6.1} GB/s {gmacs:6.1} GMAC/s"));
            }
            println!("{line}");
        }
    });
}
