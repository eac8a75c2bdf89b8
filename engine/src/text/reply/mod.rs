//! Splits a streamed reply into what a chat API reports separately: the answer's text
//! (content), the text between think tags (reasoning), and tool calls written in the model
//! family's syntax (deltas: the call's name first, then fragments of its arguments' JSON).
//!
//! Everything is incremental and safe for markup split across tokens: text that could be
//! the start of a tag is held back until the next delta decides. A tool call is only
//! reported complete at its closing tag; one cut off (e.g. by max_tokens) stays incomplete.
//!
//! `parser.rs` is the driver, the same for every syntax: content, think blocks, sections of
//! calls, and the markers between them; `call.rs` one call being read. Each tool-call syntax
//! is a file of its own that says where its calls start and end (`CallMarkup`) and reads a
//! call's body (`CallBody`): `qwen.rs` (Qwen3 / Hermes JSON), `glm.rs` (GLM's
//! arg_key/arg_value pairs), `deepseek.rs` (DeepSeek-V3 / V3.1), `kimi.rs` (Kimi-K2 / K2.5's
//! section tokens, the call id `functions.NAME:IDX`). A new syntax is a
//! `ToolFormat` variant (detection and markers in `tools.rs`), a file here, and one arm in
//! `parser.rs`'s `markup` and `body`.

mod call;
mod deepseek;
mod delta;
mod dsml;
mod glm;
mod json_value;
mod kimi;
mod parser;
mod qwen;

pub use delta::{ReplyDelta, ReplySummary, ToolCallDelta};
pub use parser::{ReplyConfig, ReplyParser, ThinkTags, THINK_CLOSE, THINK_OPEN};

#[cfg(test)]
mod tests;
