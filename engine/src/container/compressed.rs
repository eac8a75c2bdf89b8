//! compressed-tensors checkpoints (`quantization_config.quant_method` "compressed-tensors",
//! format "pack-quantized"), read as published: each quantized Linear's `X.weight_packed`
//! (I32, eight 4-bit codes per word), `X.weight_scale` (one scale per group, bf16 as
//! published) and `X.weight_shape` become one tensor `X.weight` in
//! [`WeightFormat::I4Ct`], its codes and scales borrowed where they lie — so every family
//! loads such a checkpoint (Kimi-K2-Thinking, Kimi-K2.5, llm-compressor's W4A16 exports)
//! without a conversion step, and streams its experts from those bytes.
//!
//! The scheme comes from the config (top level, or a multimodal wrapper's `text_config`, where
//! Kimi-K2.5 keeps it): 4-bit `int` weights, strategy `group` (or `channel`: one group per
//! row), symmetric. Anything else is refused by name rather than read wrong.

use super::{DType, TensorRef};
use crate::error::{Error, Result};
use crate::format::{ScaleType, WeightFormat};
use crate::tensor::Blob;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// `quant_method`s read elsewhere: gpt-oss's MXFP4 (`arch::gpt_oss`) and DeepSeek's FP8
/// blocks (`coli convert`).
const OTHER_METHODS: [&str; 2] = ["mxfp4", "fp8"];

/// The weights' scheme of a compressed-tensors config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtScheme {
    /// Elements per scale; 0 = one scale per row (`channel`).
    pub group: u32,
}

/// The config's `quantization_config` (top level, else the nested text config's).
pub fn quantization_config(config: &Value) -> Option<&Value> {
    config.get("quantization_config").or_else(|| {
        ["text_config", "language_config", "llm_config"]
            .iter()
            .find_map(|k| config.get(*k)?.get("quantization_config"))
    })
}

/// The compressed-tensors scheme a config declares: `Ok(None)` when it declares none (or a
/// method read elsewhere), an error naming the key for anything this engine cannot read.
pub fn scheme(config: &Value, file: &Path) -> Result<Option<CtScheme>> {
    let Some(q) = quantization_config(config) else {
        return Ok(None);
    };
    let err = |msg: String| Error::Config {
        file: file.to_path_buf(),
        msg,
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    if OTHER_METHODS.contains(&method) {
        return Ok(None);
    }
    if method != "compressed-tensors" {
        return Err(err(format!(
            "quantization_config.quant_method '{method}' is not supported (compressed-tensors \
             pack-quantized int4, mxfp4 and fp8 are)"
        )));
    }
    let top_format = q.get("format").and_then(Value::as_str);
    let groups = q
        .get("config_groups")
        .and_then(Value::as_object)
        .filter(|g| !g.is_empty())
        .ok_or_else(|| err("quantization_config.config_groups: none given".into()))?;
    let mut found: Option<CtScheme> = None;
    for (name, group) in groups {
        let at = |k: &str| format!("quantization_config.config_groups.{name}.{k}");
        let format = group
            .get("format")
            .and_then(Value::as_str)
            .or(top_format)
            .unwrap_or("");
        if format != "pack-quantized" {
            return Err(err(format!(
                "{}: compressed-tensors format '{format}' is not supported (pack-quantized is)",
                at("format")
            )));
        }
        let w = group
            .get("weights")
            .filter(|w| w.is_object())
            .ok_or_else(|| err(format!("{}: missing", at("weights"))))?;
        let get_str = |k: &str| w.get(k).and_then(Value::as_str).unwrap_or("");
        let bits = w.get("num_bits").and_then(Value::as_u64);
        if get_str("type") != "int" || bits != Some(4) {
            return Err(err(format!(
                "{}: {:?}-bit '{}' weights are not supported (4-bit int is)",
                at("weights"),
                bits,
                get_str("type")
            )));
        }
        if w.get("symmetric").and_then(Value::as_bool) == Some(false) {
            return Err(err(format!(
                "{}: asymmetric int4 (weight_zero_point) is not supported; symmetric is",
                at("weights.symmetric")
            )));
        }
        if let Some(a) = w.get("actorder").filter(|a| !a.is_null()) {
            if a.as_str() == Some("group") {
                return Err(err(format!(
                    "{}: activation-ordered groups (weight_g_idx) are not supported",
                    at("weights.actorder")
                )));
            }
        }
        let g = match get_str("strategy") {
            "group" => {
                let g = w.get("group_size").and_then(Value::as_u64).unwrap_or(0);
                if g == 0 || !g.is_multiple_of(8) || g > 1 << 20 {
                    return Err(err(format!(
                        "{}: {g} is not a positive multiple of 8",
                        at("weights.group_size")
                    )));
                }
                g as u32
            }
            "channel" => 0,
            other => {
                return Err(err(format!(
                    "{}: strategy '{other}' is not supported (group, channel are)",
                    at("weights.strategy")
                )))
            }
        };
        let s = CtScheme { group: g };
        if found.is_some_and(|f| f != s) {
            return Err(err(
                "quantization_config.config_groups: groups with different int4 group sizes \
                 are not supported"
                    .into(),
            ));
        }
        found = Some(s);
    }
    Ok(found)
}

const PACKED: &str = ".weight_packed";

/// Attaches every `X.weight_packed` as `X.weight` in [`WeightFormat::I4Ct`]; returns how
/// many. A packed weight without a compressed-tensors config, or without its scales, is an
/// error naming the tensor.
pub(super) fn attach(
    config: &Value,
    config_path: &Path,
    tensors: &mut HashMap<String, TensorRef>,
) -> Result<usize> {
    let mut stems: Vec<String> = tensors
        .keys()
        .filter_map(|n| n.strip_suffix(PACKED).map(str::to_string))
        .collect();
    let scheme = scheme(config, config_path)?;
    if stems.is_empty() {
        return Ok(0);
    }
    stems.sort();
    let Some(scheme) = scheme else {
        let t = &tensors[&format!("{}{PACKED}", stems[0])];
        return Err(t.bad(
            "a compressed-tensors packed weight, but config.json declares no compressed-tensors \
             quantization_config",
        ));
    };
    for stem in &stems {
        let t = attach_one(stem, scheme, tensors)?;
        tensors.insert(t.name.clone(), t);
    }
    Ok(stems.len())
}

fn attach_one(
    stem: &str,
    scheme: CtScheme,
    tensors: &HashMap<String, TensorRef>,
) -> Result<TensorRef> {
    let packed = &tensors[&format!("{stem}{PACKED}")];
    let name = format!("{stem}.weight");
    if tensors.contains_key(&name) {
        return Err(packed.bad(format!("both '{name}' and its packed form are present")));
    }
    if packed.dtype != DType::I32 || packed.shape.len() != 2 {
        return Err(packed.bad(format!(
            "a pack-quantized weight is a 2-D I32 tensor, not {} {:?}",
            packed.dtype.name(),
            packed.shape
        )));
    }
    let (rows, words) = (packed.shape[0], packed.shape[1]);
    let cols = match tensors.get(&format!("{stem}.weight_shape")) {
        Some(s) => {
            let v = shape_values(s)?;
            if v.len() != 2 || v[0] != rows as i64 || v[1] <= 0 {
                return Err(s.bad(format!(
                    "weight_shape {v:?} does not fit the packed weight's {rows} rows"
                )));
            }
            v[1] as usize
        }
        None => words * 8,
    };
    if cols.div_ceil(8) != words || !cols.is_multiple_of(8) {
        return Err(packed.bad(format!(
            "{words} words of codes per row do not hold {cols} 4-bit values (rows of a multiple \
             of 8 are read)"
        )));
    }
    let scale_name = format!("{stem}.weight_scale");
    let scale = tensors.get(&scale_name).ok_or_else(|| {
        packed.bad(format!(
            "compressed-tensors int4 weight without its scale tensor '{scale_name}'"
        ))
    })?;
    for extra in ["weight_zero_point", "weight_g_idx"] {
        if let Some(t) = tensors.get(&format!("{stem}.{extra}")) {
            return Err(t.bad(format!(
                "{extra} is not supported (symmetric int4 without activation order is)"
            )));
        }
    }
    let st = match scale.dtype {
        DType::BF16 => ScaleType::BF16,
        DType::F16 => ScaleType::F16,
        DType::F32 => ScaleType::F32,
        other => {
            return Err(scale.bad(format!(
                "scales of dtype {} (bf16, f16 or f32 are read)",
                other.name()
            )))
        }
    };
    let format = WeightFormat::I4Ct {
        group: scheme.group,
        scale: st,
    };
    let groups = format.groups_per_row(cols);
    if scale.shape != [rows, groups] {
        return Err(scale.bad(format!(
            "shape {:?}, but [{rows}, {cols}] in groups of {} needs [{rows}, {groups}]",
            scale.shape,
            format.group_len(cols).unwrap_or(cols)
        )));
    }
    let routed = stem.contains(".mlp.experts.") || stem.contains(".block_sparse_moe.experts.");
    Ok(TensorRef {
        name,
        dtype: DType::I32,
        shape: vec![rows, words],
        file: packed.file.clone(),
        start: packed.start,
        end: packed.end,
        quant: Some(Arc::new(super::QuantAttach {
            format: Some(format),
            shape: vec![rows, cols],
            scales: Some(Blob::Mapped {
                file: scale.file.clone(),
                start: scale.start,
                end: scale.end,
            }),
            scale_count: rows * groups,
            routed_expert: routed,
            repack: false,
            repacked: Default::default(),
        })),
    })
}

/// The values of a `weight_shape` tensor (I32 or I64, as compressed-tensors writes it).
fn shape_values(t: &TensorRef) -> Result<Vec<i64>> {
    let b = t.bytes();
    match t.dtype {
        DType::I64 => Ok(b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()),
        DType::I32 => Ok(b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
            .collect()),
        other => Err(t.bad(format!(
            "weight_shape of dtype {} (I32 or I64)",
            other.name()
        ))),
    }
}
