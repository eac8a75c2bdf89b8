//! Samplers. (Placeholder signatures; the full implementation replaces this file.)

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
        }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::invalid("temperature", "must be a finite number >= 0"));
        }
        Ok(())
    }
}

pub struct Sampler {
    pub params: SamplingParams,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler { params }
    }
    /// Picks the next token from `logits`; `history` is every token of the sequence so far
    /// (for the repetition penalty).
    pub fn sample(&mut self, logits: &[f32], _history: &[u32]) -> u32 {
        argmax(logits)
    }
}

/// Index of the largest value; the lowest index wins ties (as torch.argmax).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}
