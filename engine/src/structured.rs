//! Structured output: constrains sampling so that the generated text is valid for a grammar
//! (a JSON schema, any JSON object, a Lark grammar, a regex, or the model family's tool-call
//! syntax with arguments valid for the tools' schemas). The grammar engine is llguidance;
//! this module only builds grammars and connects its token mask to the sampler.
//!
//! The mask for the next token depends only on the tokens sampled so far, so callers compute
//! it ([`Constraint::prepare_mask`]) while the forward pass for that token runs.

use crate::error::{Error, Result};
use crate::text::tools::{
    DSML_CALLS_BEGIN, DSML_CALLS_END, DSML_INVOKE, DSML_INVOKE_END, DSML_PARAM, DSML_PARAM_END,
    DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP, KIMI_ARGS, KIMI_CALLS_BEGIN,
    KIMI_CALLS_END, KIMI_CALL_BEGIN, KIMI_CALL_END,
};
use crate::text::{Text, ToolFormat, ToolSpec};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the output must look like.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputFormat {
    /// Any JSON object, or one valid for this schema.
    JsonObject(Option<Value>),
    /// JSON valid for this schema.
    JsonSchema(Value),
    /// llguidance's Lark dialect.
    Lark(String),
    Regex(String),
    /// One or more tool calls in the family's syntax (`parallel`: more than one allowed),
    /// calling one of `tools`.
    ToolCalls {
        format: ToolFormat,
        tools: Vec<ToolSpec>,
        parallel: bool,
    },
}

/// JSON is written on one line with Python's separators (what templates show the model,
/// and it cannot run on with whitespace).
fn json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

fn with_options(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => {
            let mut o = o.clone();
            o.entry("x-guidance").or_insert_with(json_options);
            Value::Object(o)
        }
        // `true` / `{}`-like schemas: anything JSON.
        other => json!({"allOf": [other], "x-guidance": json_options()}),
    }
}

impl OutputFormat {
    fn grammar(&self, text: &Text) -> Result<TopLevelGrammar> {
        Ok(match self {
            OutputFormat::JsonObject(schema) => {
                let s = schema.clone().unwrap_or_else(|| json!({"type": "object"}));
                let mut s = with_options(&s);
                if let Some(o) = s.as_object_mut() {
                    o.entry("type").or_insert(json!("object"));
                }
                TopLevelGrammar::from_json_schema(s)
            }
            OutputFormat::JsonSchema(s) => TopLevelGrammar::from_json_schema(with_options(s)),
            OutputFormat::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            OutputFormat::Regex(r) => TopLevelGrammar::from_regex(r),
            OutputFormat::ToolCalls {
                format,
                tools,
                parallel,
            } => TopLevelGrammar::from_lark(tool_grammar(text, *format, tools, *parallel)?),
        })
    }

    /// The request field an error in this format is about.
    fn field(&self) -> &'static str {
        match self {
            OutputFormat::ToolCalls { .. } => "tools",
            OutputFormat::JsonObject(_) | OutputFormat::JsonSchema(_) => "response_format.schema",
            _ => "response_format.grammar",
        }
    }
}

/// A Lark literal for `marker`: the special token itself when the tokenizer has it as one
/// (its text spelled out in other tokens is not the same thing to the model).
fn lit(text: &Text, marker: &str) -> String {
    match text.token_to_id(marker) {
        Some(id) if text.is_special(id) => format!("<[{id}]>"),
        _ => Value::String(marker.to_string()).to_string(),
    }
}

/// A tool's arguments schema for a forced call: an object (none declared = any object)
/// without properties the tool does not declare, unless it says otherwise (a model must not
/// invent arguments, and unbounded extra keys could run on forever).
fn tool_args_schema(t: &ToolSpec) -> Value {
    let mut s = if t.parameters.is_null() {
        json!({"type": "object"})
    } else {
        t.parameters.clone()
    };
    if let Some(o) = s.as_object_mut() {
        if o.contains_key("properties") {
            o.entry("additionalProperties").or_insert(json!(false));
        }
    }
    s
}

/// `%json {...}` for a tool's arguments.
fn args_json(t: &ToolSpec) -> String {
    format!("%json {}", with_options(&tool_args_schema(t)))
}

/// Lark grammar for tool calls in the family's syntax: the same text its chat template
/// writes for an assistant's tool calls.
fn tool_grammar(
    text: &Text,
    format: ToolFormat,
    tools: &[ToolSpec],
    parallel: bool,
) -> Result<String> {
    if tools.is_empty() {
        return Err(Error::invalid("tools", "no tool to call"));
    }
    let q = |s: &str| Value::String(s.to_string()).to_string();
    let mut g = String::new();
    let many = |call: &str, sep: &str| {
        if parallel {
            format!("{call} ({sep} {call})*")
        } else {
            call.to_string()
        }
    };
    match format {
        ToolFormat::Qwen3 => {
            let alts: Vec<Value> = tools
                .iter()
                .map(|t| {
                    let args = tool_args_schema(t);
                    json!({
                        "type": "object",
                        "properties": {"name": {"const": t.name}, "arguments": args},
                        "required": ["name", "arguments"],
                        "additionalProperties": false
                    })
                })
                .collect();
            let body = with_options(&json!({"anyOf": alts}));
            g.push_str(&format!("start: {}\n", many("call", r#""\n""#)));
            g.push_str(&format!(
                "call: {} \"\\n\" body \"\\n\" {}\nbody: %json {}\n",
                lit(text, "<tool_call>"),
                lit(text, "</tool_call>"),
                body
            ));
        }
        ToolFormat::Glm => {
            g.push_str(&format!("start: {}\n", many("call", r#""\n""#)));
            let names: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
            g.push_str(&format!(
                "call: {} ({}) {}\n",
                lit(text, "<tool_call>"),
                names.join(" | "),
                lit(text, "</tool_call>")
            ));
            for (i, t) in tools.iter().enumerate() {
                let props = t.parameters.get("properties").and_then(Value::as_object);
                let required: Vec<&str> = t
                    .parameters
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut parts = Vec::new();
                for (j, (k, schema)) in props.into_iter().flatten().enumerate() {
                    let value = if t.property_type(k) == Some("string") {
                        match schema.get("enum").and_then(Value::as_array) {
                            Some(e) => {
                                let alts: Vec<String> =
                                    e.iter().filter_map(Value::as_str).map(q).collect();
                                format!("({})", alts.join(" | "))
                            }
                            // Bare text up to the closing tag.
                            None => "/[^<]*/".to_string(),
                        }
                    } else {
                        format!("%json {}", with_options(schema))
                    };
                    // `<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n`, as the template.
                    g.push_str(&format!(
                        "arg{i}_{j}: {} {} {} \"\\n\" {} value{i}_{j} {} \"\\n\"\n",
                        lit(text, "<arg_key>"),
                        q(k),
                        lit(text, "</arg_key>"),
                        lit(text, "<arg_value>"),
                        lit(text, "</arg_value>"),
                    ));
                    g.push_str(&format!("value{i}_{j}: {value}\n"));
                    let opt = if required.contains(&k.as_str()) {
                        ""
                    } else {
                        "?"
                    };
                    parts.push(format!("arg{i}_{j}{opt}"));
                }
                g.push_str(&format!(
                    "call{i}: {} \"\\n\" {}\n",
                    q(&t.name),
                    parts.join(" ")
                ));
            }
        }
        ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => {
            // V3's template puts a newline between calls, V3.1's nothing.
            let calls = match (parallel, format) {
                (false, _) => "call".to_string(),
                (true, ToolFormat::DeepSeekV3) => many("call", r#""\n""#),
                (true, _) => "call+".to_string(),
            };
            g.push_str(&format!(
                "start: {} {calls} {}\n",
                lit(text, DS_CALLS_BEGIN),
                lit(text, DS_CALLS_END)
            ));
            let names: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
            g.push_str(&format!(
                "call: {} ({}) {}\n",
                lit(text, DS_CALL_BEGIN),
                names.join(" | "),
                lit(text, DS_CALL_END)
            ));
            for (i, t) in tools.iter().enumerate() {
                if format == ToolFormat::DeepSeekV3 {
                    g.push_str(&format!(
                        "call{i}: \"function\" {} {} \"\\n```json\\n\" args{i} \"\\n```\"\n",
                        lit(text, DS_SEP),
                        q(&t.name)
                    ));
                } else {
                    g.push_str(&format!(
                        "call{i}: {} {} args{i}\n",
                        q(&t.name),
                        lit(text, DS_SEP)
                    ));
                }
                g.push_str(&format!("args{i}: {}\n", args_json(t)));
            }
        }
        ToolFormat::Dsml => {
            // As DeepSeek-V3.2's encoder writes calls: one invoke per line in the section,
            // each parameter on its own line, strings bare, other values JSON.
            g.push_str(&format!(
                "start: {} \"\\n\" {} \"\\n\" {}\n",
                lit(text, DSML_CALLS_BEGIN),
                many("call", r#""\n""#),
                lit(text, DSML_CALLS_END)
            ));
            let names: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
            g.push_str(&format!("call: {}\n", names.join(" | ")));
            for (i, t) in tools.iter().enumerate() {
                let props = t.parameters.get("properties").and_then(Value::as_object);
                let required: Vec<&str> = t
                    .parameters
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut parts = Vec::new();
                for (j, (k, schema)) in props.into_iter().flatten().enumerate() {
                    let (string, value) = if t.property_type(k) == Some("string") {
                        let v = match schema.get("enum").and_then(Value::as_array) {
                            Some(e) => {
                                let alts: Vec<String> =
                                    e.iter().filter_map(Value::as_str).map(q).collect();
                                format!("({})", alts.join(" | "))
                            }
                            None => "/[^<]*/".to_string(),
                        };
                        ("true", v)
                    } else {
                        ("false", format!("%json {}", with_options(schema)))
                    };
                    g.push_str(&format!(
                        "arg{i}_{j}: {} {} value{i}_{j} {} \"\\n\"\n",
                        lit(text, DSML_PARAM),
                        q(&format!(" name=\"{k}\" string=\"{string}\">")),
                        lit(text, DSML_PARAM_END),
                    ));
                    g.push_str(&format!("value{i}_{j}: {value}\n"));
                    let opt = if required.contains(&k.as_str()) {
                        ""
                    } else {
                        "?"
                    };
                    parts.push(format!("arg{i}_{j}{opt}"));
                }
                g.push_str(&format!(
                    "call{i}: {} {} \"\\n\" {} {}\n",
                    lit(text, DSML_INVOKE),
                    q(&format!(" name=\"{}\">", t.name)),
                    parts.join(" "),
                    lit(text, DSML_INVOKE_END)
                ));
            }
        }
        ToolFormat::Kimi => {
            // `functions.NAME:IDX` heads each call; its template puts nothing between calls.
            let calls = if parallel { "call+" } else { "call" };
            g.push_str(&format!(
                "start: {} {calls} {}\n",
                lit(text, KIMI_CALLS_BEGIN),
                lit(text, KIMI_CALLS_END)
            ));
            let names: Vec<String> = (0..tools.len()).map(|i| format!("call{i}")).collect();
            g.push_str(&format!(
                "call: {} ({}) {}\n",
                lit(text, KIMI_CALL_BEGIN),
                names.join(" | "),
                lit(text, KIMI_CALL_END)
            ));
            for (i, t) in tools.iter().enumerate() {
                g.push_str(&format!(
                    "call{i}: {} /[0-9]{{1,3}}/ {} args{i}\n",
                    q(&format!("functions.{}:", t.name)),
                    lit(text, KIMI_ARGS)
                ));
                g.push_str(&format!("args{i}: {}\n", args_json(t)));
            }
        }
    }
    Ok(g)
}

/// llguidance's view of the tokenizer: every token's bytes, and the tokenizer itself for
/// turning forced text back into tokens.
struct ColiTokEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for ColiTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.tokenizer
                .encode(s, false)
                .map(|e| e.get_ids().to_vec())
                .unwrap_or_default()
        })
    }
}

/// Compiles grammars for one model (built once: it indexes the whole vocabulary).
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab: usize,
}

impl GrammarCompiler {
    /// `vocab` is the model's logit row length (it may exceed the tokenizer's: padding rows
    /// are never allowed); `eos` the ids that end a generation.
    pub fn new(text: &Text, vocab: usize, eos: &[u32]) -> Result<GrammarCompiler> {
        let mut words: Vec<Vec<u8>> = text.token_bytes()?.to_vec();
        if words.len() > vocab {
            return Err(Error::Tokenizer(format!(
                "the tokenizer has {} tokens, more than the model's {vocab} logits",
                words.len()
            )));
        }
        while words.len() < vocab {
            let mut w = format!("X<[{}]>", words.len()).into_bytes();
            w[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(w);
        }
        let eos: Vec<u32> = eos
            .iter()
            .copied()
            .filter(|&e| (e as usize) < vocab)
            .collect();
        let info = TokRxInfo::new(vocab as u32, eos.first().copied().unwrap_or(0));
        let mut trie = TokTrie::from(&info, &words);
        if eos.len() > 1 {
            trie = trie.with_eos_tokens(&eos);
        }
        let env: TokEnv = Arc::new(ColiTokEnv {
            trie,
            tokenizer: text.tokenizer().clone(),
        });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Tokenizer(format!("structured output: {e}")))?;
        factory.quiet();
        Ok(GrammarCompiler { factory, vocab })
    }

    /// A constraint for one generation; a grammar that does not compile (bad schema, bad
    /// Lark) is an InvalidArgument naming the request field.
    pub fn constraint(&self, text: &Text, format: &OutputFormat) -> Result<Constraint> {
        let grammar = format.grammar(text)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| Error::invalid(format.field(), format!("does not compile: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(Error::invalid(format.field(), e));
        }
        Ok(Constraint {
            matcher,
            mask: None,
            vocab: self.vocab,
            mask_time: Duration::ZERO,
            masks: 0,
        })
    }
}

/// One generation's grammar state.
pub struct Constraint {
    matcher: Matcher,
    /// The mask for the next token, when already computed.
    mask: Option<SimpleVob>,
    vocab: usize,
    mask_time: Duration,
    masks: u64,
}

impl Constraint {
    /// Computes the next token's mask now (call it while the forward pass runs).
    pub fn prepare_mask(&mut self) -> Result<()> {
        if self.mask.is_none() {
            let t = Instant::now();
            let m = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| Error::invalid("response_format", format!("grammar failed: {e}")))?;
            self.mask_time += t.elapsed();
            self.masks += 1;
            self.mask = Some(m);
        }
        Ok(())
    }

    /// Sets the logit of every token the grammar does not allow next to -inf.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        self.prepare_mask()?;
        let mask = self.mask.as_ref().expect("prepared above");
        if mask.is_zero() {
            return Err(Error::invalid(
                "response_format",
                "the grammar allows no token here",
            ));
        }
        let n = logits.len().min(self.vocab);
        mask.iter_unset_entries(|i| {
            if i < n {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        Ok(())
    }

    /// Advances the grammar past a sampled token.
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::invalid("response_format", format!("grammar failed: {e}")))
    }

    /// The grammar is complete and allows nothing more but end-of-sequence.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Time spent computing masks, and how many.
    pub fn mask_stats(&self) -> (Duration, u64) {
        (self.mask_time, self.masks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::{Sampler, SamplingParams};
    use crate::text::{ReplyConfig, ReplyParser};
    use std::path::Path;

    fn fixture() -> Text {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/qwen3_moe");
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        Text::load(&dir, &cfg).unwrap()
    }

    /// Samples from random logits under the constraint until the grammar stops (or eos):
    /// what a random-weight model does. Returns the text.
    fn run(text: &Text, c: &mut Constraint, seed: u64, eos: &[u32]) -> String {
        let mut rng = crate::sample::Xoshiro256::seed_from_u64(seed);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        });
        let mut ids = Vec::new();
        for _ in 0..2000 {
            let mut logits: Vec<f32> = (0..512).map(|_| (rng.next_f64() * 8.0) as f32).collect();
            c.apply(&mut logits).unwrap();
            let t = s.sample(&logits, &[]);
            c.commit(t).unwrap();
            if eos.contains(&t) {
                break;
            }
            ids.push(t);
            if c.is_stopped() {
                break;
            }
        }
        assert!(
            c.is_stopped() || ids.len() < 2000,
            "never finished: {:?}",
            text.decode(&ids, false).unwrap()
        );
        text.decode(&ids, false).unwrap()
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "São Paulo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "metric": {"type": "boolean"}
            },
            "required": ["city", "days", "metric"],
            "additionalProperties": false
        })
    }

    fn check(v: &Value) {
        assert!(
            ["Paris", "Oslo", "São Paulo"].contains(&v["city"].as_str().unwrap()),
            "{v}"
        );
        let d = v["days"].as_i64().unwrap();
        assert!((1..=7).contains(&d), "{v}");
        assert!(v["metric"].is_boolean(), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
    }

    #[test]
    fn json_schema_output_parses_and_validates() {
        let text = fixture();
        let g = GrammarCompiler::new(&text, 512, &[0, 2]).unwrap();
        for seed in 0..6 {
            let mut c = g
                .constraint(&text, &OutputFormat::JsonSchema(schema()))
                .unwrap();
            let out = run(&text, &mut c, seed, &[0, 2]);
            let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
            check(&v);
            // One line, Python's separators, the schema's key order.
            assert!(out.starts_with("{\"city\": \""), "{out}");
            assert!(c.mask_stats().1 > 5);
        }
        // Any object.
        let mut c = g
            .constraint(&text, &OutputFormat::JsonObject(None))
            .unwrap();
        let out = run(&text, &mut c, 7, &[0, 2]);
        if c.is_stopped() {
            assert!(
                serde_json::from_str::<Value>(&out).unwrap().is_object(),
                "{out}"
            );
        } else {
            assert!(out.starts_with('{'), "{out}");
        }
        // A regex.
        let mut c = g
            .constraint(&text, &OutputFormat::Regex("(yes|no)!".into()))
            .unwrap();
        let out = run(&text, &mut c, 3, &[0, 2]);
        assert!(out == "yes!" || out == "no!", "{out}");
    }

    #[test]
    fn bad_grammars_name_the_field() {
        let text = fixture();
        let g = GrammarCompiler::new(&text, 512, &[0, 2]).unwrap();
        let field = |f: OutputFormat| match g.constraint(&text, &f) {
            Err(Error::InvalidArgument { field, .. }) => field,
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("compiled"),
        };
        assert_eq!(
            field(OutputFormat::JsonSchema(json!({"type": "no-such-type"}))),
            "response_format.schema"
        );
        assert_eq!(
            field(OutputFormat::Lark("start: undefined_rule".into())),
            "response_format.grammar"
        );
        assert_eq!(
            field(OutputFormat::ToolCalls {
                format: ToolFormat::Qwen3,
                tools: vec![],
                parallel: false
            }),
            "tools"
        );
    }

    #[test]
    fn forced_tool_calls_parse_in_every_family_syntax() {
        let text = fixture();
        let g = GrammarCompiler::new(&text, 512, &[0, 2]).unwrap();
        let tools = vec![
            ToolSpec::parse("get_weather", "", &schema().to_string(), "t").unwrap(),
            ToolSpec::parse(
                "ping",
                "",
                r#"{"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}, "required": ["n"]}"#,
                "t",
            )
            .unwrap(),
        ];
        for format in [
            ToolFormat::Qwen3,
            ToolFormat::Glm,
            ToolFormat::DeepSeekV3,
            ToolFormat::DeepSeekV31,
            ToolFormat::Dsml,
            ToolFormat::Kimi,
        ] {
            for (seed, parallel) in [(1, false), (2, true), (3, true), (4, false)] {
                let mut c = g
                    .constraint(
                        &text,
                        &OutputFormat::ToolCalls {
                            format,
                            tools: tools.clone(),
                            parallel,
                        },
                    )
                    .unwrap();
                let out = run(&text, &mut c, seed, &[0, 2]);
                let mut p = ReplyParser::new(ReplyConfig {
                    think: None,
                    tools: Some((format, tools.clone())),
                    id_prefix: "c".into(),
                    ..Default::default()
                });
                let d = p.push(&out);
                let (d2, s) = p.finish();
                assert_eq!(d.content + &d2.content, "", "{format:?}: {out:?}");
                assert!(!s.incomplete_call, "{format:?}: {out:?}");
                assert!(!s.tool_calls.is_empty(), "{format:?}: {out:?}");
                if !parallel {
                    assert_eq!(s.tool_calls.len(), 1);
                }
                for call in &s.tool_calls {
                    let v: Value = serde_json::from_str(&call.arguments).unwrap();
                    match call.name.as_str() {
                        "get_weather" => check(&v),
                        "ping" => assert!(v["n"] == 1 || v["n"] == 2, "{v}"),
                        other => panic!("{other}"),
                    }
                }
            }
        }
    }
}
