//! `coli bench`: kernel throughput against the memory read bandwidth measured in the same run
//! (`--kernels`), and a model's prefill/decode speed and peak RSS (`--model DIR`).

use clap::Args;
use colibri_engine::bench;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Measure the matvec kernels of every format against the read bandwidth.
    #[arg(long)]
    pub kernels: bool,
    /// Measure only the memory read bandwidth that --model's decode is reported against
    /// (to put another engine's decode on the same measure, tools/bench/decode_pairs.sh).
    #[arg(long)]
    pub bandwidth: bool,
    /// Measure this model (a container or Hub folder) fully in RAM.
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// Threads [default: all cores].
    #[arg(long)]
    pub threads: Option<usize>,
    /// Weight matrix size for --kernels, MiB (larger than the L3 cache).
    #[arg(long, default_value_t = 1024)]
    pub size_mib: usize,
    /// Prompt tokens to prefill (--model).
    #[arg(long, default_value_t = 128)]
    pub prompt: usize,
    /// Tokens to decode (--model).
    #[arg(long, default_value_t = 32)]
    pub tokens: usize,
    /// Positions already in the KV cache when prefill and decode are timed (--model; as
    /// `llama-bench -d`).
    #[arg(long, default_value_t = 0)]
    pub depth: usize,
    /// Runs of prefill and decode (--model); the mean and the range are reported.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    #[command(flatten)]
    pub daemon: crate::bench_daemon::DaemonBenchArgs,
}

pub fn bench(a: BenchArgs) -> anyhow::Result<()> {
    if a.daemon.daemon {
        let dir = a
            .model
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--daemon needs --model DIR"))?;
        return crate::bench_daemon::run(&a.daemon, dir, a.threads, a.prompt, a.tokens);
    }
    if !a.kernels && !a.bandwidth && a.model.is_none() {
        anyhow::bail!("say what to measure: --kernels, --bandwidth and/or --model DIR");
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if a.bandwidth {
        println!(
            "read bandwidth {:.1} GB/s ({threads} threads)",
            bench::bandwidth(threads)? / 1e9
        );
    }
    if a.kernels {
        print!("{}", bench::kernel_report(a.size_mib << 20, threads, 5));
    }
    if let Some(dir) = &a.model {
        let r = bench::model_bench(
            dir,
            &bench::ModelBenchOptions {
                threads,
                prompt: a.prompt,
                gen: a.tokens,
                depth: a.depth,
                reps: a.repeat,
            },
        )?;
        println!("model {}", dir.display());
        print!("{r}");
    }
    Ok(())
}
