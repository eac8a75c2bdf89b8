//! What structured output costs per token: the time llguidance needs to compute the next
//! token's mask for a JSON schema, over the vocabulary of a real tokenizer.
//!
//!     cargo run --release -p colibri-engine --example mask_cost -- MODEL_DIR [RUNS]
//!
//! MODEL_DIR holds tokenizer.json (and config.json for the logit row length). Each run
//! samples a JSON document token by token from random logits under the constraint (what a
//! model does, minus the forward pass) and times every mask. The daemon computes each mask
//! while the forward pass for that token runs, so this is the cost hidden behind it.

use colibri_engine::sample::{Sampler, SamplingParams, Xoshiro256};
use colibri_engine::structured::{GrammarCompiler, OutputFormat};
use colibri_engine::text::Text;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .unwrap_or_else(|| "tests/fixtures/qwen3_moe".into()),
    );
    let runs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let config: Value = std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let text = Text::load(&dir, &config).expect("tokenizer");
    let vocab = config["vocab_size"]
        .as_u64()
        .map(|v| v as usize)
        .unwrap_or_else(|| text.vocab_size())
        .max(text.vocab_size());
    let t = Instant::now();
    let g = GrammarCompiler::new(&text, vocab, text.eos_ids()).expect("grammar compiler");
    let setup = t.elapsed();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.(com|org)$"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
            "role": {"enum": ["admin", "user", "guest"]},
            "score": {"type": "integer", "minimum": -1000, "maximum": 1000},
            "active": {"type": "boolean"}
        },
        "required": ["name", "age", "email", "tags", "role", "score", "active"],
        "additionalProperties": false
    });
    let mut times: Vec<Duration> = Vec::new();
    let mut compile = Duration::ZERO;
    let mut valid = 0;
    for run in 0..runs {
        let t = Instant::now();
        let mut c = g
            .constraint(&text, &OutputFormat::JsonSchema(schema.clone()))
            .expect("schema compiles");
        compile += t.elapsed();
        let mut rng = Xoshiro256::seed_from_u64(run);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: run,
            ..Default::default()
        });
        let mut ids = Vec::new();
        for _ in 0..600 {
            let mut logits: Vec<f32> = (0..vocab).map(|_| (rng.next_f64() * 10.0) as f32).collect();
            let t = Instant::now();
            c.prepare_mask().expect("mask");
            times.push(t.elapsed());
            c.apply(&mut logits).expect("mask");
            let tok = s.sample(&logits, &[]);
            c.commit(tok).expect("commit");
            if text.eos_ids().contains(&tok) {
                break;
            }
            ids.push(tok);
            if c.is_stopped() {
                break;
            }
        }
        let out = text.decode(&ids, false).unwrap_or_default();
        if serde_json::from_str::<Value>(&out).is_ok() {
            valid += 1;
        }
    }
    times.sort();
    let n = times.len().max(1);
    let mean = times.iter().sum::<Duration>() / n as u32;
    let pct = |p: f64| times[((n as f64 * p) as usize).min(n - 1)];
    println!(
        "tokenizer {} ({} tokens, {} logits): compiler setup {:.1} ms, schema compile {:.2} ms per request",
        dir.display(),
        text.vocab_size(),
        vocab,
        setup.as_secs_f64() * 1e3,
        compile.as_secs_f64() * 1e3 / runs as f64
    );
    println!(
        "mask per token over {n} tokens ({runs} documents, {valid} parsed): mean {:.1} us, p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, max {:.1} us",
        mean.as_secs_f64() * 1e6,
        pct(0.5).as_secs_f64() * 1e6,
        pct(0.9).as_secs_f64() * 1e6,
        pct(0.99).as_secs_f64() * 1e6,
        times[n - 1].as_secs_f64() * 1e6
    );
}
