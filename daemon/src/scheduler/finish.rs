//! A row's end: its last message, its statistics, its cache back to its session or into
//! the prefix cache.

use super::rows::{Outcome, Row};
use super::thread::EngineThread;
use crate::wire::{self, now_unix_ms};
use colibri_engine::text::{ChatMessage, ToolCall};
use colibri_engine::{FinishReason, KvCache};
use colibri_proto::v1 as pb;
use pb::generate_event::{Event, Finished};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tonic::Status;

impl EngineThread {
    /// Sends a row's last message and returns its cache to its session.
    pub(super) fn finish_row(&mut self, row: Row, outcome: Outcome) {
        self.shared.outstanding.fetch_sub(1, Ordering::SeqCst);
        match row {
            Row::Perplexity(p) => {
                let msg = match outcome {
                    Outcome::Failed(st) => Err(st),
                    Outcome::Finished(FinishReason::Cancelled) => {
                        Err(Status::cancelled("perplexity request cancelled"))
                    }
                    _ => Ok(p.progress(true)),
                };
                let _ = p.events.send(msg);
            }
            Row::Score(mut s) => {
                let Some(reply) = s.reply.take() else { return };
                let r = match outcome {
                    Outcome::Failed(st) => Err(st),
                    Outcome::Finished(FinishReason::Cancelled) => {
                        Err(Status::cancelled("score request cancelled"))
                    }
                    _ => {
                        let vocab = self.model.info.vocab_size;
                        let argmax = s
                            .logits
                            .chunks(vocab)
                            .map(colibri_engine::sample::argmax)
                            .collect();
                        Ok(pb::ScoreResponse {
                            positions: s.ids.len() as u32,
                            vocab_size: vocab as u32,
                            argmax,
                            logits: if s.argmax_only { Vec::new() } else { s.logits },
                        })
                    }
                };
                let _ = reply.send(r);
            }
            Row::Gen(g) => {
                let g = *g;
                let now = Instant::now();
                let generated = g.gen.generated().to_vec();
                let reason = match &outcome {
                    Outcome::Finished(r) => Some(*r),
                    Outcome::Failed(st) => {
                        let _ = g.events.send(Err(st.clone()));
                        None
                    }
                    Outcome::Continue => unreachable!("finish_row is called for finished rows"),
                };
                if let Some(reason) = reason {
                    let ms = |d: Duration| d.as_secs_f64() * 1e3;
                    let per_s = |n: usize, d: Duration| {
                        if d.is_zero() {
                            0.0
                        } else {
                            n as f64 / d.as_secs_f64()
                        }
                    };
                    let admitted = g.admitted.unwrap_or(now);
                    let first = g.first_token;
                    let expert_cache = match (&g.cache_at_admission, self.store_stats()) {
                        (Some((before, t0)), Some(after)) => {
                            let forward = self.forward_time.saturating_sub(*t0);
                            Some(Box::new(wire::expert_cache_stats(
                                &after.since(before),
                                forward.as_secs_f64(),
                            )))
                        }
                        _ => None,
                    };
                    let stats = pb::GenerationStats {
                        prompt_tokens: g.prompt_tokens as u32,
                        cached_tokens: g.cached_tokens as u32,
                        generated_tokens: generated.len() as u32,
                        prefill_tokens_per_second: first
                            .map(|f| per_s(g.prompt_tokens, f - admitted))
                            .unwrap_or(0.0),
                        decode_tokens_per_second: first
                            .map(|f| per_s(generated.len().saturating_sub(1), now - f))
                            .unwrap_or(0.0),
                        time_to_first_token_ms: first.map(|f| ms(f - g.arrived)).unwrap_or(0.0),
                        queue_ms: ms(admitted.saturating_duration_since(g.arrived)),
                        total_ms: ms(now - g.arrived),
                        // The cache is shared: lookups of rows batched with this one count too.
                        expert_cache_hit_rate: expert_cache
                            .as_ref()
                            .map(|c| c.hit_rate)
                            .unwrap_or(0.0),
                        expert_cache,
                        speculation: g.spec_wanted.then(|| {
                            let st = g.spec.stats();
                            pb::SpeculationStats {
                                drafted: st.drafted as u32,
                                accepted: st.accepted as u32,
                                steps: st.spec_steps as u32,
                                off_reason: st.disabled.clone().unwrap_or_default(),
                            }
                        }),
                    };
                    let summary = g.gen.reply_summary().cloned().unwrap_or_default();
                    let mut reason = wire::finish_reason(reason);
                    if reason == pb::FinishReason::Eos && !summary.tool_calls.is_empty() {
                        reason = pb::FinishReason::ToolCalls;
                    }
                    let _ = g.events.send(Ok(pb::GenerateEvent {
                        event: Some(Event::Finished(Finished {
                            reason: reason as i32,
                            stats: Some(stats),
                            session_id: g.session.clone().unwrap_or_default(),
                            tool_calls: wire::pb_tool_calls(&summary.tool_calls),
                            tool_call_incomplete: summary.incomplete_call,
                            stop_sequence: g.gen.matched_stop().unwrap_or_default().to_string(),
                        })),
                    }));
                }
                let tool_calls: Vec<ToolCall> = g
                    .gen
                    .reply_summary()
                    .map(|s| s.tool_calls.clone())
                    .unwrap_or_default();
                let Some(sid) = g.session else {
                    // Keep the KV for later requests with the same prefix (not a failed
                    // step's: its cache may hold half-written positions).
                    if reason.is_some() && self.cfg.prefix_cache_bytes > 0 {
                        let cache = g.gen.into_cache();
                        let mut tokens = g.full;
                        tokens.extend_from_slice(&generated);
                        if cache.len <= tokens.len() {
                            tokens.truncate(cache.len);
                            self.prefix.insert(tokens, cache);
                        }
                    }
                    return;
                };
                let Some(s) = self.sessions.get_mut(&sid) else {
                    return;
                };
                let mut tokens = g.full;
                tokens.extend_from_slice(&generated);
                // After a failed step the caches may not agree: the MTP one goes.
                let mtp = if matches!(outcome, Outcome::Failed(_)) {
                    None
                } else {
                    g.spec.into_mtp_cache(&self.model, &g.gen)
                };
                let cache = g.gen.into_cache();
                s.cached_len = cache.len;
                s.kv_bytes = cache.size_bytes() + mtp.as_ref().map_or(0, KvCache::size_bytes);
                s.cache = Some(cache);
                s.mtp = mtp;
                s.tokens = tokens;
                if let Some(mut msgs) = g.chat {
                    msgs.push(ChatMessage {
                        role: "assistant".into(),
                        content: g.reply_text,
                        tool_calls,
                        reasoning_content: (!g.reasoning_text.is_empty())
                            .then_some(g.reasoning_text),
                        ..Default::default()
                    });
                    s.messages = msgs;
                }
                s.busy = None;
                s.persisted = false;
                s.last_used = now;
                s.last_used_ms = now_unix_ms();
            }
        }
    }
}
