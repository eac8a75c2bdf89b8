//! DeepSeek-V3.2's chat format. Its Hub repository ships no Jinja template but a Python encoder
//! (encoding/encoding_dsv32.py) and that encoder's test vectors, copied unchanged into
//! `tests/fixtures/deepseek_v32/encoding/` (MIT, DeepSeek; see the README there): a folder of
//! model_type `deepseek_v32` without a template gets the engine's built-in one, which must
//! write those bytes. Then the other way: the DSML calls of those conversations, parsed back
//! from the text the model generates.

use colibri_engine::text::{ChatMessage, ReplyParser, Text, ToolCall, ToolFormat, ToolSpec};
use colibri_tests::fixture;
use serde_json::{json, Map, Value};

fn encoding(file: &str) -> String {
    std::fs::read_to_string(fixture("deepseek_v32").join("encoding").join(file)).unwrap()
}

fn text() -> Text {
    let dir = fixture("deepseek_v32");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    Text::load(&dir, &config).unwrap()
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
                    id: c["id"].as_str().unwrap_or("").to_string(),
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

/// A test input as the encoder's test script reads it: tools beside the messages or on the
/// first message, thinking mode.
fn case(file: &str) -> (Vec<ChatMessage>, Vec<ToolSpec>) {
    let v: Value = serde_json::from_str(&encoding(file)).unwrap();
    let msgs = v["messages"].as_array().unwrap();
    let tools = v
        .get("tools")
        .or_else(|| msgs[0].get("tools"))
        .and_then(Value::as_array)
        .map(|a| a.iter().map(tool).collect())
        .unwrap_or_default();
    (msgs.iter().map(message).collect(), tools)
}

fn thinking(on: bool) -> Map<String, Value> {
    let mut vars = Map::new();
    vars.insert("thinking".into(), json!(on));
    vars
}

const CASES: [(&str, &str); 3] = [
    ("test_input.json", "test_output.txt"),
    (
        "test_input_search_w_date.json",
        "test_output_search_w_date.txt",
    ),
    (
        "test_input_search_wo_date.json",
        "test_output_search_wo_date.txt",
    ),
];

#[test]
fn the_built_in_format_writes_the_encoders_test_vectors() {
    let t = text();
    assert_eq!(t.tool_format(), Some(ToolFormat::Dsml));
    for (input, output) in CASES {
        let (msgs, tools) = case(input);
        let got = t
            .render_chat_with(&msgs, false, &tools, &thinking(true))
            .unwrap();
        let want = encoding(output);
        let want = want.trim_end_matches('\n');
        if got != want {
            let at = got
                .char_indices()
                .zip(want.chars())
                .find(|((_, a), b)| a != b)
                .map(|((i, _), _)| i)
                .unwrap_or(got.len().min(want.len()));
            let from = got[..at].char_indices().rev().nth(80).map_or(0, |(i, _)| i);
            panic!(
                "{input}: differs at byte {at}:\n got: {:?}\nwant: {:?}",
                &got[from..(at + 80).min(got.len())],
                &want[from..(at + 80).min(want.len())]
            );
        }
    }
}

#[test]
fn chat_mode_closes_the_think_block_and_drops_reasoning() {
    let t = text();
    let msgs = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
    ];
    let chat = t
        .render_chat_with(&msgs, true, &[], &thinking(false))
        .unwrap();
    assert_eq!(
        chat,
        "<｜begin▁of▁sentence｜>Be brief.<｜User｜>Hi<｜Assistant｜></think>"
    );
    let think = t
        .render_chat_with(&msgs, true, &[], &thinking(true))
        .unwrap();
    assert!(think.ends_with("<｜Assistant｜><think>"), "{think}");
    // The reply to a thinking prompt starts inside the think block.
    let cfg = t.reply_config(&think, &[], "c");
    assert_eq!(cfg.think, Some(true));
}

#[test]
fn dsml_calls_parse_back_in_every_chunking() {
    let t = text();
    let (msgs, tools) = case("test_input.json");
    // The last assistant turn with tool calls, as the model generates it after the prompt.
    let upto = msgs.iter().rposition(|m| !m.tool_calls.is_empty()).unwrap();
    let prompt = t
        .render_chat_with(&msgs[..upto], true, &tools, &thinking(true))
        .unwrap();
    let full = t
        .render_chat_with(&msgs[..=upto], false, &tools, &thinking(true))
        .unwrap();
    let reply = full[prompt.len()..].trim_end_matches("<｜end▁of▁sentence｜>");
    let want = &msgs[upto];
    let cfg = t.reply_config(&prompt, &tools, "call_");
    for chunk in [1, 2, 3, 5, 8, 13, 1000] {
        let mut p = ReplyParser::new(cfg.clone());
        let chars: Vec<char> = reply.chars().collect();
        let mut content = String::new();
        let mut reasoning = String::new();
        for piece in chars.chunks(chunk) {
            let d = p.push(&piece.iter().collect::<String>());
            content += &d.content;
            reasoning += &d.reasoning;
        }
        let (d, s) = p.finish();
        content += &d.content;
        reasoning += &d.reasoning;
        assert_eq!(
            reasoning,
            want.reasoning_content.clone().unwrap(),
            "chunk {chunk}"
        );
        assert_eq!(content, "", "chunk {chunk}");
        assert!(!s.incomplete_call);
        assert_eq!(s.tool_calls.len(), want.tool_calls.len());
        for (got, want) in s.tool_calls.iter().zip(&want.tool_calls) {
            assert_eq!(got.name, want.name);
            let a: Value = serde_json::from_str(&got.arguments).unwrap();
            let b: Value = serde_json::from_str(&want.arguments).unwrap();
            assert_eq!(a, b, "chunk {chunk}");
        }
    }
    // Typed values: a non-string parameter is JSON, a string stays text even when it reads
    // as a number.
    let mut p = ReplyParser::new(cfg);
    p.push("</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"location\" string=\"true\">007</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
    let (_, s) = p.finish();
    assert_eq!(
        s.tool_calls[0].arguments,
        r#"{"location": "007", "days": [1, 2]}"#
    );
}
