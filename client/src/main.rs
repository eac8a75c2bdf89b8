//! coli: colibri's command-line client.
//!
//! This file only declares the command line and dispatches. Every command group lives in its
//! own module with its own `clap::Args` struct and an entry function; to add a command, write
//! `foo.rs`, add a variant to [`Command`] and one arm to [`dispatch`].

mod local;
mod output;
mod progress;
mod run;
mod bench;
mod convert;
mod synth;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "coli",
    version,
    about = "colibri: run huge Mixture-of-Experts models on an ordinary PC",
    propagate_version = true
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand accepts.
#[derive(clap::Args, Clone, Debug)]
pub struct Global {
    /// The daemon's socket [default: $XDG_RUNTIME_DIR/colibri/colibrid.sock, else
    /// ~/.colibri/run/colibrid.sock].
    #[arg(long, global = true, env = "COLI_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a continuation of a prompt (chat template applied unless --raw).
    Run(run::RunArgs),
    /// Teacher-forced logits of every position of a token sequence.
    Score(run::ScoreArgs),
    /// Convert a Hugging Face checkpoint into a colibri container.
    Convert(convert::ConvertArgs),
    /// Write a random-weight model of a real architecture's shape (for benchmarks).
    Synth(synth::SynthArgs),
    /// Measure kernels against memory bandwidth, or a model's speed and memory.
    Bench(bench::BenchArgs),
    // Engine tools (convert, synth, bench, plan, trace) are added here, each in its own module.
}

fn dispatch(global: &Global, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(a) => run::run(global, a),
        Command::Score(a) => run::score(global, a),
        Command::Convert(a) => convert::convert(a),
        Command::Synth(a) => synth::synth(a),
        Command::Bench(a) => bench::bench(a),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(&cli.global, cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if output::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the whole context chain on one line: "loading X: <engine error>".
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
