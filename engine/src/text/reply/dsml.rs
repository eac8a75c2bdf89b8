//! DeepSeek-V3.2's DSML tool calls: a section `<｜DSML｜function_calls>…</｜DSML｜function_calls>`
//! of calls `<｜DSML｜invoke name="NAME">…</｜DSML｜invoke>`, each argument a
//! `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`: a string value as
//! written, any other value as JSON. The arguments object is built from the parameters.

use super::call::{CallBody, CallMarkup, CallText};
use crate::text::tools::{
    python_json, DSML_CALLS_BEGIN, DSML_CALLS_END, DSML_INVOKE, DSML_INVOKE_END, DSML_PARAM,
    DSML_PARAM_END,
};
use serde_json::Value;

pub(super) const MARKUP: CallMarkup = CallMarkup {
    section: Some((DSML_CALLS_BEGIN, DSML_CALLS_END)),
    open: DSML_INVOKE,
    close: DSML_INVOKE_END,
};

#[derive(Default)]
pub(super) struct Body {
    /// Parameters written into the arguments so far.
    params: usize,
}

/// The value of attribute `key="…"` in a tag's text.
fn attribute<'a>(tag: &'a str, key: &str) -> Option<&'a str> {
    let start = tag.find(&format!("{key}=\""))? + key.len() + 2;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

impl CallBody for Body {
    fn feed(&mut self, call: &mut CallText) {
        if call.name.is_none() {
            // ` name="NAME">` after the opening marker.
            let Some(end) = call.buf.find('>') else {
                return;
            };
            call.name = Some(
                attribute(&call.buf[..end], "name")
                    .unwrap_or("")
                    .to_string(),
            );
            call.buf.drain(..end + 1);
        }
        while let Some(ps) = call.buf.find(DSML_PARAM) {
            let Some(te) = call.buf[ps..].find('>').map(|i| i + ps) else {
                break;
            };
            let Some(ve) = call.buf[te..].find(DSML_PARAM_END).map(|i| i + te) else {
                break;
            };
            let tag = &call.buf[ps + DSML_PARAM.len()..te];
            let key = attribute(tag, "name").unwrap_or("").to_string();
            let raw = &call.buf[te + 1..ve];
            let value = if attribute(tag, "string") == Some("false") {
                serde_json::from_str::<Value>(raw.trim())
                    .unwrap_or_else(|_| Value::String(raw.to_string()))
            } else {
                Value::String(raw.to_string())
            };
            let mut pair = String::from(if self.params == 0 { "{" } else { ", " });
            pair.push_str(&Value::String(key).to_string());
            pair.push_str(": ");
            pair.push_str(&python_json(&value));
            call.args.push_str(&pair);
            self.params += 1;
            call.buf.drain(..ve + DSML_PARAM_END.len());
        }
    }

    fn close(&mut self, call: &mut CallText) {
        self.feed(call);
        call.args
            .push_str(if self.params == 0 { "{}" } else { "}" });
        call.args_done = true;
    }
}
