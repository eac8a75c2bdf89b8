//! Where a forward pass spends its time, by phase (`coli bench --model` prints it).
//!
//! Off unless [`enable`]d: a span then costs one relaxed atomic load. On, each span reads the
//! clock twice; spans are taken on the thread that drives the forward pass (around the
//! parallel regions, not inside them), so the phases add up to wall time.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// q/k/v (or MLA's latent) projections, norms, RoPE, the cache append.
    AttnProj,
    /// Scores, softmax and the weighted sum over the KV cache.
    AttnCore,
    /// The attention's output projection.
    AttnOut,
    /// Router logits and top-k.
    Router,
    /// Routed and shared experts (and dense MLPs).
    Experts,
    /// Final norm and the vocabulary projection.
    LmHead,
}

pub const PHASES: [Phase; 6] = [
    Phase::AttnProj,
    Phase::AttnCore,
    Phase::AttnOut,
    Phase::Router,
    Phase::Experts,
    Phase::LmHead,
];

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::AttnProj => "attn-proj",
            Phase::AttnCore => "attn-core",
            Phase::AttnOut => "attn-out",
            Phase::Router => "router",
            Phase::Experts => "experts",
            Phase::LmHead => "lm_head",
        }
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Starts (or stops) accounting; the totals are kept until [`take`].
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Nanoseconds per phase since the last call, in [`PHASES`] order; resets them.
pub fn take() -> [u64; 6] {
    let mut out = [0; 6];
    for (o, n) in out.iter_mut().zip(&NANOS) {
        *o = n.swap(0, Ordering::Relaxed);
    }
    out
}

/// Counts the time until it is dropped to `phase`.
pub struct Span(Option<(Phase, Instant)>);

#[inline]
pub fn span(phase: Phase) -> Span {
    Span(ON.load(Ordering::Relaxed).then(|| (phase, Instant::now())))
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((p, t)) = self.0 {
            let i = PHASES.iter().position(|&q| q == p).unwrap_or(0);
            NANOS[i].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}
