//! Mixtral (`MixtralForCausalLM`): GQA without q/k norm, optional sliding window, experts
//! named `block_sparse_moe.experts.{e}.w1/w2/w3` (gate/down/up), top-k always renormalised.

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
    let rope = RopeParams::read(cfg, 1e6)?;
    rope.require_type(cfg, &["default"])?;
    let n_experts = cfg.dim("num_local_experts")?;
    let top_k = cfg.dim("num_experts_per_tok")?;
    if top_k > n_experts {
        return Err(cfg.err("num_experts_per_tok exceeds num_local_experts"));
    }
    let inter = cfg.dim("intermediate_size")?;
    let window = cfg.opt_usize("sliding_window")?;
    let ld = Loader {
        ckpt,
        family: "mixtral",
        progress,
    };

    let mut layers = Vec::with_capacity(d.n_layers);
    for i in 0..d.n_layers {
        let p = format!("model.layers.{i}");
        let mut attn = GqaAttention::load(
            &ld,
            &format!("{p}.self_attn"),
            &d,
            QkNormKind::None,
            false,
            Rope::new(rope.theta, d.head_dim, RopeLayout::HalfSplit),
        )?;
        attn.sliding_window = window;
        let moe = format!("{p}.block_sparse_moe");
        let experts = (0..n_experts)
            .map(|e| {
                ld.mlp(
                    &format!("{moe}.experts.{e}"),
                    ["w1", "w3", "w2"],
                    d.hidden,
                    inter,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let ffn = Ffn::Moe(Moe {
            router: ld.matrix(&format!("{moe}.gate.weight"), n_experts, d.hidden)?,
            routing: Routing::SoftmaxTopK {
                norm_topk_prob: true,
            },
            top_k,
            experts,
            shared: None,
            hooks: Default::default(),
        });
        layers.push(Layer::load(&ld, &p, &d, Attention::Gqa(attn), ffn)?);
    }
    Network::decoder("mixtral", &d, &ld, layers, Vec::new())
}
