//! How results reach stdout: the `--output` formats and the sink that streams a generation.
//! Both the in-process path and the daemon path feed the same sink, so the two print
//! identically.

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
        format!(
            "{load}prompt {} tok in {:.2} s ({:.1} tok/s), generated {} tok, decode {:.1} tok/s, seed {}",
            self.prompt_tokens,
            self.prefill_s,
            self.prefill_tok_per_s,
            self.generated_tokens,
            self.decode_tok_per_s,
            self.seed
        )
    }
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
        self.ids.push(id);
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
        OutputFormat::Ids => writeln!(out, "{}", join_ids(&argmax))?,
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
