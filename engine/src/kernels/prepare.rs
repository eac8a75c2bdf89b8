//! How activations are prepared: one row for a format ([`prepare`]), and the forms of an
//! [`Input`] made on first use (thread-safe) and kept.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::input::{
    Act, ActRow, F32Panel, Input, Packing, Q8Act, Q8I4Panel, Q8Panel, Q8Row, Q8Rows,
};
#[cfg(target_arch = "x86_64")]
use super::isa::Level;
use super::isa::{bf16_act, level};
use super::policy::{q8_supported, tiled};
use super::{int5, lowbit, scalar};
use crate::format::{WeightFormat, QBLOCK};
use std::sync::{Arc, Mutex, OnceLock};

/// Quantizes `x` per 32-element block ([`quantize_row`]), with the int4 order if asked.
pub fn quantize_act(x: &[f32], with_int4_order: bool) -> Q8Act {
    let nb = x.len().div_ceil(QBLOCK);
    let mut a = Q8Act {
        q: vec![0; x.len()],
        d: vec![0.0; nb],
        qsum: vec![0; nb],
        ..Default::default()
    };
    quantize_row(x, &mut a.q, &mut a.d, &mut a.qsum);
    if with_int4_order {
        let pairs = x.len() / QBLOCK / 2;
        a.qp = vec![0; pairs * 64];
        a.d8 = vec![0.0; pairs * 8];
        a.corr8 = vec![0; pairs * 8];
        for p in 0..pairs {
            for k in 0..4 {
                a.d8[p * 8 + k] = a.d[2 * p];
                a.d8[p * 8 + 4 + k] = a.d[2 * p + 1];
            }
            a.corr8[p * 8] = 8 * a.qsum[2 * p];
            a.corr8[p * 8 + 4] = 8 * a.qsum[2 * p + 1];
            let out = &mut a.qp[p * 64..(p + 1) * 64];
            for (h, blk) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                let q = &a.q[blk * QBLOCK..(blk + 1) * QBLOCK];
                for k in 0..16 {
                    out[h * 16 + k] = q[2 * k];
                    out[32 + h * 16 + k] = q[2 * k + 1];
                }
            }
        }
    }
    a
}

/// Prepares one activation row for `format`. `int8` asks for quantized activations; it is
/// honoured only where [`q8_supported`].
pub fn prepare(format: WeightFormat, x: &[f32], int8: bool) -> Act {
    let format = format.row_major();
    let cols = x.len();
    let full = cols / QBLOCK;
    let mut act = Act {
        x: x.to_vec(),
        ..Default::default()
    };
    if int8 && q8_supported(format, cols) {
        let mut q = quantize_act(x, matches!(format, WeightFormat::I4 { .. }));
        if matches!(format, WeightFormat::I3G64 | WeightFormat::I2Plain) {
            lowbit::order_q8(format, &mut q);
        }
        if matches!(format, WeightFormat::I5 { .. }) {
            int5::order_q8(&mut q);
        }
        act.q8 = Some(q);
        return act;
    }
    if matches!(
        format,
        WeightFormat::I4 { .. }
            | WeightFormat::I2 { .. }
            | WeightFormat::I3G64
            | WeightFormat::I2Plain
    ) {
        act.bsum = (0..full)
            .map(|b| x[b * QBLOCK..(b + 1) * QBLOCK].iter().sum())
            .collect();
    }
    if matches!(format, WeightFormat::I4 { .. }) {
        act.xp = vec![0.0; full * QBLOCK];
        for b in 0..full {
            let src = &x[b * QBLOCK..(b + 1) * QBLOCK];
            let dst = &mut act.xp[b * QBLOCK..(b + 1) * QBLOCK];
            for half in 0..2 {
                for k in 0..8 {
                    dst[half * 16 + k] = src[half * 16 + 2 * k];
                    dst[half * 16 + 8 + k] = src[half * 16 + 2 * k + 1];
                }
            }
        }
    }
    act
}

impl<'a> Input<'a> {
    /// `n` rows of `x.len() / n` activations.
    pub fn new(x: &'a [f32], n: usize) -> Input<'a> {
        Input::with_cols(x, n, x.len().checked_div(n).unwrap_or(0))
    }

    /// `n` rows of `cols` activations (`n` may be 0).
    pub fn with_cols(x: &'a [f32], n: usize, cols: usize) -> Input<'a> {
        assert_eq!(
            x.len(),
            n * cols,
            "activations: {} values are not {n} rows of {cols}",
            x.len()
        );
        Input {
            x,
            n,
            cols,
            q8: OnceLock::new(),
            q8_panel: OnceLock::new(),
            q8_i4: OnceLock::new(),
            x_panel: OnceLock::new(),
            x_i4: OnceLock::new(),
            x_bf16: OnceLock::new(),
            per_row: Mutex::new(Vec::new()),
        }
    }

    /// Every row prepared for `format`'s per-row kernels (made on first use, then shared by
    /// every task that reads this input).
    pub fn acts(&self, format: WeightFormat, int8: bool) -> Arc<[Act]> {
        // Interleaved int4 takes the activations of int4 (its rows are int4 rows).
        let format = format.row_major();
        let key = (format, int8);
        let mut made = self.per_row.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, a)) = made.iter().find(|(k, _)| *k == key) {
            return a.clone();
        }
        let a: Arc<[Act]> = (0..self.n)
            .map(|t| prepare(format, self.row(t), int8))
            .collect();
        made.push((key, a.clone()));
        a
    }

    /// Row `t`, f32.
    #[inline]
    pub fn row(&self, t: usize) -> &'a [f32] {
        &self.x[t * self.cols..(t + 1) * self.cols]
    }

    /// Blocks per row (the last may be partial).
    #[inline]
    pub fn blocks(&self) -> usize {
        self.cols.div_ceil(QBLOCK)
    }

    /// The rows quantized to int8 per block (computed on first use).
    pub fn q8(&self) -> &Q8Rows {
        self.q8.get_or_init(|| {
            let (cols, nb) = (self.cols, self.blocks());
            let mut r = Q8Rows {
                q: vec![0; self.n * cols],
                d: vec![0.0; self.n * nb],
                qsum: vec![0; self.n * nb],
            };
            let work = |t: usize, q: &mut [i8], d: &mut [f32], s: &mut [i32]| {
                quantize_row(self.row(t), q, d, s)
            };
            if self.n * cols >= 1 << 16 {
                use rayon::prelude::*;
                r.q.par_chunks_mut(cols.max(1))
                    .zip(r.d.par_chunks_mut(nb.max(1)))
                    .zip(r.qsum.par_chunks_mut(nb.max(1)))
                    .enumerate()
                    .for_each(|(t, ((q, d), s))| work(t, q, d, s));
            } else {
                for t in 0..self.n {
                    work(
                        t,
                        &mut r.q[t * cols..(t + 1) * cols],
                        &mut r.d[t * nb..(t + 1) * nb],
                        &mut r.qsum[t * nb..(t + 1) * nb],
                    );
                }
            }
            r
        })
    }

    /// How the block panels are packed.
    pub fn blocks_packing(&self) -> Packing {
        Packing {
            n: self.n,
            units: self.cols / QBLOCK,
        }
    }

    /// How the int4 pair panel is packed.
    pub fn pairs_packing(&self) -> Packing {
        Packing {
            n: self.n,
            units: self.cols / QBLOCK / 2,
        }
    }

    /// The quantized rows packed by block for the SIMD tiles (computed on first use).
    pub fn q8_panel(&self) -> &Q8Panel {
        self.q8_panel.get_or_init(|| {
            let a = self.q8();
            let (cols, nb) = (self.cols, self.blocks());
            let pk = self.blocks_packing();
            let len = pk.units * self.n;
            let mut r = Q8Panel {
                q: vec![0; len * QBLOCK],
                d: vec![0.0; len],
                qsum: vec![0; len],
            };
            for t in 0..self.n {
                for b in 0..pk.units {
                    let (i, src) = (pk.at(t, b), t * cols + b * QBLOCK);
                    r.q[i * QBLOCK..(i + 1) * QBLOCK].copy_from_slice(&a.q[src..src + QBLOCK]);
                    r.d[i] = a.d[t * nb + b];
                    r.qsum[i] = a.qsum[t * nb + b];
                }
            }
            r
        })
    }

    /// The quantized rows in int4 SIMD order (computed on first use).
    pub fn q8_i4(&self) -> &Q8I4Panel {
        self.q8_i4.get_or_init(|| {
            let a = self.q8();
            let (cols, nb) = (self.cols, self.blocks());
            let pk = self.pairs_packing();
            let len = pk.units * self.n;
            let mut r = Q8I4Panel {
                qp: vec![0; len * 64],
                d8: vec![0.0; len * 8],
                corr8: vec![0; len * 8],
                cp: vec![0.0; len],
            };
            for t in 0..self.n {
                let (q, d, qs) = (
                    &a.q[t * cols..(t + 1) * cols],
                    &a.d[t * nb..(t + 1) * nb],
                    &a.qsum[t * nb..(t + 1) * nb],
                );
                for p in 0..pk.units {
                    let i = pk.at(t, p);
                    for k in 0..4 {
                        r.d8[i * 8 + k] = d[2 * p];
                        r.d8[i * 8 + 4 + k] = d[2 * p + 1];
                    }
                    r.corr8[i * 8] = 8 * qs[2 * p];
                    r.corr8[i * 8 + 4] = 8 * qs[2 * p + 1];
                    r.cp[t * pk.units + p] = (8 * qs[2 * p]) as f32 * d[2 * p]
                        + (8 * qs[2 * p + 1]) as f32 * d[2 * p + 1];
                    let out = &mut r.qp[i * 64..(i + 1) * 64];
                    for (h, blk) in [2 * p, 2 * p + 1].into_iter().enumerate() {
                        let qb = &q[blk * QBLOCK..(blk + 1) * QBLOCK];
                        for k in 0..16 {
                            out[h * 16 + k] = qb[2 * k];
                            out[32 + h * 16 + k] = qb[2 * k + 1];
                        }
                    }
                }
            }
            r
        })
    }

    /// The f32 rows packed by block, natural order (computed on first use).
    /// The rows rounded to bf16 (to nearest even), each padded with zeros to a multiple of
    /// 16 values, and that padded length: what bf16 matrices read under [`bf16_act`].
    pub fn x_bf16(&self) -> (&[u16], usize) {
        let (v, row) = self.x_bf16.get_or_init(|| {
            let row = self.cols.div_ceil(16) * 16;
            let mut v = vec![0u16; self.n * row];
            for t in 0..self.n {
                for (d, &x) in v[t * row..].iter_mut().zip(self.row(t)) {
                    *d = half::bf16::from_f32(x).to_bits();
                }
            }
            (v, row)
        });
        (v, *row)
    }

    pub fn x_panel(&self) -> &F32Panel {
        self.x_panel.get_or_init(|| self.pack_f32(false))
    }

    /// The f32 rows packed by block, int4 order (computed on first use).
    pub fn x_i4(&self) -> &F32Panel {
        self.x_i4.get_or_init(|| self.pack_f32(true))
    }

    fn pack_f32(&self, int4_order: bool) -> F32Panel {
        let pk = self.blocks_packing();
        let mut v = vec![0f32; pk.units * self.n * QBLOCK];
        for t in 0..self.n {
            let x = self.row(t);
            for b in 0..pk.units {
                let src = &x[b * QBLOCK..(b + 1) * QBLOCK];
                let i = pk.at(t, b);
                let dst = &mut v[i * QBLOCK..(i + 1) * QBLOCK];
                if int4_order {
                    for half in 0..2 {
                        for k in 0..8 {
                            dst[half * 16 + k] = src[half * 16 + 2 * k];
                            dst[half * 16 + 8 + k] = src[half * 16 + 2 * k + 1];
                        }
                    }
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
        F32Panel { x: v }
    }

    /// Makes the forms `format` (with or without int8 activations) needs, so the parallel
    /// kernels find them ready.
    pub fn prepare_for(&self, format: WeightFormat, int8: bool) {
        let format = format.row_major();
        if !level().has_avx2() || !tiled(format, self.cols) {
            self.acts(format, int8);
            return;
        }
        if int8 {
            self.q8();
        }
        match (int8, matches!(format, WeightFormat::I4 { .. })) {
            (true, true) => {
                self.q8_i4();
            }
            (true, false) => {
                self.q8_panel();
            }
            (false, true) => {
                self.x_i4();
            }
            (false, false) if format == WeightFormat::BF16 && bf16_act() => {
                self.x_bf16();
            }
            (false, false) => {
                self.x_panel();
            }
        }
    }

    /// Row `t` as the reference kernels take it.
    pub fn act(&self, t: usize, int8: bool) -> ActRow<'_> {
        let nb = self.blocks();
        ActRow {
            x: self.row(t),
            q8: int8.then(|| {
                let a = self.q8();
                Q8Row {
                    q: &a.q[t * self.cols..(t + 1) * self.cols],
                    d: &a.d[t * nb..(t + 1) * nb],
                    qsum: &a.qsum[t * nb..(t + 1) * nb],
                }
            }),
        }
    }
}

/// Quantizes one row per 32-element block, symmetric, round half to even (so the SIMD path
/// gives the same bytes): `q`, `d` and `qsum` as in [`Q8Row`].
pub fn quantize_row(x: &[f32], q: &mut [i8], d: &mut [f32], qsum: &mut [i32]) {
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected.
        Level::Avx2 | Level::Avx512Vnni => unsafe { avx2::quantize_row(x, q, d, qsum) },
        _ => scalar::quantize_row(x, q, d, qsum),
    }
}
