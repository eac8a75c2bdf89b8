//! What a reply parser reports: deltas as text arrives, the summary at the end.

use crate::text::tools::ToolCall;

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
