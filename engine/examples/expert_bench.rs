//! The routed experts of a prefill chunk, alone: `L` layers of `E` experts (gate, up:
//! `F × D`; down: `D × F`) in one format, each layer's experts fed the tokens a random top-`K`
//! routing of `T` tokens sends them (about `T·K/E` each, as a prefill chunk of an MoE model
//! does), gate and up of every expert in one parallel region, then the downs in another.
//! Prints GMAC/s per pass over all layers (the layers together exceed the caches, so each
//! expert streams from memory as in a real prefill).
//!
//! `cargo run --release -p colibri-engine --example expert_bench -- [LAYERS] [TOKENS] [PASSES] [FORMAT]`
//! with FORMAT `int4-g64` (default) or `int4-g32`, either with `-rows8` (rows interleaved
//! by 8 as `coli convert` writes them); OLMoE-1B-7B's shape (64 experts, top 8, D 2048,
//! F 1024). Also prints the bytes of the experts used per pass over the time (GB/s): with 1
//! token, what a decode step's experts stream.

use colibri_engine::bench::random_matrix;
use colibri_engine::kernels::{self, Input};
use colibri_engine::tensor::{Matrix, ScaleType, WeightFormat};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let layers: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(6);
    let tokens: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let passes: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let name = args.get(4).map(String::as_str).unwrap_or("int4-g64");
    let group = if name.starts_with("int4-g32") { 32 } else { 64 };
    let (experts, top_k, d, f) = (64usize, 8usize, 2048usize, 1024usize);
    let format = if name.ends_with("-rows8") {
        WeightFormat::I4Rows8 {
            group,
            scale: ScaleType::F16,
        }
    } else {
        WeightFormat::I4 {
            group,
            scale: ScaleType::F16,
        }
    };
    let mut seed = 1u64;
    let mut mat = |rows, cols| {
        seed += 1;
        let mut m: Matrix = random_matrix(rows, cols, format, seed);
        m.int8_act = true;
        m
    };
    let model: Vec<Vec<[Matrix; 3]>> = (0..layers)
        .map(|_| {
            (0..experts)
                .map(|_| [mat(f, d), mat(f, d), mat(d, f)])
                .collect()
        })
        .collect();
    println!(
        "{} · {layers} layers × {experts} experts {} · {tokens} tokens, top {top_k}",
        kernels::isa_report(),
        format.name()
    );
    // A fixed pseudo-random routing: each token picks `top_k` distinct experts per layer.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let counts: Vec<Vec<usize>> = (0..layers)
        .map(|_| {
            let mut c = vec![0usize; experts];
            for _ in 0..tokens {
                let mut picked = Vec::with_capacity(top_k);
                while picked.len() < top_k {
                    let e = (next() % experts as u64) as usize;
                    if !picked.contains(&e) {
                        picked.push(e);
                        c[e] += 1;
                    }
                }
            }
            c
        })
        .collect();
    let xs: Vec<Vec<f32>> = (0..experts)
        .map(|e| {
            (0..tokens * d)
                .map(|i| (((i + e) * 37 % 101) as f32 - 50.0) / 50.0)
                .collect()
        })
        .collect();
    let macs: usize = counts.iter().flatten().sum::<usize>() * 3 * d * f;
    let bytes: usize = counts
        .iter()
        .zip(&model)
        .flat_map(|(c, layer)| c.iter().zip(layer))
        .filter(|(n, _)| **n > 0)
        .map(|(_, ms)| ms.iter().map(Matrix::size_bytes).sum::<usize>())
        .sum();
    for pass in 0..passes {
        let t0 = Instant::now();
        for (l, layer) in model.iter().enumerate() {
            let inputs: Vec<Input> = (0..experts)
                .map(|e| Input::with_cols(&xs[e][..counts[l][e] * d], counts[l][e], d))
                .collect();
            let mut gate: Vec<Vec<f32>> = counts[l].iter().map(|&n| vec![0.0; n * f]).collect();
            let mut up: Vec<Vec<f32>> = counts[l].iter().map(|&n| vec![0.0; n * f]).collect();
            let mut jobs = Vec::new();
            for ((e, g), u) in gate.iter_mut().enumerate().zip(up.iter_mut()) {
                jobs.push((layer[e][0].weights(), &inputs[e], &mut g[..]));
                jobs.push((layer[e][1].weights(), &inputs[e], &mut u[..]));
            }
            kernels::matmul_each(&mut jobs);
            let h: Vec<Vec<f32>> = gate
                .iter()
                .map(|g| g.iter().map(|v| v * 0.5).collect())
                .collect();
            let hin: Vec<Input> = (0..experts)
                .map(|e| Input::with_cols(&h[e], counts[l][e], f))
                .collect();
            let mut down: Vec<Vec<f32>> = counts[l].iter().map(|&n| vec![0.0; n * d]).collect();
            let mut jobs: Vec<_> = down
                .iter_mut()
                .enumerate()
                .map(|(e, o)| (layer[e][2].weights(), &hin[e], &mut o[..]))
                .collect();
            kernels::matmul_each(&mut jobs);
        }
        let s = t0.elapsed().as_secs_f64();
        println!(
            "pass {pass}: {:.1} ms, {:.1} GMAC/s, {:.1} GB/s",
            s * 1e3,
            macs as f64 / s / 1e9,
            bytes as f64 / s / 1e9
        );
    }
}
