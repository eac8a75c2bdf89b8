//! `coli chat`: an interactive conversation. Through the daemon (the default) the
//! conversation is a daemon session that survives coli and daemon restarts, and `coli chat`
//! re-attaches to the most recent one; with `--local` it lives in this process.
//!
//! Line editing and history come from rustyline. Ctrl-C while a reply streams stops that
//! reply (the session keeps what was said); Ctrl-C at the prompt clears the line; Ctrl-D or
//! /exit leaves.

use crate::args::Global;
use crate::args::SamplingArgs;
use crate::daemon_discovery::{self, status_error, Client, RpcResult};
use crate::local;
use crate::output::{fmt_bytes, RunStats};
use crate::remote::{self, finish_reason, model_id, run_stats};
use anyhow::{anyhow, bail, Context};
use clap::Args;
use colibri_engine::kv::KvCache;
use colibri_engine::text::ChatMessage;
use colibri_engine::{GenerateRequest, Generation, LogitsWanted, Model, SeqStep};
use colibri_proto::v1 as pb;
use pb::generate_event::Event;
use rustyline::error::ReadlineError;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Reply length when `--max-tokens` is not given (capped to the room left).
const DEFAULT_REPLY_TOKENS: usize = 1024;

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Model folder [default: the model of the most recent session].
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Run the engine in this process (the conversation ends with coli).
    #[arg(long)]
    pub local: bool,
    /// Start a new conversation instead of re-attaching to the last one.
    #[arg(long, conflicts_with = "session")]
    pub new: bool,
    /// Re-attach to this session.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// A system message for a new conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Tokens per reply at most [default: 1024, capped to the room left in the context].
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop a reply when this text appears (repeatable).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Collapse the model's reasoning (text between its think tags) to one line instead
    /// of streaming it dimmed.
    #[arg(long)]
    pub hide_reasoning: bool,
}

/// A piece of a streamed reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece<'a> {
    /// The answer.
    Content(&'a str),
    /// Reasoning (between the model's think tags), split by the shared reply parser.
    Reasoning(&'a str),
}

/// What one reply cost, for the footer and /stats.
struct Turn {
    stats: RunStats,
    finish: &'static str,
}

/// A conversation partner: the daemon's session or an in-process model.
trait Backend {
    /// Sends the user's message, streams the reply through `out`, returns its statistics.
    fn reply(
        &mut self,
        user: &str,
        interrupted: &AtomicBool,
        out: &mut dyn FnMut(Piece),
    ) -> anyhow::Result<Turn>;
    /// Forgets the conversation.
    fn reset(&mut self) -> anyhow::Result<()>;
    /// Lines about the conversation and the model for /stats.
    fn describe(&mut self) -> anyhow::Result<Vec<String>>;
    fn messages(&self) -> &[ChatMessage];
    /// A name for the saved transcript and the banner.
    fn label(&self) -> String;
}

pub fn chat(global: &Global, args: ChatArgs) -> anyhow::Result<()> {
    let history = daemon_discovery::state_dir(global).join("chat_history");
    // Ctrl-C is taken over only once the model is ready: until then it ends coli as usual.
    if args.local {
        let dir = args
            .model
            .clone()
            .ok_or_else(|| anyhow!("--local needs --model DIR"))?;
        let mut b = LocalChat::new(&dir, &args)?;
        repl(&mut b, &watch_interrupts(), &history, args.hide_reasoning)
    } else {
        let rt = daemon_discovery::runtime()?;
        let mut b = rt.block_on(DaemonChat::attach(global, &args))?;
        let mut b = WithRuntime { rt, chat: &mut b };
        repl(&mut b, &watch_interrupts(), &history, args.hide_reasoning)
    }
}

/// A flag raised by Ctrl-C. At the prompt rustyline reads Ctrl-C as a key, so the signal
/// only arrives while a reply streams, where it stops that reply instead of coli.
fn watch_interrupts() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            while tokio::signal::ctrl_c().await.is_ok() {
                f.store(true, Ordering::SeqCst);
            }
        });
    });
    flag
}

const HELP: &str =
    "/reset  start over   /stats  statistics   /save [FILE]  save the transcript   /exit  leave";

/// Prints a reply as it streams: the answer to stdout; reasoning dimmed before it on a
/// terminal (or collapsed to one line with --hide-reasoning), to stderr when stdout is not
/// a terminal (so that piped output holds only the answer).
struct ReplyPrinter {
    tty: bool,
    hide: bool,
    in_reasoning: bool,
    reasoning_chars: usize,
}

impl ReplyPrinter {
    fn piece(&mut self, p: Piece) {
        let mut stdout = std::io::stdout();
        match p {
            Piece::Reasoning(r) if !r.is_empty() => {
                if !self.in_reasoning {
                    self.in_reasoning = true;
                    if self.tty && !self.hide {
                        let _ = stdout.write_all(b"\x1b[2m");
                    } else if self.tty {
                        let _ = stdout.write_all(b"\x1b[2m[thinking...]\x1b[0m");
                    }
                }
                self.reasoning_chars += r.chars().count();
                if self.tty {
                    if !self.hide {
                        let _ = stdout.write_all(r.as_bytes());
                    }
                } else if !self.hide {
                    eprint!("{r}");
                }
            }
            Piece::Content(c) if !c.is_empty() => {
                self.end_reasoning();
                let _ = stdout.write_all(c.as_bytes());
            }
            _ => {}
        }
        let _ = stdout.flush();
    }

    fn end_reasoning(&mut self) {
        if !self.in_reasoning {
            return;
        }
        self.in_reasoning = false;
        let mut stdout = std::io::stdout();
        if self.tty && self.hide {
            // Collapse "[thinking...]" into a summary line.
            let _ = write!(
                stdout,
                "\r\x1b[2K\x1b[2m[thought for {} characters]\x1b[0m\n",
                self.reasoning_chars
            );
        } else if self.tty {
            let _ = stdout.write_all(b"\x1b[0m\n\n");
        } else if !self.hide {
            eprintln!();
        }
    }
}

fn repl(
    b: &mut dyn Backend,
    interrupted: &AtomicBool,
    history: &Path,
    hide_reasoning: bool,
) -> anyhow::Result<()> {
    let mut rl = rustyline::DefaultEditor::new().context("starting the line editor")?;
    let _ = rl.load_history(history);
    let tty = std::io::stdout().is_terminal();
    if std::io::stdin().is_terminal() {
        eprintln!("{}\n{HELP}", b.label());
    }
    let mut last: Option<Turn> = None;
    loop {
        let line = match rl.readline(">>> ") {
            Ok(l) => l,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("reading input"),
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let _ = rl.add_history_entry(line);
        if let Some(cmd) = line.strip_prefix('/') {
            let (name, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
            match name {
                "exit" | "quit" | "bye" => break,
                "reset" | "clear" => {
                    b.reset()?;
                    eprintln!("(conversation reset)");
                }
                "stats" => {
                    if let Some(t) = &last {
                        eprintln!("last reply: {} (finish: {})", t.stats.summary(), t.finish);
                    }
                    for l in b.describe()? {
                        eprintln!("{l}");
                    }
                }
                "save" => match save_transcript(b, rest.trim()) {
                    Ok(p) => eprintln!("(saved to {})", p.display()),
                    Err(e) => eprintln!("error: {e:#}"),
                },
                "help" | "?" => eprintln!("{HELP}"),
                other => eprintln!("unknown command /{other}; {HELP}"),
            }
            continue;
        }
        interrupted.store(false, Ordering::SeqCst);
        let mut printer = ReplyPrinter {
            tty,
            hide: hide_reasoning,
            in_reasoning: false,
            reasoning_chars: 0,
        };
        let turn = b.reply(line, interrupted, &mut |p| printer.piece(p));
        printer.end_reasoning();
        println!();
        match turn {
            Ok(t) => {
                eprintln!("{}", footer(&t, tty));
                last = Some(t);
            }
            // A failed turn (e.g. the context is full) is reported; the REPL goes on.
            Err(e) => eprintln!("error: {e:#}"),
        }
    }
    if let Some(dir) = history.parent() {
        let _ = colibri_daemon::state::create_private_dir(dir);
    }
    let _ = rl.save_history(history);
    Ok(())
}

fn footer(t: &Turn, tty: bool) -> String {
    let s = &t.stats;
    let mut parts = vec![
        format!("{} tokens", s.generated_tokens),
        format!("{:.1} tok/s", s.decode_tok_per_s),
        format!("first token {:.0} ms", s.prefill_s * 1000.0),
    ];
    // The daemon reports 0 when nothing was looked up (all experts resident).
    if let Some(h) = s.expert_cache_hit_rate.filter(|h| *h > 0.0) {
        parts.push(format!("expert cache hit {:.1}%", h * 100.0));
    }
    if t.finish == "cancelled" {
        parts.push("stopped".into());
    } else if t.finish == "length" {
        parts.push("cut at max tokens".into());
    }
    let text = format!("[{}]", parts.join(" · "));
    if tty {
        format!("\x1b[2m{text}\x1b[0m")
    } else {
        text
    }
}

/// Writes the conversation as Markdown (atomically: temp file, then rename).
fn save_transcript(b: &dyn Backend, path: &str) -> anyhow::Result<PathBuf> {
    let path = if path.is_empty() {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("colibri-chat-{stamp}.md"))
    } else {
        PathBuf::from(path)
    };
    let mut md = format!("# {}\n\n", b.label());
    for m in b.messages() {
        md.push_str(&format!("**{}**\n\n{}\n\n", m.role, m.content.trim_end()));
    }
    let tmp = path.with_extension("md.tmp");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(md.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

// ---------------------------------------------------------------------------------------
// Through the daemon

struct DaemonChat {
    client: Client,
    model: String,
    session: String,
    system: Option<String>,
    messages: Vec<ChatMessage>,
    max_tokens: Option<usize>,
    max_context: usize,
    sampling: pb::SamplingParams,
    stop: Vec<String>,
}

impl DaemonChat {
    async fn attach(global: &Global, args: &ChatArgs) -> anyhow::Result<DaemonChat> {
        let mut client = daemon_discovery::ensure(global).await?;
        let mut model = args.model.as_deref().map(model_id).transpose()?;
        if let Some(m) = &model {
            remote::load_model(&mut client, m, None).await?;
        }
        let resume_id = match (&args.session, args.new) {
            (Some(id), _) => Some(id.clone()),
            (None, true) => None,
            (None, false) => client
                .list_sessions(pb::ListSessionsRequest {
                    model: model.clone().unwrap_or_default(),
                })
                .await
                .rpc()?
                .sessions
                .into_iter()
                .next()
                .map(|s| s.id),
        };
        let mut messages = Vec::new();
        let session = match resume_id {
            Some(id) => {
                let r = client
                    .resume_session(pb::ResumeSessionRequest {
                        id: id.clone(),
                        load_model: true,
                    })
                    .await
                    .rpc()?;
                let s = r
                    .session
                    .ok_or_else(|| anyhow!("the daemon resumed {id} without its info"))?;
                if let Some(m) = &model {
                    if *m != s.model {
                        bail!("session {id} belongs to {}, not {m}", s.model);
                    }
                }
                model = Some(s.model.clone());
                messages = r
                    .messages
                    .into_iter()
                    .map(|m| ChatMessage {
                        role: m.role,
                        content: m.content,
                        ..Default::default()
                    })
                    .collect();
                eprintln!(
                    "resumed session {} ({} messages, {} tokens{})",
                    s.id,
                    messages.len(),
                    s.history_tokens,
                    if r.restored_from_disk {
                        ", restored from disk"
                    } else {
                        ""
                    }
                );
                s.id
            }
            None => {
                let m = model.clone().ok_or_else(|| {
                    anyhow!("no previous conversation to re-attach to; give --model DIR")
                })?;
                new_session(&mut client, &m).await?
            }
        };
        let model = model.unwrap_or_default();
        let info = remote::load_model(&mut client, &model, None).await?;
        Ok(DaemonChat {
            client,
            model,
            session,
            system: args.system.clone(),
            messages,
            max_tokens: args.max_tokens,
            max_context: info.max_context as usize,
            sampling: remote::sampling(&args.sampling),
            stop: args.stop.clone(),
        })
    }

    async fn reply(
        &mut self,
        user: &str,
        interrupted: &AtomicBool,
        out: &mut dyn FnMut(Piece),
    ) -> anyhow::Result<Turn> {
        let mut new = Vec::new();
        if self.messages.is_empty() {
            if let Some(s) = &self.system {
                new.push(ChatMessage {
                    role: "system".into(),
                    content: s.clone(),
                    ..Default::default()
                });
            }
        }
        new.push(ChatMessage {
            role: "user".into(),
            content: user.into(),
            ..Default::default()
        });
        // The daemon checks that the reply fits after the prompt; without --max-tokens ask
        // for at most what is left of the context.
        let used = self.session_tokens().await.unwrap_or(0);
        let room = self.max_context.saturating_sub(used);
        let max_tokens = self.max_tokens.unwrap_or(
            DEFAULT_REPLY_TOKENS
                .min(room.saturating_sub(prompt_allowance(user)))
                .max(1),
        );
        let req = pb::ChatRequest {
            model: self.model.clone(),
            messages: new
                .iter()
                .map(|m| pb::ChatMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                    ..Default::default()
                })
                .collect(),
            options: Some(pb::GenerationOptions {
                sampling: Some(self.sampling.clone()),
                max_tokens: max_tokens.min(u32::MAX as usize) as u32,
                stop: self.stop.clone(),
                ..Default::default()
            }),
            session_id: self.session.clone(),
            ..Default::default()
        };
        let mut stream = self.client.chat(req).await.rpc()?;
        let mut request_id = String::new();
        let mut text = String::new();
        let mut reasoning = String::new();
        let mut cancel_sent = false;
        let seed = self.sampling.seed.unwrap_or(0);
        loop {
            // Checked before every wait, not only when the stream is quiet: a fast model's
            // tokens arrive more often than the 50 ms tick, which then never fires.
            if !cancel_sent && !request_id.is_empty() && interrupted.load(Ordering::SeqCst) {
                cancel_sent = true;
                let _ = self
                    .client
                    .cancel(pb::CancelRequest {
                        request_id: request_id.clone(),
                        session_id: String::new(),
                    })
                    .await;
            }
            let msg = tokio::select! {
                m = stream.message() => m.map_err(status_error)?,
                // Wakes a quiet stream (a long prefill) to look at the flag again.
                _ = tokio::time::sleep(Duration::from_millis(50)), if !cancel_sent => continue,
            };
            let Some(ev) = msg else {
                bail!("the daemon closed the reply stream before it finished");
            };
            match ev.event {
                Some(Event::Started(s)) => request_id = s.request_id,
                Some(Event::Tokens(t)) => {
                    out(Piece::Reasoning(&t.reasoning));
                    out(Piece::Content(&t.text));
                    reasoning.push_str(&t.reasoning);
                    text.push_str(&t.text);
                }
                Some(Event::Finished(f)) => {
                    self.messages.extend(new);
                    self.messages.push(ChatMessage {
                        role: "assistant".into(),
                        content: text,
                        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                        ..Default::default()
                    });
                    return Ok(Turn {
                        stats: run_stats(&f.stats.unwrap_or_default(), seed),
                        finish: finish_reason(f.reason),
                    });
                }
                None => {}
            }
        }
    }

    async fn session_info(&mut self) -> anyhow::Result<Option<pb::SessionInfo>> {
        let r = self
            .client
            .list_sessions(pb::ListSessionsRequest {
                model: self.model.clone(),
            })
            .await
            .rpc()?;
        Ok(r.sessions.into_iter().find(|s| s.id == self.session))
    }

    async fn session_tokens(&mut self) -> anyhow::Result<usize> {
        Ok(self
            .session_info()
            .await?
            .map(|s| s.history_tokens as usize)
            .unwrap_or(0))
    }

    async fn reset(&mut self) -> anyhow::Result<()> {
        let old = std::mem::take(&mut self.session);
        self.session = new_session(&mut self.client, &self.model).await?;
        self.messages.clear();
        self.client
            .delete_session(pb::DeleteSessionRequest { id: old })
            .await
            .rpc()?;
        Ok(())
    }

    async fn describe(&mut self) -> anyhow::Result<Vec<String>> {
        let mut lines = Vec::new();
        if let Some(s) = self.session_info().await? {
            lines.push(format!(
                "session {}: {} messages, {} tokens ({} cached), KV {}, {}",
                s.id,
                self.messages.len(),
                s.history_tokens,
                s.cached_tokens,
                fmt_bytes(s.kv_bytes),
                s.state
            ));
        }
        let st = self.client.status(pb::StatusRequest {}).await.rpc()?;
        for m in st
            .models
            .iter()
            .filter(|m| m.info.as_ref().is_some_and(|i| i.id == self.model))
        {
            if let Some(c) = &m.expert_cache {
                lines.push(format!(
                    "expert cache: {} of {}, {} resident, {} pinned, hit rate {:.1}% ({} hits, {} misses), {} read",
                    fmt_bytes(c.used_bytes),
                    fmt_bytes(c.budget_bytes),
                    c.resident_experts,
                    c.pinned_experts,
                    c.hit_rate * 100.0,
                    c.hits,
                    c.misses,
                    fmt_bytes(c.bytes_read)
                ));
            }
            lines.push(format!(
                "model: {} steps, {} tokens generated, {} prefilled since load",
                m.steps, m.tokens_generated, m.tokens_prefilled
            ));
        }
        Ok(lines)
    }
}

/// A rough upper bound on the tokens of a user message plus its template markup, so the
/// default reply length leaves room for it (the daemon has the exact count).
fn prompt_allowance(user: &str) -> usize {
    user.len() + 32
}

async fn new_session(client: &mut Client, model: &str) -> anyhow::Result<String> {
    let s = client
        .create_session(pb::CreateSessionRequest {
            model: model.to_string(),
            id: String::new(),
        })
        .await
        .rpc()?;
    Ok(s.id)
}

/// The daemon conversation driven from the synchronous REPL.
struct WithRuntime<'a> {
    rt: tokio::runtime::Runtime,
    chat: &'a mut DaemonChat,
}

impl Backend for WithRuntime<'_> {
    fn reply(
        &mut self,
        user: &str,
        interrupted: &AtomicBool,
        out: &mut dyn FnMut(Piece),
    ) -> anyhow::Result<Turn> {
        self.rt.block_on(self.chat.reply(user, interrupted, out))
    }
    fn reset(&mut self) -> anyhow::Result<()> {
        self.rt.block_on(self.chat.reset())
    }
    fn describe(&mut self) -> anyhow::Result<Vec<String>> {
        self.rt.block_on(self.chat.describe())
    }
    fn messages(&self) -> &[ChatMessage] {
        &self.chat.messages
    }
    fn label(&self) -> String {
        format!(
            "colibri chat: {} (session {})",
            self.chat.model, self.chat.session
        )
    }
}

// ---------------------------------------------------------------------------------------
// In-process

struct LocalChat {
    model: Model,
    messages: Vec<ChatMessage>,
    /// The KV cache of the conversation and the tokens it holds.
    cache: KvCache,
    fed: Vec<u32>,
    args_max_tokens: Option<usize>,
    sampling: SamplingArgs,
    stop: Vec<String>,
}

impl LocalChat {
    fn new(dir: &Path, args: &ChatArgs) -> anyhow::Result<LocalChat> {
        let (model, _) = local::load_model(dir)?;
        if model.text.is_none() {
            bail!(
                "{} has no tokenizer (tokenizer.json or tiktoken.model); chat needs one",
                dir.display()
            );
        }
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage {
                role: "system".into(),
                content: s.clone(),
                ..Default::default()
            });
        }
        Ok(LocalChat {
            cache: model.new_cache(),
            model,
            messages,
            fed: Vec::new(),
            args_max_tokens: args.max_tokens,
            sampling: args.sampling.clone(),
            stop: args.stop.clone(),
        })
    }

    /// The conversation so far as the template renders it, with a generation prompt, and
    /// how its reply splits into reasoning and answer.
    fn rendered_ids(
        &self,
        messages: &[ChatMessage],
    ) -> anyhow::Result<(Vec<u32>, colibri_engine::text::ReplyConfig)> {
        let t = self
            .model
            .text
            .as_ref()
            .ok_or_else(|| anyhow!("no tokenizer"))?;
        let rendered = t.render_chat(messages, true)?;
        let room = self.model.info.max_context;
        Ok((
            t.encode_within(&rendered, false, room)?,
            t.reply_config(&rendered, &[], ""),
        ))
    }
}

impl Backend for LocalChat {
    fn reply(
        &mut self,
        user: &str,
        interrupted: &AtomicBool,
        out: &mut dyn FnMut(Piece),
    ) -> anyhow::Result<Turn> {
        let mut messages = self.messages.clone();
        messages.push(ChatMessage {
            role: "user".into(),
            content: user.into(),
            ..Default::default()
        });
        let (full, reply) = self.rendered_ids(&messages)?;
        // Reuse the cached prefix the new rendering shares with what was fed (the template
        // may re-render the last reply differently from the sampled tokens); at least one
        // token must be fed to get logits.
        let mut keep = self
            .fed
            .iter()
            .zip(&full)
            .take_while(|(a, b)| a == b)
            .count();
        keep = keep.min(full.len().saturating_sub(1));
        self.cache.truncate(keep);
        self.fed.truncate(keep);
        let prompt = full[keep..].to_vec();
        let max_tokens = local::max_tokens(
            self.args_max_tokens,
            full.len(),
            self.model.info.max_context,
        )
        .map_err(|e| anyhow!("{e}; /reset starts a new conversation"))?;
        let max_tokens = if self.args_max_tokens.is_none() {
            max_tokens.min(DEFAULT_REPLY_TOKENS)
        } else {
            max_tokens
        };
        let sampling = self.sampling.params();
        let seed = sampling.seed;
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens,
            sampling,
            stop_strings: self.stop.clone(),
            ignore_eos: false,
            logprobs: None,
            reply,
        };
        let cache = std::mem::take(&mut self.cache);
        let mut g = Generation::new(&self.model, cache, req)?;
        let start = Instant::now();
        let mut first: Option<Instant> = None;
        let mut text = String::new();
        let mut reasoning = String::new();
        let result = drive(&self.model, &mut g, interrupted, |ev| {
            first.get_or_insert_with(Instant::now);
            out(Piece::Reasoning(&ev.reasoning));
            out(Piece::Content(&ev.text));
            reasoning.push_str(&ev.reasoning);
            text.push_str(&ev.text);
        });
        let end = Instant::now();
        let generated = g.generated().to_vec();
        let finish = g.finished().map(|r| r.as_str()).unwrap_or("cancelled");
        self.cache = g.into_cache();
        // The cache holds the prompt and every generated token but the last.
        self.fed.extend_from_slice(&prompt);
        self.fed.extend_from_slice(&generated);
        self.fed.truncate(self.cache.len());
        result?;
        self.messages = messages;
        self.messages.push(ChatMessage {
            role: "assistant".into(),
            content: text,
            reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            ..Default::default()
        });
        let first = first.unwrap_or(end);
        Ok(Turn {
            stats: RunStats {
                prompt_tokens: prompt.len(),
                generated_tokens: generated.len(),
                prefill_s: (first - start).as_secs_f64(),
                decode_s: (end - first).as_secs_f64(),
                seed,
                cached_tokens: Some(keep),
                ..Default::default()
            }
            .with_rates(),
            finish: match finish {
                "length" => "length",
                "eos" => "eos",
                "stop" => "stop",
                _ => "cancelled",
            },
        })
    }

    fn reset(&mut self) -> anyhow::Result<()> {
        self.messages.retain(|m| m.role == "system");
        self.cache.truncate(0);
        self.fed.clear();
        Ok(())
    }

    fn describe(&mut self) -> anyhow::Result<Vec<String>> {
        Ok(vec![format!(
            "{} messages, {} tokens cached of a context of {}, KV {}",
            self.messages.len(),
            self.cache.len(),
            self.model.info.max_context,
            fmt_bytes(self.cache.size_bytes() as u64)
        )])
    }

    fn messages(&self) -> &[ChatMessage] {
        &self.messages
    }

    fn label(&self) -> String {
        format!(
            "colibri chat (in-process): {}",
            self.model.info.dir.display()
        )
    }
}

/// Steps a generation to its end like [`Generation::run`], but stops (cancels) when
/// `interrupted` is raised between two steps.
fn drive(
    model: &Model,
    g: &mut Generation,
    interrupted: &AtomicBool,
    mut on_event: impl FnMut(&colibri_engine::StepEvent),
) -> anyhow::Result<()> {
    while g.finished().is_none() {
        if interrupted.load(Ordering::SeqCst) {
            g.cancel();
            break;
        }
        let (tokens, want) = g.next_input(local::PREFILL_CHUNK);
        let tokens = tokens.to_vec();
        let out = model.forward(&mut [SeqStep {
            cache: &mut g.cache,
            tokens: &tokens,
            logits: want,
        }])?;
        let logits = (want != LogitsWanted::None).then(|| out[0].as_slice());
        let ev = g.accept(model, tokens.len(), logits)?;
        if ev.token.is_some() {
            on_event(&ev);
        }
    }
    Ok(())
}
