//! gpt-oss (`GptOssForCausalLM`: openai/gpt-oss-20b, gpt-oss-120b), read as published: GQA
//! with q/k/v/o biases and attention sinks, `layer_types` alternating sliding-window and full
//! attention, YaRN RoPE (half-split), a router with a bias whose weights are a softmax over
//! the top-k logits, and routed experts in MXFP4 (`*_blocks` / `*_scales`, read in place)
//! with biases, gate/up rows interleaved in one matrix, and the clamped SwiGLU.

use super::attention::{GqaAttention, QkNormKind};
use super::blocks::{Loader, Mlp, RopeLayout};
use super::config::{Cfg, RopeParams};
use super::glu::{Glu, GluAct};
use super::moe::{Moe, Routing};
use super::{Attention, CommonDims, Ffn, Layer, LoadHook, Network};
use crate::container::{Checkpoint, DType, TensorRef};
use crate::error::Result;
use crate::tensor::{Blob, Matrix, WeightFormat};
use std::sync::Arc;

const FAMILY: &str = "gpt_oss";

pub fn build(ckpt: &Checkpoint, cfg: &Cfg, progress: &LoadHook) -> Result<Network> {
    let d = CommonDims::read(cfg)?;
    let rope = RopeParams::read(cfg, 150000.0)?;
    rope.require_type(cfg, &["default", "yarn"])?;
    let rope = rope.rope(cfg, d.head_dim, RopeLayout::HalfSplit, d.max_context)?;
    let n_experts = cfg.dim("num_local_experts")?;
    // The published config has both spellings; transformers reads num_experts_per_tok.
    let top_k = match cfg.opt_usize("num_experts_per_tok")? {
        Some(k) => k,
        None => cfg.usize("experts_per_token")?,
    };
    if top_k == 0 || top_k > n_experts {
        return Err(cfg.err("num_experts_per_tok must be between 1 and num_local_experts"));
    }
    let inter = cfg.dim("intermediate_size")?;
    let act = GluAct::ClampedSwiGlu {
        limit: cfg.f64_or("swiglu_limit", 7.0)? as f32,
        alpha: cfg.f64_or("swiglu_alpha", 1.702)? as f32,
    };
    let bias = cfg.bool_or("attention_bias", true)?;
    let window = cfg.opt_usize("sliding_window")?;
    let sliding = layer_is_sliding(cfg, d.n_layers)?;
    let quant = cfg
        .get("quantization_config")
        .and_then(|q| q.get("quant_method"))
        .and_then(|m| m.as_str());
    if quant != Some("mxfp4") {
        return Err(cfg.err(format!(
            "gpt_oss: the routed experts are read in the published MXFP4 layout \
             (quantization_config.quant_method \"mxfp4\", *_blocks / *_scales); got {quant:?}"
        )));
    }
    let ld = Loader {
        ckpt,
        family: FAMILY,
        progress,
    };

    let mut layers = Vec::with_capacity(d.n_layers);
    for (i, &sliding) in sliding.iter().enumerate() {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        if bias {
            // GqaAttention::load takes o_proj's bias where the checkpoint has one: here it must.
            ckpt.require(&format!("{a}.o_proj.bias"), FAMILY)?;
        }
        let mut attn = GqaAttention::load(&ld, &a, &d, QkNormKind::None, bias, rope.clone())?;
        attn.sinks = Some(ld.vector(&format!("{a}.sinks"), d.n_heads)?);
        attn.sliding_window = if sliding { window } else { None };
        let x = format!("{p}.mlp.experts");
        let gate_up = mxfp4_experts(&ld, &x, "gate_up_proj", n_experts, 2 * inter, d.hidden)?;
        let down = mxfp4_experts(&ld, &x, "down_proj", n_experts, d.hidden, inter)?;
        let gu_bias = per_expert(&ld, &format!("{x}.gate_up_proj_bias"), n_experts, 2 * inter)?;
        let dn_bias = per_expert(&ld, &format!("{x}.down_proj_bias"), n_experts, d.hidden)?;
        let experts = gate_up
            .into_iter()
            .zip(down)
            .zip(gu_bias.into_iter().zip(dn_bias))
            .map(|((gate, down), (gb, db))| Mlp {
                up: no_rows(&gate),
                gate,
                down,
                glu: Glu {
                    act,
                    interleaved: true,
                    gate_up_bias: Some(gb),
                    down_bias: Some(db),
                },
            })
            .collect();
        let moe = Moe {
            router: ld.matrix(&format!("{p}.mlp.router.weight"), n_experts, d.hidden)?,
            routing: Routing::TopKSoftmax {
                bias: ld.vector(&format!("{p}.mlp.router.bias"), n_experts)?,
            },
            top_k,
            experts,
            shared: None,
            hooks: Default::default(),
        };
        layers.push(Layer::load(
            &ld,
            &p,
            &d,
            Attention::Gqa(attn),
            Ffn::Moe(moe),
        )?);
    }
    Network::decoder(FAMILY, &d, &ld, layers, Vec::new())
}

/// Per layer, whether it attends through the sliding window: `layer_types` as written
/// (`sliding_attention` / `full_attention`), else transformers' default (even layers slide).
fn layer_is_sliding(cfg: &Cfg, n_layers: usize) -> Result<Vec<bool>> {
    let Some(v) = cfg.get("layer_types") else {
        return Ok((0..n_layers).map(|i| i % 2 == 0).collect());
    };
    let types = v
        .as_array()
        .filter(|a| a.len() == n_layers)
        .ok_or_else(|| cfg.err(format!("'layer_types' must list {n_layers} layer types")))?;
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("sliding_attention") => Ok(true),
            Some("full_attention") => Ok(false),
            _ => Err(cfg.err(format!(
                "layer type {t} is not sliding_attention or full_attention"
            ))),
        })
        .collect()
}

/// The `n` expert matrices `[rows, cols]` of one MXFP4 projection as the Hub publishes
/// gpt-oss: `{experts}.{proj}_blocks` U8 `[n, rows, cols/32, 16]` and `{experts}.{proj}_scales`
/// U8 `[n, rows, cols/32]`, each expert's rows borrowed from the memory map as they lie.
pub fn mxfp4_experts(
    ld: &Loader,
    experts: &str,
    proj: &str,
    n: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<Matrix>> {
    let blocks = ld
        .ckpt
        .require(&format!("{experts}.{proj}_blocks"), FAMILY)?;
    let scales = ld
        .ckpt
        .require(&format!("{experts}.{proj}_scales"), FAMILY)?;
    if !cols.is_multiple_of(32) {
        return Err(blocks.bad(format!(
            "MXFP4 rows of {cols} elements are not whole blocks of 32"
        )));
    }
    let nb = cols / 32;
    for (t, shape) in [(blocks, vec![n, rows, nb, 16]), (scales, vec![n, rows, nb])] {
        if t.dtype != DType::U8 {
            return Err(t.bad(format!("MXFP4 {proj} is U8, not {}", t.dtype.name())));
        }
        t.expect_shape(&shape)?;
    }
    let slice = |t: &TensorRef, len: usize, e: usize| Blob::Mapped {
        file: t.file.clone(),
        start: t.start + e * len,
        end: t.start + (e + 1) * len,
    };
    (0..n)
        .map(|e| {
            let mut m = Matrix::quantized(
                rows,
                cols,
                WeightFormat::Mxfp4,
                slice(blocks, rows * nb * 16, e),
                Some(slice(scales, rows * nb, e)),
            )
            .map_err(|msg| blocks.bad(msg))?;
            m.int8_act = crate::kernels::int8_act_for(m.format)
                && crate::kernels::q8_supported(m.format, cols);
            ld.progress
                .record_matrix(&format!("{experts}.{e}.{proj}"), &m);
            Ok(m)
        })
        .collect()
}

/// A `[n, len]` tensor as `n` vectors (the experts' biases).
fn per_expert(ld: &Loader, name: &str, n: usize, len: usize) -> Result<Vec<Arc<[f32]>>> {
    let t = ld.ckpt.require(name, FAMILY)?;
    t.expect_shape(&[n, len])?;
    let v = t.to_f32_vec()?;
    Ok(v.chunks_exact(len).map(Arc::from).collect())
}

/// The empty `up` of an MLP whose gate matrix holds gate and up rows ([`Glu::interleaved`]):
/// no rows, its (empty) bytes at the end of `gate`'s in the same file.
fn no_rows(gate: &Matrix) -> Matrix {
    let data = match &gate.data {
        Blob::Mapped { file, end, .. } => Blob::Mapped {
            file: file.clone(),
            start: *end,
            end: *end,
        },
        _ => Blob::Owned(Arc::new(Vec::new())),
    };
    Matrix::quantized(0, gate.cols, gate.format, data, None).expect("an empty matrix")
}
