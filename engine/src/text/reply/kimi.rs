//! Kimi-K2 / K2.5 tool calls: a section `<|tool_calls_section_begin|>…<|tool_calls_section_end|>`
//! of calls `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`.
//! The head before the argument marker is the call's id as the model writes it (and as the
//! template renders it back in `tool_calls[].id` and a result's `## Return of ID`): the id
//! reported is that head, the name the part between `functions.` and the last `:`.

use super::call::{CallBody, CallMarkup, CallText};
use super::json_value::JsonValue;
use crate::text::tools::{
    KIMI_ARGS, KIMI_CALLS_BEGIN, KIMI_CALLS_END, KIMI_CALL_BEGIN, KIMI_CALL_END,
};

pub(super) const MARKUP: CallMarkup = CallMarkup {
    section: Some((KIMI_CALLS_BEGIN, KIMI_CALLS_END)),
    open: KIMI_CALL_BEGIN,
    close: KIMI_CALL_END,
};

enum Stage {
    /// Before the argument marker: the id.
    Head,
    /// The arguments value.
    Args(JsonValue),
    Tail,
}

pub(super) struct Body {
    stage: Stage,
}

impl Default for Body {
    fn default() -> Self {
        Body { stage: Stage::Head }
    }
}

/// The function name in a call id `functions.NAME:IDX` (a bare `NAME:IDX` or `NAME` too).
pub fn name_of(id: &str) -> &str {
    let s = id.trim();
    let s = s.strip_prefix("functions.").unwrap_or(s);
    match s.rfind(':') {
        Some(i) if s[i + 1..].chars().all(|c| c.is_ascii_digit()) => &s[..i],
        _ => s,
    }
}

impl CallBody for Body {
    fn feed(&mut self, call: &mut CallText) {
        loop {
            match &mut self.stage {
                Stage::Head => {
                    let Some(i) = call.buf.find(KIMI_ARGS) else {
                        return;
                    };
                    let head = call.buf[..i].trim().to_string();
                    call.buf.drain(..i + KIMI_ARGS.len());
                    call.name = Some(name_of(&head).to_string());
                    call.id = Some(head);
                    self.stage = Stage::Args(JsonValue::default());
                }
                Stage::Args(v) => {
                    let text = std::mem::take(&mut call.buf);
                    let mut rest = String::new();
                    for (i, c) in text.char_indices() {
                        if v.done {
                            rest = text[i..].to_string();
                            break;
                        }
                        if v.feed(c) && v.is_container() {
                            call.args.push(c);
                        }
                        if v.done && !v.is_container() {
                            rest = text[i + c.len_utf8()..].to_string();
                            break;
                        }
                    }
                    if v.done {
                        call.args_done = true;
                        call.buf = rest;
                        self.stage = Stage::Tail;
                    }
                    return;
                }
                Stage::Tail => {
                    call.buf.clear();
                    return;
                }
            }
        }
    }
}
