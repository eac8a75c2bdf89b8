//! DeepSeek tool calls, in a section `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>` of calls
//! `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>`. V3 / R1 write
//! `function<｜tool▁sep｜>NAME\n```json\n{...}\n```` in a call, V3.1
//! `NAME<｜tool▁sep｜>{...}`.

use super::call::{CallBody, CallMarkup, CallText};
use super::json_value::JsonValue;
use crate::text::tools::{DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP};

pub(super) const MARKUP: CallMarkup = CallMarkup {
    section: Some((DS_CALLS_BEGIN, DS_CALLS_END)),
    open: DS_CALL_BEGIN,
    close: DS_CALL_END,
};

enum Stage {
    /// Before the separator (V3: the call type; V3.1: the name).
    Head,
    /// V3: the name line after the separator.
    Name,
    /// V3: waiting for the ```json fence.
    Fence,
    /// The arguments value.
    Args(JsonValue),
    Tail,
}

pub(super) struct Body {
    /// V3.1's layout (the name before the separator, bare JSON after it).
    v31: bool,
    stage: Stage,
}

impl Body {
    pub fn new(v31: bool) -> Body {
        Body {
            v31,
            stage: Stage::Head,
        }
    }
}

impl CallBody for Body {
    fn feed(&mut self, call: &mut CallText) {
        loop {
            match &mut self.stage {
                Stage::Head => {
                    let Some(i) = call.buf.find(DS_SEP) else {
                        return;
                    };
                    let head = call.buf[..i].trim().to_string();
                    call.buf.drain(..i + DS_SEP.len());
                    if self.v31 {
                        call.name = Some(head);
                        self.stage = Stage::Args(JsonValue::default());
                    } else {
                        self.stage = Stage::Name;
                    }
                }
                Stage::Name => {
                    let Some(i) = call.buf.find('\n') else { return };
                    call.name = Some(call.buf[..i].trim().to_string());
                    call.buf.drain(..i + 1);
                    self.stage = Stage::Fence;
                }
                Stage::Fence => {
                    let Some(i) = call.buf.find("```") else {
                        return;
                    };
                    let Some(nl) = call.buf[i..].find('\n').map(|n| n + i) else {
                        return;
                    };
                    call.buf.drain(..nl + 1);
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
                            // Not an object: kept only for the final check.
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
