//! The generation state machine shared by the in-process CLI and the daemon's scheduler.
//!
//! A [`Generation`] owns one sequence's KV cache and sampling state. Each step the caller
//! asks it for the tokens to feed ([`Generation::next_input`]: a prompt chunk, or the last
//! sampled token), runs them through [`Model::forward`] (possibly batched with other
//! sequences), and hands back the logits ([`Generation::accept`]), which yields a
//! [`StepEvent`]: the sampled token, its text delta, and whether generation finished.

use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::model::{LogitsWanted, Model, SeqStep};
use crate::sample::{Sampler, SamplingParams};
use crate::text::{IncrementalDecoder, StopMatcher};

#[derive(Clone, Debug, Default)]
pub struct GenerateRequest {
    /// Tokens to append to the sequence before generating.
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks, oracle comparisons).
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// `max_tokens` reached.
    Length,
    /// An end-of-sequence token was sampled.
    Eos,
    /// A stop string appeared in the text.
    Stop,
    /// Cancelled by the caller (client gone, Cancel request).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepEvent {
    /// The sampled token (absent for a prefill chunk that produced no token).
    pub token: Option<u32>,
    /// Text that became final with this token (may be empty).
    pub text: String,
    pub finished: Option<FinishReason>,
}

pub struct Generation {
    pub cache: KvCache,
    sampler: Sampler,
    detok: IncrementalDecoder,
    stop: StopMatcher,
    max_tokens: usize,
    ignore_eos: bool,
    /// Prompt tokens not fed yet.
    pending: Vec<u32>,
    /// Every token of this request (prompt then generated), for the repetition penalty.
    history: Vec<u32>,
    generated: Vec<u32>,
    finished: Option<FinishReason>,
}

impl Generation {
    /// Starts a generation that continues `cache` (empty for a new sequence). Validates the
    /// request against the model: ids in the vocabulary, prompt plus `max_tokens` within the
    /// context (a prompt that does not fit is an error, never truncated).
    pub fn new(model: &Model, cache: KvCache, req: GenerateRequest) -> Result<Generation> {
        req.sampling.validate()?;
        if req.prompt.is_empty() && cache.is_empty() {
            return Err(Error::invalid("prompt", "is empty"));
        }
        model.check_tokens(cache.len(), &req.prompt, "prompt")?;
        if req.max_tokens == 0 {
            return Err(Error::invalid("max_tokens", "must be at least 1"));
        }
        let room = model.info.max_context - cache.len() - req.prompt.len();
        if req.max_tokens > room {
            return Err(Error::invalid(
                "max_tokens",
                format!(
                    "{} tokens do not fit: the context of {} holds {} more after the prompt",
                    req.max_tokens, model.info.max_context, room
                ),
            ));
        }
        Ok(Generation {
            cache,
            sampler: Sampler::new(req.sampling.clone()),
            detok: IncrementalDecoder::new(),
            stop: StopMatcher::new(req.stop_strings.clone()),
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            history: req.prompt.clone(),
            pending: req.prompt,
            generated: Vec::new(),
            finished: None,
        })
    }

    /// The tokens to feed next (at most `prefill_chunk` prompt tokens, or the last sampled
    /// token) and whether this step's logits are needed.
    pub fn next_input(&self, prefill_chunk: usize) -> (&[u32], LogitsWanted) {
        if !self.pending.is_empty() {
            let n = self.pending.len().min(prefill_chunk.max(1));
            let want = if n == self.pending.len() {
                LogitsWanted::Last
            } else {
                LogitsWanted::None
            };
            (&self.pending[..n], want)
        } else {
            let last = self.generated.len() - 1;
            (&self.generated[last..], LogitsWanted::Last)
        }
    }

    /// Records that `fed` tokens from [`next_input`](Self::next_input) went through the
    /// model; `logits` are the last position's when they were wanted.
    pub fn accept(
        &mut self,
        model: &Model,
        fed: usize,
        logits: Option<&[f32]>,
    ) -> Result<StepEvent> {
        if !self.pending.is_empty() {
            self.pending.drain(..fed.min(self.pending.len()));
        }
        let Some(logits) = logits else {
            return Ok(StepEvent::default());
        };
        let token = self.sampler.sample(logits, &self.history);
        self.push_token(model, token)
    }

    /// Appends a token chosen outside [`accept`](Self::accept) (speculative decoding picks
    /// several per step) with the same bookkeeping: text delta, stop strings, eos, length.
    pub fn push_token(&mut self, model: &Model, token: u32) -> Result<StepEvent> {
        self.generated.push(token);
        self.history.push(token);
        let mut ev = StepEvent {
            token: Some(token),
            ..Default::default()
        };
        let is_eos = !self.ignore_eos && model.info.eos_ids.contains(&token);
        if let Some(text) = &model.text {
            if !is_eos {
                let delta = self.detok.push(text, token)?;
                let (out, stopped) = self.stop.push(&delta);
                ev.text = out;
                if stopped {
                    ev.finished = Some(FinishReason::Stop);
                }
            }
        }
        if ev.finished.is_none() {
            if is_eos {
                ev.finished = Some(FinishReason::Eos);
            } else if self.generated.len() >= self.max_tokens {
                ev.finished = Some(FinishReason::Length);
            }
        }
        if ev.finished.is_some() && ev.finished != Some(FinishReason::Stop) {
            // Flush text held back for an incomplete character or a possible stop string.
            if let Some(text) = &model.text {
                let tail = self.detok.finish(text)?;
                let (out, stopped) = self.stop.push(&tail);
                ev.text.push_str(&out);
                if stopped {
                    ev.finished = Some(FinishReason::Stop);
                }
            }
            ev.text.push_str(&self.stop.finish());
        }
        self.finished = ev.finished;
        Ok(ev)
    }

    /// The sampler and the sequence's tokens so far, for callers that pick tokens
    /// themselves (speculative decoding's acceptance test).
    pub fn sampling_state(&mut self) -> (&mut Sampler, &[u32]) {
        (&mut self.sampler, &self.history)
    }

    /// Prompt tokens not fed to the model yet.
    pub fn prompt_pending(&self) -> usize {
        self.pending.len()
    }

    /// Tokens this generation may still produce.
    pub fn remaining(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated.len())
    }

    pub fn cancel(&mut self) {
        if self.finished.is_none() {
            self.finished = Some(FinishReason::Cancelled);
        }
    }

    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// The stop string that ended the generation (finish reason `Stop`).
    pub fn matched_stop(&self) -> Option<&str> {
        self.stop.matched()
    }

    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// The cache, to continue the conversation later. The last sampled token has not been
    /// fed yet: a follow-up request should start with it (see [`pending_token`](Self::pending_token)).
    pub fn into_cache(self) -> KvCache {
        self.cache
    }

    /// The last sampled token, which is not in the cache yet.
    pub fn pending_token(&self) -> Option<u32> {
        self.generated.last().copied()
    }

    /// Runs this generation alone to the end, calling `on_event` after every token.
    pub fn run(
        &mut self,
        model: &Model,
        prefill_chunk: usize,
        mut on_event: impl FnMut(&StepEvent),
    ) -> Result<()> {
        while self.finished.is_none() {
            let (tokens, want) = self.next_input(prefill_chunk);
            let tokens = tokens.to_vec();
            let mut b = [SeqStep {
                cache: &mut self.cache,
                tokens: &tokens,
                logits: want,
            }];
            let out = model.forward(&mut b)?;
            let logits = (want != LogitsWanted::None).then(|| out[0].as_slice());
            let ev = self.accept(model, tokens.len(), logits)?;
            if ev.token.is_some() {
                on_event(&ev);
            }
        }
        Ok(())
    }
}
