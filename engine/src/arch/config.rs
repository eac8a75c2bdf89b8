//! Typed reads of `config.json` with errors that name the file and key, and the parts of the
//! config every family shares (dimensions, RoPE, eos/bos ids).

use crate::error::{Error, Result};
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
                .ok_or_else(|| self.err(format!("'{key}' must be a non-negative integer, got {v}"))),
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

/// Token ids under `key`, which configs write as an int or a list of ints.
pub fn id_list(v: &Value, key: &str) -> Vec<u32> {
    match v.get(key) {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
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
