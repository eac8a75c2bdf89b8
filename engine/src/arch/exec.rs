//! How the forward pass runs its matrix products: grouped, so a layer starts a few parallel
//! regions instead of one per matrix, and on the kernels' rows × tokens tiles
//! (`kernels::matmul_each`), so a prefill or a batched decode step reads each weight row
//! once for all the rows that use it.
//!
//! - [`products`]: several matrices over the same input rows (q/k/v, MLA's q_a + kv_a), the
//!   input prepared (permuted, quantized to int8) once.
//! - [`mlps`]: many gated MLPs at once (every routed expert of a step plus the shared one),
//!   each over its own rows: every gate and up in one region, `silu(gate) ⊙ up`, every down
//!   in a second region, then the routing weights' sum.
//!
//! The tiles compute each (row, input) pair the same way whatever else is in the batch, so a
//! sequence's result does not depend on its batch partners; the weighted sum adds `w · y`
//! per expert in expert order, as the streamed-expert path's `axpy` does, so both give
//! identical outputs.

use super::blocks::Mlp;
use super::simd::axpy;
use crate::kernels::{self, Input};
use crate::tensor::Matrix;
use rayon::prelude::*;
use std::cell::RefCell;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's scratch buffer of `len` floats (contents unspecified).
pub(crate) fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

/// `outs[j] = x · mats[j]ᵀ` (`n × mats[j].rows` each) for `n` input rows `x`, in one
/// parallel region over one prepared input.
pub fn products(x: &[f32], n: usize, mats: &[&Matrix], outs: &mut [&mut [f32]]) {
    if n == 0 || mats.is_empty() {
        return;
    }
    let input = Input::with_cols(x, n, mats[0].cols);
    Matrix::matmul_many(mats, &input, outs);
}

/// Element counts below which the glue between the two regions stays on the calling thread.
const PARALLEL_GLUE: usize = 1 << 16;

/// `out[row] += w · mlp(x[row])` for every `(mlp, [(row, w)])` term, terms added in the
/// order given: a MoE layer's routed experts and its shared one in two parallel regions
/// (every gate and up, then every down), each weight row read once for all the rows routed
/// to it. `x` and `out` are `n` rows of `hidden` floats.
pub fn mlps(terms: &[(&Mlp, &[(usize, f32)])], x: &[f32], n: usize, out: &mut [f32]) {
    if terms.is_empty() || n == 0 {
        return;
    }
    let hidden = terms[0].0.gate.cols;
    // A term's input rows: `x` itself when it takes every row in order (a dense MLP, the
    // shared expert, a streamed expert's gathered rows), else its rows gathered.
    let gathered: Vec<Option<Vec<f32>>> = terms
        .iter()
        .map(|(_, rows)| {
            let all = rows.len() == n && rows.iter().enumerate().all(|(i, &(r, _))| r == i);
            (!all).then(|| {
                let mut g = Vec::with_capacity(rows.len() * hidden);
                for &(r, _) in rows.iter() {
                    g.extend_from_slice(&x[r * hidden..(r + 1) * hidden]);
                }
                g
            })
        })
        .collect();
    let inputs: Vec<Input> = terms
        .iter()
        .zip(&gathered)
        .map(|((_, rows), g)| Input::with_cols(g.as_deref().unwrap_or(x), rows.len(), hidden))
        .collect();
    let zeros = |rows: usize, width: usize| vec![0f32; rows * width];
    let mut gates: Vec<Vec<f32>> = terms
        .iter()
        .map(|(m, rows)| zeros(rows.len(), m.gate.rows))
        .collect();
    let mut ups: Vec<Vec<f32>> = terms
        .iter()
        .map(|(m, rows)| zeros(rows.len(), m.up.rows))
        .collect();
    let mut jobs = Vec::with_capacity(2 * terms.len());
    for ((((m, _), input), g), u) in terms.iter().zip(&inputs).zip(&mut gates).zip(&mut ups) {
        jobs.push((m.gate.weights(), input, &mut g[..]));
        if m.glu.interleaved {
            // gate and up rows in one matrix (`Glu::interleaved`)
            assert_eq!(
                m.gate.rows,
                2 * m.down.cols,
                "interleaved gate/up of one MLP"
            );
            continue;
        }
        assert_eq!(m.gate.rows, m.up.rows, "gate and up of one MLP");
        jobs.push((m.up.weights(), input, &mut u[..]));
    }
    kernels::matmul_each(&mut jobs);
    drop(jobs);
    type Term<'a, 'b> = &'a (&'b Mlp, &'b [(usize, f32)]);
    let act = |((g, u), (m, rows)): ((&mut Vec<f32>, &Vec<f32>), Term)| {
        m.glu.activate(g, u, rows.len(), m.down.cols)
    };
    if gates.iter().map(Vec::len).sum::<usize>() >= PARALLEL_GLUE {
        gates.par_iter_mut().zip(&ups).zip(terms).for_each(act);
    } else {
        gates.iter_mut().zip(&ups).zip(terms).for_each(act);
    }
    let mids: Vec<Input> = terms
        .iter()
        .zip(&gates)
        .map(|((m, rows), h)| Input::with_cols(h, rows.len(), m.down.cols))
        .collect();
    let mut downs: Vec<Vec<f32>> = terms
        .iter()
        .map(|(m, rows)| zeros(rows.len(), m.down.rows))
        .collect();
    let mut jobs: Vec<_> = terms
        .iter()
        .zip(&mids)
        .zip(&mut downs)
        .map(|(((m, _), input), y)| (m.down.weights(), input, &mut y[..]))
        .collect();
    kernels::matmul_each(&mut jobs);
    drop(jobs);
    for ((m, _), y) in terms.iter().zip(&mut downs) {
        m.glu.add_down_bias(y);
    }
    let rows: Vec<&[(usize, f32)]> = terms.iter().map(|(_, r)| *r).collect();
    weighted_sum(&rows, &downs, out, terms[0].0.down.rows);
}

// A dense MLP is the one-term case of [`mlps`]: its forward lives here, beside the products
// it runs, so that the blocks (where `Mlp` is defined) never call up into this file.
impl Mlp {
    /// `n` rows of `hidden` floats in, `n` rows out.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let rows: Vec<(usize, f32)> = (0..n).map(|i| (i, 1.0)).collect();
        let mut out = vec![0f32; n * self.down.rows];
        mlps(&[(self, &rows)], x, n, &mut out);
        out
    }
}

/// `out[row] += w · ys[t][k]` for every term `t` and its `k`-th `(row, w)`, terms in order
/// (per output row in parallel when there is enough of it).
fn weighted_sum(terms: &[&[(usize, f32)]], ys: &[Vec<f32>], out: &mut [f32], width: usize) {
    let adds: usize = terms.iter().map(|r| r.len()).sum::<usize>() * width;
    if adds < PARALLEL_GLUE {
        for (rows, y) in terms.iter().zip(ys) {
            for (k, &(r, w)) in rows.iter().enumerate() {
                axpy(
                    &mut out[r * width..(r + 1) * width],
                    w,
                    &y[k * width..(k + 1) * width],
                );
            }
        }
        return;
    }
    // Each output row with its terms, in term order.
    let mut per_row: Vec<Vec<(usize, usize, f32)>> = vec![Vec::new(); out.len() / width];
    for (t, rows) in terms.iter().enumerate() {
        for (k, &(r, w)) in rows.iter().enumerate() {
            per_row[r].push((t, k, w));
        }
    }
    out.par_chunks_mut(width)
        .zip(&per_row)
        .for_each(|(o, adds)| {
            for &(t, k, w) in adds {
                axpy(o, w, &ys[t][k * width..(k + 1) * width]);
            }
        });
}
