//! How many prompt tokens a step may carry while other sessions are decoding.
//!
//! A step is one forward pass over every decoding row plus one prompt chunk, so a chunk's
//! cost is a pause in every running session's token stream. A fixed chunk cannot be right
//! everywhere: on a full-size MoE model a 64-token chunk costs 20× a decode step (its tokens
//! touch nearly every expert of every layer), on a tiny one nothing. The pacer measures
//! both from the steps it sees — a decode-only step's time, and what each prompt token adds
//! to a step — and sizes the chunk so that a step with a chunk takes at most `pace` times a
//! decode-only step (vLLM's chunked prefill caps tokens per step; capping time instead
//! adapts to the model, the batch and the expert cache's misses).

use std::time::Duration;

/// Weight of the newest measurement in the running averages: a few steps of history, so a
/// change of batch or a burst of expert misses is followed within a few steps.
const ALPHA: f64 = 0.3;

/// The chunk before anything has been measured alongside decoding rows: small, so the first
/// step cannot stall the sessions for long.
const FIRST_CHUNK: usize = 4;

/// Steps with a prompt chunk in a row before one without: a decode-only step measures what
/// the decoding rows cost now (they grow dearer as their caches lengthen during a long
/// prefill; without it that growth would be charged to the prompt's tokens).
const REFRESH: usize = 8;

#[derive(Clone, Debug)]
pub struct PrefillPacer {
    /// Most prompt tokens per step while others decode (`--prefill-chunk`).
    max: usize,
    /// A step with a chunk may take this many decode-only steps; 0 = always `max`.
    pace: f64,
    /// Running average of a decode-only step, seconds.
    decode_step: Option<f64>,
    /// Running average of what one prompt token adds to a decoding step, seconds.
    per_token: Option<f64>,
    /// Steps with a prompt chunk since the last decode-only one.
    mixed_in_a_row: usize,
}

impl PrefillPacer {
    pub fn new(max: usize, pace: f64) -> PrefillPacer {
        PrefillPacer {
            max: max.max(1),
            pace: if pace.is_finite() && pace > 1.0 {
                pace
            } else {
                0.0
            },
            decode_step: None,
            per_token: None,
            mixed_in_a_row: 0,
        }
    }

    /// Prompt tokens the next step may take while other rows decode; 0 now and then, for a
    /// decode-only step that measures the decoding rows again.
    pub fn chunk(&self) -> usize {
        if self.pace == 0.0 {
            return self.max;
        }
        if self.mixed_in_a_row >= REFRESH {
            return 0;
        }
        match (self.decode_step, self.per_token) {
            (Some(d), Some(c)) => {
                let room = (self.pace - 1.0) * d / c.max(1e-9);
                // (The epsilon keeps an exact fit from rounding down a token.)
                ((room + 1e-6).floor() as usize).clamp(1, self.max)
            }
            _ => FIRST_CHUNK.min(self.max),
        }
    }

    /// Tells the pacer how long a step took: `decoding` whether it had decode rows,
    /// `prompt_tokens` the prompt tokens it carried. Steps without decode rows (a prompt
    /// alone) say nothing about stalls and are ignored.
    pub fn record(&mut self, took: Duration, decoding: bool, prompt_tokens: usize) {
        if !decoding {
            return;
        }
        let t = took.as_secs_f64();
        let avg = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + ALPHA * (new - o)));
        if prompt_tokens == 0 {
            self.decode_step = avg(self.decode_step, t);
            self.mixed_in_a_row = 0;
            return;
        }
        self.mixed_in_a_row += 1;
        if let Some(d) = self.decode_step {
            // What the chunk added; never below a small share of the step, so one step
            // that ran faster than the average cannot make the next chunk unbounded.
            let added = (t - d).max(0.05 * t) / prompt_tokens as f64;
            self.per_token = avg(self.per_token, added);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn off_or_unmeasured() {
        assert_eq!(PrefillPacer::new(64, 0.0).chunk(), 64);
        assert_eq!(PrefillPacer::new(64, 1.0).chunk(), 64);
        assert_eq!(PrefillPacer::new(64, f64::NAN).chunk(), 64);
        // Paced, nothing measured yet: a small first chunk.
        assert_eq!(PrefillPacer::new(64, 2.5).chunk(), FIRST_CHUNK);
        assert_eq!(PrefillPacer::new(2, 2.5).chunk(), 2);
    }

    #[test]
    fn chunk_fits_the_stall_budget() {
        let mut p = PrefillPacer::new(512, 3.0);
        p.record(ms(100), true, 0);
        // Still no per-token cost: the first chunk.
        assert_eq!(p.chunk(), FIRST_CHUNK);
        // 4 prompt tokens made a 100 ms step 140 ms: 10 ms a token; the budget is
        // (3 - 1) × 100 ms = 200 ms, so 20 tokens.
        p.record(ms(140), true, 4);
        assert_eq!(p.chunk(), 20);
        // Steps without decode rows change nothing.
        p.record(ms(5000), false, 512);
        assert_eq!(p.chunk(), 20);
        // A cheap model: bounded by --prefill-chunk.
        let mut q = PrefillPacer::new(64, 3.0);
        q.record(ms(10), true, 0);
        q.record(ms(11), true, 4);
        assert_eq!(q.chunk(), 64);
    }

    #[test]
    fn a_decode_only_step_now_and_then() {
        let mut p = PrefillPacer::new(512, 3.0);
        p.record(ms(100), true, 0);
        p.record(ms(140), true, 4);
        for _ in 1..REFRESH {
            assert!(p.chunk() > 0);
            p.record(ms(300), true, 20);
        }
        // The decoding rows are measured again...
        assert_eq!(p.chunk(), 0);
        // ... and found dearer (longer caches): the prompt's tokens are not charged for it.
        p.record(ms(200), true, 0);
        assert!(p.chunk() > 0);
        // Unpaced: never 0.
        let mut q = PrefillPacer::new(64, 0.0);
        for _ in 0..2 * REFRESH {
            q.record(ms(300), true, 20);
        }
        assert_eq!(q.chunk(), 64);
    }

    #[test]
    fn follows_a_dearer_prefill() {
        let mut p = PrefillPacer::new(512, 2.0);
        p.record(ms(100), true, 0);
        p.record(ms(140), true, 4);
        let before = p.chunk();
        // Prompt tokens get dearer (expert misses): the chunk shrinks within a few steps,
        // and never below one token.
        for _ in 0..16 {
            match p.chunk() {
                0 => p.record(ms(100), true, 0),
                k => p.record(ms(100 + 400 * k as u64), true, k),
            }
        }
        if p.chunk() == 0 {
            p.record(ms(100), true, 0);
        }
        assert!(p.chunk() < before);
        assert_eq!(p.chunk(), 1);
    }
}
