//! `coli synth`: a random-weight model with a real architecture's full shape, written straight
//! into the container format (for benchmarks without a download), or as a Hub checkpoint
//! (`--format hf`) that other engines convert, so both run the same weights.

use crate::convert::Bar;
use anyhow::Context;
use clap::Args;
use colibri_engine::convert::parse_format;
use colibri_engine::synth::{self, SynthFormat, SynthOptions};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// The architecture to imitate: olmoe-1b-7b, qwen3-30b-a3b, mixtral-8x7b.
    #[arg(long)]
    pub like: String,
    /// The folder to write.
    #[arg(long, value_name = "DIR")]
    pub output: PathBuf,
    /// What to write: a colibri container, or a Hub checkpoint (bf16 safetensors shards,
    /// tokenizer) that other engines' converters read (--experts/--dense do not apply).
    #[arg(long, default_value = "container", value_parser = ["container", "hf"])]
    pub format: String,
    /// Format of the routed experts.
    #[arg(long, default_value = "int4", value_parser = ["int4", "int8", "int2", "bf16"])]
    pub experts: String,
    /// Elements per scale of int4/int2 (0 = one per row).
    #[arg(long, default_value_t = 64)]
    pub group_size: u32,
    /// Format of the other matrices.
    #[arg(long, default_value = "bf16", value_parser = ["int8", "bf16"])]
    pub dense: String,
    /// Number of layers [default: the architecture's].
    #[arg(long)]
    pub layers: Option<usize>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn synth(a: SynthArgs) -> anyhow::Result<()> {
    let opts = SynthOptions {
        like: a.like.clone(),
        output: a.output.clone(),
        format: if a.format == "hf" {
            SynthFormat::Hf
        } else {
            SynthFormat::Container
        },
        experts: parse_format(&a.experts, a.group_size)?,
        dense: parse_format(&a.dense, 0)?,
        layers: a.layers,
        seed: a.seed,
    };
    let bar = Bar::new();
    let t = std::time::Instant::now();
    let bytes =
        synth::synth(&opts, &bar).with_context(|| format!("writing {}", a.output.display()))?;
    bar.0.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "wrote {} like {}: {:.2} GB in {:.1} s ({:.2} GB/s)",
        a.output.display(),
        a.like,
        bytes as f64 / 1e9,
        secs,
        bytes as f64 / 1e9 / secs.max(1e-9)
    );
    Ok(())
}
