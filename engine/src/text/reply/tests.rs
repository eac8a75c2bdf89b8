//! The reply parser on text rendered by the real chat templates of each family
//! (tests/fixtures/templates): what a template writes for an assistant turn with tool calls
//! is what the model was trained to generate, so parsing it must give the calls back.

use super::*;
use crate::text::tools::{
    ToolCall, ToolFormat, ToolSpec, DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END,
    DS_SEP,
};
use crate::text::{ChatMessage, ChatTemplate};
use serde_json::json;
use serde_json::Value;
use std::collections::BTreeMap;

fn template(file: &str) -> ChatTemplate {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/templates")
            .join(file),
    )
    .unwrap();
    let vars = BTreeMap::from([
        (
            "bos_token".to_string(),
            "<｜begin▁of▁sentence｜>".to_string(),
        ),
        ("eos_token".to_string(), "<|im_end|>".to_string()),
    ]);
    ChatTemplate::new(src, file.into(), vars).unwrap()
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec::parse(
            "get_weather",
            "Current weather in a city",
            r#"{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}, "code": {"type": "string"}}, "required": ["city"]}"#,
            "tools[0]",
        )
        .unwrap(),
        ToolSpec::parse(
            "search",
            "Web search",
            r#"{"type": "object", "properties": {"q": {"type": "string"}, "filters": {"type": "object"}}}"#,
            "tools[1]",
        )
        .unwrap(),
    ]
}

fn calls() -> Vec<ToolCall> {
    vec![
        ToolCall {
            id: "call_a".into(),
            name: "get_weather".into(),
            // "code" is a string parameter whose text looks like a number: GLM writes it
            // bare, and the schema says it stays a string.
            arguments: r#"{"city": "São Paulo <&>", "days": 3, "metric": true, "code": "007"}"#
                .into(),
        },
        ToolCall {
            id: "call_b".into(),
            name: "search".into(),
            arguments:
                r#"{"q": "line1\nline2 \"quoted\"", "filters": {"site": "x.org", "n": [1, 2]}}"#
                    .into(),
        },
    ]
}

/// The text a template writes for the assistant's turn after `user`: the rendered
/// conversation minus what the generation prompt already holds, up to the end-of-turn mark
/// (which is an end-of-sequence token, never part of the decoded reply).
fn assistant_text(t: &ChatTemplate, tools: &[ToolSpec], reply: ChatMessage) -> (String, String) {
    let vars = serde_json::Map::new();
    let user = vec![ChatMessage::new("user", "Weather in São Paulo?")];
    let prompt = t.render_with(&user, true, tools, &vars).unwrap();
    let mut all = user.clone();
    all.push(reply);
    let full = t.render_with(&all, false, tools, &vars).unwrap();
    let common = prompt
        .char_indices()
        .zip(full.chars())
        .take_while(|((_, a), b)| a == b)
        .last()
        .map(|((i, c), _)| i + c.len_utf8())
        .unwrap_or(0);
    // Not in the middle of a tag the two texts merely start alike.
    let common = match prompt[..common].rfind('<') {
        Some(lt) if !prompt[lt..common].contains('>') => lt,
        _ => common,
    };
    let mut text = full[common..].to_string();
    for eot in [
        "<|im_end|>",
        "<｜end▁of▁sentence｜>",
        "<|user|>",
        "<|observation|>",
    ] {
        if let Some(i) = text.find(eot) {
            text.truncate(i);
        }
    }
    (
        prompt[..common].to_string(),
        text.trim_end_matches('\n').to_string(),
    )
}

fn format_of(file: &str) -> ToolFormat {
    ToolFormat::detect(template(file).source()).unwrap()
}

/// Parses `text` fed in pieces of `chunk` characters; returns the merged delta, the summary,
/// and every delta seen.
fn parse(
    cfg: &ReplyConfig,
    text: &str,
    chunk: usize,
) -> (ReplyDelta, ReplySummary, Vec<ReplyDelta>) {
    let mut p = ReplyParser::new(cfg.clone());
    let chars: Vec<char> = text.chars().collect();
    let mut all = ReplyDelta::default();
    let mut seen = Vec::new();
    for piece in chars.chunks(chunk.max(1)) {
        let d = p.push(&piece.iter().collect::<String>());
        seen.push(d.clone());
        all.append(d);
    }
    let (d, s) = p.finish();
    seen.push(d.clone());
    all.append(d);
    (all, s, seen)
}

fn same_json(a: &str, b: &str) {
    let x: Value = serde_json::from_str(a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
    let y: Value = serde_json::from_str(b).unwrap();
    assert_eq!(x, y, "{a} vs {b}");
}

const FILES: [&str; 4] = [
    "qwen3.jinja",
    "glm4.6.jinja",
    "deepseek_r1.jinja",
    "deepseek_v3.1.jinja",
];

#[test]
fn tool_calls_rendered_by_each_template_parse_back() {
    for file in FILES {
        let t = template(file);
        let format = format_of(file);
        let reply = ChatMessage {
            role: "assistant".into(),
            content: String::new(),
            tool_calls: calls(),
            ..Default::default()
        };
        let (prompt, text) = assistant_text(&t, &tools(), reply);
        assert!(!text.is_empty(), "{file}");
        let cfg = ReplyConfig {
            think_tags: Default::default(),
            think: Some(crate::text::prompt_opens_think(&prompt)),
            tools: Some((format, tools())),
            id_prefix: "call_x".into(),
        };
        for chunk in [1, 2, 3, 7, 1000] {
            let (all, summary, seen) = parse(&cfg, &text, chunk);
            assert_eq!(all.content, "", "{file} chunk {chunk}: {text:?}");
            assert_eq!(all.reasoning, "", "{file}");
            assert!(!summary.incomplete_call, "{file}: {text:?}");
            assert_eq!(summary.tool_calls.len(), 2, "{file}: {text:?}");
            for (i, (got, want)) in summary.tool_calls.iter().zip(calls()).enumerate() {
                assert_eq!(got.name, want.name, "{file}");
                assert_eq!(got.id, format!("call_x{i}"));
                same_json(&got.arguments, &want.arguments);
                // The streamed pieces add up to the final call: id and name first, then the
                // arguments' text.
                let pieces: Vec<&ToolCallDelta> = seen
                    .iter()
                    .flat_map(|d| &d.tool_calls)
                    .filter(|d| d.index == i)
                    .collect();
                assert_eq!(pieces[0].name, want.name);
                assert_eq!(pieces[0].id, got.id);
                assert!(pieces[1..]
                    .iter()
                    .all(|d| d.id.is_empty() && d.name.is_empty()));
                let streamed: String = pieces.iter().map(|d| d.arguments.as_str()).collect();
                assert_eq!(streamed, got.arguments, "{file} chunk {chunk}");
            }
            if chunk == 1 && format != ToolFormat::Glm {
                // JSON arguments stream as they arrive, not in one piece at the end.
                let arg_pieces = seen
                    .iter()
                    .flat_map(|d| &d.tool_calls)
                    .filter(|d| d.index == 0 && !d.arguments.is_empty())
                    .count();
                assert!(arg_pieces > 10, "{file}: {arg_pieces}");
            }
        }
        // Rendering the parsed calls back gives the same text (Qwen and DeepSeek keep the
        // arguments' exact text; GLM re-types values from the mapping).
        let (_, parsed) = {
            let cfg = ReplyConfig {
                think_tags: Default::default(),
                think: Some(false),
                tools: Some((format, tools())),
                id_prefix: "call_".into(),
            };
            let (a, s, _) = parse(&cfg, &text, 5);
            (a, s)
        };
        let again = ChatMessage {
            role: "assistant".into(),
            tool_calls: parsed.tool_calls,
            ..Default::default()
        };
        assert_eq!(assistant_text(&t, &tools(), again).1, text, "{file}");
    }
}

#[test]
fn glm_values_are_typed_by_the_schema() {
    let t = template("glm4.6.jinja");
    let reply = ChatMessage {
        role: "assistant".into(),
        tool_calls: calls()[..1].to_vec(),
        ..Default::default()
    };
    let (_, text) = assistant_text(&t, &tools(), reply);
    // Strings are written bare, other values as JSON.
    assert!(
        text.contains("<arg_value>007</arg_value>") && text.contains("<arg_value>3</arg_value>"),
        "{text}"
    );
    let cfg = ReplyConfig {
        think_tags: Default::default(),
        think: Some(false),
        tools: Some((ToolFormat::Glm, tools())),
        id_prefix: "c".into(),
    };
    let (_, s, _) = parse(&cfg, &text, 4);
    let args: Value = serde_json::from_str(&s.tool_calls[0].arguments).unwrap();
    assert_eq!(args["code"], json!("007"));
    assert_eq!(args["days"], json!(3));
    assert_eq!(args["metric"], json!(true));
    // An unknown tool: values that read as JSON are JSON.
    let (_, s, _) = parse(
        &cfg,
        "<tool_call>other\n<arg_key>n</arg_key>\n<arg_value>5</arg_value>\n<arg_key>s</arg_key>\n<arg_value>hi there</arg_value>\n</tool_call>",
        3,
    );
    assert_eq!(s.tool_calls[0].arguments, r#"{"n": 5, "s": "hi there"}"#);
    // No arguments at all.
    let (_, s, _) = parse(&cfg, "<tool_call>ping\n</tool_call>", 1);
    assert_eq!(s.tool_calls[0].arguments, "{}");
}

#[test]
fn a_call_cut_off_by_max_tokens_is_incomplete() {
    for file in FILES {
        let t = template(file);
        let format = format_of(file);
        let reply = ChatMessage {
            role: "assistant".into(),
            tool_calls: calls(),
            ..Default::default()
        };
        let (prompt, text) = assistant_text(&t, &tools(), reply);
        let cfg = ReplyConfig {
            think_tags: Default::default(),
            think: Some(crate::text::prompt_opens_think(&prompt)),
            tools: Some((format, tools())),
            id_prefix: "c".into(),
        };
        // Stop inside the second call's arguments ("x.org" is in them).
        let cut = text.find("x.org").unwrap();
        let (all, s, _) = parse(&cfg, &text[..cut], 3);
        assert_eq!(s.tool_calls.len(), 1, "{file}");
        assert!(s.incomplete_call, "{file}");
        assert_eq!(all.content, "", "{file}: markup must not leak as content");
        // Its name was already streamed.
        assert!(all
            .tool_calls
            .iter()
            .any(|d| d.index == 1 && d.name == "search"));
        // Cut inside the first call: nothing complete, no markup as content.
        let start = text.find(calls()[0].name.as_str()).unwrap();
        let (all, s, _) = parse(&cfg, &text[..start + 3], 1);
        assert!(s.tool_calls.is_empty() && s.incomplete_call, "{file}");
        assert_eq!(all.content, "", "{file}");
    }
}

#[test]
fn content_before_calls_and_plain_answers() {
    let t = template("qwen3.jinja");
    let reply = ChatMessage {
        role: "assistant".into(),
        content: "Let me check.".into(),
        tool_calls: calls()[..1].to_vec(),
        ..Default::default()
    };
    let (_, text) = assistant_text(&t, &tools(), reply);
    let cfg = ReplyConfig {
        think_tags: Default::default(),
        think: Some(false),
        tools: Some((ToolFormat::Qwen3, tools())),
        id_prefix: "c".into(),
    };
    for chunk in [1, 4, 100] {
        let (all, s, _) = parse(&cfg, &text, chunk);
        assert_eq!(all.content, "Let me check.\n");
        assert_eq!(s.tool_calls.len(), 1);
    }
    // Text that only looks like the start of a tag is released.
    let (all, s, _) = parse(&cfg, "a <tool and <b> <tool_cal x", 1);
    assert_eq!(all.content, "a <tool and <b> <tool_cal x");
    assert!(s.tool_calls.is_empty() && !s.incomplete_call);
    // A reply that ends inside the opening tag is a cut-off call.
    let (all, s, _) = parse(&cfg, "Sure. <tool_ca", 2);
    assert_eq!(all.content, "Sure. ");
    assert!(s.tool_calls.is_empty() && s.incomplete_call);
    // Malformed JSON inside the tags: not a call.
    let (_, s, _) = parse(
        &cfg,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>",
        2,
    );
    assert!(s.tool_calls.is_empty() && s.incomplete_call);
    // Arguments given as a JSON string, and a call without arguments.
    let (_, s, _) = parse(
        &cfg,
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
        3,
    );
    assert_eq!(s.tool_calls[0].arguments, "{\"a\": 1}");
    assert_eq!(s.tool_calls[1].arguments, "{}");
}

#[test]
fn reasoning_is_split_at_think_tags() {
    // Qwen3: the reply opens its own think block.
    let t = template("qwen3.jinja");
    let reply = ChatMessage {
        role: "assistant".into(),
        content: "The answer is 4.".into(),
        reasoning_content: Some("2 + 2.\nThat is 4.".into()),
        ..Default::default()
    };
    let (prompt, text) = assistant_text(&t, &[], reply);
    assert_eq!(
        text,
        "<think>\n2 + 2.\nThat is 4.\n</think>\n\nThe answer is 4."
    );
    let cfg = ReplyConfig {
        think_tags: Default::default(),
        think: Some(crate::text::prompt_opens_think(&prompt)),
        tools: None,
        id_prefix: String::new(),
    };
    assert_eq!(cfg.think, Some(false));
    for chunk in 1..12 {
        let (all, s, _) = parse(&cfg, &text, chunk);
        assert_eq!(all.reasoning, "2 + 2.\nThat is 4.", "chunk {chunk}");
        assert_eq!(all.content, "The answer is 4.");
        assert_eq!(s, ReplySummary::default());
    }
    // DeepSeek-V3.1 with thinking on: the generation prompt opens the block.
    let t = template("deepseek_v3.1.jinja");
    let mut vars = serde_json::Map::new();
    vars.insert("thinking".into(), json!(true));
    let prompt = t
        .render_with(&[ChatMessage::new("user", "hi")], true, &[], &vars)
        .unwrap();
    assert!(prompt.ends_with("<｜Assistant｜><think>"), "{prompt}");
    let cfg = ReplyConfig {
        think_tags: Default::default(),
        think: Some(crate::text::prompt_opens_think(&prompt)),
        tools: Some((ToolFormat::DeepSeekV31, tools())),
        id_prefix: "c".into(),
    };
    let text = format!("Hmm, weather.</think>Calling.{DS_CALLS_BEGIN}{DS_CALL_BEGIN}get_weather{DS_SEP}{{\"city\": \"Oslo\"}}{DS_CALL_END}{DS_CALLS_END}");
    for chunk in [1, 5, 50] {
        let (all, s, _) = parse(&cfg, &text, chunk);
        assert_eq!(all.reasoning, "Hmm, weather.");
        assert_eq!(all.content, "Calling.");
        assert_eq!(s.tool_calls[0].arguments, "{\"city\": \"Oslo\"}");
    }
    // A think block never closed (cut off): all of it is reasoning.
    let (all, _, _) = parse(&cfg, "still thinking\n", 2);
    assert_eq!(all.reasoning, "still thinking");
    // Nothing to split: text passes through untouched.
    let (all, _, _) = parse(&ReplyConfig::default(), "<think>x</think>y", 1);
    assert_eq!(all.content, "<think>x</think>y");
}

#[test]
fn templates_render_tools_and_tool_results() {
    let vars = serde_json::Map::new();
    let conv = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather?"),
        ChatMessage {
            role: "assistant".into(),
            tool_calls: calls()[..1].to_vec(),
            ..Default::default()
        },
        ChatMessage {
            role: "tool".into(),
            content: "{\"temp\": 21}".into(),
            tool_call_id: Some("call_a".into()),
            name: Some("get_weather".into()),
            ..Default::default()
        },
    ];
    let q = template("qwen3.jinja")
        .render_with(&conv, true, &tools(), &vars)
        .unwrap();
    // transformers' output for this conversation (Python json.dumps of the OpenAI tool).
    assert!(q.starts_with("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Current weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}"), "{q}");
    assert!(q.ends_with("<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"), "{q}");
    let g = template("glm4.6.jinja")
        .render_with(&conv, true, &tools(), &vars)
        .unwrap();
    assert!(g.starts_with("[gMASK]<sop><|system|>\n# Tools"), "{g}");
    assert!(
        g.contains(
            "<|observation|>\n<tool_response>\n{\"temp\": 21}\n</tool_response><|assistant|>"
        ),
        "{g}"
    );
}

/// Kimi-K2.5's template (tests/fixtures/kimi_k25): a thinking turn with two calls parses back
/// into its reasoning, content and calls — ids as the model writes them (`functions.NAME:IDX`,
/// which the template renders back) — fed in pieces of every size.
#[test]
fn kimi_reasoning_content_and_calls_parse_back_in_every_chunk_size() {
    let src = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/kimi_k25/chat_template.jinja"),
    )
    .unwrap();
    let t = ChatTemplate::new(src, "kimi".into(), BTreeMap::new()).unwrap();
    assert_eq!(ToolFormat::detect(t.source()), Some(ToolFormat::Kimi));
    let mut want = calls();
    want[0].id = "functions.get_weather:0".into();
    want[1].id = "functions.search:1".into();
    let reply = ChatMessage {
        role: "assistant".into(),
        content: "Checking both.".into(),
        reasoning_content: Some("The user wants <weather>; search too.".into()),
        tool_calls: want.clone(),
        ..Default::default()
    };
    let (prompt, text) = assistant_text(&t, &tools(), reply);
    assert!(prompt.ends_with("<think>"), "{prompt}");
    assert!(
        text.contains(crate::text::tools::KIMI_CALLS_BEGIN),
        "{text}"
    );
    let cfg = ReplyConfig {
        think_tags: Default::default(),
        think: Some(crate::text::prompt_opens_think(&prompt)),
        tools: Some((ToolFormat::Kimi, tools())),
        id_prefix: "call_".into(),
    };
    for chunk in 1..=text.chars().count() {
        let (all, summary, seen) = parse(&cfg, &text, chunk);
        assert_eq!(
            all.reasoning, "The user wants <weather>; search too.",
            "chunk {chunk}"
        );
        assert_eq!(all.content, "Checking both.", "chunk {chunk}");
        assert!(!summary.incomplete_call);
        assert_eq!(summary.tool_calls.len(), 2, "chunk {chunk}: {text:?}");
        for (i, (got, w)) in summary.tool_calls.iter().zip(&want).enumerate() {
            assert_eq!((&got.id, &got.name), (&w.id, &w.name), "chunk {chunk}");
            same_json(&got.arguments, &w.arguments);
            let first = seen
                .iter()
                .flat_map(|d| &d.tool_calls)
                .find(|d| d.index == i)
                .unwrap();
            assert_eq!((&first.id, &first.name), (&w.id, &w.name));
        }
    }
    // A call cut off inside its arguments is reported incomplete, not as a call.
    let cut = &text[..text.find("\"days\"").unwrap()];
    let (_, summary, _) = parse(&cfg, cut, 4);
    assert!(summary.incomplete_call && summary.tool_calls.is_empty());
    assert_eq!(super::kimi::name_of(" functions.a.b:12 "), "a.b");
    assert_eq!(super::kimi::name_of("plain"), "plain");
}
