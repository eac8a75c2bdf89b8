//! `coli perplexity`: a model's perplexity on a text or a list of token ids, with
//! llama-perplexity's method (engine::perplexity), in this process (`--local`) or through
//! the daemon's streaming Perplexity RPC. With `--compare DIR` (in-process) a reference
//! model scores the same windows and the mean KL divergence to it is reported too.

use crate::args::Global;
use crate::args::ModelTarget;
use crate::daemon_discovery::{self, status_error, Client, RpcResult};
use crate::output::OutputFormat;
use crate::{local, remote};
use anyhow::{anyhow, bail, Context};
use clap::Args;
use colibri_engine::arch::Ffn;
use colibri_engine::perplexity::{self as ppl, Perplexity};
use colibri_engine::Model;
use colibri_proto::v1 as pb;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub target: ModelTarget,
    /// A UTF-8 text file, tokenized as llama-perplexity does it: with the tokenizer's special
    /// tokens; when the tokenizer adds a BOS, every window starts with BOS.
    #[arg(
        long,
        value_name = "TEXT",
        conflicts_with = "ids_file",
        required_unless_present = "ids_file"
    )]
    pub file: Option<PathBuf>,
    /// Token ids separated by commas and/or whitespace, scored as they are (no BOS added).
    #[arg(long, value_name = "FILE")]
    pub ids_file: Option<PathBuf>,
    /// Window length: the ids are cut into non-overlapping windows of N; in each, the
    /// second half is scored.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub ctx: usize,
    /// Score only the first N windows (0 = all).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub chunks: usize,
    /// Also run this reference model (e.g. the bf16 checkpoint a container was converted
    /// from) on the same windows; report the mean KL(reference ‖ model) and how often both
    /// rank the same token first. In-process only.
    #[arg(long, value_name = "DIR", requires = "local")]
    pub compare: Option<PathBuf>,
    /// LOSSY: keep each token's experts, heaviest first, until their routing weight reaches
    /// this share (e.g. 0.9). In-process only.
    #[arg(long, value_name = "P", requires = "local")]
    pub expert_topp: Option<f32>,
    /// text: one line; json: {"ppl","nll_sum","tokens_scored","windows"} (plus "kl_mean"
    /// and "top1_agreement" with --compare).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn perplexity(global: &Global, a: PerplexityArgs) -> anyhow::Result<()> {
    if a.output == OutputFormat::Ids {
        bail!("--output ids does not apply to perplexity: use text or json");
    }
    if let Some(p) = a.expert_topp {
        if !(p > 0.0 && p <= 1.0) {
            bail!("--expert-topp must be in (0, 1], got {p}");
        }
    }
    let source = Source::read(&a)?;
    let result = if a.target.local {
        run_local(&a, source)?
    } else {
        let rt = daemon_discovery::runtime()?;
        rt.block_on(async {
            let mut client = daemon_discovery::ensure(global).await?;
            run_remote(&mut client, &a, source).await
        })?
    };
    print(&a, &result)
}

/// What is scored: ids as given, or a text to tokenize with the model's tokenizer.
enum Source {
    Ids(Vec<u32>),
    Text(String),
}

impl Source {
    fn read(a: &PerplexityArgs) -> anyhow::Result<Source> {
        if let Some(p) = &a.ids_file {
            let s =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let ids = ppl::parse_ids(&s).with_context(|| format!("{}", p.display()))?;
            return Ok(Source::Ids(ids));
        }
        let p = a.file.as_ref().expect("clap requires --file or --ids-file");
        let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|e| anyhow!("{} is not UTF-8 text: {e}", p.display()))?;
        Ok(Source::Text(text))
    }
}

/// The ids to score from a text's two encodings (with and without the tokenizer's special
/// tokens, of a probe text), llama-perplexity's way: when the tokenizer adds a BOS, every
/// window's first id becomes BOS.
fn prepare(mut ids: Vec<u32>, probe_with: &[u32], probe_without: &[u32], ctx: usize) -> Vec<u32> {
    if let Some(bos) = ppl::added_bos(probe_with, probe_without) {
        if ctx > 0 {
            ppl::replace_window_starts(&mut ids, ctx, bos);
        }
    }
    ids
}

/// The first `chunks` windows (all when 0).
fn limit(mut ids: Vec<u32>, a: &PerplexityArgs) -> Vec<u32> {
    if a.chunks > 0 {
        ids.truncate(a.chunks.saturating_mul(a.ctx));
    }
    ids
}

const PROBE: &str = "a";

fn run_local(a: &PerplexityArgs, source: Source) -> anyhow::Result<Perplexity> {
    let (mut model, _) = local::load_model(&a.target.model)
        .with_context(|| format!("loading {}", a.target.model.display()))?;
    if let Some(p) = a.expert_topp {
        eprintln!("note: --expert-topp {p} is lossy: the model's outputs change");
        for l in model.net.layers.iter_mut() {
            if let Ffn::Moe(m) = &mut l.ffn {
                m.hooks.top_p = Some(p);
            }
        }
    }
    let reference = match &a.compare {
        Some(dir) => Some(
            local::load_model(dir)
                .with_context(|| format!("loading the reference {}", dir.display()))?
                .0,
        ),
        None => None,
    };
    let ids = match source {
        Source::Ids(ids) => ids,
        Source::Text(text) => {
            let t = text_of(&model)?;
            let ids = t.encode(&text, true)?;
            prepare(
                ids,
                &t.encode(PROBE, true)?,
                &t.encode(PROBE, false)?,
                a.ctx,
            )
        }
    };
    let ids = limit(ids, a);
    let total = ppl::window_count(ids.len(), a.ctx, model.info.max_context)?;
    let bar = WindowBar::new(total, a.ctx);
    let r = ppl::evaluate(&model, reference.as_ref(), &ids, a.ctx, &mut |p, _| {
        bar.update(p)
    });
    bar.finish();
    Ok(r?)
}

fn text_of(model: &Model) -> anyhow::Result<&colibri_engine::text::Text> {
    model.text.as_ref().ok_or_else(|| {
        anyhow!(
            "{} has no tokenizer (tokenizer.json or tiktoken.model), so --file cannot be tokenized; give --ids-file",
            model.info.dir.display()
        )
    })
}

async fn run_remote(
    client: &mut Client,
    a: &PerplexityArgs,
    source: Source,
) -> anyhow::Result<Perplexity> {
    let model = remote::model_id(&a.target.model)?;
    remote::load_model(client, &model, None).await?;
    let ids = match source {
        Source::Ids(ids) => ids,
        Source::Text(text) => {
            let ids = tokenize(client, &model, &text, true).await?;
            let with = tokenize(client, &model, PROBE, true).await?;
            let without = tokenize(client, &model, PROBE, false).await?;
            prepare(ids, &with, &without, a.ctx)
        }
    };
    let ids = limit(ids, a);
    let mut stream = client
        .perplexity(pb::PerplexityRequest {
            model,
            ids,
            ctx: a.ctx.min(u32::MAX as usize) as u32,
        })
        .await
        .rpc()?;
    let mut bar: Option<WindowBar> = None;
    let result = async {
        while let Some(p) = stream.message().await.map_err(status_error)? {
            let acc = Perplexity {
                nll_sum: p.nll_sum,
                tokens_scored: p.tokens_scored,
                windows: p.windows_done as usize,
                ..Default::default()
            };
            bar.get_or_insert_with(|| WindowBar::new(p.windows_total as usize, a.ctx))
                .update(&acc);
            if p.done {
                return Ok(acc);
            }
        }
        Err(anyhow!(
            "the daemon closed the perplexity stream before it finished"
        ))
    }
    .await;
    if let Some(b) = &bar {
        b.finish();
    }
    result
}

async fn tokenize(
    client: &mut Client,
    model: &str,
    text: &str,
    special: bool,
) -> anyhow::Result<Vec<u32>> {
    let req = pb::TokenizeRequest {
        model: model.to_string(),
        text: text.to_string(),
        add_special_tokens: Some(special),
        messages: vec![],
    };
    Ok(client.tokenize(req).await.rpc()?.ids)
}

/// Windows done, with tokens per second and ETA, on a terminal's stderr.
struct WindowBar {
    pb: ProgressBar,
    ctx: usize,
    start: Instant,
}

impl WindowBar {
    fn new(total: usize, ctx: usize) -> WindowBar {
        let pb = if std::io::stderr().is_terminal() {
            let pb = ProgressBar::new(total as u64);
            pb.set_style(
                ProgressStyle::with_template(
                    "{spinner} perplexity [{bar:30}] {pos}/{len} windows {msg} ETA {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            pb.enable_steady_tick(std::time::Duration::from_millis(200));
            pb
        } else {
            ProgressBar::hidden()
        };
        WindowBar {
            pb,
            ctx,
            start: Instant::now(),
        }
    }

    fn update(&self, p: &Perplexity) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let tok_s = (p.windows * self.ctx) as f64 / secs;
        let ppl = if p.tokens_scored > 0 {
            format!("ppl {:.4}, ", p.ppl())
        } else {
            String::new()
        };
        self.pb.set_message(format!("({ppl}{tok_s:.0} tok/s)"));
        self.pb.set_position(p.windows as u64);
    }

    fn finish(&self) {
        self.pb.finish_and_clear();
    }
}

fn print(a: &PerplexityArgs, r: &Perplexity) -> anyhow::Result<()> {
    match a.output {
        OutputFormat::Json => {
            let mut v = json!({
                "ppl": r.ppl(),
                "nll_sum": r.nll_sum,
                "tokens_scored": r.tokens_scored,
                "windows": r.windows,
            });
            if let (Some(kl), Some(top1)) = (r.mean_kl(), r.top1_agreement()) {
                v["kl_mean"] = json!(kl);
                v["top1_agreement"] = json!(top1);
            }
            crate::output::print_line(&v.to_string())?;
        }
        _ => {
            let mut line = format!(
                "perplexity {:.4} over {} tokens in {} windows of {} ({:.4} nats per token)",
                r.ppl(),
                r.tokens_scored,
                r.windows,
                a.ctx,
                r.nll_sum / r.tokens_scored.max(1) as f64
            );
            if let (Some(kl), Some(top1)) = (r.mean_kl(), r.top1_agreement()) {
                line.push_str(&format!(
                    "; against {}: mean KL {kl:.6} nats, same top token {:.2}%",
                    display(a.compare.as_deref()),
                    top1 * 100.0
                ));
            }
            crate::output::print_line(&line)?;
        }
    }
    Ok(())
}

fn display(p: Option<&Path>) -> String {
    p.map(|p| p.display().to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_windows_start_with_bos_only_when_the_tokenizer_adds_one() {
        let ids: Vec<u32> = (10..20).collect();
        assert_eq!(prepare(ids.clone(), &[7], &[7], 4), ids);
        let got = prepare(ids, &[1, 7], &[7], 4);
        assert_eq!(got, vec![1, 11, 12, 13, 1, 15, 16, 17, 18, 19]);
    }
}
