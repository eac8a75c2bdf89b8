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
use crate::sample::{self, Sampler, SamplingParams};
use crate::structured::Constraint;
use crate::text::{
    IncrementalDecoder, ReplyConfig, ReplyParser, ReplySummary, StopMatcher, ToolCallDelta,
};
use std::collections::HashMap;

/// Most alternatives a token's logprobs may list (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

#[derive(Clone, Debug, Default)]
pub struct GenerateRequest {
    /// Tokens to append to the sequence before generating.
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_strings: Vec<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks, oracle comparisons).
    pub ignore_eos: bool,
    /// Report each token's log-probability and this many alternatives (at most
    /// [`MAX_TOP_LOGPROBS`]); None = no logprobs.
    pub logprobs: Option<usize>,
    /// Split the reply into content, reasoning and tool calls (chat requests).
    pub reply: ReplyConfig,
}

/// A generated token's log-probability under the model (log-softmax of its raw logits) and
/// the most likely alternatives at that position.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
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
    /// Text that became final with this token (may be empty): with a reply parser, the
    /// answer's text only.
    pub text: String,
    /// Reasoning text that became final (reply parser with think tags).
    pub reasoning: String,
    /// Pieces of tool calls (reply parser with tools).
    pub tool_calls: Vec<ToolCallDelta>,
    pub logprob: Option<TokenLogprob>,
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
    logprobs: Option<usize>,
    reply: ReplyParser,
    summary: Option<ReplySummary>,
    constraint: Option<Constraint>,
    /// Occurrences of each generated token (frequency / presence penalties).
    counts: HashMap<u32, u32>,
    /// Logits after penalties and the grammar mask; reused between steps.
    scratch: Vec<f32>,
}

impl Generation {
    /// Starts a generation that continues `cache` (empty for a new sequence). Validates the
    /// request against the model: ids in the vocabulary, prompt plus `max_tokens` within the
    /// context (a prompt that does not fit is an error, never truncated).
    pub fn new(model: &Model, cache: KvCache, req: GenerateRequest) -> Result<Generation> {
        req.sampling.validate()?;
        if let Some(&(id, _)) = req
            .sampling
            .logit_bias
            .iter()
            .find(|(id, _)| *id as usize >= model.info.vocab_size)
        {
            return Err(Error::invalid(
                "logit_bias",
                format!(
                    "token {id} is outside the vocabulary of {}",
                    model.info.vocab_size
                ),
            ));
        }
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
        if let Some(k) = req.logprobs {
            if k > MAX_TOP_LOGPROBS {
                return Err(Error::invalid(
                    "top_logprobs",
                    format!("{k} is more than {MAX_TOP_LOGPROBS}"),
                ));
            }
        }
        // Markup the reply parser reads must survive detokenization even where the
        // tokenizer marks it special.
        let keep = match &model.text {
            Some(t) if req.reply.is_active() => t.special_marker_ids(&req.reply.markers()),
            _ => Vec::new(),
        };
        Ok(Generation {
            cache,
            sampler: Sampler::new(req.sampling.clone()),
            detok: IncrementalDecoder::keeping(keep),
            stop: StopMatcher::new(req.stop_strings.clone()),
            max_tokens: req.max_tokens,
            ignore_eos: req.ignore_eos,
            history: req.prompt.clone(),
            pending: req.prompt,
            generated: Vec::new(),
            finished: None,
            logprobs: req.logprobs,
            reply: ReplyParser::new(req.reply),
            summary: None,
            constraint: None,
            counts: HashMap::new(),
            scratch: Vec::new(),
        })
    }

    /// Constrains the tokens this generation may sample (structured output, forced tool
    /// calls).
    pub fn set_constraint(&mut self, c: Constraint) {
        self.constraint = Some(c);
    }

    /// The grammar state, for callers that compute its next mask while the forward pass
    /// runs ([`Constraint::prepare_mask`]); the cache is handed out alongside so that both
    /// can be borrowed at once.
    /// Whether a grammar constrains the tokens (structured output, forced tool calls).
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    pub fn cache_and_constraint(&mut self) -> (&mut KvCache, Option<&mut Constraint>) {
        (&mut self.cache, self.constraint.as_mut())
    }

    /// The reply's tool calls once generation finished (None before).
    pub fn reply_summary(&self) -> Option<&ReplySummary> {
        self.summary.as_ref()
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
        let p = &self.sampler.params;
        let token = if self.constraint.is_some() || p.adjusts_logits() {
            self.scratch.clear();
            self.scratch.extend_from_slice(logits);
            if p.adjusts_logits() {
                sample::apply_occurrence_penalties(
                    &mut self.scratch,
                    &self.counts,
                    p.frequency_penalty,
                    p.presence_penalty,
                );
                sample::apply_logit_bias(&mut self.scratch, &p.logit_bias);
            }
            if let Some(c) = &mut self.constraint {
                c.apply(&mut self.scratch)?;
            }
            self.sampler.sample(&self.scratch, &self.history)
        } else {
            self.sampler.sample(logits, &self.history)
        };
        let logprob = self.logprobs.map(|k| {
            let (logprob, top) = sample::logprobs(logits, token, k);
            TokenLogprob {
                id: token,
                logprob,
                top,
            }
        });
        let mut grammar_done = false;
        if let Some(c) = &mut self.constraint {
            c.commit(token)?;
            grammar_done = c.is_stopped();
        }
        let mut ev = self.push_token(model, token)?;
        ev.logprob = logprob;
        if grammar_done && ev.finished.is_none() {
            // The grammar is complete: only end-of-sequence could follow.
            ev.finished = Some(FinishReason::Eos);
            self.finished = ev.finished;
            self.finish_text(model, &mut ev)?;
        }
        Ok(ev)
    }

    /// Appends a token chosen outside [`accept`](Self::accept) (speculative decoding picks
    /// several per step) with the same bookkeeping: text delta, stop strings, eos, length.
    pub fn push_token(&mut self, model: &Model, token: u32) -> Result<StepEvent> {
        self.generated.push(token);
        self.history.push(token);
        *self.counts.entry(token).or_insert(0) += 1;
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
        self.finished = ev.finished;
        let raw = std::mem::take(&mut ev.text);
        self.split_reply(&mut ev, &raw);
        if ev.finished.is_some() {
            self.finish_text(model, &mut ev)?;
        }
        Ok(ev)
    }

    /// Routes raw reply text through the reply parser into the event.
    fn split_reply(&mut self, ev: &mut StepEvent, raw: &str) {
        let d = self.reply.push(raw);
        ev.text.push_str(&d.content);
        ev.reasoning.push_str(&d.reasoning);
        ev.tool_calls.extend(d.tool_calls);
    }

    /// At the end: flushes text held back for an incomplete character or a possible stop
    /// string, and closes the reply parser.
    fn finish_text(&mut self, model: &Model, ev: &mut StepEvent) -> Result<()> {
        if ev.finished != Some(FinishReason::Stop) {
            let mut raw = String::new();
            if let Some(text) = &model.text {
                let tail = self.detok.finish(text)?;
                let (out, stopped) = self.stop.push(&tail);
                raw.push_str(&out);
                if stopped {
                    ev.finished = Some(FinishReason::Stop);
                    self.finished = ev.finished;
                }
            }
            raw.push_str(&self.stop.finish());
            self.split_reply(ev, &raw);
        }
        let (d, summary) = self.reply.finish();
        ev.text.push_str(&d.content);
        ev.reasoning.push_str(&d.reasoning);
        ev.tool_calls.extend(d.tool_calls);
        self.summary = Some(summary);
        Ok(())
    }

    /// The sampler and the sequence's tokens so far, for callers that pick tokens
    /// themselves (speculative decoding's acceptance test).
    pub fn sampling_state(&mut self) -> (&mut Sampler, &[u32]) {
        (&mut self.sampler, &self.history)
    }

    /// Every token of this request: its prompt (fed or not yet), then the generated ones.
    pub fn history(&self) -> &[u32] {
        &self.history
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
            let (_, summary) = self.reply.finish();
            self.summary = Some(summary);
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
            let (cache, constraint) = self.cache_and_constraint();
            let mut b = [SeqStep {
                cache,
                tokens: &tokens,
                logits: want,
            }];
            // The grammar's next mask is computed while the model runs.
            let (out, mask) = std::thread::scope(|s| {
                let mask = constraint
                    .filter(|_| want != LogitsWanted::None)
                    .map(|c| s.spawn(move || c.prepare_mask()));
                let out = model.forward(&mut b);
                (out, mask.map(|h| h.join()))
            });
            if let Some(m) = mask {
                m.map_err(|_| Error::invalid("response_format", "grammar thread failed"))??;
            }
            let out = out?;
            let logits = (want != LogitsWanted::None).then(|| out[0].as_slice());
            let ev = self.accept(model, tokens.len(), logits)?;
            if ev.token.is_some() {
                on_event(&ev);
            }
        }
        Ok(())
    }
}
