//! Splits a streamed reply into what a chat API reports separately: the answer's text
//! (content), the text between think tags (reasoning), and tool calls written in the model
//! family's syntax (deltas: the call's name first, then fragments of its arguments' JSON).
//!
//! Everything is incremental and safe for markup split across tokens: text that could be
//! the start of a tag is held back until the next delta decides. A tool call is only
//! reported complete at its closing tag; one cut off (e.g. by max_tokens) stays incomplete.

use super::tools::{
    python_json, ToolCall, ToolFormat, ToolSpec, DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN,
    DS_CALL_END, DS_SEP,
};
use serde_json::Value;

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// What a reply parser looks for.
#[derive(Clone, Debug, Default)]
pub struct ReplyConfig {
    /// Split reasoning out: None = no think tags; Some(true) = the prompt left a think block
    /// open, so the reply starts inside it.
    pub think: Option<bool>,
    /// Parse tool calls in this syntax, typed by these tools' schemas (GLM).
    pub tools: Option<(ToolFormat, Vec<ToolSpec>)>,
    /// Call ids are this prefix plus the call's index.
    pub id_prefix: String,
}

impl ReplyConfig {
    /// Whether the parser changes anything (otherwise the text passes through).
    pub fn is_active(&self) -> bool {
        self.think.is_some() || self.tools.is_some()
    }

    /// Markup the detokenizer must keep for this parser.
    pub fn markers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.think.is_some() {
            m.extend([THINK_OPEN, THINK_CLOSE]);
        }
        if let Some((f, _)) = &self.tools {
            m.extend(f.markers());
        }
        m
    }
}

/// A piece of a tool call: the first one of each call carries `id` and `name`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCallDelta {
    pub index: usize,
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// What one piece of generated text contributed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyDelta {
    pub content: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl ReplyDelta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.tool_calls.is_empty()
    }

    pub fn append(&mut self, other: ReplyDelta) {
        self.content.push_str(&other.content);
        self.reasoning.push_str(&other.reasoning);
        for d in other.tool_calls {
            match self.tool_calls.last_mut() {
                Some(last) if last.index == d.index && d.id.is_empty() => {
                    last.arguments.push_str(&d.arguments)
                }
                _ => self.tool_calls.push(d),
            }
        }
    }
}

/// The whole reply once generation stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplySummary {
    /// Complete calls, in order (arguments are valid JSON objects).
    pub tool_calls: Vec<ToolCall>,
    /// A call was open (or malformed) when the reply ended.
    pub incomplete_call: bool,
}

enum Mode {
    Content,
    Think,
    /// DeepSeek: between `calls_begin` and `calls_end`, outside a call.
    Section,
    Call(Box<CallParser>),
}

pub struct ReplyParser {
    cfg: ReplyConfig,
    mode: Mode,
    pending: String,
    /// Strip newlines at the start of the next content / reasoning text.
    trim_content: bool,
    trim_reasoning: bool,
    /// Newlines at the end of the reasoning so far, held until we know whether `</think>`
    /// follows (then they are dropped).
    held_newlines: String,
    calls: Vec<ToolCall>,
    started_calls: usize,
    incomplete: bool,
}

impl ReplyParser {
    pub fn new(cfg: ReplyConfig) -> ReplyParser {
        let mode = if cfg.think == Some(true) {
            Mode::Think
        } else {
            Mode::Content
        };
        ReplyParser {
            cfg,
            mode,
            pending: String::new(),
            // Newlines a reply opens with (before its think block or answer) are layout.
            trim_content: true,
            trim_reasoning: true,
            held_newlines: String::new(),
            calls: Vec::new(),
            started_calls: 0,
            incomplete: false,
        }
    }

    /// Feeds generated text; returns what can be reported now.
    pub fn push(&mut self, text: &str) -> ReplyDelta {
        let mut out = ReplyDelta::default();
        if !self.cfg.is_active() {
            out.content = text.to_string();
            return out;
        }
        self.pending.push_str(text);
        while self.step(&mut out, false) {}
        out
    }

    /// The end of the reply: flushes held text, closes the summary.
    pub fn finish(&mut self) -> (ReplyDelta, ReplySummary) {
        let mut out = ReplyDelta::default();
        if self.cfg.is_active() {
            // A reply cut off inside the opening tag of a tool call: the call is incomplete,
            // its markup is not an answer.
            if matches!(self.mode, Mode::Content) && !self.pending.is_empty() {
                if let Some((f, _)) = &self.cfg.tools {
                    let start = match f {
                        ToolFormat::Qwen3 | ToolFormat::Glm => "<tool_call>",
                        _ => DS_CALLS_BEGIN,
                    };
                    if start.starts_with(self.pending.as_str()) {
                        self.pending.clear();
                        self.incomplete = true;
                    }
                }
            }
            while self.step(&mut out, true) {}
            match std::mem::replace(&mut self.mode, Mode::Content) {
                Mode::Call(c) => {
                    // Cut off inside a call: what was streamed stays, the call is not complete.
                    let _ = c;
                    self.incomplete = true;
                }
                Mode::Think => {
                    // An unclosed think block: its trailing newlines belong to it.
                    self.held_newlines.clear();
                }
                _ => {}
            }
        }
        let summary = ReplySummary {
            tool_calls: std::mem::take(&mut self.calls),
            incomplete_call: self.incomplete,
        };
        (out, summary)
    }

    /// One transition over `pending`; false when it needs more text.
    fn step(&mut self, out: &mut ReplyDelta, at_end: bool) -> bool {
        match &mut self.mode {
            Mode::Content => {
                let mut markers: Vec<&'static str> = Vec::new();
                if self.cfg.think.is_some() {
                    markers.push(THINK_OPEN);
                }
                if let Some((f, _)) = &self.cfg.tools {
                    match f {
                        ToolFormat::Qwen3 | ToolFormat::Glm => markers.push("<tool_call>"),
                        ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => {
                            markers.extend([DS_CALLS_BEGIN, DS_CALL_BEGIN])
                        }
                    }
                }
                let (before, found) = split_at_marker(&mut self.pending, &markers, at_end);
                self.emit_content(out, before);
                match found {
                    None => false,
                    Some(THINK_OPEN) => {
                        self.mode = Mode::Think;
                        self.trim_reasoning = true;
                        true
                    }
                    Some(DS_CALLS_BEGIN) => {
                        self.mode = Mode::Section;
                        true
                    }
                    Some(_) => {
                        self.start_call(out);
                        true
                    }
                }
            }
            Mode::Think => {
                let (before, found) = split_at_marker(&mut self.pending, &[THINK_CLOSE], at_end);
                self.emit_reasoning(out, before);
                if found.is_some() {
                    self.held_newlines.clear();
                    self.mode = Mode::Content;
                    self.trim_content = true;
                    true
                } else {
                    false
                }
            }
            Mode::Section => {
                let (_dropped, found) =
                    split_at_marker(&mut self.pending, &[DS_CALL_BEGIN, DS_CALLS_END], at_end);
                match found {
                    Some(DS_CALL_BEGIN) => {
                        self.start_call(out);
                        true
                    }
                    Some(_) => {
                        self.mode = Mode::Content;
                        self.trim_content = true;
                        true
                    }
                    None => false,
                }
            }
            Mode::Call(call) => {
                let end = match call.format {
                    ToolFormat::Qwen3 | ToolFormat::Glm => "</tool_call>",
                    _ => DS_CALL_END,
                };
                let (body, found) = split_at_marker(&mut self.pending, &[end], at_end);
                call.feed(&body, out);
                if found.is_none() {
                    return false;
                }
                let Mode::Call(call) = std::mem::replace(&mut self.mode, Mode::Content) else {
                    unreachable!()
                };
                let format = call.format;
                match call.finish(out) {
                    Some(c) => self.calls.push(c),
                    None => self.incomplete = true,
                }
                self.mode = match format {
                    ToolFormat::Qwen3 | ToolFormat::Glm => Mode::Content,
                    _ => Mode::Section,
                };
                self.trim_content = true;
                true
            }
        }
    }

    fn start_call(&mut self, _out: &mut ReplyDelta) {
        let Some((format, tools)) = &self.cfg.tools else {
            return;
        };
        let index = self.started_calls;
        self.started_calls += 1;
        self.mode = Mode::Call(Box::new(CallParser::new(
            *format,
            tools.clone(),
            index,
            format!("{}{index}", self.cfg.id_prefix),
        )));
    }

    fn emit_content(&mut self, out: &mut ReplyDelta, mut text: String) {
        if self.trim_content {
            let t = text.trim_start_matches(['\n', '\r']);
            if t.is_empty() {
                return;
            }
            text = t.to_string();
            self.trim_content = false;
        }
        // Whitespace between tool calls is not an answer.
        if self.started_calls > 0 && text.trim().is_empty() {
            return;
        }
        out.content.push_str(&text);
    }

    fn emit_reasoning(&mut self, out: &mut ReplyDelta, text: String) {
        let mut text = text.as_str();
        if self.trim_reasoning {
            text = text.trim_start_matches(['\n', '\r']);
            if text.is_empty() {
                return;
            }
            self.trim_reasoning = false;
        }
        let body = text.trim_end_matches('\n');
        if !body.is_empty() {
            out.reasoning
                .push_str(&std::mem::take(&mut self.held_newlines));
            out.reasoning.push_str(body);
        }
        self.held_newlines.push_str(&text[body.len()..]);
    }
}

/// Takes from `pending` the text before the earliest marker (then drops the marker too and
/// returns it), or, when none is there, everything that cannot be the start of a marker.
/// At the end of the reply nothing is held back.
fn split_at_marker(
    pending: &mut String,
    markers: &[&'static str],
    at_end: bool,
) -> (String, Option<&'static str>) {
    let first = markers
        .iter()
        .filter_map(|m| pending.find(m).map(|i| (i, *m)))
        .min_by_key(|(i, m)| (*i, std::cmp::Reverse(m.len())));
    if let Some((i, m)) = first {
        let before = pending[..i].to_string();
        pending.drain(..i + m.len());
        return (before, Some(m));
    }
    let keep = if at_end {
        0
    } else {
        partial_marker_len(pending, markers)
    };
    let cut = pending.len() - keep;
    let before = pending[..cut].to_string();
    pending.drain(..cut);
    (before, None)
}

/// Length of the longest suffix of `s` that is a proper prefix of a marker.
fn partial_marker_len(s: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let start = s.len().saturating_sub(longest.saturating_sub(1));
    (start..s.len())
        .filter(|&i| s.is_char_boundary(i))
        .find(|&i| markers.iter().any(|m| m.starts_with(&s[i..])))
        .map(|i| s.len() - i)
        .unwrap_or(0)
}

/// One JSON value read character by character; reports when it is complete.
#[derive(Default)]
struct JsonValue {
    raw: String,
    started: bool,
    done: bool,
    depth: u32,
    in_str: bool,
    esc: bool,
    /// A number / true / false / null.
    scalar: bool,
}

impl JsonValue {
    /// Feeds one character; returns whether it belongs to the value (a scalar ends at the
    /// first character that cannot continue it, which is not consumed).
    fn feed(&mut self, c: char) -> bool {
        if self.done {
            return false;
        }
        if !self.started {
            if c.is_whitespace() {
                return false;
            }
            self.started = true;
            match c {
                '{' | '[' => self.depth = 1,
                '"' => self.in_str = true,
                _ => self.scalar = true,
            }
            self.raw.push(c);
            return true;
        }
        if self.scalar {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '+' | '.') {
                self.raw.push(c);
                return true;
            }
            self.done = true;
            return false;
        }
        self.raw.push(c);
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if c == '\\' {
                self.esc = true;
            } else if c == '"' {
                self.in_str = false;
                if self.depth == 0 {
                    self.done = true;
                }
            }
            return true;
        }
        match c {
            '"' => self.in_str = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    self.done = true;
                }
            }
            _ => {}
        }
        true
    }

    /// A container or string value: streaming its characters is safe.
    fn is_container(&self) -> bool {
        self.started && !self.scalar && self.raw.starts_with(['{', '['])
    }
}

enum QwenState {
    Open,
    Key(JsonValue),
    Colon(String),
    Value(String, JsonValue),
    AfterValue,
    Closed,
}

enum Stage {
    /// Qwen: the `{"name": ..., "arguments": ...}` object.
    Qwen(QwenState),
    /// GLM: the name line, then `<arg_key>`/`<arg_value>` pairs (in `buf`).
    Glm {
        name_done: bool,
        args: usize,
    },
    /// DeepSeek: before the separator (V3: the call type; V3.1: the name).
    DsHead,
    /// DeepSeek V3: the name line after the separator.
    DsName,
    /// DeepSeek V3: waiting for the ```json fence.
    DsFence,
    /// DeepSeek: the arguments value.
    DsArgs(JsonValue),
    DsTail,
}

struct CallParser {
    format: ToolFormat,
    tools: Vec<ToolSpec>,
    index: usize,
    id: String,
    stage: Stage,
    /// Text received and not yet consumed by the stage.
    buf: String,
    name: Option<String>,
    name_sent: bool,
    /// Arguments streamed (or held until the name is known).
    args: String,
    args_sent: usize,
    args_done: bool,
}

impl CallParser {
    fn new(format: ToolFormat, tools: Vec<ToolSpec>, index: usize, id: String) -> CallParser {
        let stage = match format {
            ToolFormat::Qwen3 => Stage::Qwen(QwenState::Open),
            ToolFormat::Glm => Stage::Glm {
                name_done: false,
                args: 0,
            },
            _ => Stage::DsHead,
        };
        CallParser {
            format,
            tools,
            index,
            id,
            stage,
            buf: String::new(),
            name: None,
            name_sent: false,
            args: String::new(),
            args_sent: 0,
            args_done: false,
        }
    }

    fn feed(&mut self, text: &str, out: &mut ReplyDelta) {
        self.buf.push_str(text);
        match self.format {
            ToolFormat::Qwen3 => self.feed_qwen(),
            ToolFormat::Glm => self.feed_glm(false),
            _ => self.feed_deepseek(),
        }
        self.flush(out);
    }

    /// Sends the name once known, then whatever arguments text has not been sent.
    fn flush(&mut self, out: &mut ReplyDelta) {
        let Some(name) = &self.name else { return };
        if !self.name_sent {
            self.name_sent = true;
            out.tool_calls.push(ToolCallDelta {
                index: self.index,
                id: self.id.clone(),
                name: name.clone(),
                arguments: String::new(),
            });
        }
        if self.args.len() > self.args_sent {
            let frag = self.args[self.args_sent..].to_string();
            self.args_sent = self.args.len();
            match out.tool_calls.last_mut() {
                Some(d) if d.index == self.index => d.arguments.push_str(&frag),
                _ => out.tool_calls.push(ToolCallDelta {
                    index: self.index,
                    arguments: frag,
                    ..Default::default()
                }),
            }
        }
    }

    fn feed_qwen(&mut self) {
        let Stage::Qwen(state) = &mut self.stage else {
            return;
        };
        let text = std::mem::take(&mut self.buf);
        for c in text.chars() {
            loop {
                match state {
                    QwenState::Open => {
                        if c == '{' {
                            *state = QwenState::AfterValue;
                        }
                    }
                    QwenState::AfterValue => {
                        if c == '"' {
                            let mut k = JsonValue::default();
                            k.feed(c);
                            *state = QwenState::Key(k);
                        } else if c == '}' {
                            *state = QwenState::Closed;
                        }
                    }
                    QwenState::Key(k) => {
                        k.feed(c);
                        if k.done {
                            let key: String = serde_json::from_str(&k.raw).unwrap_or_default();
                            *state = QwenState::Colon(key);
                        }
                    }
                    QwenState::Colon(key) => {
                        if c == ':' {
                            *state = QwenState::Value(std::mem::take(key), JsonValue::default());
                        }
                    }
                    QwenState::Value(key, v) => {
                        let taken = v.feed(c);
                        if key == "arguments" && taken && v.is_container() {
                            self.args.push(c);
                        }
                        if v.done {
                            if key == "name" {
                                self.name = serde_json::from_str::<String>(&v.raw).ok();
                            } else if key == "arguments" {
                                if !v.is_container() {
                                    // Arguments given as a JSON string holding the object.
                                    if let Ok(s) = serde_json::from_str::<String>(&v.raw) {
                                        self.args = s;
                                    }
                                }
                                self.args_done = true;
                            }
                            *state = QwenState::AfterValue;
                            if !taken {
                                // A scalar ended at this character: read it again.
                                continue;
                            }
                        }
                    }
                    QwenState::Closed => {}
                }
                break;
            }
        }
    }

    fn feed_glm(&mut self, at_end: bool) {
        let Stage::Glm { name_done, args } = &mut self.stage else {
            return;
        };
        if !*name_done {
            let cut = [self.buf.find('\n'), self.buf.find("<arg_key>")]
                .into_iter()
                .flatten()
                .min();
            let cut = match (cut, at_end) {
                (Some(i), _) => i,
                (None, true) => self.buf.len(),
                (None, false) => return,
            };
            let name = self.buf[..cut].trim().to_string();
            self.buf.drain(..cut);
            *name_done = true;
            self.name = Some(name);
        }
        while let Some(ks) = self.buf.find("<arg_key>") {
            let Some(ke) = self.buf[ks..].find("</arg_key>").map(|i| i + ks) else {
                break;
            };
            let Some(vs) = self.buf[ke..].find("<arg_value>").map(|i| i + ke) else {
                break;
            };
            let Some(ve) = self.buf[vs..].find("</arg_value>").map(|i| i + vs) else {
                break;
            };
            let key = self.buf[ks + "<arg_key>".len()..ke].trim().to_string();
            let raw = &self.buf[vs + "<arg_value>".len()..ve];
            let tool = self
                .tools
                .iter()
                .find(|t| Some(&t.name) == self.name.as_ref());
            let value = glm_value(tool.and_then(|t| t.property_type(&key)), raw);
            self.args.push_str(if *args == 0 { "{" } else { ", " });
            self.args.push_str(&Value::String(key).to_string());
            self.args.push_str(": ");
            self.args.push_str(&python_json(&value));
            *args += 1;
            self.buf.drain(..ve + "</arg_value>".len());
        }
    }

    fn feed_deepseek(&mut self) {
        loop {
            match &mut self.stage {
                Stage::DsHead => {
                    let Some(i) = self.buf.find(DS_SEP) else {
                        return;
                    };
                    let head = self.buf[..i].trim().to_string();
                    self.buf.drain(..i + DS_SEP.len());
                    if self.format == ToolFormat::DeepSeekV31 {
                        self.name = Some(head);
                        self.stage = Stage::DsArgs(JsonValue::default());
                    } else {
                        self.stage = Stage::DsName;
                    }
                }
                Stage::DsName => {
                    let Some(i) = self.buf.find('\n') else { return };
                    self.name = Some(self.buf[..i].trim().to_string());
                    self.buf.drain(..i + 1);
                    self.stage = Stage::DsFence;
                }
                Stage::DsFence => {
                    let Some(i) = self.buf.find("```") else {
                        return;
                    };
                    let Some(nl) = self.buf[i..].find('\n').map(|n| n + i) else {
                        return;
                    };
                    self.buf.drain(..nl + 1);
                    self.stage = Stage::DsArgs(JsonValue::default());
                }
                Stage::DsArgs(v) => {
                    let text = std::mem::take(&mut self.buf);
                    let mut rest = String::new();
                    for (i, c) in text.char_indices() {
                        if v.done {
                            rest = text[i..].to_string();
                            break;
                        }
                        if v.feed(c) && v.is_container() {
                            self.args.push(c);
                        }
                        if v.done && !v.is_container() {
                            // Not an object: kept only for the final check.
                            rest = text[i + c.len_utf8()..].to_string();
                            break;
                        }
                    }
                    if v.done {
                        self.args_done = true;
                        self.buf = rest;
                        self.stage = Stage::DsTail;
                    }
                    return;
                }
                Stage::DsTail => {
                    self.buf.clear();
                    return;
                }
                _ => return,
            }
        }
    }

    /// The closing tag arrived: the complete call, or None when it is malformed.
    fn finish(mut self, out: &mut ReplyDelta) -> Option<ToolCall> {
        match self.format {
            ToolFormat::Glm => {
                self.feed_glm(true);
                if let Stage::Glm { args, .. } = self.stage {
                    self.args.push_str(if args == 0 { "{}" } else { "}" });
                }
                self.args_done = true;
            }
            // A call without arguments.
            ToolFormat::Qwen3
                if !self.args_done && matches!(self.stage, Stage::Qwen(QwenState::Closed)) =>
            {
                self.args = "{}".into();
                self.args_done = true;
            }
            _ => {}
        }
        let name = self.name.clone().filter(|n| !n.is_empty());
        let valid = name.is_some()
            && self.args_done
            && serde_json::from_str::<Value>(&self.args).is_ok_and(|v| v.is_object());
        if name.is_some() {
            self.flush(out);
        }
        valid.then(|| ToolCall {
            id: self.id,
            name: name.unwrap_or_default(),
            arguments: self.args,
        })
    }
}

/// A GLM argument value: bare text for string parameters, JSON otherwise (a value that is
/// not JSON stays text).
fn glm_value(ty: Option<&str>, raw: &str) -> Value {
    if ty == Some("string") {
        return Value::String(raw.to_string());
    }
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v) => v,
        Err(_) => Value::String(raw.to_string()),
    }
}

#[cfg(test)]
mod tests;
