//! The product driver: `out[t][r] = dot(weight row r, activation row t)` for one matrix or
//! several matrices that read the same input (q/k/v, gate/up), split into row ranges that
//! run as one parallel region.

use super::policy::tiled;
use super::{level, q8_supported, team, Input, Level, Weights};
use crate::format::WeightFormat;

/// `out = input · wᵀ`: `out` is `input.n × w.rows`, row-major.
pub fn matmul(w: &Weights, input: &Input, out: &mut [f32]) {
    matmul_many(&mut [(*w, out)], input)
}

/// Several products over the same input, in one parallel region (one fork and join for all
/// of them).
pub fn matmul_many(jobs: &mut [(Weights, &mut [f32])], input: &Input) {
    let mut each: Vec<(Weights, &Input, &mut [f32])> = jobs
        .iter_mut()
        .map(|(w, out)| (*w, input, &mut **out))
        .collect();
    matmul_each(&mut each);
}

/// Products that each read their own input (every routed expert of a step over the rows
/// routed to it), in one parallel region: `out` of each job is `input.n × w.rows`.
pub fn matmul_each(jobs: &mut [(Weights, &Input, &mut [f32])]) {
    for (w, input, out) in jobs.iter_mut() {
        let n = input.n;
        assert!(
            n == 0 || w.cols == input.cols,
            "matmul: input width {} is not the matrix's {}",
            input.cols,
            w.cols
        );
        assert_eq!(out.len(), n * w.rows, "matmul: output size");
        assert_eq!(w.data.len(), w.rows * w.format.row_bytes(w.cols));
        assert_eq!(w.scales.len(), w.rows * w.format.scale_row_bytes(w.cols));
        w.int8 = w.int8 && q8_supported(w.format, w.cols);
    }
    prepare_inputs(jobs);
    // A job's work: its bytes, read once, applied to each of its rows.
    let work = |w: &Weights, n: usize| (w.bytes() + 1) * n;
    let total: usize = jobs.iter().map(|(w, i, _)| work(w, i.n)).sum();
    if total == 0 {
        return;
    }
    let threads = team::threads();
    // A few tasks per thread (the cores are shared with other work, so smaller pieces
    // balance better), none under 16 rows (one cache line of outputs), nothing parallel for
    // products too small to pay for waking threads.
    let target = if threads == 1 || total < (96 << 10) {
        1
    } else {
        threads * 4
    };
    let mut tasks: Vec<(usize, usize, usize)> = Vec::with_capacity(target + jobs.len());
    for (j, (w, input, _)) in jobs.iter().enumerate() {
        if w.rows == 0 || input.n == 0 {
            continue;
        }
        let k = (target * work(w, input.n)).div_ceil(total).max(1);
        let chunk = w.rows.div_ceil(k).next_multiple_of(16);
        let mut r = 0;
        while r < w.rows {
            let e = (r + chunk).min(w.rows);
            tasks.push((j, r, e));
            r = e;
        }
    }
    // Each task writes its own rows of every token, and the region ends before the borrow
    // of the outputs does.
    let outs: Vec<team::SharedMut<f32>> = jobs
        .iter_mut()
        .map(|(_, _, o)| team::SharedMut::new(o))
        .collect();
    let jobs: &[(Weights, &Input, &mut [f32])] = jobs;
    team::par_for(tasks.len(), &|k| {
        let (j, r0, r1) = tasks[k];
        let (w, input, _) = &jobs[j];
        // SAFETY: task `k` alone writes rows r0..r1 of output j, which is n × rows.
        unsafe { run_rows(w, input, r0..r1, outs[j].ptr(), w.rows) }
    });
}

/// Makes the forms each job's input needs before the parallel region (so its tasks find
/// them ready), the distinct inputs side by side when there are many of them (a prefill's
/// experts each read their own rows).
fn prepare_inputs(jobs: &[(Weights, &Input, &mut [f32])]) {
    let mut distinct: Vec<(&Input, Vec<(WeightFormat, bool)>)> = Vec::new();
    for (w, input, _) in jobs {
        if input.n == 0 {
            continue;
        }
        let form = (w.format, w.int8);
        match distinct.iter_mut().find(|(i, _)| std::ptr::eq(*i, *input)) {
            Some((_, forms)) if !forms.contains(&form) => forms.push(form),
            Some(_) => {}
            None => distinct.push((input, vec![form])),
        }
    }
    let elems: usize = distinct.iter().map(|(i, _)| i.n * i.cols).sum();
    let one = |k: usize| {
        let (input, forms) = &distinct[k];
        for &(format, int8) in forms {
            input.prepare_for(format, int8);
        }
    };
    if distinct.len() > 1 && elems >= 1 << 15 {
        team::par_for(distinct.len(), &one);
    } else {
        (0..distinct.len()).for_each(one);
    }
}

/// `out[t * ld + r]` for `r` in `rows` and every token, on the level's kernels.
///
/// # Safety
/// `out` must be valid for those writes and no one else may write them meanwhile.
unsafe fn run_rows(
    w: &Weights,
    input: &Input,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    if w.format.interleaved() {
        return run_rows_interleaved(w, input, rows, out, ld);
    }
    match level() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the AVX2 levels are only chosen when avx2, fma and f16c are detected (and
        // Avx512Vnni when avx512f/bw/vl/vnni are too); the input was prepared for this format
        // by `matmul_many`.
        l @ (Level::Avx2 | Level::Avx512Vnni) if tiled(w.format, w.cols) => {
            let vnni = l == Level::Avx512Vnni;
            if w.format == WeightFormat::BF16 && !w.int8 && super::bf16_act() {
                // bf16 activations on `vdpbf16ps` (opt-in, `COLIBRI_BF16_ACT=1`).
                return super::avx512_bf16::matmul_rows(w, input, rows, out, ld);
            }
            if w.rows8 && super::avx2_rows8::serves(w) {
                // int4-g32/g64 with int8 activations: 8 rows in the lanes, every token count.
                return super::avx2_rows8::matmul_rows(w, input, rows, out, ld, vnni);
            }
            super::avx2::matmul_rows(w, input, rows, out, ld, vnni)
        }
        _ => {
            // The per-row kernels, every row against each token prepared once for the
            // region (other levels, the colibri C engine's int3/int2 rows, int5, and groups
            // the tiles' scale windows cannot express). A row stays in L1 for all tokens:
            // the matrix is read once however many tokens there are.
            let acts = input.acts(w.format, w.int8);
            if matches!(w.format, WeightFormat::I5 { .. })
                && super::int5::matmul_rows(w, &acts, rows.clone(), out, ld)
            {
                return;
            }
            if matches!(w.format, WeightFormat::I4Ct { .. })
                && super::ct_int4::matmul_rows(w, &acts, rows.clone(), out, ld)
            {
                return;
            }
            for r in rows {
                let (row, srow) = (w.row(r), w.srow(r));
                for (t, a) in acts.iter().enumerate() {
                    *out.add(t * ld + r) = super::dot_act(w.format, row, srow, a);
                }
            }
        }
    }
}

/// [`run_rows`] for int4 with rows interleaved by 8 ([`crate::rows8`]): the 8-row kernels
/// read it as it lies; other levels, f32 activations, or those kernels turned off
/// (`COLIBRI_INT4_ROWS8=0`) take each row out as int4 for the per-row kernels, the same
/// products as on row-major int4, at their (slower) speed.
///
/// # Safety
/// As [`run_rows`].
unsafe fn run_rows_interleaved(
    w: &Weights,
    input: &Input,
    rows: std::ops::Range<usize>,
    out: *mut f32,
    ld: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if w.rows8 && super::avx2_rows8::serves(w) {
        if let l @ (Level::Avx2 | Level::Avx512Vnni) = level() {
            // SAFETY: as in `run_rows`; `serves` holds (int8 activations included) and the
            // input holds its int4-order panel (`prepare_for` of int4 with int8 activations).
            return super::avx2_rows8::matmul_rows(w, input, rows, out, ld, l == Level::Avx512Vnni);
        }
    }
    let f = w.format.row_major();
    let acts = input.acts(f, w.int8);
    let mut codes = vec![0u8; f.row_bytes(w.cols)];
    let mut scales = vec![0u8; f.scale_row_bytes(w.cols)];
    for r in rows {
        crate::format::rows8::gather_row(
            w.format,
            w.cols,
            w.data,
            w.scales,
            r,
            &mut codes,
            &mut scales,
        );
        for (t, a) in acts.iter().enumerate() {
            *out.add(t * ld + r) = super::dot_act(f, &codes, &scales, a);
        }
    }
}
