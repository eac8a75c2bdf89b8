//! One batched forward step over the active rows, and what each row makes of its outputs.

use super::rows::{Outcome, Picked, Row};
use super::thread::EngineThread;
use crate::wire::{self, status_from_engine};
use colibri_engine::perplexity;
use colibri_engine::{FinishReason, LogitsWanted, SeqStep, StepEvent};
use colibri_proto::v1 as pb;
use pb::generate_event::{Event, Tokens};
use std::sync::Arc;
use std::time::Instant;
use tonic::Status;

impl EngineThread {
    /// One batched forward step over the active rows.
    pub(super) fn step(&mut self) {
        let decoding = self.active.iter().any(Row::is_decode);
        let chunk = if decoding {
            self.pacer.chunk()
        } else {
            self.cfg.solo_prefill_chunk.max(1)
        };
        let model = Arc::clone(&self.model);
        // Every decode row (its pending token, with drafts after it when drafting), plus
        // prompt rows in arrival order while the step's prompt budget (`chunk` tokens) lasts:
        // prompts that arrive together start together (one step, one TTFT) instead of one
        // step after another, and their sessions then decode in the same steps.
        let mut picked: Vec<Picked> = Vec::new();
        let mut failed: Vec<(usize, Status)> = Vec::new();
        // Prompt tokens this step may still carry; a chunk of 0: the pacer wants a
        // decode-only step (no prompt this time).
        let mut budget = chunk;
        for (i, row) in self.active.iter_mut().enumerate() {
            match row {
                Row::Gen(g) if g.prompt_left == 0 || budget > 0 => {
                    let prompt = g.prompt_left > 0;
                    // (A decode row's plan takes no prompt tokens whatever the budget.)
                    match g.spec.plan(&model, &mut g.gen, budget) {
                        Ok(plan) => {
                            if prompt {
                                budget = budget.saturating_sub(plan.tokens.len());
                            }
                            picked.push(Picked {
                                i,
                                tokens: plan.tokens.clone(),
                                logits: plan.logits,
                                hidden: plan.hidden,
                                plan: Some(plan),
                            })
                        }
                        Err(e) => failed.push((i, status_from_engine(&e))),
                    }
                }
                // Scoring and perplexity rows take a whole chunk, alone among prompts.
                Row::Score(s) if budget == chunk && budget > 0 => {
                    budget = 0;
                    let n = chunk.min(s.ids.len() - s.fed);
                    picked.push(Picked {
                        i,
                        tokens: s.ids[s.fed..s.fed + n].to_vec(),
                        logits: LogitsWanted::All,
                        hidden: LogitsWanted::None,
                        plan: None,
                    });
                }
                Row::Perplexity(p) if budget == chunk && budget > 0 => {
                    budget = 0;
                    let scored = chunk.min(perplexity::rows_per_chunk(self.model.info.vocab_size));
                    let (s, e, want) = perplexity::next_chunk(p.ctx, p.fed, chunk, scored)
                        .expect("a finished window is moved on right after its last chunk");
                    let base = p.window * p.ctx;
                    picked.push(Picked {
                        i,
                        tokens: p.ids[base + s..base + e].to_vec(),
                        logits: want,
                        hidden: LogitsWanted::None,
                        plan: None,
                    });
                }
                _ => {}
            }
        }
        // Remove from the back so earlier indices stay valid (picked ones too).
        for (i, st) in failed.into_iter().rev() {
            let row = self.active.remove(i);
            self.finish_row(row, Outcome::Failed(st));
            for p in picked.iter_mut().filter(|p| p.i > i) {
                p.i -= 1;
            }
        }
        if picked.is_empty() {
            return;
        }
        let with_hidden = picked.iter().any(|p| p.hidden != LogitsWanted::None);
        let prompt_tokens: usize = picked
            .iter()
            .filter(|p| !self.active[p.i].is_decode())
            .map(|p| p.tokens.len())
            .sum();
        let t = Instant::now();
        let result = {
            let mut steps = Vec::with_capacity(picked.len());
            // Grammars of rows that sample this step: their masks are computed while the
            // forward pass runs (they depend only on the tokens sampled so far).
            let mut grammars = Vec::new();
            let mut want = picked.iter().peekable();
            for (i, row) in self.active.iter_mut().enumerate() {
                if let Some(p) = want.peek() {
                    if p.i == i {
                        let (cache, c) = row.cache_and_constraint();
                        if p.logits != LogitsWanted::None {
                            grammars.extend(c);
                        }
                        steps.push(SeqStep {
                            cache,
                            tokens: &p.tokens,
                            logits: p.logits,
                        });
                        want.next();
                    }
                }
            }
            let hidden: Vec<LogitsWanted> = picked.iter().map(|p| p.hidden).collect();
            // A bug in a kernel must not take the daemon down: the rows of this batch fail,
            // everyone else carries on.
            std::thread::scope(|s| {
                if !grammars.is_empty() {
                    // A failed mask is reported again (and fails its row) when applied.
                    s.spawn(move || {
                        for c in grammars {
                            let _ = c.prepare_mask();
                        }
                    });
                }
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if with_hidden {
                        model.forward_with_hidden(&mut steps, &hidden)
                    } else {
                        model.forward(&mut steps).map(|out| (out, Vec::new()))
                    }
                }))
            })
        };
        let seconds = t.elapsed();
        self.forward_time += seconds;
        self.pacer.record(seconds, decoding, prompt_tokens);
        self.steps += 1;
        let (out, hidden) = match result {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => return self.fail_rows(&picked, status_from_engine(&e)),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!("model {}: forward step panicked: {msg}", self.id);
                return self.fail_rows(&picked, Status::internal(format!("engine failure: {msg}")));
            }
        };
        let mut hidden = hidden.into_iter();
        let vocab = model.info.vocab_size;
        let mut outcomes: Vec<(usize, Outcome)> = Vec::new();
        for (p, logits) in picked.iter_mut().zip(out) {
            let h = hidden.next().unwrap_or_default();
            let outcome = match &mut self.active[p.i] {
                Row::Gen(g) => {
                    if g.prompt_left > 0 {
                        g.prompt_left -= p.tokens.len().min(g.prompt_left);
                        self.tokens_prefilled += p.tokens.len() as u64;
                    }
                    let plan = p.plan.take().expect("generation rows are planned");
                    // A verifying step emits up to drafts + 1 tokens, the one before the
                    // first rejected draft last: token j came from logits row j.
                    let mut events: Vec<StepEvent> = Vec::new();
                    let done = g.spec.finish(
                        &model,
                        &mut g.gen,
                        plan,
                        &logits,
                        h,
                        seconds.as_secs_f64(),
                        &mut |ev| events.push(ev.clone()),
                    );
                    match done {
                        Err(e) => Outcome::Failed(status_from_engine(&e)),
                        Ok(()) => {
                            let ids: Vec<u32> = events.iter().filter_map(|e| e.token).collect();
                            if !ids.is_empty() {
                                self.tokens_generated += ids.len() as u64;
                                g.first_token.get_or_insert_with(Instant::now);
                                let text: String = events.iter().map(|e| e.text.as_str()).collect();
                                let reasoning: String =
                                    events.iter().map(|e| e.reasoning.as_str()).collect();
                                g.reply_text.push_str(&text);
                                g.reasoning_text.push_str(&reasoning);
                                let logits = if g.return_logits {
                                    logits[..(ids.len() * vocab).min(logits.len())].to_vec()
                                } else {
                                    Vec::new()
                                };
                                let logprobs = match &model.text {
                                    Some(t) => events
                                        .iter()
                                        .filter_map(|e| e.logprob.as_ref())
                                        .map(|lp| wire::token_logprob(t, lp))
                                        .collect(),
                                    None => Vec::new(),
                                };
                                let tool_calls = events
                                    .iter_mut()
                                    .flat_map(|e| std::mem::take(&mut e.tool_calls))
                                    .map(|d| pb::ToolCallDelta {
                                        index: d.index as u32,
                                        id: d.id,
                                        name: d.name,
                                        arguments: d.arguments,
                                    })
                                    .collect();
                                let msg = pb::GenerateEvent {
                                    event: Some(Event::Tokens(Tokens {
                                        ids,
                                        text,
                                        logits,
                                        logprobs,
                                        reasoning,
                                        tool_calls,
                                    })),
                                };
                                if g.events.send(Ok(msg)).is_err() {
                                    g.gen.cancel();
                                }
                            }
                            let finished = events.iter().rev().find_map(|e| e.finished);
                            match finished.or(g.gen.finished()) {
                                Some(r) => Outcome::Finished(r),
                                None => Outcome::Continue,
                            }
                        }
                    }
                }
                Row::Score(s) => {
                    s.fed += p.tokens.len();
                    s.logits.extend_from_slice(&logits);
                    self.tokens_prefilled += p.tokens.len() as u64;
                    if s.fed == s.ids.len() {
                        Outcome::Finished(FinishReason::Length)
                    } else {
                        Outcome::Continue
                    }
                }
                Row::Perplexity(w) => {
                    let base = w.window * w.ctx;
                    if p.logits == LogitsWanted::All {
                        let window = &w.ids[base..base + w.ctx];
                        let vocab = model.info.vocab_size;
                        w.acc.score_rows(window, w.fed, vocab, &logits, None);
                    }
                    w.fed += p.tokens.len();
                    self.tokens_prefilled += p.tokens.len() as u64;
                    if perplexity::next_chunk(w.ctx, w.fed, 1, 1).is_some() {
                        Outcome::Continue
                    } else {
                        // The window is done: the next one starts from an empty cache.
                        w.acc.windows += 1;
                        w.window += 1;
                        w.fed = 0;
                        w.cache.truncate(0);
                        if w.window == w.windows {
                            Outcome::Finished(FinishReason::Length)
                        } else {
                            // A client that went away is dropped before the next step.
                            let _ = w.events.send(Ok(w.progress(false)));
                            Outcome::Continue
                        }
                    }
                }
            };
            if !matches!(outcome, Outcome::Continue) {
                outcomes.push((p.i, outcome));
            }
        }
        // Remove from the back so earlier indices stay valid.
        for (i, outcome) in outcomes.into_iter().rev() {
            let row = self.active.remove(i);
            self.finish_row(row, outcome);
        }
    }

    pub(super) fn fail_rows(&mut self, picked: &[Picked], st: Status) {
        for p in picked.iter().rev() {
            let row = self.active.remove(p.i);
            self.finish_row(row, Outcome::Failed(st.clone()));
        }
    }
}
