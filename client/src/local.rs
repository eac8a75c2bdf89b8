//! The in-process path (`--local`): load the model in this process and drive the engine's
//! own [`Generation`] state machine, exactly as the daemon's scheduler does for one session.

use crate::args::{PromptSpec, RunArgs, ScoreArgs};
use crate::output::{expert_report, print_score, RunSink, RunStats};
use crate::progress;
use anyhow::Context;
use colibri_engine::experts::stream::{self, StreamOptions};
use colibri_engine::speculative::{DraftMode, SpeculativeGeneration};
use colibri_engine::text::ChatMessage;
use colibri_engine::{Error, GenerateRequest, Model};
use std::path::Path;
use std::time::Instant;

/// Prompt tokens fed per forward step; bounds the activation memory of a long prompt.
pub const PREFILL_CHUNK: usize = 512;

/// Tokens generated when `--max-tokens` is not given (capped to the room left).
pub const DEFAULT_MAX_TOKENS: usize = 256;

/// Loads a model folder, with a spinner on a terminal (a byte bar with rate and ETA for a
/// large one; stdout stays clean). Returns the model and the seconds taken.
pub fn load_model(dir: &Path) -> anyhow::Result<(Model, f64)> {
    load_model_with(dir, false)
}

/// [`load_model`]; `streamed_experts`: the expert files stay mapped (the expert cache will
/// read them), only the dense files may be copied into RAM.
pub fn load_model_with(dir: &Path, streamed_experts: bool) -> anyhow::Result<(Model, f64)> {
    let t = Instant::now();
    let open = colibri_engine::container::OpenOptions {
        streamed_experts,
        ..Default::default()
    };
    let bar = std::cell::RefCell::new(progress::LoadBar::new(
        dir.display().to_string(),
        progress::LOAD_BAR_MIN_BYTES,
        false,
    ));
    let model = Model::load_with(dir, &open, &|p| {
        bar.borrow_mut().update(p.done, p.total, &p.message)
    });
    bar.borrow().finish();
    let model = model?;
    for n in &model.info.notes {
        eprintln!("note: {n}");
    }
    Ok((model, t.elapsed().as_secs_f64()))
}

/// Turns the prompt into token ids: the chat template for text (unless raw), else as given.
pub fn prompt_ids(model: &Model, spec: &PromptSpec) -> anyhow::Result<Vec<u32>> {
    let (text, system, raw) = match spec {
        PromptSpec::Ids(ids) => return Ok(ids.clone()),
        PromptSpec::Text { text, system, raw } => (text, system, *raw),
    };
    let Some(t) = &model.text else {
        anyhow::bail!(
            "{} has no tokenizer (tokenizer.json or tiktoken.model), so text prompts cannot be encoded; give --prompt-ids",
            model.info.dir.display()
        );
    };
    // A text that cannot fit is refused before it is tokenized in full.
    let room = model.info.max_context;
    if raw {
        return Ok(t.encode_within(text, true, room)?);
    }
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(ChatMessage {
            role: "system".into(),
            content: s.clone(),
            ..Default::default()
        });
    }
    messages.push(ChatMessage {
        role: "user".into(),
        content: text.clone(),
        ..Default::default()
    });
    let rendered = t.render_chat(&messages, true)?;
    // The template writes the special tokens (BOS, role markers) itself.
    Ok(t.encode_within(&rendered, false, room)?)
}

/// `--max-tokens`, or the default capped to the context room. A prompt that leaves no room
/// is an error, never a silent truncation.
pub fn max_tokens(
    requested: Option<usize>,
    prompt_len: usize,
    max_context: usize,
) -> Result<usize, Error> {
    if prompt_len >= max_context {
        // A prompt that exactly fills the context leaves no room for one generated token.
        return Err(Error::ContextOverflow {
            needed: prompt_len.max(max_context + 1),
            max: max_context,
        });
    }
    Ok(requested.unwrap_or(DEFAULT_MAX_TOKENS.min(max_context - prompt_len)))
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let spec = args.prompt_spec()?;
    let (mut model, load_s) = load_model_with(&args.target.model, args.expert_cache.is_some())?;
    let streaming = match args.expert_cache {
        Some(mib) => {
            let opts = StreamOptions {
                budget: Some(mib << 20),
                ..Default::default()
            };
            let s = stream::enable(&mut model.net, &model.info.dir, &opts)?;
            for w in &s.warnings {
                eprintln!("warning: {w}");
            }
            Some(s)
        }
        None => None,
    };
    let prompt = prompt_ids(&model, &spec)?;
    let sampling = args.sampling.params();
    let seed = sampling.seed;
    let req = GenerateRequest {
        max_tokens: max_tokens(args.max_tokens, prompt.len(), model.info.max_context)?,
        prompt: prompt.clone(),
        sampling,
        stop_strings: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        ..Default::default()
    };
    // Automatic drafting only for greedy decoding: with sampling, speculation keeps the
    // distribution but a fixed seed would give other tokens depending on measured speed.
    let mode = match DraftMode::from_flags(args.draft, args.no_draft)? {
        DraftMode::Auto if req.sampling.temperature > 0.0 => DraftMode::Off,
        m => m,
    };
    let mut generation = SpeculativeGeneration::new(&model, model.new_cache(), req, mode)?;
    let mut sink = RunSink::new(args.output);
    let start = Instant::now();
    let mut first_token: Option<Instant> = None;
    let mut write_err: Option<std::io::Error> = None;
    generation.run(&model, PREFILL_CHUNK, |ev| {
        first_token.get_or_insert_with(Instant::now);
        if let (Some(id), None) = (ev.token, &write_err) {
            if let Err(e) = sink.token(id, &ev.text) {
                write_err = Some(e);
            }
        }
    })?;
    if let Some(e) = write_err {
        return Err(e).context("writing to stdout");
    }
    let spec = generation.stats().clone();
    let store = streaming.as_ref().map(|s| s.stats());
    let generation = generation.into_generation();
    let end = Instant::now();
    let first = first_token.unwrap_or(end);
    let stats = RunStats {
        prompt_tokens: prompt.len(),
        generated_tokens: generation.generated().len(),
        load_s: Some(load_s),
        prefill_s: (first - start).as_secs_f64(),
        decode_s: (end - first).as_secs_f64(),
        seed,
        expert_cache_hit_rate: store.as_ref().map(|s| s.hit_rate()),
        expert_cache: store,
        ..Default::default()
    }
    .with_rates();
    let reason = generation
        .finished()
        .map(|r| r.as_str())
        .unwrap_or("unknown");
    sink.finish(reason, &stats)?;
    if args.stats {
        eprintln!("{} (finish: {reason})", stats.summary());
        if let Some(st) = &stats.expert_cache {
            eprint!("{}", expert_report(st, stats.prefill_s + stats.decode_s));
        }
        match &spec.disabled {
            Some(why) if spec.drafted == 0 => eprintln!("speculation: off ({why})"),
            _ => eprintln!(
                "speculation: {} drafted, {} accepted ({:.1}%){}",
                spec.drafted,
                spec.accepted,
                spec.acceptance() * 100.0,
                spec.disabled
                    .as_ref()
                    .map(|w| format!(", then stopped: {w}"))
                    .unwrap_or_default()
            ),
        }
    }
    Ok(())
}

pub fn score(args: &ScoreArgs) -> anyhow::Result<()> {
    let (model, _) = load_model(&args.target.model)?;
    let logits = model.score(&args.ids)?;
    print_score(args.output, model.info.vocab_size, &logits)
}
