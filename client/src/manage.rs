//! Daemon management: `coli status` / `ps`, `load`, `unload`, `stop`, `sessions`, `pin`.
//! Each prints text for people or, with `--output json`, one JSON document for scripts.

use crate::args::Global;
use crate::daemon_discovery::{self, Client, RpcResult};
use crate::output::{
    expert_key_figures, fmt_bytes, fmt_secs, print_json, print_table, OutputFormat,
};
use crate::remote::{load_model_reporting, model_id};
use anyhow::{anyhow, bail};
use clap::{Args, Subcommand};
use colibri_proto::v1 as pb;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Model folder.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Expert cache budget, e.g. 8G, 512M [default: the daemon's].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub expert_cache: Option<u64>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct UnloadArgs {
    /// Model folder (as loaded).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Args, Debug)]
pub struct StopArgs {
    /// Seconds to wait for the daemon to save its state and exit.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct SessionsArgs {
    #[command(subcommand)]
    pub action: Option<SessionsAction>,
    /// Only this model's sessions.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Subcommand, Debug)]
pub enum SessionsAction {
    /// Delete sessions (from memory and disk).
    Rm {
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
}

#[derive(Args, Debug)]
pub struct PinArgs {
    /// Model folder (as loaded).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Experts as LAYER:EXPERT, e.g. 3:17. Without any, lists the pinned experts.
    #[arg(value_name = "LAYER:EXPERT", value_parser = parse_expert)]
    pub experts: Vec<pb::ExpertRef>,
    /// Also pin the N most used experts (by the usage history).
    #[arg(long, value_name = "N", conflicts_with = "unpin")]
    pub hottest: Option<u32>,
    /// Unpin the given experts instead.
    #[arg(long)]
    pub unpin: bool,
    /// With --unpin: unpin every expert.
    #[arg(long, requires = "unpin")]
    pub all: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// "8G", "512M", "1.5GiB", "1000000" → bytes (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size like 8G or 512M"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown size unit '{u}' (use K, M, G or T)")),
    };
    Ok((v * mult as f64) as u64)
}

fn parse_expert(s: &str) -> Result<pb::ExpertRef, String> {
    let (l, e) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not LAYER:EXPERT"))?;
    Ok(pb::ExpertRef {
        layer: l
            .trim()
            .parse()
            .map_err(|_| format!("bad layer in '{s}'"))?,
        expert: e
            .trim()
            .parse()
            .map_err(|_| format!("bad expert in '{s}'"))?,
    })
}

/// Runs `f` with a client of the (auto-started) daemon.
fn with_daemon<T>(
    global: &Global,
    f: impl AsyncFnOnce(&mut Client) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    daemon_discovery::runtime()?.block_on(async {
        let mut client = daemon_discovery::ensure(global).await?;
        f(&mut client).await
    })
}

// ---------------------------------------------------------------------------------------
// JSON views of the daemon's messages (field names as in colibri.proto).

pub fn model_info_json(i: &pb::ModelInfo) -> Value {
    json!({
        "id": i.id, "model_type": i.model_type, "vocab_size": i.vocab_size,
        "hidden_size": i.hidden_size, "num_layers": i.num_layers, "max_context": i.max_context,
        "eos_ids": i.eos_ids, "bos_id": i.bos_id, "weight_bytes": i.weight_bytes,
        "has_tokenizer": i.has_tokenizer, "notes": i.notes, "layout": i.layout,
        "weight_classes": i.weight_classes.iter().map(|c| json!({
            "class": c.class, "format": c.format, "tensors": c.tensors, "bytes": c.bytes,
        })).collect::<Vec<_>>(),
    })
}

pub fn cache_json(c: &pb::ExpertCacheStats) -> Value {
    json!({
        "budget_bytes": c.budget_bytes, "used_bytes": c.used_bytes, "hits": c.hits,
        "misses": c.misses, "hit_rate": c.hit_rate, "bytes_read": c.bytes_read,
        "resident_experts": c.resident_experts, "pinned_experts": c.pinned_experts,
        "total_experts": c.total_experts, "streamed": c.streamed, "policy": c.policy,
        "readers": c.readers, "capacity_experts": c.capacity_experts,
        "expert_bytes": c.expert_bytes, "requests": c.requests,
        "inflight_hits": c.inflight_hits, "evictions": c.evictions, "tokens": c.tokens,
        "bytes_per_token": c.bytes_per_token, "reads": c.reads,
        "direct_reads": c.direct_reads, "read_errors": c.read_errors,
        "read_seconds": c.read_seconds, "disk_busy_seconds": c.disk_busy_seconds,
        "read_wait_seconds": c.read_wait_seconds,
        "disk_read_gb_per_s": c.disk_read_gb_per_s, "forward_seconds": c.forward_seconds,
        "prefetch_issued": c.prefetch_issued, "prefetch_used": c.prefetch_used,
        "prefetch_wasted": c.prefetch_wasted, "predicted": c.predicted,
        "predicted_correct": c.predicted_correct, "predicted_actual": c.predicted_actual,
        "prefetch_recall": c.prefetch_recall, "prefetch_precision": c.prefetch_precision,
        "preload_issued": c.preload_issued, "preload_bytes": c.preload_bytes,
        "notes": c.notes,
    })
}

pub fn model_status_json(m: &pb::ModelStatus) -> Value {
    json!({
        "info": m.info.as_ref().map(model_info_json),
        "active_generations": m.active_generations, "queued": m.queued,
        "live_sessions": m.live_sessions, "kv_bytes": m.kv_bytes,
        "idle_seconds": m.idle_seconds, "loaded_seconds": m.loaded_seconds, "steps": m.steps,
        "tokens_generated": m.tokens_generated, "tokens_prefilled": m.tokens_prefilled,
        "expert_cache": m.expert_cache.as_ref().map(cache_json),
        "keep_alive_seconds": m.keep_alive_seconds,
    })
}

pub fn session_json(s: &pb::SessionInfo) -> Value {
    json!({
        "id": s.id, "model": s.model, "cached_tokens": s.cached_tokens,
        "history_tokens": s.history_tokens, "kv_bytes": s.kv_bytes, "state": s.state,
        "created_unix_ms": s.created_unix_ms, "last_used_unix_ms": s.last_used_unix_ms,
        "persisted": s.persisted, "messages": s.messages,
    })
}

fn memory_json(m: &pb::MemoryStats) -> Value {
    json!({
        "rss_bytes": m.rss_bytes, "system_total_bytes": m.system_total_bytes,
        "system_available_bytes": m.system_available_bytes, "weight_bytes": m.weight_bytes,
        "kv_bytes": m.kv_bytes, "expert_cache_bytes": m.expert_cache_bytes,
    })
}

pub fn status_json(s: &pb::StatusResponse) -> Value {
    json!({
        "running": true,
        "version": s.version, "uptime_seconds": s.uptime_seconds, "pid": s.pid,
        "socket": s.socket, "state_dir": s.state_dir,
        "models": s.models.iter().map(model_status_json).collect::<Vec<_>>(),
        "memory": s.memory.as_ref().map(memory_json),
        "sessions": s.sessions.iter().map(session_json).collect::<Vec<_>>(),
        "queue_capacity": s.queue_capacity,
    })
}

fn hit_rate(c: Option<&pb::ExpertCacheStats>) -> String {
    match c {
        Some(c) if c.hits + c.misses > 0 => format!("{:.1}%", c.hit_rate * 100.0),
        _ => "-".into(),
    }
}

fn models_table(models: &[pb::ModelStatus]) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = models
        .iter()
        .map(|m| {
            let i = m.info.clone().unwrap_or_default();
            let cache = m
                .expert_cache
                .as_ref()
                .map(|c| format!("{}/{}", fmt_bytes(c.used_bytes), fmt_bytes(c.budget_bytes)))
                .unwrap_or_else(|| "-".into());
            vec![
                i.id,
                i.model_type,
                i.max_context.to_string(),
                fmt_bytes(i.weight_bytes),
                format!("{}+{}", m.active_generations, m.queued),
                m.live_sessions.to_string(),
                fmt_bytes(m.kv_bytes),
                cache,
                hit_rate(m.expert_cache.as_ref()),
                fmt_secs(m.idle_seconds),
            ]
        })
        .collect();
    print_table(
        &[
            "MODEL",
            "TYPE",
            "CONTEXT",
            "WEIGHTS",
            "RUN+QUEUE",
            "SESSIONS",
            "KV",
            "EXPERT CACHE",
            "HIT",
            "IDLE",
        ],
        &rows,
    )
}

/// What each model's load found worth telling (a missing DSA indexer, no MTP layers) and,
/// for a quantized folder, its formats per tensor class.
fn model_notes(models: &[pb::ModelStatus]) {
    for i in models.iter().filter_map(|m| m.info.as_ref()) {
        for n in &i.notes {
            println!("note: {}: {n}", i.id);
        }
        if i.weight_classes.iter().any(|c| c.format.starts_with("int")) {
            println!("formats of {} ({}):", i.id, i.layout);
            for line in format_lines(&i.weight_classes) {
                println!("  {line}");
            }
        }
    }
}

/// One line per tensor class: its formats with tensor counts and bytes.
pub fn format_lines(classes: &[pb::WeightClass]) -> Vec<String> {
    let v: Vec<colibri_engine::arch::census::WeightClass> = classes
        .iter()
        .map(|c| colibri_engine::arch::census::WeightClass {
            class: c.class.clone(),
            format: c.format.clone(),
            tensors: c.tensors as usize,
            bytes: c.bytes,
        })
        .collect();
    colibri_engine::arch::census::summary(&v)
}

/// The key figures of each streamed model's expert cache since load.
fn expert_cache_lines(models: &[pb::ModelStatus]) {
    for m in models {
        let Some(c) = m.expert_cache.as_ref().filter(|c| c.streamed) else {
            continue;
        };
        let id = m.info.as_ref().map(|i| i.id.as_str()).unwrap_or("?");
        println!(
            "experts of {id}: {}",
            expert_key_figures(&colibri_daemon::wire::store_stats(c))
        );
    }
}

fn sessions_table(sessions: &[pb::SessionInfo]) -> std::io::Result<()> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.state.clone(),
                s.messages.to_string(),
                s.cached_tokens.to_string(),
                fmt_bytes(s.kv_bytes),
                format!(
                    "{} ago",
                    fmt_secs((now_ms - s.last_used_unix_ms) as f64 / 1000.0)
                ),
                s.model.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "SESSION",
            "STATE",
            "MESSAGES",
            "TOKENS",
            "KV",
            "LAST USED",
            "MODEL",
        ],
        &rows,
    )
}

// ---------------------------------------------------------------------------------------
// Commands

pub fn status(global: &Global, args: InfoArgs) -> anyhow::Result<()> {
    let s = with_daemon(global, async |c| c.status(pb::StatusRequest {}).await.rpc())?;
    if args.output == OutputFormat::Json {
        return print_json(&status_json(&s));
    }
    println!(
        "colibrid {}  pid {}  up {}  socket {}",
        s.version,
        s.pid,
        fmt_secs(s.uptime_seconds),
        s.socket
    );
    println!("state folder {}", s.state_dir);
    if let Some(m) = &s.memory {
        println!(
            "memory: daemon {} resident; system {} available of {}; weights {}, KV {}, expert caches {}",
            fmt_bytes(m.rss_bytes),
            fmt_bytes(m.system_available_bytes),
            fmt_bytes(m.system_total_bytes),
            fmt_bytes(m.weight_bytes),
            fmt_bytes(m.kv_bytes),
            fmt_bytes(m.expert_cache_bytes)
        );
    }
    if s.models.is_empty() {
        println!("no model loaded");
    } else {
        println!();
        models_table(&s.models)?;
        expert_cache_lines(&s.models);
        model_notes(&s.models);
    }
    if !s.sessions.is_empty() {
        println!();
        sessions_table(&s.sessions)?;
    }
    Ok(())
}

pub fn ps(global: &Global, args: InfoArgs) -> anyhow::Result<()> {
    let r = with_daemon(global, async |c| {
        c.list_models(pb::ListModelsRequest {}).await.rpc()
    })?;
    if args.output == OutputFormat::Json {
        return print_json(&json!({
            "models": r.models.iter().map(model_status_json).collect::<Vec<_>>()
        }));
    }
    if r.models.is_empty() {
        println!("no model loaded");
        return Ok(());
    }
    models_table(&r.models)?;
    expert_cache_lines(&r.models);
    model_notes(&r.models);
    Ok(())
}

pub fn load(global: &Global, args: LoadArgs) -> anyhow::Result<()> {
    let model = model_id(&args.model)?;
    let t = Instant::now();
    let info = with_daemon(global, async |c| {
        load_model_reporting(c, &model, args.expert_cache, true).await
    })?;
    if args.output == OutputFormat::Json {
        return print_json(&json!({
            "info": model_info_json(&info),
            "seconds": t.elapsed().as_secs_f64(),
        }));
    }
    println!(
        "loaded {} ({}, {} layers, context {}, {} of weights) in {:.1} s",
        info.id,
        info.model_type,
        info.num_layers,
        info.max_context,
        fmt_bytes(info.weight_bytes),
        t.elapsed().as_secs_f64()
    );
    for n in &info.notes {
        println!("note: {n}");
    }
    Ok(())
}

pub fn unload(global: &Global, args: UnloadArgs) -> anyhow::Result<()> {
    let model = model_id(&args.model)?;
    let r = with_daemon(global, async |c| {
        c.unload_model(pb::UnloadModelRequest { model }).await.rpc()
    })?;
    if args.output == OutputFormat::Json {
        return print_json(&json!({"model": r.model, "sessions_saved": r.sessions_saved}));
    }
    println!("unloaded {} ({} sessions saved)", r.model, r.sessions_saved);
    Ok(())
}

/// Asks the daemon to save its state and exit, and waits until its socket stops answering.
/// Never starts a daemon.
pub fn stop(global: &Global, args: StopArgs) -> anyhow::Result<()> {
    let socket = daemon_discovery::socket_path(global);
    daemon_discovery::runtime()?.block_on(async {
        let Some(mut c) = daemon_discovery::try_connect(&socket).await else {
            eprintln!("colibrid is not running on {}", socket.display());
            return Ok(());
        };
        let pid = c
            .status(pb::StatusRequest {})
            .await
            .ok()
            .map(|r| r.into_inner().pid);
        // The daemon may close the connection while answering: only a refusal that arrives
        // with a real status matters.
        if let Err(s) = c.shutdown(pb::ShutdownRequest {}).await {
            if !matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
            ) {
                return Err(daemon_discovery::status_error(s));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(args.timeout);
        // Wait for the process rather than the socket: under socket activation systemd keeps
        // the socket open, and connecting to it would start a new daemon.
        loop {
            let gone = match pid.and_then(process_alive) {
                Some(alive) => !alive,
                None => daemon_discovery::connect(&socket).await.is_err(),
            };
            if gone {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "colibrid on {} is still running after {} s",
                    socket.display(),
                    args.timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        match pid {
            Some(pid) => eprintln!("colibrid (pid {pid}) stopped"),
            None => eprintln!("colibrid stopped"),
        }
        Ok(())
    })
}

/// Whether process `pid` still runs (a zombie, exited but not yet reaped, does not);
/// None where this platform cannot tell.
fn process_alive(pid: u32) -> Option<bool> {
    #[cfg(target_os = "linux")]
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name.
        return Some(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X"),
        );
    }
    #[cfg(unix)]
    {
        // SAFETY: signal 0 only checks that the process exists; nothing is delivered.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        Some(r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        None
    }
}

pub fn sessions(global: &Global, args: SessionsArgs) -> anyhow::Result<()> {
    let model = args.model.as_deref().map(model_id).transpose()?;
    with_daemon(global, async |c| {
        if let Some(SessionsAction::Rm { ids }) = &args.action {
            for id in ids {
                c.delete_session(pb::DeleteSessionRequest { id: id.clone() })
                    .await
                    .rpc()?;
                if args.output == OutputFormat::Text {
                    println!("deleted session {id}");
                }
            }
            if args.output == OutputFormat::Json {
                print_json(&json!({ "deleted": ids }))?;
            }
            return Ok(());
        }
        let r = c
            .list_sessions(pb::ListSessionsRequest {
                model: model.unwrap_or_default(),
            })
            .await
            .rpc()?;
        if args.output == OutputFormat::Json {
            return print_json(&json!({
                "sessions": r.sessions.iter().map(session_json).collect::<Vec<_>>()
            }));
        }
        if r.sessions.is_empty() {
            println!("no sessions");
            return Ok(());
        }
        Ok(sessions_table(&r.sessions)?)
    })
}

pub fn pin(global: &Global, args: PinArgs) -> anyhow::Result<()> {
    let model = model_id(&args.model)?;
    let r = with_daemon(global, async |c| {
        if args.unpin {
            if args.experts.is_empty() && !args.all {
                return Err(anyhow!("--unpin needs experts (LAYER:EXPERT) or --all"));
            }
            c.unpin(pb::UnpinRequest {
                model,
                experts: args.experts.clone(),
                all: args.all,
            })
            .await
            .rpc()
        } else {
            c.pin(pb::PinRequest {
                model,
                experts: args.experts.clone(),
                hottest: args.hottest.unwrap_or(0),
            })
            .await
            .rpc()
        }
    })?;
    if args.output == OutputFormat::Json {
        return print_json(&json!({
            "pinned": r.pinned.iter().map(|e| json!({"layer": e.layer, "expert": e.expert})).collect::<Vec<_>>()
        }));
    }
    if r.pinned.is_empty() {
        println!("no experts pinned");
    } else {
        let list: Vec<String> = r
            .pinned
            .iter()
            .map(|e| format!("{}:{}", e.layer, e.expert))
            .collect();
        println!("{} experts pinned: {}", list.len(), list.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("8X").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn experts_parse_as_layer_colon_expert() {
        let e = parse_expert("3:17").unwrap();
        assert_eq!((e.layer, e.expert), (3, 17));
        assert!(parse_expert("3").is_err());
        assert!(parse_expert("a:1").is_err());
    }
}
