//! Typed reads of `config.json` with errors that name the file and key, and the parts of the
//! config every family shares (dimensions, RoPE).

use super::blocks::{self, RmsNorm, Rope, RopeLayout};
use crate::error::{Error, Result};
use crate::tensor::Matrix;
use serde_json::Value;
use std::path::Path;

/// A view of config.json that turns missing or mistyped keys into errors naming the key.
pub struct Cfg<'a> {
    pub v: &'a Value,
    pub file: &'a Path,
}

impl<'a> Cfg<'a> {
    pub fn new(v: &'a Value, file: &'a Path) -> Self {
        Cfg { v, file }
    }

    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::Config {
            file: self.file.to_path_buf(),
            msg: msg.into(),
        }
    }

    /// A key that is absent or JSON null reads as `None`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(format!("'{key}' must be a non-negative integer, got {v}"))
                }),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| self.err(format!("missing required key '{key}'")))
    }

    /// A positive dimension bounded so that products of a few of them cannot overflow.
    pub fn dim(&self, key: &str) -> Result<usize> {
        let d = self.usize(key)?;
        if d == 0 || d > (1 << 24) {
            return Err(self.err(format!("'{key}' = {d} is out of range")));
        }
        Ok(d)
    }

    pub fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.opt_usize(key)?.unwrap_or(default))
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(format!("'{key}' must be a finite number, got {v}"))),
        }
    }

    pub fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        Ok(self.opt_f64(key)?.unwrap_or(default))
    }

    pub fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.err(format!("'{key}' must be true or false, got {v}"))),
        }
    }

    pub fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err(format!("'{key}' must be a string, got {v}"))),
        }
    }

    pub fn usize_list_or_empty(&self, key: &str) -> Result<Vec<usize>> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64()
                        .map(|x| x as usize)
                        .ok_or_else(|| self.err(format!("'{key}' must be a list of integers")))
                })
                .collect(),
            Some(v) => Err(self.err(format!("'{key}' must be a list, got {v}"))),
        }
    }
}

/// RoPE settings, read from either spelling real checkpoints use: the Hub's legacy
/// `rope_theta` + `rope_scaling: {"type": ...}` or transformers 5's
/// `rope_parameters: {"rope_type": ..., "rope_theta": ...}`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    /// `"default"` when unscaled, else the scaling type as written.
    pub rope_type: String,
    /// The whole scaling dict (factor, beta_fast, ...), for the types that need it.
    pub params: serde_json::Map<String, Value>,
}

impl RopeParams {
    pub fn read(cfg: &Cfg, default_theta: f64) -> Result<RopeParams> {
        let mut params = serde_json::Map::new();
        let mut theta = cfg.opt_f64("rope_theta")?;
        let mut rope_type = "default".to_string();
        let mut take = |d: &serde_json::Map<String, Value>| -> Result<()> {
            for (k, v) in d {
                params.insert(k.clone(), v.clone());
            }
            if let Some(t) = d.get("rope_type").or_else(|| d.get("type")) {
                rope_type = t
                    .as_str()
                    .ok_or_else(|| cfg.err("rope type must be a string"))?
                    .to_string();
            }
            if let Some(t) = d.get("rope_theta") {
                theta = Some(
                    t.as_f64()
                        .ok_or_else(|| cfg.err("rope_theta must be a number"))?,
                );
            }
            Ok(())
        };
        if let Some(v) = cfg.get("rope_parameters") {
            let d = v
                .as_object()
                .ok_or_else(|| cfg.err("'rope_parameters' must be an object"))?;
            // transformers 5 may nest per attention type ({"full_attention": {...}}).
            if d.values().all(|x| x.is_object()) && !d.is_empty() {
                if let Some(first) = d.values().next().and_then(|x| x.as_object()) {
                    take(first)?;
                }
            } else {
                take(d)?;
            }
        }
        if let Some(v) = cfg.get("rope_scaling") {
            let d = v
                .as_object()
                .ok_or_else(|| cfg.err("'rope_scaling' must be an object or null"))?;
            take(d)?;
        }
        let theta = theta.unwrap_or(default_theta);
        if !(theta.is_finite() && theta > 0.0) {
            return Err(cfg.err(format!("rope_theta {theta} must be positive")));
        }
        Ok(RopeParams {
            theta,
            rope_type,
            params,
        })
    }

    pub fn param(&self, key: &str) -> Option<f64> {
        self.params.get(key).and_then(|v| v.as_f64())
    }

    /// Errors unless the scaling type is one of `supported`.
    pub fn require_type(&self, cfg: &Cfg, supported: &[&str]) -> Result<()> {
        if supported.contains(&self.rope_type.as_str()) {
            Ok(())
        } else {
            Err(cfg.err(format!(
                "rope scaling type '{}' is not supported for this model family (supported: {})",
                self.rope_type,
                supported.join(", ")
            )))
        }
    }
}

impl RopeParams {
    /// The rotary embedding over `rotary_dim` dims per head, for the scaling types colibri
    /// implements: `default` and `yarn` (as transformers' `_compute_yarn_parameters`, with the
    /// same f32/f64 split so the frequencies match bit for bit). `max_position` is the
    /// config's `max_position_embeddings`.
    pub fn rope(
        &self,
        cfg: &Cfg,
        rotary_dim: usize,
        layout: RopeLayout,
        max_position: usize,
    ) -> Result<Rope> {
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(cfg.err(format!(
                "rotary dimension {rotary_dim} must be even and positive"
            )));
        }
        match self.rope_type.as_str() {
            "default" => Ok(Rope::new(self.theta, rotary_dim, layout)),
            "yarn" => self.yarn(cfg, rotary_dim, layout, max_position),
            _ => Err(cfg.err(format!(
                "rope scaling type '{}' is not supported (supported: default, yarn)",
                self.rope_type
            ))),
        }
    }

    /// `original_max_position_embeddings`: transformers prefers a top-level key over the
    /// one in the scaling dict, and falls back to `max_position_embeddings`.
    fn original_max_position(&self, cfg: &Cfg, max_position: usize) -> Result<f64> {
        if let Some(v) = cfg.opt_f64("original_max_position_embeddings")? {
            return Ok(v);
        }
        Ok(self
            .param("original_max_position_embeddings")
            .unwrap_or(max_position as f64))
    }

    /// YaRN's `factor`, or max / original positions when the config leaves it out.
    fn yarn_factor(&self, cfg: &Cfg, max_position: usize) -> Result<f64> {
        match self.param("factor") {
            Some(f) => Ok(f),
            None => Ok(max_position as f64 / self.original_max_position(cfg, max_position)?),
        }
    }

    fn yarn(&self, cfg: &Cfg, dim: usize, layout: RopeLayout, max_position: usize) -> Result<Rope> {
        let base = self.theta;
        let factor = self.yarn_factor(cfg, max_position)?;
        let orig = self.original_max_position(cfg, max_position)?;
        if !(factor.is_finite() && factor > 0.0 && orig > 0.0) {
            return Err(cfg.err(format!(
                "yarn needs a positive factor and original_max_position_embeddings (got {factor}, {orig})"
            )));
        }
        let truthy = |k: &str| self.param(k).filter(|v| *v != 0.0);
        let mscale = |scale: f64, m: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * m * scale.ln() + 1.0
            }
        };
        let attention_factor = match self.param("attention_factor") {
            Some(a) => a,
            None => match (truthy("mscale"), truthy("mscale_all_dim")) {
                (Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
                _ => mscale(factor, 1.0),
            },
        };
        let beta_fast = truthy("beta_fast").unwrap_or(32.0);
        let beta_slow = truthy("beta_slow").unwrap_or(1.0);
        let truncate = match self.params.get("truncate") {
            None | Some(Value::Null) => true,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| cfg.err("rope 'truncate' must be true or false"))?,
        };
        let dimf = dim as f64;
        let correction_dim =
            |rot: f64| dimf * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln());
        let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
        if truncate {
            low = low.floor();
            high = high.ceil();
        }
        let low = low.max(0.0);
        let mut high = high.min(dimf - 1.0);
        if low == high {
            high += 0.001; // transformers' guard against a zero-width ramp
        }
        // f32 from here on, as torch: the python scalars enter the tensor ops as f32.
        let (base32, factor32) = (base as f32, factor as f32);
        let (low32, span32) = (low as f32, (high - low) as f32);
        let inv_freq = (0..dim / 2)
            .map(|i| {
                let pos_freq = base32.powf((2 * i) as f32 / dim as f32);
                let extrapolation = 1.0 / pos_freq;
                let interpolation = 1.0 / (factor32 * pos_freq);
                let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
                let extrapolation_factor = 1.0 - ramp;
                interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor
            })
            .collect();
        Ok(Rope {
            inv_freq,
            rotary_dim: dim,
            layout,
            attention_scaling: attention_factor as f32,
            table: Default::default(),
        })
    }

    /// The factor MLA families (DeepSeek-V3, GLM-5) multiply their softmax scale by: YaRN's
    /// `mscale(factor, mscale_all_dim)²` when the config scales RoPE and sets
    /// `mscale_all_dim`, else 1 (transformers' `yarn_apply_mscale`).
    pub fn mla_softmax_mscale(&self, cfg: &Cfg, max_position: usize) -> Result<f64> {
        if self.rope_type == "default" {
            return Ok(1.0);
        }
        match self.param("mscale_all_dim").filter(|v| *v != 0.0) {
            None => Ok(1.0),
            Some(all) => {
                let factor = self.yarn_factor(cfg, max_position)?;
                let m = if factor <= 1.0 {
                    1.0
                } else {
                    0.1 * all * factor.ln() + 1.0
                };
                Ok(m * m)
            }
        }
    }
}

/// Dimensions every GQA family reads the same way.
pub struct CommonDims {
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub max_context: usize,
    pub eps: f32,
    pub tie_embeddings: bool,
}

impl CommonDims {
    pub fn read(cfg: &Cfg) -> Result<CommonDims> {
        let mut d = Self::read_shared(cfg)?;
        let n_heads = d.n_heads;
        let n_kv_heads = match cfg.opt_usize("num_key_value_heads")? {
            Some(k) => k,
            None => n_heads,
        };
        if n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
            return Err(cfg.err(format!(
                "num_attention_heads ({n_heads}) must be a multiple of num_key_value_heads ({n_kv_heads})"
            )));
        }
        let head_dim = match cfg.opt_usize("head_dim")? {
            Some(h) if h > 0 => h,
            _ => {
                if d.hidden % n_heads != 0 {
                    return Err(cfg.err("hidden_size is not a multiple of num_attention_heads and no head_dim is given"));
                }
                d.hidden / n_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(cfg.err(format!("head_dim {head_dim} must be even for RoPE")));
        }
        d.n_kv_heads = n_kv_heads;
        d.head_dim = head_dim;
        Ok(d)
    }

    /// Everything but the GQA head layout (`n_kv_heads` = `n_heads`, `head_dim` = 0): MLA
    /// families size their heads from their own keys (see [`MlaDims`](super::mla::MlaDims)).
    pub fn read_shared(cfg: &Cfg) -> Result<CommonDims> {
        let act = cfg.str_or("hidden_act", "silu")?;
        if act != "silu" {
            return Err(cfg.err(format!("hidden_act '{act}' is not supported (silu is)")));
        }
        let n_heads = cfg.dim("num_attention_heads")?;
        Ok(CommonDims {
            hidden: cfg.dim("hidden_size")?,
            n_layers: cfg.dim("num_hidden_layers")?,
            n_heads,
            n_kv_heads: n_heads,
            head_dim: 0,
            vocab: cfg.dim("vocab_size")?,
            max_context: cfg.dim("max_position_embeddings")?,
            eps: cfg.f64_or("rms_norm_eps", 1e-6)? as f32,
            tie_embeddings: cfg.bool_or("tie_word_embeddings", false)?,
        })
    }

    /// Embedding, final norm and lm_head under the usual Hub names.
    pub fn embeddings(&self, ld: &blocks::Loader) -> Result<(Matrix, RmsNorm, Matrix)> {
        let embed = ld.matrix("model.embed_tokens.weight", self.vocab, self.hidden)?;
        let norm = ld.norm("model.norm.weight", self.hidden, self.eps)?;
        let lm_head = if self.tie_embeddings && ld.ckpt.get("lm_head.weight").is_none() {
            embed.clone()
        } else {
            ld.matrix("lm_head.weight", self.vocab, self.hidden)?
        };
        Ok((embed, norm, lm_head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope_of(json: &str, dim: usize) -> (Rope, f64) {
        let v: Value = serde_json::from_str(json).unwrap();
        let cfg = Cfg::new(&v, Path::new("config.json"));
        let p = RopeParams::read(&cfg, 10000.0).unwrap();
        let max = cfg.usize("max_position_embeddings").unwrap();
        (
            p.rope(&cfg, dim, RopeLayout::Interleaved, max).unwrap(),
            p.mla_softmax_mscale(&cfg, max).unwrap(),
        )
    }

    #[test]
    fn yarn_matches_transformers_for_both_spellings() {
        // The deepseek_v3 fixture's settings; values from transformers 5.24.
        let want = [
            1.0, 0.23717, 0.05, 0.0079057, 0.0025, 7.9057e-4, 2.5e-4, 7.9057e-5,
        ];
        let legacy = r#"{"max_position_embeddings": 256, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}"#;
        let v5 = r#"{"max_position_embeddings": 256, "rope_parameters": {"rope_type": "yarn",
            "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}"#;
        for json in [legacy, v5] {
            let (r, m) = rope_of(json, 16);
            for (got, want) in r.inv_freq.iter().zip(want) {
                assert!((got - want).abs() <= want * 1e-4, "{:?}", r.inv_freq);
            }
            assert_eq!(r.attention_scaling, 1.0);
            let scale = (48f64).powf(-0.5) * m;
            assert!((scale - 0.18713).abs() < 1e-5, "{scale}");
        }
    }

    #[test]
    fn yarn_attention_factor_without_mscale_all_dim() {
        let (r, m) = rope_of(
            r#"{"max_position_embeddings": 256, "rope_scaling": {"type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 64}}"#,
            16,
        );
        assert!((r.attention_scaling - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        assert_eq!(m, 1.0);
    }

    #[test]
    fn unknown_rope_type_is_an_error() {
        let v: Value =
            serde_json::from_str(r#"{"rope_scaling": {"type": "dynamic", "factor": 2.0}}"#)
                .unwrap();
        let cfg = Cfg::new(&v, Path::new("config.json"));
        let p = RopeParams::read(&cfg, 10000.0).unwrap();
        assert!(p.rope(&cfg, 16, RopeLayout::HalfSplit, 128).is_err());
    }
}
