//! `coli doctor`: a read-only readiness check. Each line says OK, WARN or FAIL and, when it
//! is not OK, what to do about it. Nothing is changed, nothing is started.

use crate::args::Global;
use crate::daemon_discovery;
use crate::output::{fmt_bytes, fmt_secs, print_json, OutputFormat};
use clap::Args;
use colibri_proto::v1 as pb;
use serde::Serialize;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// A model folder to check (files, validity, and the read speed of its drive).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Serialize, Debug)]
pub struct Check {
    pub name: &'static str,
    pub status: Level,
    pub detail: String,
    /// What to do about a WARN or FAIL.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &'static str, status: Level, detail: impl Into<String>, fix: Option<&str>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        fix: fix.map(str::to_string),
    }
}

pub fn doctor(global: &Global, args: DoctorArgs) -> anyhow::Result<()> {
    let mut checks = vec![cpu(), memory(args.model.as_deref())];
    if let Some(dir) = &args.model {
        checks.extend(model_folder(dir));
        checks.push(disk_speed(dir));
    }
    checks.push(daemon_binary());
    checks.push(daemon(global));
    checks.push(state_dir(global));
    let failed = checks.iter().filter(|c| c.status == Level::Fail).count();
    if args.output == OutputFormat::Json {
        print_json(&serde_json::json!({ "ok": failed == 0, "checks": checks }))?;
    } else {
        let color = std::io::stdout().is_terminal();
        for c in &checks {
            let (tag, on) = match c.status {
                Level::Ok => ("OK  ", "\x1b[32m"),
                Level::Warn => ("WARN", "\x1b[33m"),
                Level::Fail => ("FAIL", "\x1b[31m"),
            };
            if color {
                println!("{on}{tag}\x1b[0m  {:<8} {}", c.name, c.detail);
            } else {
                println!("{tag}  {:<8} {}", c.name, c.detail);
            }
            if let Some(f) = &c.fix {
                println!("{:14} -> {f}", "");
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}

fn cpu() -> Check {
    use colibri_engine::kernels;
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let arch = std::env::consts::ARCH;
    let feats = kernels::cpu_features();
    let detail = format!(
        "{arch}, {threads} threads, features: {}; {}",
        if feats.is_empty() {
            "none".to_string()
        } else {
            feats.join(" ")
        },
        kernels::isa_report()
    );
    let simd_here = feats.contains(&"avx2") || feats.contains(&"neon");
    match kernels::level() {
        kernels::Level::Scalar if simd_here => check(
            "cpu",
            Level::Warn,
            detail,
            Some("COLIBRI_ISA (or COLIBRI_KERNELS) forces the portable kernels: unset it for full speed"),
        ),
        kernels::Level::Scalar => check(
            "cpu",
            Level::Warn,
            detail,
            Some("no SIMD kernels for this CPU (AVX2+FMA+F16C or NEON): the portable kernels run, several times slower"),
        ),
        _ => check("cpu", Level::Ok, detail, None),
    }
}

/// (total, available) bytes of RAM, where the platform tells.
fn ram() -> Option<(u64, Option<u64>)> {
    #[cfg(target_os = "linux")]
    {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let field = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .map(|kib| kib * 1024)
        };
        Some((field("MemTotal:")?, field("MemAvailable:")))
    }
    #[cfg(target_os = "macos")]
    {
        let out = std::process::Command::new("sysctl")
            .args(["-n", "hw.memsize"])
            .output()
            .ok()?;
        let total = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        Some((total, None))
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        None
    }
}

/// Bytes of the model's weight files.
fn model_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn memory(model: Option<&Path>) -> Check {
    let Some((total, avail)) = ram() else {
        return check(
            "memory",
            Level::Warn,
            "cannot read the RAM size on this system",
            None,
        );
    };
    let mut detail = match avail {
        Some(a) => format!("{} total, {} available", fmt_bytes(total), fmt_bytes(a)),
        None => format!("{} total", fmt_bytes(total)),
    };
    let avail_or_total = avail.unwrap_or(total);
    if let Some(dir) = model {
        let m = model_bytes(dir);
        if m > 0 {
            if m <= avail_or_total {
                detail.push_str(&format!("; the model's {} fit in RAM", fmt_bytes(m)));
            } else {
                detail.push_str(&format!(
                    "; the model's {} do not fit: routed experts stream from the disk",
                    fmt_bytes(m)
                ));
            }
        }
    }
    if avail_or_total < 2 << 30 {
        return check(
            "memory",
            Level::Warn,
            detail,
            Some("less than 2 GiB free: close other programs, or give the expert cache a small budget (coli load --expert-cache)"),
        );
    }
    check("memory", Level::Ok, detail, None)
}

/// The model check, then one line for its formats per tensor class and one per note of
/// the load (a missing DSA indexer or MTP layers: WARN, with what to do).
fn model_folder(dir: &Path) -> Vec<Check> {
    let t = Instant::now();
    match colibri_engine::Model::load(dir) {
        Ok(m) => {
            let i = &m.info;
            let mut detail = format!(
                "{}: {} ({} layers, vocab {}, context {}), {}, {} of weights, checked in {:.1} s",
                dir.display(),
                i.model_type,
                i.num_layers,
                i.vocab_size,
                i.max_context,
                i.layout,
                fmt_bytes(i.weight_bytes as u64),
                t.elapsed().as_secs_f64()
            );
            let mut out = Vec::new();
            if m.text.is_none() {
                detail.push_str("; no tokenizer (tokenizer.json or tiktoken.model)");
                out.push(check(
                    "model",
                    Level::Warn,
                    detail,
                    Some("text prompts and chat need its tokenizer, tokenizer.json or tiktoken.model (download it with the checkpoint); token ids still work"),
                ));
            } else {
                out.push(check("model", Level::Ok, detail, None));
            }
            out.push(check(
                "formats",
                Level::Ok,
                colibri_engine::arch::census::summary(&i.weight_classes).join("; "),
                None,
            ));
            for n in &i.notes {
                let fix = if n.starts_with("DSA indexer absent") {
                    Some("add the indexer weights (the C converter's --indexer pass) or convert the Hub checkpoint with coli convert")
                } else if n.starts_with("no MTP layers") {
                    Some("add the MTP layer (the C converter's --mtp pass) to draft tokens; outputs are unaffected")
                } else {
                    None
                };
                out.push(check("model", Level::Warn, n.clone(), fix));
            }
            out
        }
        Err(e) => vec![check(
            "model",
            Level::Fail,
            e.to_string(),
            Some("re-download the checkpoint (huggingface-cli download REPO --local-dir DIR) or point --model at the folder with config.json"),
        )],
    }
}

/// Reads up to 256 MiB (or 2 s) of the model's largest weight file, bypassing the page cache
/// where the platform allows (O_DIRECT), to estimate how fast experts can stream.
fn disk_speed(dir: &Path) -> Check {
    let largest = std::fs::read_dir(dir).ok().and_then(|rd| {
        rd.filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
            .filter_map(|e| Some((e.metadata().ok()?.len(), e.path())))
            .max()
    });
    let Some((size, path)) = largest else {
        return check(
            "disk",
            Level::Warn,
            format!("no *.safetensors in {}", dir.display()),
            None,
        );
    };
    match measure_read(&path) {
        Ok((bytes, secs, direct)) => {
            let rate = bytes as f64 / secs.max(1e-9);
            let how = if direct {
                "direct I/O"
            } else {
                "buffered, may include the page cache"
            };
            let detail = format!(
                "{:.0} MB/s reading {} of {} ({how})",
                rate / 1e6,
                fmt_bytes(bytes),
                path.display()
            );
            if bytes < 32 << 20 && size < 32 << 20 {
                check(
                    "disk",
                    Level::Ok,
                    format!("{detail}; file too small for a meaningful figure"),
                    None,
                )
            } else if rate < 1e9 {
                check(
                    "disk",
                    Level::Warn,
                    detail,
                    Some("experts stream at disk speed when the model does not fit in RAM: an NVMe SSD (2-7 GB/s) is several times faster"),
                )
            } else {
                check("disk", Level::Ok, detail, None)
            }
        }
        Err(e) => check(
            "disk",
            Level::Warn,
            format!("cannot read {}: {e}", path.display()),
            Some("check the file's permissions"),
        ),
    }
}

/// Returns (bytes read, seconds, whether the page cache was bypassed).
fn measure_read(path: &Path) -> std::io::Result<(u64, f64, bool)> {
    const BLOCK: usize = 4 << 20;
    const LIMIT: u64 = 256 << 20;
    let (mut file, direct) = open_direct(path)?;
    // O_DIRECT needs an aligned buffer: over-allocate and start at a 4096-byte boundary.
    let mut raw = vec![0u8; BLOCK + 4096];
    let off = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[off..off + BLOCK];
    let t = Instant::now();
    let mut total = 0u64;
    while total < LIMIT && t.elapsed() < Duration::from_secs(2) {
        let n = match file.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            // The tail of a file is not a multiple of the block size under O_DIRECT.
            Err(e) if direct && total > 0 && e.raw_os_error() == Some(22) => break,
            Err(e) => return Err(e),
        };
        total += n as u64;
    }
    Ok((total, t.elapsed().as_secs_f64(), direct))
}

fn open_direct(path: &Path) -> std::io::Result<(std::fs::File, bool)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        if let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            return Ok((f, true));
        }
    }
    Ok((std::fs::File::open(path)?, false))
}

fn daemon_binary() -> Check {
    let bin = daemon_discovery::daemon_binary();
    if bin.is_file() {
        return check("colibrid", Level::Ok, format!("{}", bin.display()), None);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(&bin).is_file()))
        .unwrap_or(false);
    if on_path {
        check(
            "colibrid",
            Level::Ok,
            format!("{} (on PATH)", bin.display()),
            None,
        )
    } else {
        check(
            "colibrid",
            Level::Fail,
            "the daemon binary is neither next to coli nor on PATH",
            Some("build both with `cargo build --release` and run target/release/coli, or copy colibrid next to coli"),
        )
    }
}

fn daemon(global: &Global) -> Check {
    let socket = daemon_discovery::socket_path(global);
    let status = daemon_discovery::runtime().ok().and_then(|rt| {
        rt.block_on(async {
            let mut c = daemon_discovery::try_connect(&socket).await?;
            c.status(pb::StatusRequest {})
                .await
                .ok()
                .map(|r| r.into_inner())
        })
    });
    match status {
        Some(s) => check(
            "daemon",
            Level::Ok,
            format!(
                "colibrid {} (pid {}) on {}, up {}, {} model(s) loaded, {} session(s)",
                s.version,
                s.pid,
                socket.display(),
                fmt_secs(s.uptime_seconds),
                s.models.len(),
                s.sessions.len()
            ),
            None,
        ),
        None if socket.exists() => check(
            "daemon",
            Level::Warn,
            format!("{} exists but nobody answers (a stale socket)", socket.display()),
            Some("coli replaces it by starting colibrid on first use; or `systemctl --user restart colibrid.socket`"),
        ),
        None => check(
            "daemon",
            Level::Warn,
            format!("not running on {}", socket.display()),
            Some("coli starts it on first use; to start it at login: systemctl --user enable --now colibrid.socket"),
        ),
    }
}

fn state_dir(global: &Global) -> Check {
    let dir = daemon_discovery::state_dir(global);
    if dir.is_dir() {
        let probe = dir.join(format!(".coli-doctor-{}", std::process::id()));
        return match std::fs::write(&probe, b"") {
            Ok(()) => {
                let _ = std::fs::remove_file(&probe);
                check("state", Level::Ok, format!("{} is writable", dir.display()), None)
            }
            Err(e) => check(
                "state",
                Level::Fail,
                format!("{} is not writable: {e}", dir.display()),
                Some("fix its owner/permissions, or pass --state-dir (COLIBRI_STATE_DIR) to a writable folder"),
            ),
        };
    }
    // Not there yet: the daemon creates it; check that the nearest existing parent allows it.
    let parent = dir.ancestors().skip(1).find(|a| a.is_dir());
    let writable = parent.is_some_and(|p| {
        std::fs::metadata(p)
            .map(|m| !m.permissions().readonly())
            .unwrap_or(false)
    });
    if writable {
        check(
            "state",
            Level::Ok,
            format!("{} will be created on first use", dir.display()),
            None,
        )
    } else {
        check(
            "state",
            Level::Fail,
            format!("{} does not exist and cannot be created", dir.display()),
            Some("pass --state-dir (COLIBRI_STATE_DIR) to a writable folder"),
        )
    }
}
