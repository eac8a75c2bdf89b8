//! A prototype of issue 11's row-interleaved int4 layout, measured against the tiles colibri
//! runs today on the same shape, one thread, CPU time, alternating:
//!
//! cargo run --release -p colibri-engine --example interleaved_bench -- [ROWS] [COLS] [TOKENS] [ROUNDS]
//!
//! TOKENS = 1 measures decode instead: the matvec over a 256 MiB matrix on both layouts, GB/s.
//!
//! Today's int4 × int8 tile accumulates one (row, token) in a vector, so every 64 weights of
//! every (row, token) pay a convert, a scale multiply and an FMA: 5 operations on the two
//! multiply pipes per 64 MACs of which 2 are float. Interleaving 8 rows so that lane `r` of
//! a vector is row `r` lets the integer sums of a 32-element block stay in int16 across the
//! block (8 `maddubs`, at most 8 · 2 · 15 · 127 = 30 480) and pay one `madd`, one convert, one
//! multiply and one FMA for 8 rows at once: 11 multiply-pipe operations per 256 MACs
//! against 20. This example checks the prototype against a scalar reference and prints both
//! kernels' GMAC/s; it is not wired into the engine (docs/PERFORMANCE.md).

#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod proto {
    use std::arch::x86_64::*;

    /// 8 rows × `cols` int4 codes (0..15, value `q − 8`), interleaved: for every 8 columns
    /// `k0..k0 + 8`, 32 bytes whose dword `r` holds row `r`'s columns `k0..k0 + 4` in the low
    /// nibbles and `k0 + 4..k0 + 8` in the high ones.
    pub fn interleave(codes: &[u8], cols: usize) -> Vec<u8> {
        let mut out = vec![0u8; 4 * cols];
        for k8 in 0..cols / 8 {
            for r in 0..8 {
                for i in 0..4 {
                    let lo = codes[r * cols + k8 * 8 + i];
                    let hi = codes[r * cols + k8 * 8 + 4 + i];
                    out[k8 * 32 + r * 4 + i] = lo | (hi << 4);
                }
            }
        }
        out
    }

    /// Prepared activations of one token: int8 codes, a scale and `8 · Σ codes` per block of 32.
    pub struct Act {
        pub q: Vec<i8>,
        pub d: Vec<f32>,
        pub c8: Vec<i32>,
    }

    /// `out[t · 8 + r]` = row `r` · token `t` for 4 tokens, the rows' scales `s`
    /// (`blocks × 8`, block-major).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn tile_8x4(w: &[u8], s: &[f32], acts: &[&Act; 4], cols: usize, out: &mut [f32]) {
        let m0f = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); 4];
        for b in 0..cols / 32 {
            let mut s16 = [_mm256_setzero_si256(); 4];
            for v in 0..4 {
                let k0 = b * 32 + v * 8;
                let x = _mm256_loadu_si256(w.as_ptr().add(k0 * 4) as *const __m256i);
                let lo = _mm256_and_si256(x, m0f);
                let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m0f);
                for t in 0..4 {
                    let qa = acts[t].q.as_ptr().add(k0) as *const i32;
                    let a0 = _mm256_set1_epi32(qa.read_unaligned());
                    let a1 = _mm256_set1_epi32(qa.add(1).read_unaligned());
                    s16[t] = _mm256_add_epi16(
                        s16[t],
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, a0),
                            _mm256_maddubs_epi16(hi, a1),
                        ),
                    );
                }
            }
            let sv = _mm256_loadu_ps(s.as_ptr().add(b * 8));
            for t in 0..4 {
                let i32s = _mm256_sub_epi32(
                    _mm256_madd_epi16(s16[t], ones),
                    _mm256_set1_epi32(acts[t].c8[b]),
                );
                let ds = _mm256_mul_ps(sv, _mm256_set1_ps(acts[t].d[b]));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32s), ds, acc[t]);
            }
        }
        for t in 0..4 {
            _mm256_storeu_ps(out.as_mut_ptr().add(t * 8), acc[t]);
        }
    }

    /// Decode on the same layout: `G` groups of 8 rows × 1 token side by side (`G`
    /// sequential streams), the rows' scales in f16 (`blocks × 8` half-floats, 2 bytes per
    /// 32 weights as int4-g32 today).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn tile_8x1<const G: usize>(
        w: [*const u8; G],
        s: [*const u16; G],
        act: &Act,
        cols: usize,
    ) -> [__m256; G] {
        let m0f = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); G];
        for b in 0..cols / 32 {
            let mut s16 = [_mm256_setzero_si256(); G];
            for v in 0..4 {
                let k0 = b * 32 + v * 8;
                let qa = act.q.as_ptr().add(k0) as *const i32;
                let a0 = _mm256_set1_epi32(qa.read_unaligned());
                let a1 = _mm256_set1_epi32(qa.add(1).read_unaligned());
                for g in 0..G {
                    if v % 2 == 0 {
                        // 6 KiB ahead, as the engine's row kernels do.
                        _mm_prefetch::<_MM_HINT_T0>(w[g].add(k0 * 4 + 6144) as *const i8);
                    }
                    let x = _mm256_loadu_si256(w[g].add(k0 * 4) as *const __m256i);
                    let lo = _mm256_and_si256(x, m0f);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m0f);
                    s16[g] = _mm256_add_epi16(
                        s16[g],
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(lo, a0),
                            _mm256_maddubs_epi16(hi, a1),
                        ),
                    );
                }
            }
            let c8 = _mm256_set1_epi32(act.c8[b]);
            let d = _mm256_set1_ps(act.d[b]);
            for g in 0..G {
                let i32s = _mm256_sub_epi32(_mm256_madd_epi16(s16[g], ones), c8);
                let sv = _mm256_cvtph_ps(_mm_loadu_si128(s[g].add(b * 8) as *const __m128i));
                acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32s), _mm256_mul_ps(sv, d), acc[g]);
            }
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
fn main() {
    use colibri_engine::bench::{best_cpu_seconds, random_matrix};
    use colibri_engine::tensor::{ScaleType, WeightFormat};
    use proto::*;

    let arg = |i: usize, d: usize| {
        std::env::args()
            .nth(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (rows, cols, tokens, rounds) = (arg(1, 512), arg(2, 2048), arg(3, 64), arg(4, 5));
    assert!(rows % 8 == 0 && cols % 64 == 0 && (tokens == 1 || tokens % 4 == 0));
    if !is_x86_feature_detected!("avx2")
        || !is_x86_feature_detected!("fma")
        || !is_x86_feature_detected!("f16c")
    {
        println!("needs AVX2, FMA and F16C");
        return;
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let blocks = cols / 32;
    let codes: Vec<u8> = (0..rows * cols).map(|_| (rnd() % 16) as u8).collect();
    let scales: Vec<f32> = (0..rows * blocks)
        .map(|_| 0.01 + (rnd() % 1000) as f32 * 1e-5)
        .collect();
    let acts: Vec<Act> = (0..tokens)
        .map(|_| {
            let q: Vec<i8> = (0..cols)
                .map(|_| ((rnd() % 255) as i32 - 127) as i8)
                .collect();
            let d = (0..blocks)
                .map(|_| 0.001 + (rnd() % 100) as f32 * 1e-5)
                .collect();
            let c8 = q
                .chunks(32)
                .map(|c| 8 * c.iter().map(|&x| x as i32).sum::<i32>())
                .collect();
            Act { q, d, c8 }
        })
        .collect();
    if tokens == 1 {
        decode(rows, cols, &codes, &scales, &acts[0], rounds);
        return;
    }
    // Per group of 8 rows: the interleaved codes and the scales block-major.
    let groups: Vec<(Vec<u8>, Vec<f32>)> = (0..rows / 8)
        .map(|g| {
            let w = interleave(&codes[g * 8 * cols..(g + 1) * 8 * cols], cols);
            let mut s = vec![0f32; blocks * 8];
            for b in 0..blocks {
                for r in 0..8 {
                    s[b * 8 + r] = scales[(g * 8 + r) * blocks + b];
                }
            }
            (w, s)
        })
        .collect();
    let run = |out: &mut [f32]| {
        for (g, (w, s)) in groups.iter().enumerate() {
            for t0 in (0..tokens).step_by(4) {
                let a = [&acts[t0], &acts[t0 + 1], &acts[t0 + 2], &acts[t0 + 3]];
                let mut o = [0f32; 32];
                // SAFETY: AVX2 and FMA detected above; every index is inside its buffer.
                unsafe { tile_8x4(w, s, &a, cols, &mut o) };
                for t in 0..4 {
                    out[(t0 + t) * rows + g * 8..(t0 + t) * rows + g * 8 + 8]
                        .copy_from_slice(&o[t * 8..t * 8 + 8]);
                }
            }
        }
    };
    // Correctness against a scalar reference in f64.
    let mut out = vec![0f32; tokens * rows];
    run(&mut out);
    let mut worst = 0f64;
    for t in 0..tokens {
        for r in 0..rows {
            let mut want = 0f64;
            for b in 0..blocks {
                let mut i = 0i64;
                for k in b * 32..b * 32 + 32 {
                    i += (codes[r * cols + k] as i64 - 8) * acts[t].q[k] as i64;
                }
                want += i as f64 * scales[r * blocks + b] as f64 * acts[t].d[b] as f64;
            }
            let got = out[t * rows + r] as f64;
            worst = worst.max((got - want).abs() / want.abs().max(1e-3));
        }
    }
    assert!(
        worst < 1e-3,
        "prototype differs from the reference: {worst:e}"
    );
    println!("prototype matches the scalar reference (worst relative error {worst:.1e})");

    // Today's tiles on the same shape (int4-g32 and -g64, int8 activations).
    let x: Vec<f32> = (0..tokens * cols)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let formats = [32, 64].map(|group| {
        let mut m = random_matrix(
            rows,
            cols,
            WeightFormat::I4 {
                group,
                scale: ScaleType::F16,
            },
            7,
        );
        m.int8_act = true;
        (group, m)
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let macs = (rows * cols * tokens) as f64;
    let best = |f: &mut dyn FnMut()| macs / best_cpu_seconds(5, f) / 1e9;
    println!("{rows} rows × {cols} columns × {tokens} tokens, one thread, CPU time, GMAC/s:");
    for round in 1..=rounds {
        let mut line = format!("round {round}:");
        let p = best(&mut || run(&mut out));
        line.push_str(&format!("  interleaved 8×4 {p:6.1}"));
        for (group, m) in &formats {
            let mut o = vec![0f32; tokens * rows];
            let t = pool.install(|| best(&mut || m.matmul(&x, tokens, &mut o)));
            line.push_str(&format!("  today int4-g{group} {t:6.1}"));
        }
        println!("{line}");
    }
}

/// Decode's matvec on the interleaved layout against today's row kernel, both streaming a
/// matrix far larger than the caches: GB/s of weights and scales, one thread, CPU time.
/// The first `check` rows are compared with an f64 reference; the rest repeat them.
#[cfg(target_arch = "x86_64")]
fn decode(
    check: usize,
    cols: usize,
    codes: &[u8],
    scales: &[f32],
    act: &proto::Act,
    rounds: usize,
) {
    use colibri_engine::bench::{best_cpu_seconds, random_matrix};
    use colibri_engine::tensor::{ScaleType, WeightFormat};
    let blocks = cols / 32;
    let group_bytes = 4 * cols + 16 * blocks;
    let groups = (256usize << 20) / group_bytes;
    let mut w = vec![0u8; groups * group_bytes];
    for g in 0..groups {
        let c = g % (check / 8);
        let dst = &mut w[g * group_bytes..(g + 1) * group_bytes];
        dst[..4 * cols].copy_from_slice(&proto::interleave(
            &codes[c * 8 * cols..(c + 1) * 8 * cols],
            cols,
        ));
        for b in 0..blocks {
            for r in 0..8 {
                let h = half::f16::from_f32(scales[(c * 8 + r) * blocks + b]).to_bits();
                dst[4 * cols + (b * 8 + r) * 2..4 * cols + (b * 8 + r) * 2 + 2]
                    .copy_from_slice(&h.to_le_bytes());
            }
        }
    }
    let mut out = vec![0f32; groups * 8];
    let at = |g: usize| {
        let p = w.as_ptr().wrapping_add(g * group_bytes);
        (p, p.wrapping_add(4 * cols) as *const u16)
    };
    let store = |out: &mut [f32], g: usize, v: std::arch::x86_64::__m256| {
        // SAFETY: 8 floats into the 8 of group g.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(out[g * 8..g * 8 + 8].as_mut_ptr(), v) };
    };
    let run = |out: &mut [f32]| {
        for g in 0..groups {
            let (p, s) = at(g);
            // SAFETY: AVX2, FMA and F16C detected; group g's bytes are inside `w`.
            let [v] = unsafe { proto::tile_8x1::<1>([p], [s], act, cols) };
            store(out, g, v);
        }
    };
    // Two groups at a time: two streams.
    let run2 = |out: &mut [f32]| {
        for g in (0..groups / 2 * 2).step_by(2) {
            let ((p0, s0), (p1, s1)) = (at(g), at(g + 1));
            // SAFETY: as in `run`.
            let [v0, v1] = unsafe { proto::tile_8x1::<2>([p0, p1], [s0, s1], act, cols) };
            store(out, g, v0);
            store(out, g + 1, v1);
        }
    };
    run(&mut out);
    let mut worst = 0f64;
    for r in 0..check.min(groups * 8) {
        let mut want = 0f64;
        for b in 0..blocks {
            let mut i = 0i64;
            for k in b * 32..b * 32 + 32 {
                i += (codes[r * cols + k] as i64 - 8) * act.q[k] as i64;
            }
            let s = half::f16::from_f32(scales[r * blocks + b]).to_f32();
            want += i as f64 * s as f64 * act.d[b] as f64;
        }
        worst = worst.max((out[r] as f64 - want).abs() / want.abs().max(1e-3));
    }
    assert!(
        worst < 1e-3,
        "decode prototype differs from the reference: {worst:e}"
    );
    let mut out2 = vec![0f32; groups * 8];
    run2(&mut out2);
    let both = groups / 2 * 2 * 8;
    assert_eq!(out[..both], out2[..both], "two streams differ from one");
    let mut m = random_matrix(
        groups * 8,
        cols,
        WeightFormat::I4 {
            group: 32,
            scale: ScaleType::F16,
        },
        7,
    );
    m.int8_act = true;
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    println!(
        "decode, {} rows × {cols} columns, {} MiB interleaved / {} MiB today, one thread, CPU time; matches the reference ({worst:.1e}):",
        groups * 8,
        w.len() >> 20,
        m.size_bytes() >> 20
    );
    let best = |f: &mut dyn FnMut()| best_cpu_seconds(5, f);
    for round in 1..=rounds {
        let p = w.len() as f64 / best(&mut || run(&mut out)) / 1e9;
        let p2 = w.len() as f64 / best(&mut || run2(&mut out)) / 1e9;
        let mut o = vec![0f32; groups * 8];
        let t =
            m.size_bytes() as f64 / pool.install(|| best(&mut || m.matmul(&x, 1, &mut o))) / 1e9;
        println!(
            "round {round}:  interleaved 8×1 {p:6.1} GB/s  2 × (8×1) {p2:6.1} GB/s  today int4-g32 {t:6.1} GB/s"
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    println!("x86-64 only");
}
