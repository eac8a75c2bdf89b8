//! Multi-token prediction layers (DeepSeek-V3, GLM-4.5, GLM-5): stored after the last decoder
//! layer (`model.layers.{num_hidden_layers + k}`), ignored by transformers, used here to draft
//! tokens for speculative decoding ([`crate::speculative`]).
//!
//! Layer `k` maps (the previous stage's hidden state at position p, the token at p + 1) to
//! logits for the token at p + 2: `eh_proj([enorm(embed(token)) ‖ hnorm(hidden)])`, one full
//! decoder layer with its own KV cache, then `shared_head.norm` and `shared_head.head`
//! (as vLLM's `DeepSeekMultiTokenPredictorLayer`).

use super::blocks::{Loader, RmsNorm};
use super::config::{Cfg, CommonDims};
use super::layer::Layer;
use crate::error::Result;
use crate::tensor::Matrix;

#[derive(Clone, Debug)]
pub struct MtpLayer {
    /// The layer's own `embed_tokens` (DeepSeek saves a copy); the model's otherwise.
    pub embed: Option<Matrix>,
    pub enorm: RmsNorm,
    pub hnorm: RmsNorm,
    /// `[hidden, 2 × hidden]`.
    pub eh_proj: Matrix,
    pub layer: Layer,
    /// `shared_head.norm`.
    pub norm: RmsNorm,
    /// `shared_head.head`; the model's `lm_head` when absent.
    pub head: Option<Matrix>,
}

impl MtpLayer {
    pub fn size_bytes(&self) -> usize {
        self.embed.as_ref().map_or(0, |m| m.size_bytes())
            + self.eh_proj.size_bytes()
            + self.layer.size_bytes()
            + self.head.as_ref().map_or(0, |m| m.size_bytes())
    }
}

/// Loads the MTP layers the config announces (`num_nextn_predict_layers`, transformers 5:
/// `num_mtp_layers`) and the checkpoint holds; a checkpoint stripped of them (as some
/// conversions are) simply has none. `layer(i, prefix)` builds decoder layer `i`.
pub fn load(
    ld: &Loader,
    cfg: &Cfg,
    d: &CommonDims,
    layer: &dyn Fn(usize, &str) -> Result<Layer>,
) -> Result<Vec<MtpLayer>> {
    let announced = match cfg.opt_usize("num_nextn_predict_layers")? {
        Some(n) => n,
        None => cfg.usize_or("num_mtp_layers", 0)?,
    };
    let mut out = Vec::new();
    for k in 0..announced {
        let i = d.n_layers + k;
        let p = format!("model.layers.{i}");
        if ld.ckpt.get(&format!("{p}.eh_proj.weight")).is_none() {
            // Converters often leave them out (the C converter writes them in a separate
            // `--mtp` pass); the model runs without drafting.
            ld.progress.note(format!(
                "no MTP layers: the config announces {announced} but the checkpoint holds {k}; \
                 speculative decoding is off"
            ));
            break;
        }
        let opt_matrix = |name: String, rows: usize| -> Result<Option<Matrix>> {
            match ld.ckpt.get(&name) {
                Some(_) => Ok(Some(ld.matrix(&name, rows, d.hidden)?)),
                None => Ok(None),
            }
        };
        out.push(MtpLayer {
            embed: opt_matrix(format!("{p}.embed_tokens.weight"), d.vocab)?,
            enorm: ld.norm(&format!("{p}.enorm.weight"), d.hidden, d.eps)?,
            hnorm: ld.norm(&format!("{p}.hnorm.weight"), d.hidden, d.eps)?,
            eh_proj: ld.matrix(&format!("{p}.eh_proj.weight"), d.hidden, 2 * d.hidden)?,
            layer: layer(i, &p)?,
            norm: ld.norm(&format!("{p}.shared_head.norm.weight"), d.hidden, d.eps)?,
            head: opt_matrix(format!("{p}.shared_head.head.weight"), d.vocab)?,
        });
    }
    Ok(out)
}
