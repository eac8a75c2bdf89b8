//! Qwen3 / Hermes tool calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
//! (the arguments may also be a JSON string holding the object, or absent).

use super::call::{CallBody, CallMarkup, CallText};
use super::json_value::JsonValue;

pub(super) const MARKUP: CallMarkup = CallMarkup {
    section: None,
    open: "<tool_call>",
    close: "</tool_call>",
};

/// Where the reader is in the `{"name": ..., "arguments": ...}` object.
#[derive(Default)]
enum State {
    #[default]
    Open,
    Key(JsonValue),
    Colon(String),
    Value(String, JsonValue),
    AfterValue,
    Closed,
}

#[derive(Default)]
pub(super) struct Body {
    state: State,
}

impl CallBody for Body {
    fn feed(&mut self, call: &mut CallText) {
        let state = &mut self.state;
        let text = std::mem::take(&mut call.buf);
        for c in text.chars() {
            loop {
                match state {
                    State::Open => {
                        if c == '{' {
                            *state = State::AfterValue;
                        }
                    }
                    State::AfterValue => {
                        if c == '"' {
                            let mut k = JsonValue::default();
                            k.feed(c);
                            *state = State::Key(k);
                        } else if c == '}' {
                            *state = State::Closed;
                        }
                    }
                    State::Key(k) => {
                        k.feed(c);
                        if k.done {
                            let key: String = serde_json::from_str(&k.raw).unwrap_or_default();
                            *state = State::Colon(key);
                        }
                    }
                    State::Colon(key) => {
                        if c == ':' {
                            *state = State::Value(std::mem::take(key), JsonValue::default());
                        }
                    }
                    State::Value(key, v) => {
                        let taken = v.feed(c);
                        if key == "arguments" && taken && v.is_container() {
                            call.args.push(c);
                        }
                        if v.done {
                            if key == "name" {
                                call.name = serde_json::from_str::<String>(&v.raw).ok();
                            } else if key == "arguments" {
                                if !v.is_container() {
                                    // Arguments given as a JSON string holding the object.
                                    if let Ok(s) = serde_json::from_str::<String>(&v.raw) {
                                        call.args = s;
                                    }
                                }
                                call.args_done = true;
                            }
                            *state = State::AfterValue;
                            if !taken {
                                // A scalar ended at this character: read it again.
                                continue;
                            }
                        }
                    }
                    State::Closed => {}
                }
                break;
            }
        }
    }

    fn close(&mut self, call: &mut CallText) {
        // A call without arguments.
        if !call.args_done && matches!(self.state, State::Closed) {
            call.args = "{}".into();
            call.args_done = true;
        }
    }
}
