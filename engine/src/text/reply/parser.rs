//! The driver every tool-call syntax shares: content, think blocks, sections of calls, and
//! the markers between them, held back while they may still be arriving.

use super::call::{Call, CallBody, CallMarkup};
use super::delta::{ReplyDelta, ReplySummary};
use super::{deepseek, dsml, glm, kimi, qwen};
use crate::text::tools::{ToolCall, ToolFormat, ToolSpec};

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// The markers around a reply's reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinkTags {
    pub open: &'static str,
    pub close: &'static str,
}

impl Default for ThinkTags {
    fn default() -> Self {
        ThinkTags {
            open: THINK_OPEN,
            close: THINK_CLOSE,
        }
    }
}

/// What a reply parser looks for.
#[derive(Clone, Debug, Default)]
pub struct ReplyConfig {
    /// Split reasoning out: None = no think tags; Some(true) = the prompt left a think block
    /// open, so the reply starts inside it.
    pub think: Option<bool>,
    /// The tags around reasoning (`<think>`/`</think>` unless the family writes others).
    pub think_tags: ThinkTags,
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
            m.extend([self.think_tags.open, self.think_tags.close]);
        }
        if let Some((f, _)) = &self.tools {
            m.extend(f.markers());
        }
        m
    }
}

/// Where `format`'s calls start and end.
fn markup(format: ToolFormat) -> CallMarkup {
    match format {
        ToolFormat::Qwen3 => qwen::MARKUP,
        ToolFormat::Glm => glm::MARKUP,
        ToolFormat::DeepSeekV3 | ToolFormat::DeepSeekV31 => deepseek::MARKUP,
        ToolFormat::Dsml => dsml::MARKUP,
        ToolFormat::Kimi => kimi::MARKUP,
    }
}

/// A reader for the body of one call in `format`.
fn body(format: ToolFormat) -> Box<dyn CallBody> {
    match format {
        ToolFormat::Qwen3 => Box::new(qwen::Body::default()),
        ToolFormat::Glm => Box::new(glm::Body::default()),
        ToolFormat::DeepSeekV3 => Box::new(deepseek::Body::new(false)),
        ToolFormat::DeepSeekV31 => Box::new(deepseek::Body::new(true)),
        ToolFormat::Dsml => Box::new(dsml::Body::default()),
        ToolFormat::Kimi => Box::new(kimi::Body::default()),
    }
}

enum Mode {
    Content,
    Think,
    /// Inside a section of calls, outside a call.
    Section,
    Call(Box<Call>),
}

pub struct ReplyParser {
    cfg: ReplyConfig,
    /// The call syntax's markers, when tools were offered.
    calls_markup: Option<CallMarkup>,
    mode: Mode,
    pending: String,
    /// Strip newlines at the start of the next content / reasoning text.
    trim_content: bool,
    trim_reasoning: bool,
    /// Newlines at the end of the reasoning so far, held until we know whether the closing
    /// think tag follows (then they are dropped).
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
            calls_markup: cfg.tools.as_ref().map(|(f, _)| markup(*f)),
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
                if let Some(m) = &self.calls_markup {
                    if m.first().starts_with(self.pending.as_str()) {
                        self.pending.clear();
                        self.incomplete = true;
                    }
                }
            }
            while self.step(&mut out, true) {}
            match std::mem::replace(&mut self.mode, Mode::Content) {
                Mode::Call(_) => {
                    // Cut off inside a call: what was streamed stays, the call is not complete.
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
        let tags = self.cfg.think_tags;
        match &mut self.mode {
            Mode::Content => {
                let mut markers: Vec<&'static str> = Vec::new();
                if self.cfg.think.is_some() {
                    markers.push(tags.open);
                }
                if let Some(m) = &self.calls_markup {
                    if let Some((open, _)) = m.section {
                        markers.push(open);
                    }
                    markers.push(m.open);
                }
                let (before, found) = split_at_marker(&mut self.pending, &markers, at_end);
                self.emit_content(out, before);
                let section_open = self.calls_markup.and_then(|m| m.section).map(|s| s.0);
                match found {
                    None => false,
                    Some(m) if m == tags.open && self.cfg.think.is_some() => {
                        self.mode = Mode::Think;
                        self.trim_reasoning = true;
                        true
                    }
                    Some(m) if Some(m) == section_open => {
                        self.mode = Mode::Section;
                        true
                    }
                    Some(_) => {
                        self.start_call();
                        true
                    }
                }
            }
            Mode::Think => {
                let (before, found) = split_at_marker(&mut self.pending, &[tags.close], at_end);
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
                let Some(m) = self.calls_markup else {
                    return false;
                };
                let close = m.section.map(|s| s.1).unwrap_or(m.close);
                let (_dropped, found) =
                    split_at_marker(&mut self.pending, &[m.open, close], at_end);
                match found {
                    Some(f) if f == m.open => {
                        self.start_call();
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
                let Some(m) = self.calls_markup else {
                    return false;
                };
                let (body, found) = split_at_marker(&mut self.pending, &[m.close], at_end);
                call.feed(&body, out);
                if found.is_none() {
                    return false;
                }
                let Mode::Call(call) = std::mem::replace(&mut self.mode, Mode::Content) else {
                    unreachable!()
                };
                match call.finish(out) {
                    Some(c) => self.calls.push(c),
                    None => self.incomplete = true,
                }
                self.mode = if m.section.is_some() {
                    Mode::Section
                } else {
                    Mode::Content
                };
                self.trim_content = true;
                true
            }
        }
    }

    fn start_call(&mut self) {
        let Some((format, tools)) = &self.cfg.tools else {
            return;
        };
        let index = self.started_calls;
        self.started_calls += 1;
        self.mode = Mode::Call(Box::new(Call::new(
            body(*format),
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
pub(crate) fn split_at_marker(
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
pub(crate) fn partial_marker_len(s: &str, markers: &[&str]) -> usize {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let start = s.len().saturating_sub(longest.saturating_sub(1));
    (start..s.len())
        .filter(|&i| s.is_char_boundary(i))
        .find(|&i| markers.iter().any(|m| m.starts_with(&s[i..])))
        .map(|i| s.len() - i)
        .unwrap_or(0)
}
