//! The daemon path of `coli run` and `coli score`: the same arguments and output as the
//! in-process path, with the model loaded (once) and run by colibrid.

use crate::args::{PromptSpec, RunArgs, SamplingArgs, ScoreArgs};
use crate::daemon_discovery::{status_error, Client, RpcResult};
use crate::local;
use crate::output::{expert_report, print_argmax, print_score, RunSink, RunStats};
use crate::progress;
use anyhow::{anyhow, Context};
use colibri_proto::v1 as pb;
use pb::generate_event::Event;
use pb::load_model_progress::Stage;
use std::path::Path;

/// The model id sent to the daemon: an absolute path, since the daemon's working folder is
/// not ours. The daemon canonicalizes it again and reports a missing folder itself.
pub fn model_id(dir: &Path) -> anyhow::Result<String> {
    let abs = std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .with_context(|| format!("resolving {}", dir.display()))?;
    abs.into_os_string()
        .into_string()
        .map_err(|p| anyhow!("model path {} is not valid UTF-8", Path::new(&p).display()))
}

/// Loads `model` in the daemon (a no-op when it is loaded), showing progress on a terminal.
pub async fn load_model(
    client: &mut Client,
    model: &str,
    expert_cache_bytes: Option<u64>,
) -> anyhow::Result<pb::ModelInfo> {
    load_model_reporting(client, model, expert_cache_bytes, false).await
}

/// [`load_model`]; with `lines`, progress also goes to stderr as plain lines when it is not
/// a terminal (`coli load`).
pub async fn load_model_reporting(
    client: &mut Client,
    model: &str,
    expert_cache_bytes: Option<u64>,
    lines: bool,
) -> anyhow::Result<pb::ModelInfo> {
    let mut stream = client
        .load_model(pb::LoadModelRequest {
            model: model.to_string(),
            expert_cache_bytes,
        })
        .await
        .rpc()?;
    let name = Path::new(model)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.to_string());
    // The daemon reports per layer, at most every 100 ms: any size gets the byte bar.
    let mut bar = progress::LoadBar::new(name, 0, lines);
    let result = async {
        while let Some(p) = stream.message().await.map_err(status_error)? {
            if p.stage == Stage::Ready as i32 {
                return p
                    .info
                    .ok_or_else(|| anyhow!("the daemon reported {model} ready without its info"));
            }
            bar.update(p.done, p.total, &p.message);
        }
        Err(anyhow!(
            "the daemon ended the load of {model} without reporting it ready"
        ))
    }
    .await;
    bar.finish();
    result
}

pub fn sampling(s: &SamplingArgs) -> pb::SamplingParams {
    let p = s.params();
    pb::SamplingParams {
        temperature: Some(p.temperature),
        top_k: p.top_k.min(u32::MAX as usize) as u32,
        top_p: Some(p.top_p),
        min_p: Some(p.min_p),
        repetition_penalty: Some(p.repetition_penalty),
        seed: Some(p.seed),
        frequency_penalty: Some(p.frequency_penalty),
        presence_penalty: Some(p.presence_penalty),
        ..Default::default()
    }
}

/// Token ids of a prompt, tokenized (and templated) by the daemon exactly as the in-process
/// path does it: the template writes its own special tokens, raw text gets the tokenizer's.
pub async fn prompt_ids(
    client: &mut Client,
    model: &str,
    spec: &PromptSpec,
) -> anyhow::Result<Vec<u32>> {
    let req = match spec {
        PromptSpec::Ids(ids) => return Ok(ids.clone()),
        PromptSpec::Text {
            text, raw: true, ..
        } => pb::TokenizeRequest {
            model: model.to_string(),
            text: text.clone(),
            add_special_tokens: Some(true),
            messages: vec![],
        },
        PromptSpec::Text {
            text,
            system,
            raw: false,
        } => pb::TokenizeRequest {
            model: model.to_string(),
            text: String::new(),
            add_special_tokens: Some(false),
            messages: chat_messages(system.as_deref(), text),
        },
    };
    Ok(client.tokenize(req).await.rpc()?.ids)
}

fn chat_messages(system: Option<&str>, user: &str) -> Vec<pb::ChatMessage> {
    let mut m = Vec::new();
    if let Some(s) = system {
        m.push(pb::ChatMessage {
            role: "system".into(),
            content: s.into(),
            ..Default::default()
        });
    }
    m.push(pb::ChatMessage {
        role: "user".into(),
        content: user.into(),
        ..Default::default()
    });
    m
}

pub fn finish_reason(r: i32) -> &'static str {
    match pb::FinishReason::try_from(r) {
        Ok(pb::FinishReason::Length) => "length",
        Ok(pb::FinishReason::Eos) => "eos",
        Ok(pb::FinishReason::Stop) => "stop",
        Ok(pb::FinishReason::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

pub fn run_stats(s: &pb::GenerationStats, seed: u64) -> RunStats {
    let ttft = s.time_to_first_token_ms / 1000.0;
    RunStats {
        // The whole prompt: what was prefilled plus what a cache supplied.
        prompt_tokens: (s.prompt_tokens + s.cached_tokens) as usize,
        generated_tokens: s.generated_tokens as usize,
        load_s: None,
        prefill_s: ttft,
        decode_s: (s.total_ms / 1000.0 - ttft).max(0.0),
        prefill_tok_per_s: s.prefill_tokens_per_second,
        decode_tok_per_s: s.decode_tokens_per_second,
        seed,
        cached_tokens: Some(s.cached_tokens as usize),
        queue_ms: Some(s.queue_ms),
        expert_cache_hit_rate: Some(s.expert_cache_hit_rate),
        expert_cache: s
            .expert_cache
            .as_ref()
            .map(|c| colibri_daemon::wire::store_stats(c)),
    }
}

pub async fn run(client: &mut Client, args: &RunArgs) -> anyhow::Result<()> {
    let spec = args.prompt_spec()?;
    let model = model_id(&args.target.model)?;
    let info = load_model(client, &model, args.expert_cache.map(|mib| mib << 20)).await?;
    let prompt = prompt_ids(client, &model, &spec).await?;
    let max_tokens = local::max_tokens(args.max_tokens, prompt.len(), info.max_context as usize)?;
    let sampling = sampling(&args.sampling);
    let seed = sampling.seed.unwrap_or(0);
    let req = pb::GenerateRequest {
        model,
        prompt_ids: prompt,
        options: Some(pb::GenerationOptions {
            sampling: Some(sampling),
            max_tokens: max_tokens.min(u32::MAX as usize) as u32,
            stop: args.stop.clone(),
            ignore_eos: args.ignore_eos,
            draft_tokens: if args.no_draft {
                Some(0)
            } else {
                args.draft.map(|n| n.min(u32::MAX as usize) as u32)
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut stream = client.generate(req).await.rpc()?;
    let mut sink = RunSink::new(args.output);
    while let Some(ev) = stream.message().await.map_err(status_error)? {
        match ev.event {
            Some(Event::Tokens(t)) => sink.tokens(&t.ids, &t.text)?,
            Some(Event::Finished(f)) => {
                let pb_stats = f.stats.unwrap_or_default();
                let stats = run_stats(&pb_stats, seed);
                let reason = finish_reason(f.reason);
                sink.finish(reason, &stats)?;
                if args.stats {
                    eprintln!("{} (finish: {reason})", stats.summary());
                    // The engine's time in forward passes while the request ran: the daemon's
                    // counterpart of the in-process run's prefill + decode time.
                    if let (Some(st), Some(c)) = (&stats.expert_cache, &pb_stats.expert_cache) {
                        eprint!("{}", expert_report(st, c.forward_seconds));
                    }
                    if let Some(sp) = &pb_stats.speculation {
                        eprintln!("{}", speculation_line(sp));
                    }
                }
                return Ok(());
            }
            Some(Event::Started(_)) | None => {}
        }
    }
    Err(anyhow!(
        "the daemon closed the generation stream before it finished"
    ))
}

/// The daemon's account of MTP drafting, worded as `coli run --local --stats` words it.
pub fn speculation_line(s: &pb::SpeculationStats) -> String {
    if s.drafted == 0 {
        let why = if s.off_reason.is_empty() {
            "nothing drafted"
        } else {
            &s.off_reason
        };
        return format!("speculation: off ({why})");
    }
    format!(
        "speculation: {} drafted, {} accepted ({:.1}%){}",
        s.drafted,
        s.accepted,
        100.0 * f64::from(s.accepted) / f64::from(s.drafted),
        if s.off_reason.is_empty() {
            String::new()
        } else {
            format!(", then stopped: {}", s.off_reason)
        }
    )
}

pub async fn score(client: &mut Client, args: &ScoreArgs) -> anyhow::Result<()> {
    let model = model_id(&args.target.model)?;
    load_model(client, &model, None).await?;
    let argmax_only = args.output == crate::output::OutputFormat::Ids;
    let r = client
        .score(pb::ScoreRequest {
            model,
            ids: args.ids.clone(),
            argmax_only,
        })
        .await
        .rpc()?;
    if argmax_only {
        print_argmax(&r.argmax)
    } else {
        print_score(args.output, r.vocab_size as usize, &r.logits)
    }
}
