//! The streaming state every MoE block of one model shares: the expert store, and how a
//! block's routed experts are computed from the bytes it reads. Below the MoE block (which
//! calls [`Streaming::expert_outputs`]); [`super::stream`] builds it and installs it.
//!
//! The experts' `Matrix` templates built by the loader stay as they are; a streamed expert is
//! the same matrices re-pointed at the bytes the store read ([`rebind`]).

use super::plan::MemoryPlan;
use super::route::Route;
use super::store::{ExpertStore, StoreStats, Ticket};
use super::{ExpertBuf, Key};
use crate::arch::blocks::Mlp;
use crate::error::{Error, Result};
use crate::tensor::{Blob, Matrix};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Save the histogram every this many tokens (and when the model is dropped).
const AUTOSAVE_TOKENS: u64 = 256;

/// The streaming state shared by every MoE block of one model.
pub struct Streaming {
    pub store: ExpertStore,
    pub plan: MemoryPlan,
    /// Things to tell the user (a damaged history set aside, no direct I/O, ...).
    pub warnings: Vec<String>,
    pub hist_path: Option<PathBuf>,
    /// Reads of a layer's missing experts in flight at most (as many buffers as the
    /// prefetch staging slots the memory plan counts, and never fewer than the readers).
    pub(super) window: usize,
    /// The first MoE layer: its rows are counted as tokens.
    pub(super) first_layer: usize,
    pub(super) error: Mutex<Option<Error>>,
    pub(super) predictions: Mutex<HashMap<usize, Vec<usize>>>,
    pub(super) saved_at: AtomicU64,
    pub(super) idle_kv: AtomicU64,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.save_histogram();
    }
}

impl Streaming {
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Tells the store how many bytes the KV caches of every sequence on this model hold
    /// now; past half the plan's safety margin, they are taken from the expert cache
    /// ([`ExpertStore::lend`]), so the process stays within budget + resident part + margin
    /// however long the generation. Callers pass the total after each step.
    pub fn set_kv_bytes(&self, total: u64) {
        self.store.lend(total.saturating_sub(self.plan.margin / 2));
    }

    /// KV bytes of the sequences that stay in memory between steps without being stepped
    /// (a daemon's idle sessions); [`Model::forward`](crate::Model::forward) adds the
    /// stepped sequences' own and calls [`set_kv_bytes`](Self::set_kv_bytes).
    pub fn set_idle_kv_bytes(&self, bytes: u64) {
        self.idle_kv.store(bytes, Ordering::Relaxed);
    }

    /// Writes the usage histogram (when persisting).
    pub fn save_histogram(&self) -> Result<()> {
        match &self.hist_path {
            Some(p) => self.store.save_histogram(p),
            None => Ok(()),
        }
    }

    /// The first read error of a forward pass since the last call, if any. A forward pass
    /// that met one produced garbage and must be discarded.
    pub fn take_error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn record_prediction(&self, layer: usize, set: Vec<usize>) {
        self.predictions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(layer, set);
    }

    /// Scores the prediction made for `layer` (if any) against its routes.
    pub(crate) fn check_prediction(&self, layer: usize, routes: &[Route]) {
        let Some(pred) = self
            .predictions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&layer)
        else {
            return;
        };
        let mut actual: Vec<usize> = routes
            .iter()
            .flat_map(|r| r.experts.iter().copied())
            .collect();
        actual.sort_unstable();
        actual.dedup();
        let correct = actual
            .iter()
            .filter(|e| pred.binary_search(e).is_ok())
            .count();
        self.store
            .note_prediction(pred.len() as u64, correct as u64, actual.len() as u64);
    }

    /// The outputs of the experts of `layer` that rows are routed to (`by_expert[e]` lists
    /// `(row, weight)`), in ascending expert order like the resident path (the caller sums
    /// them in this order: the same bits as resident). Each expert is fetched once for all
    /// the step's rows. The step's misses are requested first (up to `window` at a time,
    /// topped up as they are consumed), so their reads are queued together and run while
    /// the experts already in the cache are computed; then the others, in the order they
    /// were asked for.
    pub fn expert_outputs(
        &self,
        layer: usize,
        templates: &[Mlp],
        by_expert: &[Vec<(usize, f32)>],
        h: &[f32],
        hidden: usize,
    ) -> Vec<(usize, Vec<f32>)> {
        if layer == self.first_layer && hidden > 0 {
            self.store.note_tokens((h.len() / hidden) as u64);
            self.autosave();
        }
        let (cached, missing): (Vec<usize>, Vec<usize>) = (0..by_expert.len())
            .filter(|&e| !by_expert[e].is_empty())
            .partition(|&e| self.store.contains(Key::new(layer, e)));
        let mut tickets: VecDeque<(usize, Result<Ticket>)> = VecDeque::new();
        let mut next = 0;
        let mut top_up = |tickets: &mut VecDeque<(usize, Result<Ticket>)>| {
            while next < missing.len() && tickets.len() < self.window {
                let e = missing[next];
                tickets.push_back((e, self.store.request(Key::new(layer, e))));
                next += 1;
            }
        };
        top_up(&mut tickets);
        let mut out = Vec::with_capacity(cached.len() + missing.len());
        for &e in &cached {
            let t = self.store.request(Key::new(layer, e));
            out.push((e, self.compute(&templates[e], &by_expert[e], h, hidden, t)));
        }
        while let Some((e, t)) = tickets.pop_front() {
            top_up(&mut tickets);
            out.push((e, self.compute(&templates[e], &by_expert[e], h, hidden, t)));
        }
        out.sort_unstable_by_key(|(e, _)| *e);
        out
    }

    /// One expert's output for its rows once its bytes are in (zeros and the error kept
    /// for [`take_error`] when they cannot be read).
    fn compute(
        &self,
        template: &Mlp,
        rows: &[(usize, f32)],
        h: &[f32],
        hidden: usize,
        ticket: Result<Ticket>,
    ) -> Vec<f32> {
        let mut x = Vec::with_capacity(rows.len() * hidden);
        for &(r, _) in rows {
            x.extend_from_slice(&h[r * hidden..(r + 1) * hidden]);
        }
        match ticket.and_then(|t| self.store.wait(t)) {
            Ok(buf) => rebind(template, &buf).forward(&x, rows.len()),
            Err(err) => {
                let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(err);
                vec![0f32; rows.len() * hidden]
            }
        }
    }

    fn autosave(&self) {
        let t = self.store.tokens();
        let last = self.saved_at.load(Ordering::Relaxed);
        if t >= last + AUTOSAVE_TOKENS
            && self
                .saved_at
                .compare_exchange(last, t, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // A failed save (read-only state folder) must not stop generation.
            let _ = self.save_histogram();
        }
    }
}

/// The expert's matrices pointing into `buf` (parts: each matrix's streamed blobs, gate, up,
/// down); scales held in RAM stay as they are.
fn rebind(t: &Mlp, buf: &Arc<ExpertBuf>) -> Mlp {
    let mut i = 0;
    let mut next = |b: &Blob| {
        let r = buf.parts[i].clone();
        i += 1;
        debug_assert_eq!(r.len(), b.bytes().len());
        Blob::Shared {
            owner: buf.clone(),
            start: r.start,
            end: r.end,
        }
    };
    let mut one = |m: &Matrix| {
        let data = next(&m.data);
        let scales = m.scales.as_ref().map(|s| match s {
            Blob::Owned(_) => s.clone(),
            _ => next(s),
        });
        // A matrix interleaved in RAM at load is read from its file in the file's layout.
        let format = match &m.data {
            Blob::Mapped { file, start, .. } if file.repacked_at(*start) => m.format.row_major(),
            _ => m.format,
        };
        Matrix {
            data,
            scales,
            format,
            ..m.clone()
        }
    };
    Mlp {
        gate: one(&t.gate),
        up: one(&t.up),
        down: one(&t.down),
        glu: t.glu.clone(),
    }
}
