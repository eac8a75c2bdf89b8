//! How results reach stdout: the `--output` formats and the sink that streams a generation.
//! Both the in-process path and the daemon path feed the same sink, so the two print
//! identically.

use colibri_engine::experts::StoreStats;
use serde::Serialize;
use std::io::{self, Write};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Human-readable text.
    Text,
    /// Token ids, space separated, on one line.
    Ids,
    /// One JSON document.
    Json,
}

/// Timing and counts of one generation.
#[derive(Serialize, Clone, Debug, Default)]
pub struct RunStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Seconds spent loading the model (in-process runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_s: Option<f64>,
    /// Seconds from the start of the prompt to the first generated token.
    pub prefill_s: f64,
    /// Seconds from the first generated token to the last.
    pub decode_s: f64,
    pub prefill_tok_per_s: f64,
    /// Decode speed over the tokens after the first.
    pub decode_tok_per_s: f64,
    pub seed: u64,
    /// Tokens of a session's cache reused without prefill (daemon runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<usize>,
    /// Time spent waiting for a slot in the daemon's engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_ms: Option<f64>,
    /// Expert cache hits / lookups during the request (daemon runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_cache_hit_rate: Option<f64>,
    /// The expert cache's statistics over the run (streamed experts only); through the
    /// daemon, the change while the request ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_cache: Option<StoreStats>,
}

impl RunStats {
    /// Fills the rates from the counts and times.
    pub fn with_rates(mut self) -> Self {
        self.prefill_tok_per_s = rate(self.prompt_tokens, self.prefill_s);
        self.decode_tok_per_s = rate(self.generated_tokens.saturating_sub(1), self.decode_s);
        self
    }

    pub fn summary(&self) -> String {
        let load = self
            .load_s
            .map(|s| format!("load {s:.2} s, "))
            .unwrap_or_default();
        let hits = self
            .expert_cache_hit_rate
            .map(|h| format!(", expert cache hit {:.1}%", h * 100.0))
            .unwrap_or_default();
        format!(
            "{load}prompt {} tok in {:.2} s ({:.1} tok/s), generated {} tok, decode {:.1} tok/s{hits}, seed {}",
            self.prompt_tokens,
            self.prefill_s,
            self.prefill_tok_per_s,
            self.generated_tokens,
            self.decode_tok_per_s,
            self.seed
        )
    }
}

/// The expert cache's key figures on one line (`coli run --stats`, `coli status`).
pub fn expert_key_figures(st: &StoreStats) -> String {
    format!(
        "hit {:.1}%, {:.2} MB/token, disk {:.2} GB/s, prefetch recall {:.0}% precision {:.0}%",
        st.hit_rate() * 100.0,
        st.bytes_per_token() / 1e6,
        st.disk_gbps(),
        st.prefetch_recall() * 100.0,
        st.prefetch_precision() * 100.0
    )
}

/// What `coli run --stats` prints about the expert cache, the same in-process and through
/// the daemon: the key figures and the time blocked on reads against `running_s` (the time
/// the run spent in the engine), then the store's own report (its `Display`).
pub fn expert_report(st: &StoreStats, running_s: f64) -> String {
    format!(
        "experts: {}, waited {:.2} s on reads of {:.2} s running ({:.2} s computing)\n{st}",
        expert_key_figures(st),
        st.wait_seconds,
        running_s,
        (running_s - st.wait_seconds).max(0.0)
    )
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

#[derive(Serialize)]
struct RunJson<'a> {
    ids: &'a [u32],
    text: &'a str,
    finish_reason: &'a str,
    stats: &'a RunStats,
}

/// Receives a generation token by token and prints it in the chosen format: `text` streams
/// as tokens arrive, `ids` and `json` print once at the end.
pub struct RunSink {
    format: OutputFormat,
    ids: Vec<u32>,
    text: String,
}

impl RunSink {
    pub fn new(format: OutputFormat) -> Self {
        RunSink {
            format,
            ids: Vec::new(),
            text: String::new(),
        }
    }

    pub fn token(&mut self, id: u32, delta: &str) -> io::Result<()> {
        self.tokens(&[id], delta)
    }

    /// Several tokens (one engine step) and the text that became final with them.
    pub fn tokens(&mut self, ids: &[u32], delta: &str) -> io::Result<()> {
        self.ids.extend_from_slice(ids);
        self.text.push_str(delta);
        if self.format == OutputFormat::Text && !delta.is_empty() {
            let mut out = io::stdout().lock();
            out.write_all(delta.as_bytes())?;
            out.flush()?;
        }
        Ok(())
    }

    pub fn finish(self, finish_reason: &str, stats: &RunStats) -> io::Result<()> {
        let mut out = io::stdout().lock();
        match self.format {
            OutputFormat::Text => writeln!(out)?,
            OutputFormat::Ids => writeln!(out, "{}", join_ids(&self.ids))?,
            OutputFormat::Json => {
                let doc = RunJson {
                    ids: &self.ids,
                    text: &self.text,
                    finish_reason,
                    stats,
                };
                serde_json::to_writer(&mut out, &doc)?;
                writeln!(out)?;
            }
        }
        out.flush()
    }
}

pub fn join_ids(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Serialize)]
struct ScoreJson<'a> {
    argmax: Vec<u32>,
    logits: Vec<&'a [f32]>,
}

/// Prints teacher-forced logits (`rows × vocab`, row-major).
pub fn print_score(format: OutputFormat, vocab: usize, logits: &[f32]) -> anyhow::Result<()> {
    anyhow::ensure!(
        vocab > 0 && logits.len() / vocab * vocab == logits.len(),
        "the engine returned {} logits, not a multiple of the vocabulary size {vocab}",
        logits.len()
    );
    let rows: Vec<&[f32]> = logits.chunks_exact(vocab).collect();
    let argmax: Vec<u32> = rows
        .iter()
        .map(|r| colibri_engine::sample::argmax(r))
        .collect();
    let mut out = io::BufWriter::new(io::stdout().lock());
    match format {
        OutputFormat::Json => {
            serde_json::to_writer(
                &mut out,
                &ScoreJson {
                    argmax,
                    logits: rows,
                },
            )?;
            writeln!(out)?;
        }
        OutputFormat::Ids => {
            drop(out);
            return print_argmax(&argmax);
        }
        OutputFormat::Text => {
            for (pos, (row, best)) in rows.iter().zip(&argmax).enumerate() {
                writeln!(
                    out,
                    "{pos}\targmax {best}\tlogit {:.4}",
                    row[*best as usize]
                )?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// Prints the argmax of each position, space separated, on one line.
/// One line on stdout, flushed.
pub fn print_line(line: &str) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

pub fn print_argmax(argmax: &[u32]) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    writeln!(out, "{}", join_ids(argmax))?;
    out.flush()?;
    Ok(())
}

/// A closed stdout (`coli run ... | head`) ends the program quietly, not as an error.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
            || c.downcast_ref::<serde_json::Error>()
                .and_then(|j| j.io_error_kind())
                .is_some_and(|k| k == io::ErrorKind::BrokenPipe)
    })
}

/// Bytes in binary units, e.g. "1.5 GiB".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A duration in the largest sensible units, e.g. "3m12s".
pub fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// Prints rows as left-aligned columns under a header.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = io::stdout().lock();
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    out.flush()
}

/// Prints one JSON document on stdout.
pub fn print_json(v: &serde_json::Value) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}
