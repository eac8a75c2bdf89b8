//! How the forward pass runs its matrix products: grouped, so a layer forks its threads a few
//! times instead of once per matrix.
//!
//! - [`products`]: several matrices over the same input rows (q/k/v, MLA's q_a + kv_a) in one
//!   parallel region, the input prepared (permuted, quantized to int8) once per format.
//! - [`gated`]: `silu(gate·x) ⊙ (up·x)` for many MLPs at once (every routed expert of a step
//!   plus the shared one); a task computes the same rows of gate and up and applies SiLU in
//!   place, so the two never exist as full vectors.
//! - [`down_accumulate`]: the down projections of those MLPs with the routing weights'
//!   sum built in: a task owns a block of output columns and adds every expert's
//!   contribution to it, in expert order.
//!
//! Every dot product goes through [`Matrix::rows_block`], the one kernel entry point, so
//! a (row, input) pair gives the same bits whatever the batch, the grouping or the split
//! between threads; the weighted sum adds `w · y` in the same order as a per-expert
//! `axpy` (what the streamed-expert path does), so both give identical outputs.
//! Task buffers are per-thread scratch reused across calls, not per-call allocations.

use crate::kernels::Act;
use crate::tensor::Matrix;
use rayon::prelude::*;
use std::cell::RefCell;

/// Weight rows per task: a task's weights (16–256 KiB) stay in L2 while every input row
/// passes over them; small enough that a decode matrix gives each thread many tasks.
fn rows_per_task(n: usize) -> usize {
    if n == 1 {
        64
    } else {
        16
    }
}

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

/// A mutable float buffer that tasks of one parallel region write at disjoint indices.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: every user writes disjoint elements from different tasks (stated at each use) and
// the buffer outlives the parallel region that uses it.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    fn new(s: &mut [f32]) -> Out {
        Out {
            ptr: s.as_mut_ptr(),
            len: s.len(),
        }
    }
    /// # Safety
    /// No other task touches index `i` during the region.
    // A shared handle to a buffer that tasks write disjoint parts of: `&self` in, `&mut` out
    // is the point (rayon tasks share the handle), and the caller's contract makes it sound.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn at(&self, i: usize) -> &mut f32 {
        assert!(i < self.len);
        &mut *self.ptr.add(i)
    }
    /// # Safety
    /// No other task touches `start..start + len` during the region.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), len)
    }
}

/// The kernel entry points the forward pass uses, on top of `kernels::dot_act`.
impl Matrix {
    /// Prepares `n` activation rows for this matrix's kernels (in parallel when `n > 1`).
    /// Matrices of the same format and `int8_act` accept each other's prepared rows, so a
    /// layer prepares its input once for all of them.
    pub fn prepare_rows(&self, x: &[f32], n: usize) -> Vec<Act> {
        let c = self.cols;
        if n > 1 {
            (0..n)
                .into_par_iter()
                .map(|i| {
                    crate::kernels::prepare(self.format, &x[i * c..(i + 1) * c], self.int8_act)
                })
                .collect()
        } else {
            vec![crate::kernels::prepare(self.format, &x[..c], self.int8_act)]
        }
    }

    /// Whether rows prepared for `self` serve `other` too.
    pub fn same_activations(&self, other: &Matrix) -> bool {
        self.format == other.format && self.int8_act == other.int8_act && self.cols == other.cols
    }

    /// Weight rows `r0..r1` against every prepared row of `acts`, written transposed:
    /// `out_t[(r - r0) * acts.len() + i] = dot(row r, acts[i])`: the same kernel call per
    /// (row, input) pair as [`Matrix::matmul`], so the same bits whatever else is in the
    /// batch and however the rows are split between threads.
    pub fn rows_block(&self, acts: &[&Act], r0: usize, r1: usize, out_t: &mut [f32]) {
        let n = acts.len();
        debug_assert!(r0 <= r1 && r1 <= self.rows);
        debug_assert_eq!(out_t.len(), (r1 - r0) * n);
        let (rb, sb) = (
            self.format.row_bytes(self.cols),
            self.format.scale_row_bytes(self.cols),
        );
        let data = self.data.bytes();
        let scales = self.scales.as_ref().map_or(&[][..], |s| s.bytes());
        for (i, act) in acts.iter().enumerate() {
            for r in r0..r1 {
                out_t[(r - r0) * n + i] = crate::kernels::dot_act(
                    self.format,
                    &data[r * rb..(r + 1) * rb],
                    &scales[r * sb..(r + 1) * sb],
                    act,
                );
            }
        }
    }
}

/// Prepared input rows for each distinct activation format among `mats`: returns, per
/// matrix, the index of its rows in the returned list.
pub(crate) fn prepare_shared(mats: &[&Matrix], x: &[f32], n: usize) -> (Vec<Vec<Act>>, Vec<usize>) {
    let mut reps: Vec<&Matrix> = Vec::new();
    let mut which = Vec::with_capacity(mats.len());
    for m in mats {
        match reps.iter().position(|r| r.same_activations(m)) {
            Some(i) => which.push(i),
            None => {
                which.push(reps.len());
                reps.push(m);
            }
        }
    }
    let acts = reps.iter().map(|m| m.prepare_rows(x, n)).collect();
    (acts, which)
}

/// `outs[j] = x · mats[j]ᵀ` (`n × mats[j].rows` each) for `n` input rows `x`, in one
/// parallel region.
pub fn products(x: &[f32], n: usize, mats: &[&Matrix], outs: &mut [&mut [f32]]) {
    assert_eq!(mats.len(), outs.len());
    if n == 0 {
        return;
    }
    let (acts, which) = prepare_shared(mats, x, n);
    let acts: Vec<Vec<&Act>> = acts.iter().map(|a| a.iter().collect()).collect();
    let per = rows_per_task(n);
    let mut tasks = Vec::new();
    let mut dst = Vec::with_capacity(mats.len());
    for (j, (m, o)) in mats.iter().zip(outs.iter_mut()).enumerate() {
        assert_eq!(o.len(), n * m.rows, "output of product {j}");
        dst.push(Out::new(o));
        tasks.extend(
            (0..m.rows)
                .step_by(per)
                .map(|r0| (j, r0, (r0 + per).min(m.rows))),
        );
    }
    tasks.par_iter().for_each(|&(j, r0, r1)| {
        let (m, a) = (mats[j], &acts[which[j]][..]);
        if n == 1 {
            // SAFETY: tasks of one matrix own disjoint row ranges.
            let o = unsafe { dst[j].slice(r0, r1 - r0) };
            m.rows_block(a, r0, r1, o);
            return;
        }
        with_scratch((r1 - r0) * n, |t| {
            m.rows_block(a, r0, r1, t);
            for r in r0..r1 {
                for i in 0..n {
                    // SAFETY: as above; element (i, r) belongs to the task owning row r.
                    unsafe { *dst[j].at(i * m.rows + r) = t[(r - r0) * n + i] };
                }
            }
        });
    });
}

/// One gated MLP's first half over the prepared rows `acts` (prepared for `gate`, which
/// shares them with `up`): `out` (`acts.len() × gate.rows`) = `silu(gate·x) ⊙ (up·x)`.
pub struct Gated<'a> {
    pub gate: &'a Matrix,
    pub up: &'a Matrix,
    pub acts: Vec<&'a Act>,
    /// `acts` prepared for `up`: the same rows as `acts` when `up` shares `gate`'s format
    /// (the usual case), separate ones when a container quantizes them differently.
    pub up_acts: Vec<&'a Act>,
    pub out: &'a mut [f32],
}

/// Runs every [`Gated`] job in one parallel region, tasks over (job, block of rows).
pub fn gated(jobs: &mut [Gated<'_>]) {
    let mut tasks = Vec::new();
    let mut dst = Vec::with_capacity(jobs.len());
    for (j, g) in jobs.iter_mut().enumerate() {
        let n = g.acts.len();
        assert!(g.gate.rows == g.up.rows && g.up_acts.len() == n);
        assert_eq!(g.out.len(), n * g.gate.rows);
        dst.push(Out::new(g.out));
        let per = rows_per_task(n);
        if n > 0 {
            tasks.extend(
                (0..g.gate.rows)
                    .step_by(per)
                    .map(|r0| (j, r0, (r0 + per).min(g.gate.rows))),
            );
        }
    }
    let jobs = &*jobs;
    tasks.par_iter().for_each(|&(j, r0, r1)| {
        let g = &jobs[j];
        let (n, inter) = (g.acts.len(), g.gate.rows);
        let len = (r1 - r0) * n;
        with_scratch(2 * len, |s| {
            let (gs, us) = s.split_at_mut(len);
            g.gate.rows_block(&g.acts, r0, r1, gs);
            g.up.rows_block(&g.up_acts, r0, r1, us);
            super::simd::silu_mul(gs, us);
            if n == 1 {
                // SAFETY: tasks of one job own disjoint row ranges.
                unsafe { dst[j].slice(r0, r1 - r0) }.copy_from_slice(gs);
                return;
            }
            for r in r0..r1 {
                for i in 0..n {
                    // SAFETY: element (i, r) belongs to the task owning row r of job j.
                    unsafe { *dst[j].at(i * inter + r) = gs[(r - r0) * n + i] };
                }
            }
        });
    });
}

/// One MLP's down projection in a weighted sum: `acts[k]` (prepared for `down`) is the
/// gated vector of output row `rows[k].0`, which receives `rows[k].1 · down·acts[k]`.
pub struct Down<'a> {
    pub down: &'a Matrix,
    pub acts: Vec<&'a Act>,
    pub rows: &'a [(usize, f32)],
}

/// `out[row] += w · down·h` for every term and row, terms added in the order given, in one
/// parallel region over blocks of output columns. `out` is `n × width`, `width` = every
/// term's `down.rows`.
pub fn down_accumulate(terms: &[Down<'_>], out: &mut [f32], width: usize) {
    for t in terms {
        assert_eq!(t.down.rows, width);
        assert_eq!(t.acts.len(), t.rows.len());
    }
    let n_max = terms.iter().map(|t| t.rows.len()).max().unwrap_or(0);
    if n_max == 0 {
        return;
    }
    let per = rows_per_task(n_max);
    let dst = Out::new(out);
    let blocks: Vec<usize> = (0..width).step_by(per).collect();
    blocks.par_iter().for_each(|&r0| {
        let r1 = (r0 + per).min(width);
        for t in terms {
            let n = t.rows.len();
            with_scratch((r1 - r0) * n, |y| {
                t.down.rows_block(&t.acts, r0, r1, y);
                for (k, &(row, w)) in t.rows.iter().enumerate() {
                    for r in r0..r1 {
                        // SAFETY: columns r0..r1 of every row belong to this task.
                        let o = unsafe { dst.at(row * width + r) };
                        *o += w * y[(r - r0) * n + k];
                    }
                }
            });
        }
    });
}

/// Prepares, per job, `x_j` (`n_j` rows) for `m_j`, in one parallel region over all rows
/// when there is enough work to pay for it.
pub fn prepare_many(jobs: &[(&Matrix, &[f32], usize)]) -> Vec<Vec<Act>> {
    let elems: usize = jobs.iter().map(|(m, _, n)| m.cols * n).sum();
    let one = |&(j, i): &(usize, usize)| -> Act {
        let (m, x, _) = jobs[j];
        crate::kernels::prepare(m.format, &x[i * m.cols..(i + 1) * m.cols], m.int8_act)
    };
    let pairs: Vec<(usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(j, &(_, _, n))| (0..n).map(move |i| (j, i)))
        .collect();
    let flat: Vec<Act> = if elems < 1 << 15 {
        pairs.iter().map(one).collect()
    } else {
        pairs.par_iter().map(one).collect()
    };
    let mut it = flat.into_iter();
    jobs.iter()
        .map(|&(_, _, n)| it.by_ref().take(n).collect())
        .collect()
}
