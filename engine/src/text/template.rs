//! Chat templates: the model's own Jinja source rendered with minijinja in the environment
//! transformers' `apply_chat_template` provides, so that the prompt text (and hence the token
//! ids) match what the model saw in training.
//!
//! transformers renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
//! lstrip_blocks=True, extensions=[loopcontrols]), a JSON `tojson` filter, and the globals
//! `raise_exception` and `strftime_now`; templates also call Python string methods, which
//! minijinja-contrib's pycompat callback supplies.

use super::tools::{arguments_as_mapping, ToolCall, ToolSpec};
use crate::error::{Error, Result};
use minijinja::value::Kwargs;
use minijinja::value::ValueKind;
use minijinja::{Environment, ErrorKind, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One message of a conversation, as the chat template renders it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// assistant: the tool calls it made.
    pub tool_calls: Vec<ToolCall>,
    /// tool: the call this message answers.
    pub tool_call_id: Option<String>,
    /// tool: the called function's name.
    pub name: Option<String>,
    /// assistant: its reasoning, for templates that show it again.
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
}

const NAME: &str = "chat_template";

/// A compiled chat template plus the special-token variables it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    /// Where the source came from, for error messages ("tokenizer_config.json", ...).
    origin: String,
    /// `bos_token`, `eos_token`, ... as transformers passes its special_tokens_map.
    vars: BTreeMap<String, String>,
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error names `origin` and the line.
    pub fn new(source: String, origin: String, vars: BTreeMap<String, String>) -> Result<Self> {
        let mut env = Environment::new();
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        env.set_syntax(
            syntax
                .build()
                .map_err(|e| Error::Template(format!("{origin}: {e}")))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| Error::Template(format!("{origin} does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            source,
            origin,
            vars,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Renders the conversation. `tools` and `documents` are left undefined, as transformers
    /// does when none are given.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            add_generation_prompt,
            &[],
            &serde_json::Map::new(),
        )
    }

    /// [`render`](Self::render) with tools (the template's `tools` variable, in OpenAI's
    /// shape) and extra variables (e.g. `enable_thinking`), as transformers'
    /// `apply_chat_template(..., tools=..., **kwargs)`.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: &[ToolSpec],
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx: BTreeMap<String, Value> = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        for (k, v) in vars {
            ctx.insert(k.clone(), json_value(v));
        }
        let as_mapping = arguments_as_mapping(&self.source);
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| json_value(&message_json(m, as_mapping)))
            .collect();
        ctx.insert("messages".into(), Value::from(msgs));
        if !tools.is_empty() {
            let t: Vec<Value> = tools
                .iter()
                .map(|t| json_value(&t.to_openai_json()))
                .collect();
            ctx.insert("tools".into(), Value::from(t));
        }
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::Template(format!("{}: {e}", self.origin)))?;
        tmpl.render(Value::from(ctx))
            .map_err(|e| Error::Template(format!("{} failed to render: {e}", self.origin)))
    }
}

/// A JSON value as a template value; objects keep their key order.
fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (_, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => Value::from(a.iter().map(json_value).collect::<Vec<_>>()),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (k.as_str(), json_value(v)))),
    }
}

/// A message as OpenAI-style clients send it (and HF templates read it): role and content,
/// then, only when present, `tool_calls` (`{id, type, function: {name, arguments}}`, the
/// arguments a mapping for templates that iterate them, else the JSON text),
/// `tool_call_id`, `name` and `reasoning_content` (also as `thinking`).
fn message_json(m: &ChatMessage, args_as_mapping: bool) -> serde_json::Value {
    use serde_json::{json, Value as J};
    let mut o = serde_json::Map::new();
    o.insert("role".into(), J::String(m.role.clone()));
    o.insert("content".into(), J::String(m.content.clone()));
    if !m.tool_calls.is_empty() {
        let calls: Vec<J> = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = if args_as_mapping {
                    serde_json::from_str::<J>(&c.arguments)
                        .ok()
                        .filter(J::is_object)
                        .unwrap_or_else(|| J::String(c.arguments.clone()))
                } else {
                    J::String(c.arguments.clone())
                };
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
            })
            .collect();
        o.insert("tool_calls".into(), J::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), J::String(id.clone()));
    }
    if let Some(n) = &m.name {
        o.insert("name".into(), J::String(n.clone()));
    }
    if let Some(r) = &m.reasoning_content {
        o.insert("reasoning_content".into(), J::String(r.clone()));
        // gpt-oss's template (and transformers' chat format for it) call it `thinking`.
        o.insert("thinking".into(), J::String(r.clone()));
    }
    J::Object(o)
}

/// `raise_exception(msg)`: how HF templates reject a conversation they cannot format.
fn raise_exception(msg: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised an exception: {msg}"),
    ))
}

/// `strftime_now(format)`: the current date, formatted like Python's strftime. The time zone
/// is UTC (the engine carries no tz database); templates use it for "Today is ..." lines.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    strftime_utc(&format, secs)
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31); Howard Hinnant's civil_from_days.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Python/C strftime over a UTC timestamp, for the directives chat templates use; glibc's
/// `%-d` (no padding) too. Unknown directives are copied through.
pub(crate) fn strftime_utc(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let sod = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (sod / 3600, sod / 60 % 60, sod % 60);
    let wday = (days + 4).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let month = MONTHS[(m - 1) as usize];
    let weekday = WEEKDAYS[wday];
    let hh12 = if hh % 12 == 0 { 12 } else { hh % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let unpadded = spec == Some('-');
        if unpadded {
            spec = chars.next();
        }
        let num = |out: &mut String, v: i64, width: usize| {
            if unpadded {
                let _ = write!(out, "{v}");
            } else {
                let _ = write!(out, "{v:0width$}");
            }
        };
        match spec {
            Some('Y') => {
                let _ = write!(out, "{y}");
            }
            Some('y') => num(&mut out, y.rem_euclid(100), 2),
            Some('m') => num(&mut out, m as i64, 2),
            Some('d') => num(&mut out, d as i64, 2),
            Some('e') => {
                let _ = write!(out, "{d:2}");
            }
            Some('H') => num(&mut out, hh, 2),
            Some('I') => num(&mut out, hh12, 2),
            Some('M') => num(&mut out, mm, 2),
            Some('S') => num(&mut out, ss, 2),
            Some('j') => num(&mut out, yday, 3),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('w') => {
                let _ = write!(out, "{wday}");
            }
            Some('F') => {
                let _ = write!(out, "{y}-{m:02}-{d:02}");
            }
            Some('T') => {
                let _ = write!(out, "{hh:02}:{mm:02}:{ss:02}");
            }
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if unpadded {
                    out.push('-');
                }
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Inverse of [`civil_from_days`].
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, i.e. Python's json.dumps output. minijinja's own tojson differs (compact
/// separators, HTML-escaped `<>&'`), which would change the prompt text of tool-calling
/// templates. Maps come out in insertion order, as Python dicts do (minijinja's
/// `preserve_order`).
fn tojson(
    value: &Value,
    ensure_ascii: Option<bool>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> std::result::Result<Value, minijinja::Error> {
    let ensure_ascii = match kwargs.get::<Option<bool>>("ensure_ascii")? {
        Some(b) => b,
        None => ensure_ascii.unwrap_or(false),
    };
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        Some(v) => Some(v),
        None => indent,
    };
    let indent: Option<String> = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
            ValueKind::Number => Some(" ".repeat(v.as_usize().unwrap_or(0))),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        // json.dumps: ", " without indent, "," with (the newline does the spacing).
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    // Accepted for compatibility; minijinja maps iterate in key order anyway.
    let _sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

fn write_json(
    out: &mut String,
    v: &Value,
    st: &JsonStyle,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    let newline = |out: &mut String, depth: usize| {
        if let Some(ind) = &st.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let s = v.to_string();
            // Python spells non-finite floats NaN/Infinity/-Infinity.
            out.push_str(match s.as_str() {
                "inf" => "Infinity",
                "-inf" => "-Infinity",
                _ => &s,
            });
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or(""), st.ensure_ascii),
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&st.item_sep);
                }
                newline(out, depth + 1);
                match k.as_str() {
                    Some(s) => write_json_str(out, s, st.ensure_ascii),
                    None => write_json_str(out, &k.to_string(), st.ensure_ascii),
                }
                out.push_str(&st.key_sep);
                write_json(out, &v.get_item(k)?, st, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&st.item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, st, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        other => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: a {other} value is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    fn tmpl(src: &str) -> ChatTemplate {
        let vars = BTreeMap::from([
            ("bos_token".to_string(), "<s>".to_string()),
            ("eos_token".to_string(), "</s>".to_string()),
        ]);
        ChatTemplate::new(src.to_string(), "test".into(), vars).unwrap()
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
        let t = 1_709_211_909;
        assert_eq!(
            strftime_utc("%Y-%m-%d %H:%M:%S %j %a %A %b %B %p %I %y", t),
            "2024-02-29 13:05:09 060 Thu Thursday Feb February PM 01 24"
        );
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        assert_eq!(strftime_utc("%-d %B %Y, 100%%", 0), "1 January 1970, 100%");
        assert_eq!(strftime_utc("%Q", 0), "%Q");
        // 2000-12-31: day 366 of a leap year; the day before 1970 works too.
        assert_eq!(strftime_utc("%F %j", 978_220_800), "2000-12-31 366");
        assert_eq!(strftime_utc("%F %T", -1), "1969-12-31 23:59:59");
        for days in [-800_000i64, -1, 0, 1, 59, 365, 11_016, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn python_string_methods_and_trim_blocks() {
        // Whitespace control as transformers: trim_blocks/lstrip_blocks remove the block
        // lines' own newlines and indentation.
        let t = tmpl(
            "{% for m in messages %}\n    {% if m.content.strip().startswith('x') %}\n{{ m.role.upper() }}:{{ m.content.strip().split(' ')[1] }}\n    {% endif %}\n{% endfor %}",
        );
        let out = t
            .render(&msgs(&[("user", "  x yz  "), ("bot", "no")]), false)
            .unwrap();
        assert_eq!(out, "USER:yz\n");
    }

    #[test]
    fn raise_exception_is_a_template_error() {
        let t = tmpl("{% if messages[0].role != 'system' %}{{ raise_exception('System message first!') }}{% endif %}ok");
        let e = t.render(&msgs(&[("user", "hi")]), true).unwrap_err();
        match e {
            Error::Template(m) => assert!(m.contains("System message first!"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.render(&msgs(&[("system", "s")]), true).unwrap(), "ok");
    }

    #[test]
    fn syntax_error_names_origin() {
        let e = ChatTemplate::new(
            "{% for %}".into(),
            "chat_template.jinja".into(),
            BTreeMap::new(),
        )
        .err()
        .unwrap();
        let m = e.to_string();
        assert!(
            m.starts_with("chat template: chat_template.jinja does not compile"),
            "{m}"
        );
    }

    #[test]
    fn undefined_tools_and_namespace_and_loop_controls() {
        let t = tmpl(
            "{% if tools is defined and tools %}TOOLS{% endif %}{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}{{ documents }}|{{ bos_token }}{{ eos_token }}",
        );
        let out = t
            .render(&msgs(&[("a", "1"), ("b", "2"), ("c", "3")]), false)
            .unwrap();
        assert_eq!(out, "2|<s></s>");
    }

    #[test]
    fn tojson_is_pythons_json_dumps() {
        // Dict keys keep their insertion order, as in Python.
        let t = tmpl(
            "{{ {'b': [1, 2.5, true, none], 'a': 'é\"<>\\n'} | tojson }}|{{ [1, {'k': 'v'}] | tojson(indent=2) }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ {} | tojson }}",
        );
        let out = t.render(&[], false).unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, true, null], \"a\": \"é\\\"<>\\n\"}|[\n  1,\n  {\n    \"k\": \"v\"\n  }\n]|\"\\u00e9\"|{}"
        );
    }

    #[test]
    fn strftime_now_is_callable() {
        let t = tmpl("{{ strftime_now('%Y') }}");
        let y: i64 = t.render(&[], false).unwrap().parse().unwrap();
        assert!(y >= 2024);
    }
}
