//! Accuracy of a quantized model against the transformers reference (`ref.json` of a
//! fixture): argmax agreement, largest logit difference, mean KL divergence of the
//! next-token distributions. Used by the quantization tests and the KL report.

use crate::error::{Error, Result};
use crate::model::Model;
use std::path::{Path, PathBuf};

/// The fixture folders under `root` (those holding a transformers reference, `ref.json`),
/// sorted by name: what the accuracy reports walk.
pub fn fixture_dirs(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("ref.json").exists())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Teacher-forced reference: the input ids and the logits of every position.
pub struct Reference {
    pub input_ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

pub fn load_reference(fixture: &Path) -> Result<Reference> {
    let path = fixture.join("ref.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| Error::Config {
        file: path.clone(),
        msg: format!("invalid JSON: {e}"),
    })?;
    let bad = |m: &str| Error::Config {
        file: path.clone(),
        msg: m.to_string(),
    };
    let input_ids = v["input_ids"]
        .as_array()
        .ok_or_else(|| bad("no input_ids"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|x| x as u32)
                .ok_or_else(|| bad("input_ids must be integers"))
        })
        .collect::<Result<Vec<_>>>()?;
    let logits = v["logits"]
        .as_array()
        .ok_or_else(|| bad("no logits"))?
        .iter()
        .map(|row| {
            row.as_array()
                .ok_or_else(|| bad("logits rows must be arrays"))?
                .iter()
                .map(|x| {
                    x.as_f64()
                        .map(|x| x as f32)
                        .ok_or_else(|| bad("logits must be numbers"))
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Reference { input_ids, logits })
}

/// How close a model's teacher-forced logits are to the reference.
#[derive(Clone, Debug, Default)]
pub struct Agreement {
    pub positions: usize,
    pub argmax_equal: usize,
    pub max_abs_diff: f32,
    /// Mean over positions of KL(reference ‖ model) in nats.
    pub mean_kl: f64,
}

fn log_softmax(x: &[f32]) -> Vec<f64> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = x.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln() + m;
    x.iter().map(|v| *v as f64 - lse).collect()
}

fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best
}

/// Compares `got` (`positions × vocab`, row-major) with the reference rows.
pub fn agreement(reference: &[Vec<f32>], got: &[f32]) -> Agreement {
    let mut a = Agreement {
        positions: reference.len(),
        ..Default::default()
    };
    let vocab = reference.first().map_or(0, |r| r.len());
    for (p, r) in reference.iter().enumerate() {
        let g = &got[p * vocab..(p + 1) * vocab];
        if argmax(r) == argmax(g) {
            a.argmax_equal += 1;
        }
        for (x, y) in r.iter().zip(g) {
            a.max_abs_diff = a.max_abs_diff.max((x - y).abs());
        }
        let (lr, lg) = (log_softmax(r), log_softmax(g));
        a.mean_kl += lr
            .iter()
            .zip(&lg)
            .map(|(a, b)| a.exp() * (a - b))
            .sum::<f64>();
    }
    a.mean_kl /= reference.len().max(1) as f64;
    a
}

/// Loads `model_dir`, scores the fixture's input ids, compares with the fixture's reference.
pub fn evaluate(model_dir: &Path, fixture: &Path) -> Result<Agreement> {
    let r = load_reference(fixture)?;
    let m = Model::load(model_dir)?;
    let got = m.score(&r.input_ids)?;
    Ok(agreement(&r.logits, &got))
}
