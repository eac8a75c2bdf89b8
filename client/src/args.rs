//! The argument types that several commands share: the global daemon options, the model
//! target, sampling, and the `run` / `score` arguments that both the in-process path
//! ([`crate::local`]) and the daemon path ([`crate::remote`]) read. They live apart from the
//! dispatch in [`crate::run`] so that those paths import the types without importing their
//! own dispatcher.

use crate::output::OutputFormat;
use clap::Args;
use colibri_engine::SamplingParams;
use std::path::PathBuf;

/// Options every subcommand accepts.
#[derive(Args, Clone, Debug)]
pub struct Global {
    /// The daemon's socket [default: $XDG_RUNTIME_DIR/colibri/colibrid.sock, else
    /// ~/.colibri/run/colibrid.sock].
    #[arg(
        long,
        global = true,
        env = "COLI_SOCKET",
        value_name = "PATH",
        help_heading = "Daemon"
    )]
    pub socket: Option<PathBuf>,
    /// The daemon's state folder, passed to a daemon that coli starts [default:
    /// $XDG_STATE_HOME/colibri, else ~/.local/state/colibri].
    #[arg(
        long,
        global = true,
        env = "COLIBRI_STATE_DIR",
        value_name = "DIR",
        help_heading = "Daemon"
    )]
    pub state_dir: Option<PathBuf>,
    /// Never start colibrid: fail when it is not running.
    #[arg(
        long,
        global = true,
        env = "COLI_NO_AUTOSTART",
        help_heading = "Daemon"
    )]
    pub no_autostart: bool,
}

/// The model and where it runs.
#[derive(Args, Clone, Debug)]
pub struct ModelTarget {
    /// Model folder: a Hugging Face checkpoint (config.json, *.safetensors, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Run the engine in this process instead of through the daemon.
    #[arg(long)]
    pub local: bool,
}

#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy (argmax).
    #[arg(
        long,
        default_value_t = 0.7,
        allow_negative_numbers = true,
        value_name = "T"
    )]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P (1 = off).
    #[arg(
        long,
        default_value_t = 0.95,
        allow_negative_numbers = true,
        value_name = "P"
    )]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        value_name = "P"
    )]
    pub min_p: f32,
    /// Penalty on tokens already in the sequence (1 = off).
    #[arg(
        long,
        default_value_t = 1.0,
        allow_negative_numbers = true,
        value_name = "R"
    )]
    pub repeat_penalty: f32,
    /// Lower a token's logit by F per time it was generated already (OpenAI's
    /// frequency_penalty, -2..2; 0 = off).
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        value_name = "F"
    )]
    pub frequency_penalty: f32,
    /// Lower a token's logit by P once it was generated (OpenAI's presence_penalty,
    /// -2..2; 0 = off).
    #[arg(
        long,
        default_value_t = 0.0,
        allow_negative_numbers = true,
        value_name = "P"
    )]
    pub presence_penalty: f32,
    /// Random seed; the same seed gives the same tokens [default: random].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed.unwrap_or_else(random_seed),
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: Vec::new(),
        }
    }
}

/// A seed that differs between runs; it is reported in the stats so a run can be repeated.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// What to generate from: text (templated unless raw) or token ids.
#[derive(Clone, Debug)]
pub enum PromptSpec {
    Ids(Vec<u32>),
    Text {
        text: String,
        system: Option<String>,
        raw: bool,
    },
}

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: ModelTarget,
    /// The prompt ("-" reads it from stdin). The model's chat template wraps it as a user
    /// message unless --raw.
    #[arg(value_name = "PROMPT", required_unless_present = "prompt_ids")]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma separated (no template, no tokenizer involved).
    #[arg(long, value_delimiter = ',', num_args = 1, value_name = "IDS", conflicts_with_all = ["prompt", "raw", "system"])]
    pub prompt_ids: Option<Vec<u32>>,
    /// Feed the prompt text as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A system message for the chat template.
    #[arg(long, value_name = "TEXT", conflicts_with = "raw")]
    pub system: Option<String>,
    /// Tokens to generate at most [default: 256, capped to the room left in the context].
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Stop when this text appears (repeatable); the stop text itself is not printed.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// text: stream the text; ids: the generated ids on one line; json: ids, text, stats.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Print timing statistics on stderr when done.
    #[arg(long)]
    pub stats: bool,
    /// Draft N tokens per step with the model's MTP layers and verify them in one batched
    /// forward (DeepSeek-V3 / GLM checkpoints that carry MTP layers), in-process or in the
    /// daemon. Default: automatic for greedy decoding, turned off when it does not pay.
    #[arg(long, value_name = "N", conflicts_with = "no_draft")]
    pub draft: Option<usize>,
    /// Never draft.
    #[arg(long)]
    pub no_draft: bool,
    /// Stream the routed experts from disk through a cache of this many MiB instead of
    /// mapping them all (in-process with --local; through the daemon it applies when this
    /// command loads the model). With --stats, the cache's statistics are printed.
    #[arg(long, value_name = "MIB")]
    pub expert_cache: Option<u64>,
}

impl RunArgs {
    pub fn prompt_spec(&self) -> anyhow::Result<PromptSpec> {
        if let Some(ids) = &self.prompt_ids {
            return Ok(PromptSpec::Ids(ids.clone()));
        }
        let text = match self.prompt.as_deref() {
            Some("-") => {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                    .map_err(|e| anyhow::anyhow!("reading the prompt from stdin: {e}"))?;
                s
            }
            Some(t) => t.to_string(),
            None => anyhow::bail!("give a prompt text or --prompt-ids"),
        };
        Ok(PromptSpec::Text {
            text,
            system: self.system.clone(),
            raw: self.raw,
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub target: ModelTarget,
    /// Token ids to score, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 1,
        required = true,
        value_name = "IDS"
    )]
    pub ids: Vec<u32>,
    /// json: {"argmax":[...],"logits":[[...],...]}; ids: the argmax of each position.
    #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
    pub output: OutputFormat,
}
