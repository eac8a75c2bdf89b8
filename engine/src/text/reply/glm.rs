//! GLM-4.5/4.6/4.7/5 tool calls: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V
//! </arg_value>\n</tool_call>`, string values bare, others JSON; the arguments object is
//! built from the pairs, each value typed by the tool's schema.

use super::call::{CallBody, CallMarkup, CallText};
use crate::text::tools::python_json;
use serde_json::Value;

pub(super) const MARKUP: CallMarkup = CallMarkup {
    section: None,
    open: "<tool_call>",
    close: "</tool_call>",
};

#[derive(Default)]
pub(super) struct Body {
    name_done: bool,
    /// Pairs written into the arguments so far.
    args: usize,
}

impl Body {
    fn read(&mut self, call: &mut CallText, at_end: bool) {
        if !self.name_done {
            let cut = [call.buf.find('\n'), call.buf.find("<arg_key>")]
                .into_iter()
                .flatten()
                .min();
            let cut = match (cut, at_end) {
                (Some(i), _) => i,
                (None, true) => call.buf.len(),
                (None, false) => return,
            };
            let name = call.buf[..cut].trim().to_string();
            call.buf.drain(..cut);
            self.name_done = true;
            call.name = Some(name);
        }
        while let Some(ks) = call.buf.find("<arg_key>") {
            let Some(ke) = call.buf[ks..].find("</arg_key>").map(|i| i + ks) else {
                break;
            };
            let Some(vs) = call.buf[ke..].find("<arg_value>").map(|i| i + ke) else {
                break;
            };
            let Some(ve) = call.buf[vs..].find("</arg_value>").map(|i| i + vs) else {
                break;
            };
            let key = call.buf[ks + "<arg_key>".len()..ke].trim().to_string();
            let raw = &call.buf[vs + "<arg_value>".len()..ve];
            let value = typed_value(call.tool().and_then(|t| t.property_type(&key)), raw);
            let mut pair = String::from(if self.args == 0 { "{" } else { ", " });
            pair.push_str(&Value::String(key).to_string());
            pair.push_str(": ");
            pair.push_str(&python_json(&value));
            call.args.push_str(&pair);
            self.args += 1;
            call.buf.drain(..ve + "</arg_value>".len());
        }
    }
}

impl CallBody for Body {
    fn feed(&mut self, call: &mut CallText) {
        self.read(call, false);
    }

    fn close(&mut self, call: &mut CallText) {
        self.read(call, true);
        call.args.push_str(if self.args == 0 { "{}" } else { "}" });
        call.args_done = true;
    }
}

/// A GLM argument value: bare text for string parameters, JSON otherwise (a value that is
/// not JSON stays text).
fn typed_value(ty: Option<&str>, raw: &str) -> Value {
    if ty == Some("string") {
        return Value::String(raw.to_string());
    }
    match serde_json::from_str::<Value>(raw.trim()) {
        Ok(v) => v,
        Err(_) => Value::String(raw.to_string()),
    }
}
