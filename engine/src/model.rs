//! [`Model`]: a loaded network plus its text assets, and the batched forward pass that
//! serves prefill, decode and the daemon's multi-session steps alike.

use crate::arch::{self, Network};
use crate::container::{Checkpoint, OpenOptions};
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::text::Text;
use std::path::{Path, PathBuf};

// The step and load types live where the forward pass and the loader use them; their paths
// here stay the ones callers know.
pub use crate::arch::load::{LoadProgress, LoadStage};
pub use crate::arch::step::{LogitsWanted, SeqStep};

/// What a caller may want to know about a model without touching its weights.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub dir: PathBuf,
    /// `model_type` from config.json, e.g. "olmoe".
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    /// Maximum positions (`max_position_embeddings`).
    pub max_context: usize,
    /// Every id that ends a generation: config.json, generation_config.json, tokenizer.
    pub eos_ids: Vec<u32>,
    pub bos_id: Option<u32>,
    /// Bytes of weights the model holds (resident part plus experts).
    pub weight_bytes: usize,
    /// The folder's kind: "Hub checkpoint", "colibri container", "colibri C layout ...".
    pub layout: String,
    /// Storage formats per tensor class (a mixed-precision container shows several).
    pub weight_classes: Vec<crate::arch::census::WeightClass>,
    /// What the load found worth telling the user, said once at load (a missing DSA
    /// indexer: dense attention; no MTP layers: no speculative decoding).
    pub notes: Vec<String>,
}

pub struct Model {
    pub info: ModelInfo,
    pub net: Network,
    /// Tokenizer and chat template; `None` for a folder without a tokenizer (ids only).
    pub text: Option<Text>,
}

impl Model {
    /// Opens a model folder, validates every tensor against the config, loads the tokenizer.
    pub fn load(dir: &Path) -> Result<Model> {
        Self::load_with_progress(dir, &|_| {})
    }

    /// [`load`](Self::load), telling `progress` where it is (see [`LoadProgress`]).
    pub fn load_with_progress(dir: &Path, progress: &dyn Fn(LoadProgress)) -> Result<Model> {
        Self::load_with(dir, &OpenOptions::default(), progress)
    }

    /// [`load_with_progress`](Self::load_with_progress), the weights placed as `opts` says
    /// (in RAM or memory-mapped; expert files left mapped when they will be streamed).
    pub fn load_with(
        dir: &Path,
        opts: &OpenOptions,
        progress: &dyn Fn(LoadProgress),
    ) -> Result<Model> {
        let ckpt = Checkpoint::open_reporting(dir, opts, &|done, total| {
            progress(LoadProgress {
                stage: LoadStage::Copying,
                done,
                total,
                message: "copying into RAM".into(),
            })
        })?;
        let hook = arch::LoadHook::new(&ckpt, progress);
        hook.report(
            LoadStage::Opening,
            format!("{} tensors in {}", ckpt.len(), dir.display()),
        );
        let net = arch::build_with_progress(&ckpt, &hook)?;
        let has_text = Text::present(dir);
        hook.finish(
            if has_text {
                LoadStage::Text
            } else {
                LoadStage::Weights
            },
            if has_text {
                "weights loaded; reading the tokenizer"
            } else {
                "weights loaded"
            },
        );
        let text = if has_text {
            Some(Text::load(dir, &ckpt.config)?)
        } else {
            None
        };
        let mut eos_ids: Vec<u32> = text
            .as_ref()
            .map(|t| t.eos_ids().to_vec())
            .unwrap_or_default();
        for id in crate::text::id_list(&ckpt.config, "eos_token_id") {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let bos_id = text.as_ref().and_then(|t| t.bos_id()).or_else(|| {
            crate::text::id_list(&ckpt.config, "bos_token_id")
                .first()
                .copied()
        });
        let info = ModelInfo {
            dir: dir.to_path_buf(),
            model_type: net.model_type.clone(),
            vocab_size: net.vocab_size,
            hidden_size: net.hidden_size,
            num_layers: net.layers.len(),
            max_context: net.max_context,
            eos_ids,
            bos_id,
            weight_bytes: net.weight_bytes(),
            layout: ckpt.layout().to_string(),
            weight_classes: hook.weight_classes(),
            notes: hook.notes(),
        };
        Ok(Model { info, net, text })
    }

    pub fn new_cache(&self) -> KvCache {
        self.net.new_cache()
    }

    /// Checks ids against the vocabulary and the sequence length against the context.
    pub fn check_tokens(&self, cache_len: usize, tokens: &[u32], field: &str) -> Result<()> {
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return Err(Error::invalid(
                field,
                format!(
                    "token id {bad} is outside the vocabulary of {} ids",
                    self.info.vocab_size
                ),
            ));
        }
        let needed = cache_len + tokens.len();
        if needed > self.info.max_context {
            return Err(Error::ContextOverflow {
                needed,
                max: self.info.max_context,
            });
        }
        Ok(())
    }

    /// What every forward step checks and reports first: the batch's token ids and
    /// positions, and (when experts are streamed) the KV bytes the step will leave.
    fn before_step(&self, batch: &[SeqStep<'_>]) -> Result<()> {
        for s in batch {
            self.check_tokens(s.cache.len, s.tokens, "tokens")?;
        }
        crate::experts::stream::note_kv_bytes(&self.net, || kv_bytes_after(batch));
        Ok(())
    }

    /// One batched forward step over several sequences. Returns, per sequence, the logits it
    /// asked for: `vocab` floats for `Last`, `tokens × vocab` for `All`, nothing for `None`.
    pub fn forward(&self, batch: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>> {
        self.before_step(batch)?;
        let out = self.net.forward(batch);
        // A streamed expert that could not be read: this step's outputs are not valid.
        crate::experts::stream::take_error(&self.net)?;
        Ok(out)
    }

    /// [`forward`](Self::forward) that also returns the final-normed hidden states of the
    /// rows `hidden[s]` selects for sequence `s` (what MTP layers draft from; see
    /// [`Network::forward_with_hidden`](crate::arch::Network::forward_with_hidden)).
    #[allow(clippy::type_complexity)]
    pub fn forward_with_hidden(
        &self,
        batch: &mut [SeqStep<'_>],
        hidden: &[LogitsWanted],
    ) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>)> {
        self.before_step(batch)?;
        let out = self.net.forward_with_hidden(batch, hidden);
        crate::experts::stream::take_error(&self.net)?;
        Ok(out)
    }

    /// Convenience: feeds `tokens` to one sequence and returns the last position's logits.
    pub fn step(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut b = [SeqStep {
            cache,
            tokens,
            logits: LogitsWanted::Last,
        }];
        Ok(self.forward(&mut b)?.pop().unwrap_or_default())
    }

    /// Teacher-forced logits of every position of `tokens` from an empty cache
    /// (`tokens × vocab`, row-major).
    pub fn score(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut cache = self.new_cache();
        let mut b = [SeqStep {
            cache: &mut cache,
            tokens,
            logits: LogitsWanted::All,
        }];
        Ok(self.forward(&mut b)?.pop().unwrap_or_default())
    }
}

/// KV bytes the batch's sequences will hold once this step has appended its tokens.
fn kv_bytes_after(batch: &[SeqStep<'_>]) -> u64 {
    batch
        .iter()
        .map(|s| (s.cache.size_bytes() + s.tokens.len() * s.cache.bytes_per_position()) as u64)
        .sum()
}
