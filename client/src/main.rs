//! coli: colibri's command-line client.
//!
//! This file only declares the command line and dispatches. Every command group lives in its
//! own module with its own `clap::Args` struct and an entry function; to add a command, write
//! `foo.rs`, add a variant to [`Command`] and one arm to [`dispatch`].

mod args;
mod bench;
mod bench_daemon;
mod chat;
mod completions;
mod convert;
mod daemon_discovery;
mod doctor;
mod local;
mod manage;
mod output;
mod perplexity;
mod plan;
mod progress;
mod remote;
mod run;
mod serve;
mod simulate;
mod synth;
mod trace;
mod web;

use args::Global;
use clap::{CommandFactory, Parser, Subcommand};
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

#[derive(Subcommand, Debug)]
enum Command {
    /// Generate a continuation of a prompt (chat template applied unless --raw).
    Run(args::RunArgs),
    /// Teacher-forced logits of every position of a token sequence.
    Score(args::ScoreArgs),
    /// Perplexity of a text or of token ids (llama-perplexity's method).
    Perplexity(perplexity::PerplexityArgs),
    /// Chat interactively; re-attaches to the last conversation.
    Chat(chat::ChatArgs),
    /// The daemon: version, memory, loaded models, expert caches, sessions.
    Status(manage::InfoArgs),
    /// Loaded models.
    Ps(manage::InfoArgs),
    /// Load a model into the daemon.
    Load(manage::LoadArgs),
    /// Serve models over the OpenAI- and Anthropic-compatible HTTP API (prints its URL).
    Serve(serve::ServeArgs),
    /// Open the dashboard (chat, the expert cache live, models) in a browser.
    Web(web::WebArgs),
    /// Unload a model (its sessions are saved).
    Unload(manage::UnloadArgs),
    /// Stop the daemon (it saves sessions, usage history and pins first).
    Stop(manage::StopArgs),
    /// List or delete conversations kept by the daemon.
    Sessions(manage::SessionsArgs),
    /// Pin experts in the cache (or list, or unpin them).
    Pin(manage::PinArgs),
    /// Check this machine and a model folder for readiness (changes nothing).
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script.
    Completions(completions::CompletionsArgs),
    /// Convert a Hugging Face checkpoint into a colibri container.
    Convert(convert::ConvertArgs),
    /// Write a random-weight model of a real architecture's shape (for benchmarks).
    Synth(synth::SynthArgs),
    /// Measure kernels against memory bandwidth, or a model's speed and memory.
    Bench(bench::BenchArgs),
    /// Where a model's bytes go: resident part, experts, memory, default expert cache.
    Plan(plan::PlanArgs),
    /// Record the expert routing of a generation (and, with --stream, the cache's stats).
    Trace(trace::TraceArgs),
    /// Replay routing traces against the cache policies and Belady's optimum.
    Simulate(simulate::SimulateArgs),
    // Engine tools (convert, synth, bench, plan, trace) are added here, each in its own module.
}

fn dispatch(global: &Global, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(a) => run::run(global, a),
        Command::Score(a) => run::score(global, a),
        Command::Perplexity(a) => perplexity::perplexity(global, a),
        Command::Convert(a) => convert::convert(a),
        Command::Synth(a) => synth::synth(a),
        Command::Bench(a) => bench::bench(a),
        Command::Plan(a) => plan::plan(a),
        Command::Trace(a) => trace::trace(global, a),
        Command::Simulate(a) => simulate::simulate_cmd(a),
        Command::Chat(a) => chat::chat(global, a),
        Command::Status(a) => manage::status(global, a),
        Command::Ps(a) => manage::ps(global, a),
        Command::Load(a) => manage::load(global, a),
        Command::Serve(a) => serve::serve(global, a),
        Command::Web(a) => web::web(global, a),
        Command::Unload(a) => manage::unload(global, a),
        Command::Stop(a) => manage::stop(global, a),
        Command::Sessions(a) => manage::sessions(global, a),
        Command::Pin(a) => manage::pin(global, a),
        Command::Doctor(a) => doctor::doctor(global, a),
        Command::Completions(a) => completions::completions(a, Cli::command()),
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

#[cfg(test)]
mod tests {
    #[test]
    fn command_line_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
