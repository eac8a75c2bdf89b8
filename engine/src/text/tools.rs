//! Tool calling, the model side: which syntax a model writes its calls in (read from its
//! chat template), how tools and earlier calls are handed to the template, and the system
//! prompt section for the templates that do not render `tools` themselves (DeepSeek's).
//!
//! The parsing of generated calls is in `reply.rs`; the grammar that forces a well-formed
//! call (tool_choice required / named) in `crate::structured`.

use crate::error::{Error, Result};
use serde_json::{json, Map, Value};

/// A function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object; `Value::Null` when the tool takes none.
    pub parameters: Value,
}

impl ToolSpec {
    /// Builds a tool from the wire's fields; `parameters` is JSON text (empty = none). The
    /// error names `field` (e.g. "tools[2].parameters").
    pub fn parse(name: &str, description: &str, parameters: &str, field: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(Error::invalid(format!("{field}.name"), "is empty"));
        }
        if name.len() > 256 || name.chars().any(|c| c.is_control() || c == '<' || c == '>') {
            return Err(Error::invalid(
                format!("{field}.name"),
                "must be at most 256 characters without control characters, '<' or '>'",
            ));
        }
        let parameters = if parameters.trim().is_empty() {
            Value::Null
        } else {
            let v: Value = serde_json::from_str(parameters).map_err(|e| {
                Error::invalid(format!("{field}.parameters"), format!("is not JSON: {e}"))
            })?;
            if !v.is_object() {
                return Err(Error::invalid(
                    format!("{field}.parameters"),
                    "must be a JSON Schema object",
                ));
            }
            v
        };
        Ok(ToolSpec {
            name: name.to_string(),
            description: description.to_string(),
            parameters,
        })
    }

    /// OpenAI's shape, which is what chat templates are written for:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_openai_json(&self) -> Value {
        let mut f = Map::new();
        f.insert("name".into(), Value::String(self.name.clone()));
        if !self.description.is_empty() {
            f.insert(
                "description".into(),
                Value::String(self.description.clone()),
            );
        }
        if !self.parameters.is_null() {
            f.insert("parameters".into(), self.parameters.clone());
        }
        json!({"type": "function", "function": Value::Object(f)})
    }

    /// The JSON Schema type of argument `key` ("string", "integer", ...), if declared.
    pub fn property_type(&self, key: &str) -> Option<&str> {
        let p = self.parameters.get("properties")?.get(key)?;
        match p.get("type")? {
            Value::String(s) => Some(s.as_str()),
            // ["string", "null"]: the first non-null type decides.
            Value::Array(a) => a.iter().filter_map(Value::as_str).find(|t| *t != "null"),
            _ => None,
        }
    }
}

/// A call of a tool, in history or parsed from a reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON object as text.
    pub arguments: String,
}

/// Who chooses whether and which tool is called.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// Tools are not offered.
    None,
    /// The reply must be tool calls (constrained decoding).
    Required,
    /// The reply must call this tool.
    Named(String),
}

/// The syntax a model family writes tool calls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// Qwen3 / Hermes: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
    Qwen3,
    /// GLM-4.5/4.6/4.7/5: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n
    /// </tool_call>`, string values bare, others JSON.
    Glm,
    /// DeepSeek-V3 / R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
    /// ```json\n{...}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
    DeepSeekV3,
    /// DeepSeek-V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
    /// <｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
    DeepSeekV31,
    /// DeepSeek-V3.2's DSML: `<｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
    /// <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n…
    /// </｜DSML｜invoke>\n</｜DSML｜function_calls>`, string values bare, others JSON.
    Dsml,
    /// Kimi-K2 / K2.5: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
    /// <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>`.
    Kimi,
}

pub const DSML_CALLS_BEGIN: &str = "<｜DSML｜function_calls>";
pub const DSML_CALLS_END: &str = "</｜DSML｜function_calls>";
pub const DSML_INVOKE: &str = "<｜DSML｜invoke";
pub const DSML_INVOKE_END: &str = "</｜DSML｜invoke>";
pub const DSML_PARAM: &str = "<｜DSML｜parameter";
pub const DSML_PARAM_END: &str = "</｜DSML｜parameter>";

pub const KIMI_CALLS_BEGIN: &str = "<|tool_calls_section_begin|>";
pub const KIMI_CALLS_END: &str = "<|tool_calls_section_end|>";
pub const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
pub const KIMI_CALL_END: &str = "<|tool_call_end|>";
pub const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";

pub const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
pub const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
pub const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
pub const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
pub const DS_SEP: &str = "<｜tool▁sep｜>";

impl ToolFormat {
    /// The format a chat template writes assistant tool calls in; None when it has no tool
    /// call syntax (the model cannot be given tools).
    pub fn detect(template: &str) -> Option<ToolFormat> {
        if template.contains("｜DSML｜invoke") {
            Some(ToolFormat::Dsml)
        } else if template.contains(KIMI_CALL_BEGIN) && template.contains(KIMI_ARGS) {
            Some(ToolFormat::Kimi)
        } else if template.contains("<arg_key>") && template.contains("<tool_call>") {
            Some(ToolFormat::Glm)
        } else if template.contains(DS_CALL_BEGIN) {
            // V3 writes the call's type ("function") before the separator, V3.1 the name.
            if template.contains("tool['type'] + '<｜tool▁sep｜>'") {
                Some(ToolFormat::DeepSeekV3)
            } else {
                Some(ToolFormat::DeepSeekV31)
            }
        } else if template.contains("<tool_call>") {
            Some(ToolFormat::Qwen3)
        } else {
            None
        }
    }

    /// The name on the wire (ModelInfo.tool_call_format).
    pub fn as_str(self) -> &'static str {
        match self {
            ToolFormat::Qwen3 => "qwen3",
            ToolFormat::Glm => "glm",
            ToolFormat::DeepSeekV3 => "deepseek_v3",
            ToolFormat::DeepSeekV31 => "deepseek_v31",
            ToolFormat::Dsml => "dsml",
            ToolFormat::Kimi => "kimi",
        }
    }

    /// Markup that must survive detokenization for the parser (some tokenizers mark these
    /// as special tokens, which a plain decode drops).
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Qwen3 => &["<tool_call>", "</tool_call>"],
            ToolFormat::Glm => &[
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
            ],
            ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => &[
                DS_CALLS_BEGIN,
                DS_CALLS_END,
                DS_CALL_BEGIN,
                DS_CALL_END,
                DS_SEP,
            ],
            ToolFormat::Dsml => &[
                DSML_CALLS_BEGIN,
                DSML_CALLS_END,
                DSML_INVOKE,
                DSML_INVOKE_END,
                DSML_PARAM,
                DSML_PARAM_END,
            ],
            ToolFormat::Kimi => &[
                KIMI_CALLS_BEGIN,
                KIMI_CALLS_END,
                KIMI_CALL_BEGIN,
                KIMI_CALL_END,
                KIMI_ARGS,
            ],
        }
    }
}

/// How a template wants `tool_calls[].function.arguments`: GLM's iterates a mapping,
/// DeepSeek's concatenates a string, Qwen's takes either (a string keeps the exact text).
pub(crate) fn arguments_as_mapping(template: &str) -> bool {
    template.contains("<arg_key>")
        || template.contains("｜DSML｜invoke")
        || template.contains("arguments is mapping")
        || template.contains("arguments.items()")
}

/// Whether the template renders the `tools` variable itself.
pub(crate) fn renders_tools(template: &str) -> bool {
    // Word match: "tools" but not only "tool_calls" / "tool".
    let b = template.as_bytes();
    template.match_indices("tools").any(|(i, _)| {
        let before = i.checked_sub(1).map(|j| b[j]);
        let after = b.get(i + 5).copied();
        let ident = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_');
        !ident(before) && !ident(after)
    })
}

/// The tool section DeepSeek's model cards ask for in the system prompt (their templates
/// leave tools to the caller).
pub(crate) fn deepseek_tool_prompt(format: ToolFormat, tools: &[ToolSpec]) -> String {
    let mut s = String::from("## Tools\nYou have access to the following tools:\n");
    for t in tools {
        s.push_str(&format!(
            "\n### {}\nDescription: {}\n\nParameters: {}\n",
            t.name,
            t.description,
            python_json(&t.parameters)
        ));
    }
    let call = match format {
        ToolFormat::DeepSeekV3 => format!(
            "{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}tool_call_name\n```json\ntool_call_arguments\n```{DS_CALL_END}{{{{additional_tool_calls}}}}{DS_CALLS_END}"
        ),
        _ => format!(
            "{DS_CALLS_BEGIN}{DS_CALL_BEGIN}tool_call_name{DS_SEP}tool_call_arguments{DS_CALL_END}{{{{additional_tool_calls}}}}{DS_CALLS_END}"
        ),
    };
    s.push_str(&format!(
        "\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n{call}\n\nWhere:\n\
         - `tool_call_name` must be an exact match to one of the available tools\n\
         - `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n\
         - For multiple tool calls, chain them directly without separators or spaces\n"
    ));
    s
}

/// `json.dumps(v)`: ", " and ": " separators, keys in their order, non-ASCII kept.
pub fn python_json(v: &Value) -> String {
    let mut out = String::new();
    write_python_json(&mut out, v);
    out
}

fn write_python_json(out: &mut String, v: &Value) {
    match v {
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_python_json(out, x);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(out, x);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_read_from_the_templates() {
        let t = |f: &str| {
            std::fs::read_to_string(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../tests/fixtures/templates")
                    .join(f),
            )
            .unwrap()
        };
        assert_eq!(
            ToolFormat::detect(&t("qwen3.jinja")),
            Some(ToolFormat::Qwen3)
        );
        assert_eq!(
            ToolFormat::detect(&t("glm4.6.jinja")),
            Some(ToolFormat::Glm)
        );
        assert_eq!(
            ToolFormat::detect(&t("deepseek_r1.jinja")),
            Some(ToolFormat::DeepSeekV3)
        );
        assert_eq!(
            ToolFormat::detect(&t("deepseek_v3.1.jinja")),
            Some(ToolFormat::DeepSeekV31)
        );
        assert_eq!(ToolFormat::detect("{{ messages }}"), None);
        assert!(renders_tools(&t("qwen3.jinja")));
        assert!(renders_tools(&t("glm4.6.jinja")));
        assert!(!renders_tools(&t("deepseek_r1.jinja")));
        assert!(!renders_tools(&t("deepseek_v3.1.jinja")));
        assert!(arguments_as_mapping(&t("glm4.6.jinja")));
        assert!(!arguments_as_mapping(&t("qwen3.jinja")));
        assert!(!arguments_as_mapping(&t("deepseek_v3.1.jinja")));
    }

    #[test]
    fn tool_spec_checks_its_fields() {
        let t = ToolSpec::parse(
            "get_weather",
            "Weather now",
            r#"{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]}}}"#,
            "tools[0]",
        )
        .unwrap();
        assert_eq!(t.property_type("city"), Some("string"));
        assert_eq!(t.property_type("days"), Some("integer"));
        assert_eq!(t.property_type("x"), None);
        // Key order is the caller's, as Python's json.dumps keeps it.
        assert_eq!(
            python_json(&t.to_openai_json()),
            r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]}}}}}"#
        );
        let field = |r: Result<ToolSpec>| match r {
            Err(Error::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(ToolSpec::parse("", "", "", "tools[1]")),
            "tools[1].name"
        );
        assert_eq!(
            field(ToolSpec::parse("f", "", "{nope", "tools[1]")),
            "tools[1].parameters"
        );
        assert_eq!(
            field(ToolSpec::parse("f", "", "[1]", "tools[1]")),
            "tools[1].parameters"
        );
        assert_eq!(field(ToolSpec::parse("a<b", "", "", "t")), "t.name");
    }
}
