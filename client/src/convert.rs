//! `coli convert`: a Hugging Face checkpoint folder → a colibri container (docs/FORMAT.md).
//! The work is `engine::convert`; this file parses options and draws the progress bar.

use anyhow::Context;
use clap::Args;
use colibri_engine::convert::{self, ConvertOptions, Progress};
use colibri_engine::tensor::WeightFormat;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The Hub checkpoint folder (config.json, *.safetensors; bf16, f16, f32 or FP8 e4m3).
    #[arg(long, value_name = "HF_DIR")]
    pub input: PathBuf,
    /// The container folder to write (an interrupted conversion into it resumes).
    #[arg(long, value_name = "DIR")]
    pub output: PathBuf,
    /// Format of the routed experts (int3: groups of 64 with f32 scales, 3.5 bits per weight,
    /// the colibri C engine's format).
    #[arg(long, default_value = "int4", value_parser = ["int4", "int8", "int3", "int2", "bf16"])]
    pub experts: String,
    /// Elements per scale of int4/int2 (32, 64, 128, ...; 0 = one scale per row).
    #[arg(long, default_value_t = 64)]
    pub group_size: u32,
    /// Format of the other matrices (attention, shared experts, embeddings, lm_head):
    /// bf16, int8 (one scale per row), int8-g32 / int8-g64 (f16 scale per 32 or 64
    /// elements), int5-g32, int4-g32 / int4-g64; routers and the sparse-attention indexer
    /// always stay exact.
    #[arg(long, default_value = "bf16")]
    pub dense: String,
    /// Format of the attention projections, when it should differ from --dense (e.g.
    /// int4-g32 attention with int8-g32 for the rest).
    #[arg(long)]
    pub attention: Option<String>,
    /// Format of the output head (lm_head, and the embedding table when tied to it), when it
    /// should differ from --dense: decode reads all of it for every token. int5-g32 (5.5
    /// bits) keeps it close to int8's accuracy; int4-g32 is smaller and lossier
    /// (docs/FORMAT.md).
    #[arg(long)]
    pub lm_head: Option<String>,
    /// How int4 rows (groups of 32 or 64) are laid out: `rows8`, 8 rows interleaved so the
    /// kernels find them in the lanes of a vector (faster decode and prefill on x86), or
    /// `rows`, each row on its own (docs/FORMAT.md).
    #[arg(long, default_value = "rows8", value_parser = ["rows8", "rows"])]
    pub int4_layout: String,
    /// Worker threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
}

/// A byte-count bar with rate and ETA (hidden when stderr is not a terminal).
pub struct Bar(pub ProgressBar);

impl Bar {
    pub fn new() -> Bar {
        if !std::io::stderr().is_terminal() {
            return Bar(ProgressBar::hidden());
        }
        let pb = ProgressBar::new(0);
        pb.set_style(
            ProgressStyle::with_template(
                "{msg:28!} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        Bar(pb)
    }
}

impl Progress for Bar {
    fn begin(&self, total: u64, _parts: usize, _done: usize) {
        self.0.set_length(total);
    }
    fn advance(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn message(&self, msg: &str) {
        self.0.set_message(msg.to_string());
    }
}

pub fn convert(a: ConvertArgs) -> anyhow::Result<()> {
    if let Some(t) = a.threads {
        rayon_threads(t)?;
    }
    let opts = ConvertOptions {
        input: a.input.clone(),
        output: a.output.clone(),
        experts: convert::parse_format(&a.experts, a.group_size)?,
        dense: convert::parse_format(&a.dense, 0)?,
        attention: optional_format(&a.attention)?,
        lm_head: optional_format(&a.lm_head)?,
        interleave: a.int4_layout == "rows8",
    };
    let bar = Bar::new();
    let t = std::time::Instant::now();
    let s = convert::convert(&opts, &bar)
        .with_context(|| format!("converting {}", a.input.display()))?;
    bar.0.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} ({} parts, {} already done): {:.2} GB in {:.1} s ({:.2} GB/s)",
        a.output.display(),
        s.parts,
        s.resumed_parts,
        s.bytes_written as f64 / 1e9,
        secs,
        s.bytes_written as f64 / 1e9 / secs.max(1e-9)
    );
    Ok(())
}

/// A format option that may be absent (`--attention`, `--lm-head`).
fn optional_format(name: &Option<String>) -> anyhow::Result<Option<WeightFormat>> {
    Ok(name
        .as_deref()
        .map(|f| convert::parse_format(f, 0))
        .transpose()?)
}

/// Sizes rayon's global pool (once per process).
pub fn rayon_threads(n: usize) -> anyhow::Result<()> {
    std::env::set_var("RAYON_NUM_THREADS", n.max(1).to_string());
    Ok(())
}
