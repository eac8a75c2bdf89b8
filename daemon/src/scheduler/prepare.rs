//! A Generate/Chat job validated and turned into a row: its prompt (fresh, from the
//! prefix cache, or continuing a session), tools, grammar, drafting.

use super::jobs::{GenExtras, GenInput, GenJob};
use super::rows::{checked_generation, GenRow};
use super::thread::EngineThread;
use crate::limits;
use crate::wire::{self, now_unix_ms, status_from_engine};
use colibri_engine::structured::{GrammarCompiler, OutputFormat};
use colibri_engine::text::{ChatMessage, ReplyConfig, ToolChoice, ToolSpec};
use colibri_engine::{DraftMode, GenerateRequest, KvCache, Model, Speculator};
use colibri_proto::v1 as pb;
use pb::generate_event::{Event, Started};
use std::sync::Arc;
use std::time::Instant;
use tonic::Status;

impl EngineThread {
    /// Validates a Generate/Chat job and turns it into a row; sends Started on success.
    pub(super) fn prepare(&mut self, job: GenJob) -> Result<GenRow, Status> {
        let model = Arc::clone(&self.model);
        let max_context = model.info.max_context;
        let model_id = self.id.clone();
        let text = || {
            model.text.as_ref().ok_or_else(|| {
                Status::failed_precondition(format!(
                    "model {model_id} has no tokenizer (tokenizer.json or tiktoken.model): send token ids (prompt_ids) instead"
                ))
            })
        };
        let x = &job.extras;
        let chat_input = matches!(job.input, GenInput::Chat(_));
        if !chat_input && !x.tools.is_empty() {
            return Err(wire::invalid("tools", "are only for Chat requests"));
        }
        let offered = offered_tools(x);
        let forced = forced_tools(x)?;
        if !offered.is_empty() {
            let t = text()?;
            if t.tool_format().is_none() {
                return Err(wire::invalid(
                    "tools",
                    format!(
                        "model {model_id} (model_type {}) has no tool-call syntax in its chat template, so it cannot be given tools",
                        self.model.info.model_type
                    ),
                ));
            }
        }
        let constrained = forced.is_some() || x.response_format.is_some();
        // A chat prompt: rendered with the tools and variables; with a constraint, an open
        // think block is closed first (the grammar covers the answer).
        let render = |msgs: &[ChatMessage]| -> Result<(Vec<u32>, String), Status> {
            if msgs.is_empty() {
                return Err(wire::invalid("messages", "is empty"));
            }
            let t = text()?;
            let mut rendered = t
                .render_chat_with(msgs, true, offered, &x.template_vars)
                .map_err(|e| status_from_engine(&e))?;
            if constrained
                && t.has_think_tags()
                && colibri_engine::text::prompt_opens_think(&rendered)
            {
                rendered.push_str("</think>\n\n");
            }
            // The template wrote the special tokens itself.
            let ids = limits::encode_text(t, &rendered, false, max_context, "messages")?;
            Ok((ids, rendered))
        };
        let mut rendered_prompt = None;
        let mode = draft_mode(job.draft, job.sampling.temperature, job.extras.logprobs);
        let mut mtp = None;
        let (cache, base_len, full, chat) = match &job.session_id {
            None => {
                let feed = match &job.input {
                    GenInput::Ids(v) => v.clone(),
                    GenInput::Text {
                        text: t,
                        add_special,
                    } => limits::encode_text(
                        text()?,
                        t,
                        add_special.unwrap_or(true),
                        max_context,
                        "prompt",
                    )?,
                    GenInput::Chat(msgs) => {
                        let (ids, r) = render(msgs)?;
                        rendered_prompt = Some(r);
                        ids
                    }
                };
                let chat = match &job.input {
                    GenInput::Chat(m) => Some(m.clone()),
                    _ => None,
                };
                // The longest prefix an earlier request left in the prefix cache. Not when
                // the request asks for MTP drafts: the prefix cache keeps no MTP cache, and a
                // continued cache cannot be drafted for. Automatic drafting takes the prefix
                // (the skipped prefill is worth more) and decodes without drafts.
                let drafts = matches!(mode, DraftMode::Tokens(_)) && !self.model.net.mtp.is_empty();
                match (!drafts).then(|| self.prefix.lookup(&feed)).flatten() {
                    Some((cache, n)) => (cache, n, feed, chat),
                    None => (self.model.new_cache(), 0, feed, chat),
                }
            }
            Some(sid) => {
                let (s, _) = self.session(sid)?;
                if let Some(r) = &s.busy {
                    return Err(Status::failed_precondition(format!(
                        "session '{sid}' is already generating (request {r}); cancel it or wait"
                    )));
                }
                let mut cache = s.cache.take().expect("an idle session holds its cache");
                mtp = s.mtp.take().filter(|_| mode != DraftMode::Off);
                let result = (|| match &job.input {
                    GenInput::Ids(v) => Ok((cache.len, [&s.tokens[..], v].concat(), None, None)),
                    GenInput::Text {
                        text: t,
                        add_special,
                    } => {
                        let room = max_context.saturating_sub(s.tokens.len());
                        let ids = limits::encode_text(
                            text()?,
                            t,
                            add_special.unwrap_or(s.tokens.is_empty()),
                            room,
                            "prompt",
                        )?;
                        Ok((cache.len, [&s.tokens[..], &ids].concat(), None, None))
                    }
                    GenInput::Chat(new) => {
                        let all: Vec<ChatMessage> = s.messages.iter().chain(new).cloned().collect();
                        let (ids, r) = render(&all)?;
                        // Reuse the cached prefix the re-rendered conversation shares with
                        // the history; at least one token must be fed to get logits.
                        let agree = s
                            .tokens
                            .iter()
                            .zip(&ids)
                            .take_while(|(a, b)| a == b)
                            .count();
                        let mut common = agree.min(cache.len).min(ids.len().saturating_sub(1));
                        if let Some(m) = &mut mtp {
                            // MTP position j was built with the token at j + 1: it stays
                            // valid while that token does. The main cache goes back as far
                            // (a token or so more to feed) so that the two keep in step.
                            common = common.min(m.len().min(agree.saturating_sub(1)));
                            m.truncate(common);
                        }
                        cache.truncate(common);
                        Ok((common, ids, Some(all), Some(r)))
                    }
                })();
                match result {
                    Ok((base_len, full, chat, r)) => {
                        s.cached_len = cache.len;
                        rendered_prompt = r;
                        (cache, base_len, full, chat)
                    }
                    Err(e) => {
                        s.cache = Some(cache);
                        s.mtp = mtp;
                        return Err(e);
                    }
                }
            }
        };
        let feed = full[base_len..].to_vec();
        if feed.is_empty() {
            self.give_back(&job.session_id, cache, mtp);
            return Err(wire::invalid(
                "prompt",
                "is empty (and the session has no pending token to continue from)",
            ));
        }
        let reply = self.reply_config(&rendered_prompt, offered);
        let mut max_tokens = job.max_tokens;
        if job.clamp_max_tokens {
            match clamped_max_tokens(
                max_tokens,
                base_len + feed.len(),
                self.model.info.max_context,
            ) {
                Ok(n) => max_tokens = n,
                Err(e) => {
                    self.give_back(&job.session_id, cache, mtp);
                    return Err(e);
                }
            }
        }
        let req = GenerateRequest {
            prompt: feed.clone(),
            max_tokens,
            sampling: job.sampling.clone(),
            stop_strings: job.stop.clone(),
            ignore_eos: job.ignore_eos,
            logprobs: x.logprobs,
            reply,
        };
        let format = output_format(&model, &forced, x);
        let constraint = match format {
            None => None,
            Some(f) => match self.grammar().and_then(|g| {
                g.constraint(text()?, &f)
                    .map_err(|e| status_from_engine(&e))
            }) {
                Ok(c) => Some(c),
                Err(e) => {
                    self.give_back(&job.session_id, cache, mtp);
                    return Err(e);
                }
            },
        };
        let mut gen = match checked_generation(&self.model, cache, req) {
            Ok(g) => g,
            Err((e, cache)) => {
                self.give_back(&job.session_id, cache, mtp);
                return Err(status_from_engine(&e));
            }
        };
        // The constraint first: a constrained generation is not drafted.
        if let Some(c) = constraint {
            gen.set_constraint(c);
        }
        let spec = match Speculator::new(&self.model, &gen, &job.sampling, mode, mtp) {
            Ok(s) => s,
            Err(e) => {
                self.give_back(&job.session_id, gen.into_cache(), None);
                return Err(status_from_engine(&e));
            }
        };
        if let Some(sid) = &job.session_id {
            let s = self.sessions.get_mut(sid).expect("looked up above");
            s.busy = Some(job.request_id.clone());
        }
        let _ = job
            .events
            .send(Ok(started_event(&job, &self.id, feed.len())));
        Ok(GenRow {
            gen,
            spec,
            spec_wanted: mode != DraftMode::Off,
            request_id: job.request_id,
            session: job.session_id,
            prompt_left: feed.len(),
            prompt_tokens: feed.len(),
            cached_tokens: base_len,
            full,
            events: job.events,
            return_logits: job.return_logits,
            chat,
            reply_text: String::new(),
            reasoning_text: String::new(),
            arrived: job.arrived,
            admitted: None,
            first_token: None,
            cache_at_admission: None,
        })
    }

    /// How the reply is split (chat only): reasoning, tool calls with fresh ids.
    fn reply_config(
        &mut self,
        rendered_prompt: &Option<String>,
        offered: &[ToolSpec],
    ) -> ReplyConfig {
        match (rendered_prompt, &self.model.text) {
            (Some(r), Some(t)) => {
                self.calls_made += 1;
                let prefix = format!(
                    "call_{:x}{:04x}_",
                    now_unix_ms() & 0xffff_ffff,
                    self.calls_made & 0xffff
                );
                t.reply_config(r, offered, &prefix)
            }
            _ => Default::default(),
        }
    }

    /// The grammar compiler, built on first use (it indexes the whole vocabulary).
    pub(super) fn grammar(&mut self) -> Result<Arc<GrammarCompiler>, Status> {
        if self.grammar.is_none() {
            let t = Instant::now();
            let r = match &self.model.text {
                None => {
                    Err("the model has no tokenizer (tokenizer.json or tiktoken.model)".to_string())
                }
                Some(text) => {
                    GrammarCompiler::new(text, self.model.info.vocab_size, &self.model.info.eos_ids)
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                }
            };
            tracing::info!(
                "model {}: structured output ready in {:.0} ms",
                self.id,
                t.elapsed().as_secs_f64() * 1e3
            );
            self.grammar = Some(r);
        }
        match self.grammar.as_ref().expect("set above") {
            Ok(g) => Ok(Arc::clone(g)),
            Err(e) => Err(Status::failed_precondition(format!(
                "structured output is not available for model {}: {e}",
                self.id
            ))),
        }
    }

    pub(super) fn give_back(
        &mut self,
        session: &Option<String>,
        cache: KvCache,
        mtp: Option<KvCache>,
    ) {
        if let Some(s) = session.as_ref().and_then(|id| self.sessions.get_mut(id)) {
            s.cached_len = cache.len;
            s.cache = Some(cache);
            s.mtp = mtp;
        }
    }
}

/// Tools the model is shown (tool_choice none: not offered).
fn offered_tools(x: &GenExtras) -> &[ToolSpec] {
    if x.tool_choice == ToolChoice::None {
        &[]
    } else {
        &x.tools
    }
}

/// The tools a required or named tool_choice forces a call of (None: no forced call).
fn forced_tools(x: &GenExtras) -> Result<Option<Vec<ToolSpec>>, Status> {
    let forced = match &x.tool_choice {
        ToolChoice::Required | ToolChoice::Named(_) if x.tools.is_empty() => {
            return Err(wire::invalid(
                "tool_choice",
                "requires a call but no tools were given",
            ))
        }
        ToolChoice::Named(n) => {
            let t =
                x.tools.iter().find(|t| &t.name == n).ok_or_else(|| {
                    wire::invalid("tool_choice.name", format!("no tool named '{n}'"))
                })?;
            Some(vec![t.clone()])
        }
        ToolChoice::Required => Some(x.tools.clone()),
        _ => None,
    };
    if forced.is_some() && x.response_format.is_some() {
        return Err(wire::invalid(
            "response_format",
            "cannot be combined with a required or named tool_choice",
        ));
    }
    Ok(forced)
}

/// Automatic drafting only for greedy decoding: with sampling, speculation keeps the
/// distribution but its acceptance is lower (as `coli run --local` does).
fn draft_mode(draft: Option<usize>, temperature: f32, logprobs: Option<usize>) -> DraftMode {
    match draft {
        Some(0) => DraftMode::Off,
        Some(n) => DraftMode::Tokens(n),
        None if temperature > 0.0 => DraftMode::Off,
        // Logprobs are reported per sampled token, from that token's own logits row.
        None if logprobs.is_some() => DraftMode::Off,
        None => DraftMode::Auto,
    }
}

/// `max_tokens` reduced to the room a prompt of `used` positions leaves in the context (0 =
/// all of it); no room at all is refused like a prompt past the context.
fn clamped_max_tokens(max_tokens: usize, used: usize, max_context: usize) -> Result<usize, Status> {
    let room = max_context.saturating_sub(used);
    if room == 0 {
        // Nothing can be generated: refused like a prompt past the context.
        let (n, max) = (used, max_context);
        return Err(wire::context_exceeded(if n > max {
            format!("prompt of {n} tokens does not fit the context of {max} tokens")
        } else {
            format!(
                "prompt of {n} tokens leaves no room to generate in the context of {max} tokens"
            )
        }));
    }
    Ok(if max_tokens == 0 {
        room
    } else {
        max_tokens.min(room)
    })
}

/// The structured output a row is held to: a forced tool call in the model's syntax, or
/// the requested response format.
fn output_format(
    model: &Model,
    forced: &Option<Vec<ToolSpec>>,
    x: &GenExtras,
) -> Option<OutputFormat> {
    match (forced, &x.response_format) {
        (Some(tools), _) => Some(OutputFormat::ToolCalls {
            format: model
                .text
                .as_ref()
                .and_then(|t| t.tool_format())
                .expect("checked with the tools above"),
            tools: tools.clone(),
            parallel: x.parallel_tool_calls,
        }),
        (None, Some(f)) => Some(f.clone()),
        _ => None,
    }
}

/// The Started event: the prompt was accepted.
fn started_event(job: &GenJob, model_id: &str, prompt_tokens: usize) -> pb::GenerateEvent {
    pb::GenerateEvent {
        event: Some(Event::Started(Started {
            request_id: job.request_id.clone(),
            model: model_id.to_string(),
            session_id: job.session_id.clone().unwrap_or_default(),
            prompt_tokens: prompt_tokens as u32,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::Value::Null,
        }
    }

    fn extras(tools: &[&str], choice: ToolChoice) -> GenExtras {
        GenExtras {
            tools: tools.iter().map(|n| tool(n)).collect(),
            tool_choice: choice,
            ..Default::default()
        }
    }

    #[test]
    fn drafting_is_automatic_only_for_greedy_without_logprobs() {
        assert_eq!(draft_mode(None, 0.0, None), DraftMode::Auto);
        assert_eq!(draft_mode(None, 0.7, None), DraftMode::Off);
        assert_eq!(draft_mode(None, 0.0, Some(2)), DraftMode::Off);
        // An explicit count wins over sampling and logprobs; 0 turns drafting off.
        assert_eq!(draft_mode(Some(3), 0.7, Some(2)), DraftMode::Tokens(3));
        assert_eq!(draft_mode(Some(0), 0.0, None), DraftMode::Off);
    }

    #[test]
    fn tool_choice_decides_what_is_offered_and_forced() {
        let x = extras(&["a", "b"], ToolChoice::Auto);
        assert_eq!(offered_tools(&x).len(), 2);
        assert_eq!(forced_tools(&x).unwrap(), None);
        let x = extras(&["a", "b"], ToolChoice::None);
        assert!(offered_tools(&x).is_empty());
        let x = extras(&["a", "b"], ToolChoice::Required);
        assert_eq!(forced_tools(&x).unwrap(), Some(vec![tool("a"), tool("b")]));
        let x = extras(&["a", "b"], ToolChoice::Named("b".into()));
        assert_eq!(forced_tools(&x).unwrap(), Some(vec![tool("b")]));
    }

    #[test]
    fn impossible_tool_choices_are_refused() {
        let e = forced_tools(&extras(&[], ToolChoice::Required)).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains("tool_choice"), "{}", e.message());
        let e = forced_tools(&extras(&["a"], ToolChoice::Named("z".into()))).unwrap_err();
        assert!(e.message().contains("no tool named 'z'"), "{}", e.message());
        let mut x = extras(&["a"], ToolChoice::Required);
        x.response_format = Some(OutputFormat::JsonObject(None));
        let e = forced_tools(&x).unwrap_err();
        assert!(e.message().contains("response_format"), "{}", e.message());
    }

    #[test]
    fn max_tokens_is_clamped_to_the_room_left() {
        assert_eq!(clamped_max_tokens(0, 10, 100).unwrap(), 90);
        assert_eq!(clamped_max_tokens(20, 10, 100).unwrap(), 20);
        assert_eq!(clamped_max_tokens(500, 10, 100).unwrap(), 90);
        let full = clamped_max_tokens(5, 100, 100).unwrap_err();
        assert!(
            full.message().contains("leaves no room"),
            "{}",
            full.message()
        );
        let over = clamped_max_tokens(5, 120, 100).unwrap_err();
        assert!(
            over.message().contains("does not fit"),
            "{}",
            over.message()
        );
        assert_eq!(
            over.metadata().get(wire::ERROR_KIND_KEY).unwrap(),
            wire::CONTEXT_LENGTH_EXCEEDED
        );
    }
}
