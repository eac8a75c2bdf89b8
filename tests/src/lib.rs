//! Shared helpers for colibri's oracle and end-to-end tests: fixture discovery and the
//! transformers reference files (`tests/fixtures/<family>/ref.json`).

pub mod daemon;
pub mod http;

use std::path::PathBuf;

/// The fixture families whose logits must match transformers.
pub const FAMILIES: &[&str] = &[
    "olmoe",
    "qwen3_moe",
    "mixtral",
    "deepseek_v3",
    "deepseek_v3_noqlora",
    "deepseek_v32",
    "glm4_moe",
    "glm_moe_dsa",
    "gpt_oss",
    "kimi_k25",
];

/// Largest |Δlogit| against transformers at any position.
pub const LOGIT_TOL: f32 = 2e-3;

/// `tests/fixtures` of this repository.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

pub fn fixture(family: &str) -> PathBuf {
    fixtures_dir().join(family)
}

/// The reference a fixture's generator computed with transformers.
pub struct Reference {
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub input_ids: Vec<u32>,
    /// One row of `vocab` logits per position of `input_ids`.
    pub logits: Vec<Vec<f32>>,
}

/// The token ids under `key` of a JSON object (ref.json, chat cases).
pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no '{key}' in the JSON"))
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

impl Reference {
    /// Greedy-decodes `prompt_ids` with `model` in process and asserts transformers'
    /// `greedy_ids` (`what` names the model in the failure).
    pub fn assert_greedy(&self, model: &colibri_engine::Model, what: &str) {
        let req = colibri_engine::GenerateRequest {
            prompt: self.prompt_ids.clone(),
            max_tokens: self.greedy_ids.len(),
            sampling: colibri_engine::SamplingParams::default(),
            ignore_eos: true,
            ..Default::default()
        };
        let mut g = colibri_engine::Generation::new(model, model.new_cache(), req).unwrap();
        g.run(model, 64, |_| {}).unwrap();
        assert_eq!(
            g.generated(),
            &self.greedy_ids[..],
            "{what}: greedy continuation"
        );
    }

    pub fn load(family: &str) -> Reference {
        let path = fixture(family).join("ref.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let v: serde_json::Value = serde_json::from_str(&text).expect("ref.json is JSON");
        let logits = v["logits"]
            .as_array()
            .expect("logits")
            .iter()
            .map(|row| {
                row.as_array()
                    .expect("logits row")
                    .iter()
                    .map(|x| x.as_f64().expect("logit") as f32)
                    .collect()
            })
            .collect();
        Reference {
            prompt_ids: ids(&v, "prompt_ids"),
            greedy_ids: ids(&v, "greedy_ids"),
            input_ids: ids(&v, "input_ids"),
            logits,
        }
    }
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// (index of the largest value, gap between the two largest values).
pub fn top2(v: &[f32]) -> (usize, f32) {
    let mut best = 0;
    for i in 1..v.len() {
        if v[i] > v[best] {
            best = i;
        }
    }
    let second = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .map(|(_, x)| *x)
        .fold(f32::NEG_INFINITY, f32::max);
    (best, v[best] - second)
}
