//! OLMoE (`OlmoeForCausalLM`): Llama-style attention with RMSNorm over the whole projected
//! q and k vectors, optional `clip_qkv`, softmax router whose top-k weights are renormalised
//! only when `norm_topk_prob` is set (it is not in the published OLMoE-1B-7B).

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
    let n_experts = cfg.dim("num_experts")?;
    let top_k = cfg.dim("num_experts_per_tok")?;
    if top_k > n_experts {
        return Err(cfg.err("num_experts_per_tok exceeds num_experts"));
    }
    let inter = cfg.dim("intermediate_size")?;
    let norm_topk_prob = cfg.bool_or("norm_topk_prob", false)?;
    let clip_qkv = cfg.opt_f64("clip_qkv")?.map(|c| c as f32);
    let bias = cfg.bool_or("attention_bias", false)?;
    let ld = Loader {
        ckpt,
        family: "olmoe",
        progress,
    };

    let mut layers = Vec::with_capacity(d.n_layers);
    for i in 0..d.n_layers {
        let p = format!("model.layers.{i}");
        let mut attn = GqaAttention::load(
            &ld,
            &format!("{p}.self_attn"),
            &d,
            QkNormKind::Whole,
            bias,
            Rope::new(rope.theta, d.head_dim, RopeLayout::HalfSplit),
        )?;
        attn.clip_qkv = clip_qkv;
        let experts = (0..n_experts)
            .map(|e| {
                ld.mlp(
                    &format!("{p}.mlp.experts.{e}"),
                    ["gate_proj", "up_proj", "down_proj"],
                    d.hidden,
                    inter,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let ffn = Ffn::Moe(Moe {
            router: ld.matrix(&format!("{p}.mlp.gate.weight"), n_experts, d.hidden)?,
            routing: Routing::SoftmaxTopK { norm_topk_prob },
            top_k,
            experts,
            shared: None,
            hooks: Default::default(),
        });
        layers.push(Layer::load(&ld, &p, &d, Attention::Gqa(attn), ffn)?);
    }
    Network::decoder("olmoe", &d, &ld, layers, Vec::new())
}
