//! Qwen3-MoE (`Qwen3MoeForCausalLM`): GQA with an explicit `head_dim`, RMSNorm per head on q
//! and k, softmax router with `norm_topk_prob`, and dense MLP layers where `mlp_only_layers`
//! or `decoder_sparse_step` say so.

use super::attention::{GqaAttention, QkNormKind};
use super::blocks::{Loader, Rope, RopeLayout};
use super::config::{Cfg, CommonDims, RopeParams};
use super::layer::{Attention, Ffn, Layer};
use super::load::LoadHook;
use super::moe::{Moe, Routing};
use super::network::Network;
use crate::container::Checkpoint;
use crate::error::Result;

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let d = CommonDims::read(cfg)?;
    let rope = RopeParams::read(cfg, 10000.0)?;
    rope.require_type(cfg, &["default"])?;
    if cfg.bool_or("use_sliding_window", false)? {
        return Err(cfg.err("use_sliding_window = true is not supported for qwen3_moe"));
    }
    // The Hub's configs say `num_experts`; transformers 5 saves `num_local_experts`.
    let n_experts = match cfg.opt_usize("num_experts")? {
        Some(n) => n,
        None => cfg.usize_or("num_local_experts", 0)?,
    };
    let top_k = cfg.usize_or("num_experts_per_tok", 0)?;
    if n_experts > 0 && (top_k == 0 || top_k > n_experts) {
        return Err(cfg.err("num_experts_per_tok must be between 1 and num_experts"));
    }
    let moe_inter = if n_experts > 0 {
        cfg.dim("moe_intermediate_size")?
    } else {
        0
    };
    let dense_inter = cfg.dim("intermediate_size")?;
    let sparse_step = cfg.usize_or("decoder_sparse_step", 1)?;
    let mlp_only = cfg.usize_list_or_empty("mlp_only_layers")?;
    let norm_topk_prob = cfg.bool_or("norm_topk_prob", false)?;
    let bias = cfg.bool_or("attention_bias", false)?;
    let ld = Loader {
        ckpt,
        family: "qwen3_moe",
        progress,
    };

    let mut layers = Vec::with_capacity(d.n_layers);
    for i in 0..d.n_layers {
        let p = format!("model.layers.{i}");
        let attn = GqaAttention::load(
            &ld,
            &format!("{p}.self_attn"),
            &d,
            QkNormKind::PerHead,
            bias,
            Rope::new(rope.theta, d.head_dim, RopeLayout::HalfSplit),
        )?;
        // Same rule as transformers' Qwen3MoeDecoderLayer.
        let sparse = !mlp_only.contains(&i)
            && n_experts > 0
            && sparse_step > 0
            && (i + 1) % sparse_step == 0;
        let names = ["gate_proj", "up_proj", "down_proj"];
        let ffn = if sparse {
            let experts = (0..n_experts)
                .map(|e| ld.mlp(&format!("{p}.mlp.experts.{e}"), names, d.hidden, moe_inter))
                .collect::<Result<Vec<_>>>()?;
            Ffn::Moe(Moe {
                router: ld.matrix(&format!("{p}.mlp.gate.weight"), n_experts, d.hidden)?,
                routing: Routing::SoftmaxTopK { norm_topk_prob },
                top_k,
                experts,
                shared: None,
                hooks: Default::default(),
            })
        } else {
            Ffn::Dense(ld.mlp(&format!("{p}.mlp"), names, d.hidden, dense_inter)?)
        };
        layers.push(Layer::load(&ld, &p, &d, Attention::Gqa(attn), ffn)?);
    }
    Network::decoder("qwen3_moe", &d, &ld, layers, Vec::new())
}
