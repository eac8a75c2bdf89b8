//! `coli convert`, `coli synth` and `coli bench` as a user runs them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn coli() -> Command {
    Command::new(env!("CARGO_BIN_EXE_coli"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn dir_bytes(d: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

fn convert_cmd(out: &Path) -> Command {
    let mut c = coli();
    c.args(["convert", "--input"])
        .arg(fixture("mixtral"))
        .arg("--output")
        .arg(out)
        .args(["--experts", "int4", "--group-size", "32"]);
    c
}

#[test]
fn convert_killed_mid_way_then_rerun_gives_identical_bytes() {
    let whole = tempfile::tempdir().unwrap();
    let st = convert_cmd(whole.path()).status().unwrap();
    assert!(st.success());
    let want = dir_bytes(whole.path());

    let cut = tempfile::tempdir().unwrap();
    let mut child = convert_cmd(cut.path())
        .env("COLIBRI_CONVERT_PAUSE_MS", "400")
        .spawn()
        .unwrap();
    // Wait until at least one part is recorded, then kill -9.
    let manifest = cut.path().join(".colibri-convert.json");
    let t = std::time::Instant::now();
    while !manifest.exists() && t.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(manifest.exists(), "the converter recorded no part in 30 s");
    assert!(
        !cut.path().join("model.safetensors.index.json").exists(),
        "killed too late"
    );
    assert!(
        cut.path().join(".colibri-convert.lock").exists(),
        "the kill should leave the lock"
    );

    let out = convert_cmd(cut.path()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains(" 0 already done"),
        "nothing was resumed: {err}"
    );
    assert_eq!(dir_bytes(cut.path()), want);
}

#[test]
fn convert_reports_bad_input_clearly() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = coli()
        .args(["convert", "--input", "/nonexistent/model", "--output"])
        .arg(out_dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/model"), "{err}");
    let out = coli()
        .args(["convert", "--input"])
        .arg(fixture("olmoe"))
        .arg("--output")
        .arg(out_dir.path())
        .args(["--group-size", "48"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("48"));
}

#[test]
fn synth_writes_a_loadable_full_shape_model() {
    let out = tempfile::tempdir().unwrap();
    let st = coli()
        .args([
            "synth",
            "--like",
            "olmoe-1b-7b",
            "--layers",
            "1",
            "--output",
        ])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(st.success());
    let ck = colibri_engine::container::Checkpoint::open(out.path()).unwrap();
    assert!(ck.is_container);
    // 64 experts in layer 0, each one aligned extent holding its three matrices and scales.
    assert_eq!(ck.expert_extents.len(), 64);
    for (name, (_, e)) in &ck.expert_extents {
        assert_eq!(e.offset % 4096, 0, "{name}");
        assert_eq!(e.length % 4096, 0, "{name}");
        assert!(e.length as usize >= 3 * 2048 * 1024 / 2, "{name}");
    }
    let m = colibri_engine::Model::load(out.path()).unwrap();
    assert_eq!(m.info.vocab_size, 50304);
    let logits = m.score(&[1, 2, 3]).unwrap();
    assert_eq!(logits.len(), 3 * 50304);
    assert!(logits.iter().all(|v| v.is_finite()));
    // Fully random routers: different tokens pick different experts.
    let out = coli()
        .args(["bench", "--model"])
        .arg(out.path())
        .args(["--threads", "2", "--prompt", "4", "--tokens", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains("decode") && s.contains("peak RSS") && s.contains("read bandwidth"),
        "{s}"
    );
    // The yardstick alone (decode_pairs.sh measures it next to llama.cpp's runs).
    let out = coli()
        .args(["bench", "--bandwidth", "--threads", "2"])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    let gbs: f64 = s
        .strip_prefix("read bandwidth ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no bandwidth in {s:?}"));
    assert!(out.status.success() && gbs > 0.1, "{s}");
}

/// `coli synth --format hf`: a Hub checkpoint (bf16 shards with an index, config, made-up
/// byte-level tokenizer with a chat template) that colibri reads as any downloaded model.
/// (Checked against transformers by hand: max |Δlogit| 1.6e-6 on the 1-layer model.)
#[test]
fn synth_hf_writes_a_hub_checkpoint_with_a_tokenizer() {
    let out = tempfile::tempdir().unwrap();
    let st = coli()
        .args([
            "synth",
            "--like",
            "olmoe-1b-7b",
            "--layers",
            "1",
            "--format",
            "hf",
        ])
        .arg("--output")
        .arg(out.path())
        .status()
        .unwrap();
    assert!(st.success());
    let ck = colibri_engine::container::Checkpoint::open(out.path()).unwrap();
    assert!(!ck.is_container);
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.path().join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        index["weight_map"]["model.layers.0.mlp.experts.63.down_proj.weight"],
        "model-00001-of-00001.safetensors"
    );
    let m = colibri_engine::Model::load(out.path()).unwrap();
    assert_eq!(m.info.vocab_size, 50304);
    assert!(m.info.eos_ids.contains(&50279));
    let text = m.text.as_ref().expect("tokenizer.json is written");
    let ids = text.encode("Tell me about the sea", false).unwrap();
    assert!(!ids.is_empty() && ids.len() < 21, "{ids:?}");
    let logits = m.score(&ids).unwrap();
    assert!(logits.iter().all(|v| v.is_finite()));
    // The chat template renders through the model's own tokenizer config.
    let out = coli()
        .args(["run", "--local", "--model"])
        .arg(out.path())
        .args([
            "--max-tokens",
            "2",
            "--temperature",
            "0",
            "--output",
            "ids",
            "hello",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A synth model's routers follow the tokens in every layer, as a trained model's do: fed a
/// real text, each layer spreads over the experts and the same word goes to mostly the same
/// experts. (With all weights at 0.02 the residual stream became one vector common to every
/// token and the deep layers picked the same 8 experts for a whole generation: a cache
/// benchmark on such a model measures nothing.)
#[test]
fn synth_routing_follows_the_tokens_in_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    let st = coli()
        .args(["synth", "--like", "olmoe-1b-7b", "--layers", "4"])
        .args(["--experts", "int4", "--dense", "int8", "--output"])
        .arg(&model)
        .status()
        .unwrap();
    assert!(st.success());
    // tools/streaming/text_ids.py --tokens 256: the prompt is its first 32 ids, the decode
    // steps are fed the rest (--follow-ids), one per step.
    let text = std::fs::read_to_string(fixture("text_ids_256.txt")).unwrap();
    let ids: Vec<u32> = text.trim().split(',').map(|v| v.parse().unwrap()).collect();
    let follow = dir.path().join("follow.txt");
    let rest: Vec<String> = ids[32..].iter().map(|i| i.to_string()).collect();
    std::fs::write(&follow, rest.join(" ")).unwrap();
    let prompt: Vec<String> = ids[..32].iter().map(|i| i.to_string()).collect();
    let trace = dir.path().join("trace.json");
    let out = coli()
        .args(["trace", "--model"])
        .arg(&model)
        .args(["--prompt-ids", &prompt.join(","), "--max-tokens", "1000"])
        .arg("--follow-ids")
        .arg(&follow)
        .arg("--output")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    // Decode steps: one row each, fed ids[32], ids[33], ... (all of --follow-ids: it is
    // shorter than --max-tokens).
    let steps: Vec<&serde_json::Value> = t["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["rows"] == 1)
        .collect();
    assert_eq!(steps.len(), ids.len() - 32 - 1);
    for layer in 0..4 {
        let sets: Vec<Vec<u64>> = steps
            .iter()
            .map(|s| {
                let mut e: Vec<u64> = s["layers"][layer]["experts"][0]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                e.sort();
                e
            })
            .collect();
        let mut uses = [0usize; 64];
        sets.iter().flatten().for_each(|&e| uses[e as usize] += 1);
        let distinct = uses.iter().filter(|&&u| u > 0).count();
        let top = *uses.iter().max().unwrap() as f64 / sets.len() as f64;
        // Same word, earlier occurrence: share of the 8 experts both chose.
        let mut last = std::collections::HashMap::new();
        let (mut same, mut n) = (0usize, 0usize);
        for (i, s) in sets.iter().enumerate() {
            if let Some(&j) = last.get(&ids[32 + i]) {
                let prev: &Vec<u64> = &sets[j];
                same += s.iter().filter(|e| prev.contains(e)).count();
                n += 8;
            }
            last.insert(ids[32 + i], i);
        }
        let consistency = same as f64 / n as f64;
        eprintln!(
            "layer {layer}: {distinct} experts used, the most used by {:.0}% of tokens, same word same expert {:.0}%",
            100.0 * top,
            100.0 * consistency
        );
        assert!(
            distinct >= 56,
            "layer {layer}: only {distinct} of 64 experts used"
        );
        assert!(
            top < 0.5,
            "layer {layer}: one expert takes {top:.2} of the tokens"
        );
        assert!(
            consistency > 0.6 && consistency < 1.0,
            "layer {layer}: same-word consistency {consistency:.2}"
        );
    }
}
