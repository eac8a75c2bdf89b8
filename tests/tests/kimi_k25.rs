//! Kimi-K2.5 as published, beyond the shared oracle tests: its tiktoken tokenizer against
//! tiktoken itself (`tokenizer_cases.json`: CJK, emoji, code, numbers, specials, whitespace
//! runs), its chat template through minijinja against the Jinja rendering
//! (`chat_cases.json`: tools, tool calls and results, reasoning, `thinking` off), and the
//! refusals: an unknown `quant_method`, a missing scale tensor, a damaged tiktoken file.

use colibri_engine::text::{ChatMessage, ChatTemplate, Text, ToolCall, ToolSpec};
use colibri_engine::Model;
use colibri_tests::{fixture, ids};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn text() -> Text {
    let dir = fixture("kimi_k25");
    Text::load(&dir, &json(&dir.join("config.json"))).unwrap()
}

#[test]
fn tiktoken_ids_equal_tiktokens() {
    let text = text();
    let cases = json(&fixture("kimi_k25").join("tokenizer_cases.json"));
    let cases = cases["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for c in cases {
        let s = c["text"].as_str().unwrap();
        let want = ids(c, "ids");
        assert_eq!(text.encode(s, false).unwrap(), want, "{s:?}");
        // Nothing is added around a text (no BOS), and ids decode back to the text.
        assert_eq!(text.encode(s, true).unwrap(), want, "{s:?} with specials");
        assert_eq!(text.decode(&want, false).unwrap(), s);
    }
}

#[test]
fn specials_follow_the_ranks_as_tokenization_kimi_places_them() {
    let text = text();
    let n_base = std::fs::read_to_string(fixture("kimi_k25").join("tiktoken.model"))
        .unwrap()
        .lines()
        .count() as u32;
    for (off, name) in [
        (0, "[BOS]"),
        (1, "[EOS]"),
        (2, "<|im_end|>"),
        (11, "<|tool_calls_section_begin|>"),
        (14, "<|tool_call_argument_begin|>"),
        (17, "<|im_middle|>"),
        (22, "<think>"),
        (23, "</think>"),
        (255, "[PAD]"),
    ] {
        assert_eq!(text.encode(name, false).unwrap(), [n_base + off], "{name}");
    }
    // Unnamed ids are reserved tokens, matched in text like the named ones.
    let r = format!("<|reserved_token_{}|>", n_base + 5);
    assert_eq!(text.encode(&r, false).unwrap(), [n_base + 5]);
    assert_eq!(text.encode("a<|im_end|>b", false).unwrap().len(), 3);
    // Stops on [EOS] (config.json) and <|im_end|> (generation_config.json).
    assert!(text.eos_ids().contains(&(n_base + 1)) && text.eos_ids().contains(&(n_base + 2)));
    assert!(text.is_special(n_base + 2));
    assert_eq!(text.decode(&[n_base + 2], true).unwrap(), "");
    // Token bytes for structured output: a rank's bytes, a special's marker + text.
    let tb = text.token_bytes().unwrap();
    assert_eq!(tb.len(), n_base as usize + 258);
    assert_eq!(tb[b'a' as usize], b"a");
    assert_eq!(&tb[n_base as usize + 2][1..], b"<|im_end|>");
}

fn message(m: &Value) -> ChatMessage {
    let s = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
    let tool_calls = m
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|c| ToolCall {
                    id: c["id"].as_str().unwrap().to_string(),
                    name: c["function"]["name"].as_str().unwrap().to_string(),
                    arguments: c["function"]["arguments"].as_str().unwrap().to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    ChatMessage {
        role: s("role").unwrap(),
        content: s("content").unwrap_or_default(),
        tool_calls,
        tool_call_id: s("tool_call_id"),
        reasoning_content: s("reasoning_content"),
        ..Default::default()
    }
}

fn tool(t: &Value) -> ToolSpec {
    let f = &t["function"];
    ToolSpec {
        name: f["name"].as_str().unwrap().to_string(),
        description: f["description"].as_str().unwrap_or("").to_string(),
        parameters: f["parameters"].clone(),
    }
}

#[test]
fn chat_template_renders_what_jinja_renders() {
    let dir = fixture("kimi_k25");
    let text = text();
    let cases = json(&dir.join("chat_cases.json"));
    let source = text.chat_template_source().unwrap().to_string();
    let template =
        ChatTemplate::new(source, "chat_template.jinja".into(), BTreeMap::new()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for (i, c) in cases.iter().enumerate() {
        let msgs: Vec<ChatMessage> = c["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message)
            .collect();
        let tools: Vec<ToolSpec> = c
            .get("tools")
            .and_then(Value::as_array)
            .map(|t| t.iter().map(tool).collect())
            .unwrap_or_default();
        let mut vars = serde_json::Map::new();
        if let Some(t) = c.get("thinking") {
            vars.insert("thinking".into(), t.clone());
        }
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let want = c["rendered"].as_str().unwrap();
        let got = template.render_with(&msgs, add, &tools, &vars).unwrap();
        assert_eq!(got, want, "case {i}");
        assert_eq!(
            text.encode(&got, false).unwrap(),
            ids(c, "ids"),
            "case {i} ids"
        );
    }
}

/// The fixture copied into a temporary folder, `edit` applied to its config.json.
fn copy_with(edit: impl FnOnce(&mut Value, &Path)) -> tempfile::TempDir {
    let src = fixture("kimi_k25");
    let dst = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.path().join(e.file_name())).unwrap();
    }
    let mut cfg = json(&src.join("config.json"));
    edit(&mut cfg, dst.path());
    std::fs::write(dst.path().join("config.json"), cfg.to_string()).unwrap();
    dst
}

fn load_err(dir: &Path) -> String {
    match Model::load(dir) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_quant_method_is_refused_by_name() {
    let d =
        copy_with(|c, _| c["text_config"]["quantization_config"]["quant_method"] = "awq".into());
    let e = load_err(d.path());
    assert!(e.contains("quant_method 'awq' is not supported"), "{e}");
    assert_eq!(e, load_err(d.path()), "the same message each time");
    let d =
        copy_with(|c, _| c["text_config"]["quantization_config"]["format"] = "marlin-24".into());
    let e = load_err(d.path());
    assert!(e.contains("format 'marlin-24' is not supported"), "{e}");
    let d = copy_with(|c, _| {
        c["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]
            ["symmetric"] = false.into()
    });
    assert!(load_err(d.path()).contains("asymmetric int4"));
    let d = copy_with(|c, _| {
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("quantization_config");
    });
    let e = load_err(d.path());
    assert!(
        e.contains("declares no compressed-tensors quantization_config"),
        "{e}"
    );
}

#[test]
fn a_missing_scale_tensor_is_named() {
    // Drop one expert's weight_scale from the index (the shard still holds it, unindexed).
    let name = "language_model.model.layers.2.mlp.experts.5.down_proj.weight_scale";
    let d = copy_with(|_, dir| {
        let p = dir.join("model.safetensors.index.json");
        let mut idx = json(&p);
        let file = idx["weight_map"][name].as_str().unwrap().to_string();
        idx["weight_map"].as_object_mut().unwrap().remove(name);
        std::fs::write(&p, idx.to_string()).unwrap();
        // Rewrite that shard without the tensor.
        let bytes = std::fs::read(dir.join(&file)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let kept: Vec<(String, safetensors::tensor::TensorView)> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != name)
            .collect();
        let out = safetensors::serialize(kept, None).unwrap();
        std::fs::write(dir.join(&file), out).unwrap();
    });
    let e = load_err(d.path());
    assert!(
        e.contains("without its scale tensor") && e.contains(name),
        "{e}"
    );
}

#[test]
fn a_damaged_tiktoken_file_is_named() {
    let d = copy_with(|_, dir| {
        let p = dir.join("tiktoken.model");
        let t = std::fs::read_to_string(&p)
            .unwrap()
            .replacen(" 65\n", " 6x5\n", 1);
        std::fs::write(&p, t).unwrap();
    });
    let e = load_err(d.path());
    assert!(
        e.contains("tiktoken.model") && e.contains("is not a number"),
        "{e}"
    );
}
