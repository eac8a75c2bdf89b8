//! One tool call being read: what every syntax shares (the call's index and id, its name
//! and arguments as far as read, what has been streamed of them, the final check) around
//! the syntax's own reader of the call's body ([`CallBody`]).

use super::delta::{ReplyDelta, ToolCallDelta};
use crate::text::tools::{ToolCall, ToolSpec};
use serde_json::Value;

/// Where a syntax's tool calls start and end in a reply.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CallMarkup {
    /// The markers that open and close a section of calls (DeepSeek's `tool▁calls▁begin`
    /// / `end`), when the syntax has one; text between the calls of a section is dropped,
    /// and a call that ends returns to its section.
    pub section: Option<(&'static str, &'static str)>,
    /// Opens one call.
    pub open: &'static str,
    /// Closes one call.
    pub close: &'static str,
}

impl CallMarkup {
    /// The marker whose beginning, left at the end of a reply, means a call was cut off.
    pub fn first(&self) -> &'static str {
        self.section.map(|(open, _)| open).unwrap_or(self.open)
    }
}

/// What a syntax's reader fills in while it reads a call's body.
#[derive(Default)]
pub(crate) struct CallText {
    /// The tools offered (some syntaxes type argument values by their schema).
    pub tools: Vec<ToolSpec>,
    /// Body text received and not yet consumed by the reader.
    pub buf: String,
    /// The function's name, once read.
    pub name: Option<String>,
    /// The arguments as a JSON object's text, as far as read (streamed as it grows; held
    /// until the name is known).
    pub args: String,
    /// The arguments are complete.
    pub args_done: bool,
    /// The call's id as the model wrote it, for syntaxes that write one (Kimi's
    /// `functions.NAME:IDX`); else the parser's own.
    pub id: Option<String>,
}

impl CallText {
    /// The offered tool this call names, if any.
    pub fn tool(&self) -> Option<&ToolSpec> {
        let name = self.name.as_ref()?;
        self.tools.iter().find(|t| &t.name == name)
    }
}

/// A syntax's reader of one call's body: the text between the call's opening and closing
/// markers, fed in pieces as it is generated.
pub(crate) trait CallBody: Send {
    /// Consumes what it can of `call.buf`: sets `call.name`, appends to `call.args` (only
    /// text that will stay part of the final arguments: it is streamed at once), sets
    /// `call.args_done`.
    fn feed(&mut self, call: &mut CallText);

    /// The closing marker arrived (everything before it was fed): complete what the body
    /// implies, e.g. close an arguments object built from pairs.
    fn close(&mut self, call: &mut CallText) {
        let _ = call;
    }
}

pub(super) struct Call {
    body: Box<dyn CallBody>,
    text: CallText,
    index: usize,
    id: String,
    name_sent: bool,
    args_sent: usize,
}

impl Call {
    pub fn new(body: Box<dyn CallBody>, tools: Vec<ToolSpec>, index: usize, id: String) -> Call {
        Call {
            body,
            text: CallText {
                tools,
                ..Default::default()
            },
            index,
            id,
            name_sent: false,
            args_sent: 0,
        }
    }

    pub fn feed(&mut self, text: &str, out: &mut ReplyDelta) {
        self.text.buf.push_str(text);
        self.body.feed(&mut self.text);
        self.flush(out);
    }

    /// Sends the name once known, then whatever arguments text has not been sent.
    fn flush(&mut self, out: &mut ReplyDelta) {
        let Some(name) = &self.text.name else { return };
        if !self.name_sent {
            self.name_sent = true;
            if let Some(id) = &self.text.id {
                self.id = id.clone();
            }
            out.tool_calls.push(ToolCallDelta {
                index: self.index,
                id: self.id.clone(),
                name: name.clone(),
                arguments: String::new(),
            });
        }
        let args = &self.text.args;
        if args.len() > self.args_sent {
            let frag = args[self.args_sent..].to_string();
            self.args_sent = args.len();
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

    /// The closing marker arrived: the complete call, or None when it is malformed.
    pub fn finish(mut self, out: &mut ReplyDelta) -> Option<ToolCall> {
        self.body.close(&mut self.text);
        let name = self.text.name.clone().filter(|n| !n.is_empty());
        let valid = name.is_some()
            && self.text.args_done
            && serde_json::from_str::<Value>(&self.text.args).is_ok_and(|v| v.is_object());
        if name.is_some() {
            self.flush(out);
        }
        valid.then(|| ToolCall {
            id: self.id,
            name: name.unwrap_or_default(),
            arguments: self.text.args,
        })
    }
}
