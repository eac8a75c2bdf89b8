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
    #[arg(long, required_unless_present = "like_trace")]
    pub like: Option<String>,
    /// Instead of --like: the expert topology (layers × experts, top-k, about the expert
    /// size) of a routing trace, for `coli trace --replay-routing TRACE`. A known
    /// architecture of the same layers × experts is used as it is (Qwen3-30B-A3B for its
    /// trace, with the trace's top-k); a known name here is the same as --like.
    #[arg(long, value_name = "TRACE", conflicts_with = "like")]
    pub like_trace: Option<String>,
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
    /// Format of the other matrices: bf16, int8 (per row), int8-g32, int8-g64, int4-g32,
    /// int4-g64.
    #[arg(long, default_value = "bf16")]
    pub dense: String,
    /// Number of layers [default: the architecture's].
    #[arg(long)]
    pub layers: Option<usize>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn synth(a: SynthArgs) -> anyhow::Result<()> {
    let experts = parse_format(&a.experts, a.group_size)?;
    let (like, topology) = match (&a.like, &a.like_trace) {
        (Some(l), _) => (l.clone(), None),
        (None, Some(t)) if synth::known_models().contains(&t.as_str()) => (t.clone(), None),
        (None, Some(t)) => {
            let path = std::path::Path::new(t);
            let trace = colibri_engine::experts::Trace::load(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let topo = synth::Topology::of_trace(&trace);
            let (_, base) = synth::config_for_topology(&topo, experts)?;
            eprintln!(
                "{}: {} layers x {} experts, top-{}, {:.2} MiB per expert; {}",
                path.display(),
                topo.layers,
                topo.experts,
                topo.top_k,
                topo.expert_bytes as f64 / (1u64 << 20) as f64,
                match base {
                    Some(b) => format!("the {b} architecture with top-{}", topo.top_k),
                    None => "a Qwen3-MoE layout of that shape".to_string(),
                }
            );
            (format!("trace:{}", trace.model), Some(topo))
        }
        (None, None) => anyhow::bail!("give --like or --like-trace"),
    };
    let opts = SynthOptions {
        like: like.clone(),
        output: a.output.clone(),
        format: if a.format == "hf" {
            SynthFormat::Hf
        } else {
            SynthFormat::Container
        },
        experts,
        dense: parse_format(&a.dense, 0)?,
        layers: a.layers,
        seed: a.seed,
        topology,
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
        like,
        bytes as f64 / 1e9,
        secs,
        bytes as f64 / 1e9 / secs.max(1e-9)
    );
    Ok(())
}
