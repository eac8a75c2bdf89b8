//! Damaged or unsupported model folders and impossible requests: each is a clear, typed
//! error that names what is wrong, never a panic.

use colibri_engine::{Error, GenerateRequest, Generation, Model};
use colibri_tests::fixture;
use std::path::Path;

/// A writable copy of a fixture folder.
fn copy_fixture(family: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture(family)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    dir
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn load_err(dir: &Path) -> Error {
    match Model::load(dir) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn unsupported_rope_scaling_is_named() {
    let d = copy_fixture("olmoe");
    edit_json(&d.path().join("config.json"), |c| {
        c["rope_scaling"] = serde_json::json!({"type": "dynamic", "factor": 2.0});
    });
    let e = load_err(d.path()).to_string();
    assert!(e.contains("dynamic") && e.contains("not supported"), "{e}");
}

#[test]
fn missing_tensor_is_named() {
    let d = copy_fixture("mixtral");
    let index = d.path().join("model.safetensors.index.json");
    // Drop one expert from the index and its shard: remove the shard entirely.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let victim = "model.layers.1.block_sparse_moe.experts.7.w2.weight";
    let shard = v["weight_map"][victim].as_str().unwrap().to_string();
    edit_json(&index, |v| {
        let map = v["weight_map"].as_object_mut().unwrap();
        map.retain(|_, f| f.as_str() != Some(shard.as_str()));
    });
    let e = load_err(d.path());
    assert!(matches!(e, Error::MissingTensor { .. }), "{e}");
    assert!(e.to_string().contains("mixtral"), "{e}");
}

#[test]
fn shape_mismatch_names_file_and_tensor() {
    let d = copy_fixture("olmoe");
    edit_json(&d.path().join("config.json"), |c| {
        c["intermediate_size"] = 48.into()
    });
    let e = load_err(d.path());
    let s = e.to_string();
    assert!(matches!(e, Error::BadTensor { .. }), "{s}");
    assert!(
        s.contains("model.safetensors") && s.contains("experts.0.gate_proj"),
        "{s}"
    );
}

#[test]
fn truncated_weights_file_is_an_error() {
    let d = copy_fixture("olmoe");
    let f = d.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let s = load_err(d.path()).to_string();
    assert!(
        s.contains("model.safetensors") && s.contains("past the data section"),
        "{s}"
    );
}

#[test]
fn missing_shard_file_is_an_error() {
    let d = copy_fixture("mixtral");
    let shard = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".safetensors"))
        .unwrap();
    std::fs::remove_file(d.path().join(&shard)).unwrap();
    let s = load_err(d.path()).to_string();
    assert!(s.contains(&shard), "{s}");
}

#[test]
fn bad_config_values_are_errors() {
    for (key, value) in [
        ("num_attention_heads", serde_json::json!(3)),
        ("hidden_size", serde_json::json!("sixty-four")),
        ("num_experts_per_tok", serde_json::json!(99)),
        ("hidden_act", serde_json::json!("gelu_pytorch_tanh")),
    ] {
        let d = copy_fixture("olmoe");
        edit_json(&d.path().join("config.json"), |c| c[key] = value.clone());
        let s = load_err(d.path()).to_string();
        assert!(s.contains("config.json"), "{key}: {s}");
    }
}

#[test]
fn prompt_longer_than_context_is_an_error_not_a_truncation() {
    let model = Model::load(&fixture("olmoe")).unwrap();
    let ctx = model.info.max_context;
    let req = GenerateRequest {
        prompt: vec![5; ctx + 1],
        max_tokens: 1,
        ..Default::default()
    };
    let e = Generation::new(&model, model.new_cache(), req)
        .err()
        .expect("must fail");
    assert!(
        matches!(e, Error::ContextOverflow { needed, max } if needed == ctx + 1 && max == ctx),
        "{e}"
    );
    // Fits the prompt, but not prompt + max_tokens.
    let req = GenerateRequest {
        prompt: vec![5; ctx - 2],
        max_tokens: 5,
        ..Default::default()
    };
    let e = Generation::new(&model, model.new_cache(), req)
        .err()
        .expect("must fail");
    assert!(e.to_string().contains("max_tokens"), "{e}");
    // Out-of-vocabulary ids.
    let req = GenerateRequest {
        prompt: vec![model.info.vocab_size as u32],
        max_tokens: 1,
        ..Default::default()
    };
    let e = Generation::new(&model, model.new_cache(), req)
        .err()
        .expect("must fail");
    assert!(e.to_string().contains("vocabulary"), "{e}");
}
