//! Token samplers with Hugging Face `generate` semantics.
//!
//! The logits pass through the same processors, in the same order, as transformers'
//! `_get_logits_processor`: repetition penalty -> temperature -> top-k -> top-p -> min-p; the
//! token is then drawn from the renormalised survivors. Temperature 0 means greedy (argmax,
//! lowest id on ties), with the repetition penalty still applied as HF does for greedy search.
//!
//! The random source is a self-contained xoshiro256** seeded through splitmix64 so that a seed
//! gives the same tokens on every machine and build, with no dependency whose stream could
//! change under us.

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax, lowest id on ties).
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    /// 1.0 = off.
    pub repetition_penalty: f32,
    pub seed: u64,
    /// OpenAI's penalties over the generated tokens (not the prompt): a token's logit drops
    /// by `frequency_penalty` per earlier occurrence and by `presence_penalty` once it has
    /// occurred. 0 = off; applied by [`crate::Generation`] before the processors above.
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// OpenAI's logit_bias: (token, bias added to its logit), bias in [-100, 100]; applied
    /// with the penalties above. A bias of -100 bans a token, 100 all but forces it.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return Err(Error::invalid(
                "temperature",
                format!("must be a finite number >= 0, got {t}"),
            ));
        }
        let p = self.top_p;
        // Range tests are false for NaN, so NaN is rejected too.
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::invalid(
                "top_p",
                format!("must be in (0, 1] (1 = off), got {p}"),
            ));
        }
        let m = self.min_p;
        if !(0.0..1.0).contains(&m) {
            return Err(Error::invalid(
                "min_p",
                format!("must be in [0, 1) (0 = off), got {m}"),
            ));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(Error::invalid(
                "repetition_penalty",
                format!("must be a finite number > 0 (1 = off), got {r}"),
            ));
        }
        for (name, v) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(Error::invalid(
                    name,
                    format!("must be in [-2, 2] (0 = off), got {v}"),
                ));
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return Err(Error::invalid(
                "logit_bias",
                format!(
                    "{} entries; at most {MAX_LOGIT_BIAS}",
                    self.logit_bias.len()
                ),
            ));
        }
        for &(id, b) in &self.logit_bias {
            if !(-100.0..=100.0).contains(&b) {
                return Err(Error::invalid(
                    "logit_bias",
                    format!("the bias of token {id} must be in [-100, 100], got {b}"),
                ));
            }
        }
        Ok(())
    }

    /// Whether the OpenAI penalties or a logit bias change anything.
    pub fn adjusts_logits(&self) -> bool {
        self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 || !self.logit_bias.is_empty()
    }

    /// Whether sampling reduces to argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

pub struct Sampler {
    pub params: SamplingParams,
    rng: Xoshiro256,
    /// Penalised logits; kept between calls to avoid a vocabulary-sized allocation per token.
    scratch: Vec<f32>,
    /// Candidate (id, scaled logit) pairs, reused likewise.
    cands: Vec<(u32, f32)>,
    /// The candidates' unnormalised probabilities.
    probs: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = Xoshiro256::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            scratch: Vec::new(),
            cands: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Picks the next token from `logits`; `history` is every token of the sequence so far
    /// (for the repetition penalty). NaN logits are never picked; an empty or all-NaN row
    /// gives token 0 rather than a panic.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        match self.process(logits, history) {
            Processed::Token(t) => t,
            Processed::Weighted { total } => {
                // Inverse-CDF draw over the renormalised weights.
                let r = self.rng.next_f64() * total;
                let mut cum = 0.0f64;
                let mut last = None;
                for (c, &w) in self.cands.iter().zip(&self.probs) {
                    if w <= 0.0 {
                        continue;
                    }
                    cum += w as f64;
                    last = Some(c.0);
                    if r < cum {
                        return c.0;
                    }
                }
                // Rounding can leave r == total; the last positive-weight token is then correct.
                last.unwrap_or(self.cands[0].0)
            }
        }
    }

    /// The probability of every token [`sample`](Self::sample) could return for these
    /// logits (same processors, same history), as `(id, p)` pairs summing to 1; a single
    /// `(argmax, 1)` when sampling is greedy. Speculative decoding compares these between a
    /// draft and the model to keep the output distribution exact. Draws no randomness.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
        match self.process(logits, history) {
            Processed::Token(t) => vec![(t, 1.0)],
            Processed::Weighted { total } => self
                .cands
                .iter()
                .zip(&self.probs)
                .filter(|(_, &w)| w > 0.0)
                .map(|(c, &w)| (c.0, w as f64 / total))
                .collect(),
        }
    }

    /// Draws a token from `(id, weight)` pairs (weights need not sum to 1) with this
    /// sampler's random stream; `None` when no weight is positive.
    pub fn draw(&mut self, weights: &[(u32, f64)]) -> Option<u32> {
        let total: f64 = weights.iter().filter(|w| w.1 > 0.0).map(|w| w.1).sum();
        if total <= 0.0 {
            return None;
        }
        let r = self.rng.next_f64() * total;
        let mut cum = 0.0;
        let mut last = None;
        for &(id, w) in weights.iter().filter(|w| w.1 > 0.0) {
            cum += w;
            last = Some(id);
            if r < cum {
                return Some(id);
            }
        }
        last
    }

    /// A uniform number in [0, 1) from this sampler's random stream.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Runs the processors (repetition penalty, temperature, top-k, top-p, min-p) and
    /// leaves the candidates and their unnormalised weights in `cands` / `probs`.
    fn process(&mut self, logits: &[f32], history: &[u32]) -> Processed {
        let p = &self.params;
        let logits: &[f32] = if p.repetition_penalty != 1.0 && !history.is_empty() {
            self.scratch.clear();
            self.scratch.extend_from_slice(logits);
            apply_repetition_penalty(&mut self.scratch, history, p.repetition_penalty);
            &self.scratch
        } else {
            logits
        };
        if p.is_greedy() {
            return Processed::Token(argmax(logits));
        }
        let Some(max) = logits
            .iter()
            .copied()
            .filter(|x| !x.is_nan())
            .reduce(f32::max)
        else {
            return Processed::Token(0);
        };
        if max == f32::NEG_INFINITY {
            return Processed::Token(argmax(logits));
        }

        // Temperature: scale relative to the max so that tiny temperatures give -inf (weight 0)
        // instead of inf - inf = NaN.
        let inv_t = 1.0 / p.temperature;
        let cands = &mut self.cands;
        cands.clear();
        cands.extend(logits.iter().enumerate().filter_map(|(i, &x)| {
            let s = (x - max) * inv_t;
            (s > f32::NEG_INFINITY).then_some((i as u32, s))
        }));
        // Highest first, lowest id first among equals: the order every later step relies on.
        let by_rank = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));

        // Top-k as HF: keep every token whose logit is >= the k-th largest (ties at the
        // boundary survive).
        if p.top_k > 0 && p.top_k < cands.len() {
            cands.select_nth_unstable_by(p.top_k - 1, by_rank);
            let kth = cands[p.top_k - 1].1;
            cands.retain(|c| c.1 >= kth);
        }
        if p.top_p < 1.0 {
            // Tokens below e^-40 of the top one hold < 1e-11 of the mass even over a million-token
            // vocabulary, under the smallest cut top-p can make (1 - top_p >= 6e-8 in f32), so
            // top-p would drop them anyway; removing them first spares sorting the whole vocab.
            cands.retain(|c| c.1 > -40.0);
            cands.sort_unstable_by(by_rank);
        }

        // Softmax over the survivors; scaled logits are <= 0 with the max at 0, so exp is safe.
        let probs = &mut self.probs;
        probs.clear();
        probs.extend(cands.iter().map(|c| c.1.exp()));
        let mut total: f64 = probs.iter().map(|&x| x as f64).sum();

        // Top-p as HF's TopPLogitsWarper: in ascending order, drop tokens whose cumulative
        // probability is <= 1 - top_p; the most likely token always stays.
        if p.top_p < 1.0 {
            let cut = (1.0 - p.top_p as f64) * total;
            let mut cum = 0.0f64;
            let mut keep = probs.len();
            for i in (1..probs.len()).rev() {
                cum += probs[i] as f64;
                if cum <= cut {
                    keep = i;
                } else {
                    break;
                }
            }
            cands.truncate(keep);
            probs.truncate(keep);
            total = probs.iter().map(|&x| x as f64).sum();
        }

        // Min-p as HF's MinPLogitsWarper: drop tokens below min_p times the top probability.
        // Ratios do not depend on normalisation, so the unnormalised weights serve.
        if p.min_p > 0.0 {
            let top = probs.iter().copied().fold(0.0f32, f32::max);
            let floor = p.min_p * top;
            for w in probs.iter_mut() {
                if *w < floor {
                    *w = 0.0;
                }
            }
            total = probs.iter().map(|&x| x as f64).sum();
        }
        Processed::Weighted { total }
    }
}

/// What the processors leave for a draw.
enum Processed {
    /// The outcome is certain (greedy, or nothing finite to weigh).
    Token(u32),
    /// Candidates in `cands` with weights in `probs`, summing to `total` (> 0).
    Weighted { total: f64 },
}

/// HF's RepetitionPenaltyLogitsProcessor: every distinct token already in the sequence gets
/// its logit divided by `penalty` when positive, multiplied when negative. Ids outside the
/// row are ignored.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    let mut seen = vec![false; logits.len()];
    for &id in history {
        let i = id as usize;
        if i < logits.len() && !seen[i] {
            seen[i] = true;
            let x = logits[i];
            logits[i] = if x > 0.0 { x / penalty } else { x * penalty };
        }
    }
}

/// Most `logit_bias` entries one request may carry (OpenAI's limit is 300; a large vocabulary
/// ban list is the reason to allow more).
pub const MAX_LOGIT_BIAS: usize = 4096;

/// OpenAI's logit_bias: each listed token's logit moves by its bias. Ids outside the row are
/// ignored (callers check them against the vocabulary first).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(x) = logits.get_mut(id as usize) {
            *x += b;
        }
    }
}

/// OpenAI's frequency and presence penalties: `counts` holds (token, occurrences in the
/// generated text so far). Ids outside the row are ignored.
pub fn apply_occurrence_penalties(
    logits: &mut [f32],
    counts: &std::collections::HashMap<u32, u32>,
    frequency: f32,
    presence: f32,
) {
    for (&id, &n) in counts {
        if let Some(x) = logits.get_mut(id as usize) {
            *x -= frequency * n as f32 + if n > 0 { presence } else { 0.0 };
        }
    }
}

/// The log-probability of `id` under softmax(`logits`) and the `top` most likely tokens
/// (highest first, lowest id first among equals). NaN logits count as impossible.
pub fn logprobs(logits: &[f32], id: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits
        .iter()
        .copied()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return (f32::NEG_INFINITY, Vec::new());
    }
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| ((x - max) as f64).exp())
        .sum();
    let lse = max as f64 + sum.ln();
    let lp = |x: f32| {
        if x.is_nan() {
            f32::NEG_INFINITY
        } else {
            (x as f64 - lse) as f32
        }
    };
    let chosen = logits
        .get(id as usize)
        .copied()
        .map(lp)
        .unwrap_or(f32::NEG_INFINITY);
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if x.is_nan() {
                continue;
            }
            if best.len() == top && x <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|b| b.1 >= x);
            best.insert(at, (i as u32, x));
            best.truncate(top);
        }
    }
    (chosen, best.into_iter().map(|(i, x)| (i, lp(x))).collect())
}

/// Index of the largest value; the lowest index wins ties (as torch.argmax). NaN entries are
/// skipped; an empty or all-NaN slice gives 0.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in v.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if x <= b => {}
            _ => best = Some((i, x)),
        }
    }
    best.map(|(i, _)| i as u32).unwrap_or(0)
}

/// xoshiro256** (Blackman & Vigna), seeded by splitmix64 as its authors recommend so that
/// nearby seeds give unrelated streams.
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    pub fn seed_from_u64(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Xoshiro256 {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..Default::default()
        }
    }

    fn freqs(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<f64> {
        let mut c = vec![0usize; logits.len()];
        for _ in 0..n {
            c[s.sample(logits, &[]) as usize] += 1;
        }
        c.into_iter().map(|x| x as f64 / n as f64).collect()
    }

    fn ln(p: &[f32]) -> Vec<f32> {
        p.iter().map(|x| x.ln()).collect()
    }

    #[test]
    fn xoshiro_reference_values() {
        // splitmix64 first output for seed 0 is a published constant.
        let mut x = 0u64;
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        assert_eq!(z ^ (z >> 31), 0xE220_A839_7B1D_CDAF);
        // xoshiro256** from state [1, 2, 3, 4]: reference outputs of the C implementation.
        let mut r = Xoshiro256 { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(got, vec![11520, 0, 1509978240]);
        let mut r = Xoshiro256::seed_from_u64(42);
        for _ in 0..1000 {
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
    }

    #[test]
    fn argmax_lowest_on_ties_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN, 0.7]), 3);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
        assert_eq!(argmax(&[f32::NAN]), 0);
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(params(0.0));
        assert_eq!(s.sample(&[0.1, 2.0, 2.0, -1.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_always_argmax() {
        let logits = [0.5, 1.0, 0.9, 0.99];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.5,
            top_k: 1,
            seed: 7,
            ..Default::default()
        });
        for _ in 0..1000 {
            assert_eq!(s.sample(&logits, &[]), 1);
        }
    }

    #[test]
    fn temperature_one_matches_distribution() {
        let p = [0.5f32, 0.25, 0.15, 0.07, 0.03];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: 123,
            ..Default::default()
        });
        // Logits shifted by a constant must not matter.
        let logits: Vec<f32> = ln(&p).iter().map(|x| x + 3.0).collect();
        let f = freqs(&mut s, &logits, 20_000);
        for (got, want) in f.iter().zip(p) {
            assert!((got - want as f64).abs() < 0.02, "{f:?} vs {p:?}");
        }
    }

    #[test]
    fn temperature_two_flattens() {
        // At T = 2, p_i ∝ sqrt(q_i): q = [0.64, 0.16, 0.16, 0.04] -> [0.8, 0.4, 0.4, 0.2]/1.8.
        let q = [0.64f32, 0.16, 0.16, 0.04];
        let want = [0.8 / 1.8, 0.4 / 1.8, 0.4 / 1.8, 0.2 / 1.8];
        let mut s = Sampler::new(SamplingParams {
            temperature: 2.0,
            seed: 5,
            ..Default::default()
        });
        let f = freqs(&mut s, &ln(&q), 20_000);
        for (got, w) in f.iter().zip(want) {
            assert!((got - w).abs() < 0.02, "{f:?}");
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let logits = ln(&[0.3, 0.3, 0.2, 0.2]);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            seed: 99,
            ..Default::default()
        };
        let run = |p: &SamplingParams| {
            let mut s = Sampler::new(p.clone());
            (0..200).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        let a = run(&p);
        assert_eq!(a, run(&p));
        let b = run(&SamplingParams { seed: 100, ..p });
        assert_ne!(a, b);
        // Not degenerate: every token shows up.
        for t in 0..4 {
            assert!(a.contains(&t));
        }
    }

    #[test]
    fn top_k_restricts_and_renormalises() {
        let p = [0.1f32, 0.4, 0.3, 0.2];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 2,
            seed: 1,
            ..Default::default()
        });
        let f = freqs(&mut s, &ln(&p), 20_000);
        assert_eq!(f[0], 0.0);
        assert_eq!(f[3], 0.0);
        assert!((f[1] - 4.0 / 7.0).abs() < 0.02, "{f:?}");
        assert!((f[2] - 3.0 / 7.0).abs() < 0.02, "{f:?}");
    }

    #[test]
    fn top_p_excludes_tail() {
        // Sorted: 0.5, 0.3, 0.15, 0.05. With top_p = 0.75 HF drops tokens whose ascending
        // cumulative mass is <= 0.25: 0.05 and 0.05 + 0.15 = 0.2, not 0.2 + 0.3. Kept: {0.5, 0.3}.
        let p = [0.15f32, 0.5, 0.05, 0.3];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.75,
            seed: 2,
            ..Default::default()
        });
        let f = freqs(&mut s, &ln(&p), 20_000);
        assert_eq!(f[0], 0.0);
        assert_eq!(f[2], 0.0);
        assert!((f[1] - 0.625).abs() < 0.02, "{f:?}");
        assert!((f[3] - 0.375).abs() < 0.02, "{f:?}");
        // A tiny top_p keeps only the most likely token.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 1e-6,
            seed: 3,
            ..Default::default()
        });
        for _ in 0..500 {
            assert_eq!(s.sample(&ln(&p), &[]), 1);
        }
    }

    #[test]
    fn min_p_excludes_relative_to_max() {
        // min_p = 0.3, max prob 0.5 -> floor 0.15: 0.1 and 0.04 go, 0.16 and 0.2 stay.
        let p = [0.5f32, 0.2, 0.16, 0.1, 0.04];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.3,
            seed: 4,
            ..Default::default()
        });
        let f = freqs(&mut s, &ln(&p), 20_000);
        assert_eq!(f[3], 0.0);
        assert_eq!(f[4], 0.0);
        for (i, w) in [(0, 0.5 / 0.86), (1, 0.2 / 0.86), (2, 0.16 / 0.86)] {
            assert!((f[i] - w).abs() < 0.02, "{f:?}");
        }
    }

    #[test]
    fn repetition_penalty_hf_semantics() {
        let mut l = vec![2.0, -2.0, 1.0, 4.0];
        // Repeated ids count once; out-of-range ids are ignored.
        apply_repetition_penalty(&mut l, &[0, 1, 0, 0, 99], 2.0);
        assert_eq!(l, vec![1.0, -4.0, 1.0, 4.0]);
        // Greedy applies the penalty too: token 3's logit 4 drops to 1, so token 0 (3) wins.
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 4.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[3.0, -1.0, 1.0, 4.0], &[3]), 0);
        assert_eq!(s.sample(&[3.0, -1.0, 1.0, 4.0], &[]), 3);
    }

    #[test]
    fn nan_and_inf_logits_are_never_sampled() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: 11,
            ..Default::default()
        });
        let logits = [f32::NAN, 0.0, f32::NEG_INFINITY, 0.0];
        for _ in 0..500 {
            let t = s.sample(&logits, &[]);
            assert!(t == 1 || t == 3);
        }
        assert_eq!(s.sample(&[], &[]), 0);
        assert_eq!(s.sample(&[f32::NAN, f32::NAN], &[]), 0);
        // A tiny temperature behaves like greedy instead of producing NaN.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1e-30,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..100 {
            assert_eq!(s.sample(&[1.0, 50.0, 49.99], &[]), 1);
        }
    }

    #[test]
    fn distribution_is_what_sample_draws() {
        let p = [0.15f32, 0.5, 0.05, 0.3];
        let top_p = SamplingParams {
            temperature: 1.0,
            top_p: 0.75,
            seed: 2,
            ..Default::default()
        };
        let mut s = Sampler::new(top_p.clone());
        let d = s.distribution(&ln(&p), &[]);
        // top_p = 0.75 keeps {0.5, 0.3}, renormalised.
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((d[0].1 - 0.625).abs() < 1e-6 && (d[1].1 - 0.375).abs() < 1e-6);
        // Asking for the distribution draws no randomness: the stream is unchanged.
        let mut fresh = Sampler::new(top_p);
        for _ in 0..100 {
            assert_eq!(s.sample(&ln(&p), &[]), fresh.sample(&ln(&p), &[]));
        }
        // Greedy: all mass on the argmax.
        let mut g = Sampler::new(params(0.0));
        assert_eq!(g.distribution(&[0.1, 2.0, 1.0], &[]), vec![(1, 1.0)]);
        // draw follows the weights.
        let mut s = Sampler::new(params(1.0));
        let w = [(7u32, 1.0), (9, 3.0), (4, 0.0)];
        let n = 20_000;
        let nines = (0..n).filter(|_| s.draw(&w) == Some(9)).count();
        assert!((nines as f64 / n as f64 - 0.75).abs() < 0.02);
        assert_eq!(s.draw(&[(1, 0.0)]), None);
    }

    #[test]
    fn occurrence_penalties_and_logprobs() {
        let mut l = vec![1.0, 2.0, 3.0, 4.0];
        let counts = std::collections::HashMap::from([(1u32, 2u32), (3, 1), (9, 5)]);
        apply_occurrence_penalties(&mut l, &counts, 0.5, 0.25);
        assert_eq!(l, vec![1.0, 2.0 - 1.0 - 0.25, 3.0, 4.0 - 0.5 - 0.25]);

        // log-softmax of [ln 0.5, ln 0.25, ln 0.25] is exactly those logs.
        let p = [0.5f32, 0.25, 0.25];
        let (lp, top) = logprobs(&ln(&p), 1, 2);
        assert!((lp - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(top.len(), 2);
        assert_eq!((top[0].0, top[1].0), (0, 1), "ties: lowest id first");
        assert!((top[0].1 - 0.5f32.ln()).abs() < 1e-6);
        // Shifting the logits changes nothing; -inf and NaN are impossible tokens.
        let (lp2, _) = logprobs(
            &[
                100.0 + 0.5f32.ln(),
                100.0 + 0.25f32.ln(),
                100.0 + 0.25f32.ln(),
            ],
            1,
            0,
        );
        assert!((lp - lp2).abs() < 1e-5);
        let (lp, top) = logprobs(&[0.0, f32::NEG_INFINITY, f32::NAN], 1, 5);
        assert_eq!(lp, f32::NEG_INFINITY);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0], (0, 0.0));
    }

    #[test]
    fn validate_names_the_field() {
        let field = |p: SamplingParams| match p.validate() {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        let d = SamplingParams::default();
        assert!(d.validate().is_ok());
        for t in [f32::NAN, -0.1, f32::INFINITY] {
            assert_eq!(
                field(SamplingParams {
                    temperature: t,
                    ..d.clone()
                }),
                "temperature"
            );
        }
        for p in [0.0, -0.5, 1.01, f32::NAN] {
            assert_eq!(
                field(SamplingParams {
                    top_p: p,
                    ..d.clone()
                }),
                "top_p"
            );
        }
        for m in [1.0, -0.01, f32::NAN] {
            assert_eq!(
                field(SamplingParams {
                    min_p: m,
                    ..d.clone()
                }),
                "min_p"
            );
        }
        for r in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert_eq!(
                field(SamplingParams {
                    repetition_penalty: r,
                    ..d.clone()
                }),
                "repetition_penalty"
            );
        }
        for v in [2.5, -2.01, f32::NAN] {
            assert_eq!(
                field(SamplingParams {
                    frequency_penalty: v,
                    ..d.clone()
                }),
                "frequency_penalty"
            );
            assert_eq!(
                field(SamplingParams {
                    presence_penalty: v,
                    ..d.clone()
                }),
                "presence_penalty"
            );
        }
        assert!(SamplingParams {
            temperature: 0.7,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 40,
            repetition_penalty: 1.1,
            seed: 1,
            frequency_penalty: 0.5,
            presence_penalty: -2.0,
            logit_bias: vec![(3, -100.0), (7, 100.0)],
        }
        .validate()
        .is_ok());
        for bias in [
            vec![(1, 100.5)],
            vec![(1, f32::NAN)],
            vec![(0, 0.0); MAX_LOGIT_BIAS + 1],
        ] {
            assert_eq!(
                field(SamplingParams {
                    logit_bias: bias,
                    ..d.clone()
                }),
                "logit_bias"
            );
        }
    }

    #[test]
    fn logit_bias_moves_the_listed_logits_only() {
        let mut logits = vec![1.0, 2.0, 3.0, 4.0];
        apply_logit_bias(&mut logits, &[(0, 10.0), (3, -100.0), (99, 5.0)]);
        assert_eq!(logits, vec![11.0, 2.0, 3.0, -96.0]);
    }
}
