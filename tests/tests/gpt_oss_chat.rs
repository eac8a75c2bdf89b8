//! gpt-oss's harmony chat template through minijinja against transformers'
//! `apply_chat_template` (`tests/fixtures/gpt_oss/chat_cases.json`, written by
//! `tools/oracle/gpt_oss.py`): system and developer messages, reasoning, tool definitions in
//! the `functions` namespace, tool calls and their results; the same text and the same ids.

use colibri_engine::text::{ChatMessage, ChatTemplate, Text, ToolCall, ToolSpec};
use colibri_tests::{fixture, ids};
use serde_json::Value;
use std::collections::BTreeMap;

/// `Current date: YYYY-MM-DD` carries the day of rendering (`strftime_now`): the same
/// placeholder in both texts.
fn undated(s: &str) -> String {
    const KEY: &str = "Current date: ";
    match s.find(KEY) {
        Some(i) => {
            let d = i + KEY.len();
            format!("{}DATE{}", &s[..d], &s[d + 10..])
        }
        None => s.to_string(),
    }
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
                    id: String::new(),
                    name: c["function"]["name"].as_str().unwrap().to_string(),
                    arguments: c["function"]["arguments"].to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    ChatMessage {
        role: s("role").unwrap(),
        content: s("content").unwrap_or_default(),
        tool_calls,
        reasoning_content: s("thinking"),
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
fn harmony_template_renders_what_transformers_renders() {
    let dir = fixture("gpt_oss");
    let cases: Value =
        serde_json::from_slice(&std::fs::read(dir.join("chat_cases.json")).unwrap()).unwrap();
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let text = Text::load(&dir, &config).unwrap();
    let source = text
        .chat_template_source()
        .expect("chat_template.jinja")
        .to_string();
    let template =
        ChatTemplate::new(source, "chat_template.jinja".into(), BTreeMap::new()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
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
        let add = c["add_generation_prompt"].as_bool().unwrap();
        let want = c["rendered"].as_str().unwrap();
        let got = template
            .render_with(&msgs, add, &tools, &serde_json::Map::new())
            .unwrap();
        assert_eq!(undated(&got), undated(want), "case {i}");
        if tools.is_empty() {
            // Through the model's Text, as a request without tools takes it.
            assert_eq!(
                undated(&text.render_chat(&msgs, add).unwrap()),
                undated(want)
            );
        }
        // Tokenized as transformers tokenized it, once the dates agree.
        let ids = ids(c, "ids");
        let dated = {
            let k = want.find("Current date: ").unwrap() + "Current date: ".len();
            let j = got.find("Current date: ").unwrap() + "Current date: ".len();
            format!("{}{}{}", &got[..j], &want[k..k + 10], &got[j + 10..])
        };
        assert_eq!(text.encode(&dated, false).unwrap(), ids, "case {i} ids");
    }
}
