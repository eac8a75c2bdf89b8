//! GLM-4.5 / 4.6 / 4.7 (`Glm4MoeForCausalLM`): GQA with q/k/v bias, optional per-head q/k
//! RMSNorm (`use_qk_norm`) before RoPE, RoPE on the first `partial_rotary_factor` of each head
//! (rotate_half layout), dense first `first_k_dense_replace` layers, then MoE with the
//! sigmoid group-limited router and shared experts; MTP layers after the last decoder layer.

use super::attention::{GqaAttention, QkNormKind};
use super::blocks::{Loader, RopeLayout};
use super::config::{Cfg, CommonDims, RopeParams};
use super::layer::{Attention, Ffn, Layer};
use super::load::LoadHook;
use super::moe::SigmoidMoeSpec;
use super::mtp;
use super::network::Network;
use crate::container::Checkpoint;
use crate::error::Result;

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let d = CommonDims::read(cfg)?;
    let rope_params = RopeParams::read(cfg, 10000.0)?;
    // transformers keeps `partial_rotary_factor` in the rope dict (v5) or at the top level
    // (legacy), defaulting to 0.5 for this family.
    let partial = match rope_params.param("partial_rotary_factor") {
        Some(p) => p,
        None => cfg.f64_or("partial_rotary_factor", 0.5)?,
    };
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(cfg.err(format!("partial_rotary_factor {partial} must be in (0, 1]")));
    }
    let rotary_dim = (d.head_dim as f64 * partial) as usize;
    let rope = rope_params.rope(cfg, rotary_dim, RopeLayout::HalfSplit, d.max_context)?;
    let moe = SigmoidMoeSpec::read(cfg)?;
    let dense_inter = cfg.dim("intermediate_size")?;
    let first_k_dense_replace = cfg.usize_or("first_k_dense_replace", 1)?;
    let qk = if cfg.bool_or("use_qk_norm", false)? {
        QkNormKind::PerHead
    } else {
        QkNormKind::None
    };
    let bias = cfg.bool_or("attention_bias", false)?;
    let ld = Loader {
        ckpt,
        family: "glm4_moe",
        progress,
    };
    let names = ["gate_proj", "up_proj", "down_proj"];
    let layer = |i: usize, p: &str| -> Result<Layer> {
        let attn = GqaAttention::load(&ld, &format!("{p}.self_attn"), &d, qk, bias, rope.clone())?;
        let ffn = if i >= first_k_dense_replace {
            Ffn::Moe(moe.load(&ld, &format!("{p}.mlp"), d.hidden)?)
        } else {
            Ffn::Dense(ld.mlp(&format!("{p}.mlp"), names, d.hidden, dense_inter)?)
        };
        Layer::load(&ld, p, &d, Attention::Gqa(attn), ffn)
    };
    let layers = (0..d.n_layers)
        .map(|i| layer(i, &format!("model.layers.{i}")))
        .collect::<Result<Vec<_>>>()?;
    let mtp = mtp::load(&ld, cfg, &d, &layer)?;
    Network::decoder("glm4_moe", &d, &ld, layers, mtp)
}
