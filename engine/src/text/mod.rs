//! Text assets of a model folder: the tokenizer (tokenizer.json via the `tokenizers` crate, or
//! a tiktoken BPE file read into one, [`tiktoken`]),
//! the chat template (rendered with minijinja as transformers does), end/begin-of-sequence
//! ids gathered from every file that declares them, generation_config defaults, and the
//! streaming helpers: [`IncrementalDecoder`] and [`StopMatcher`]; tool calling and the
//! reasoning split ([`tools`], [`reply`]).

mod assets;
mod bounded;
mod detok;
pub mod reply;
mod stop;
mod template;
pub mod tiktoken;
mod token_bound;
pub mod tools;

pub use assets::{id_list, prompt_opens_think, GenerationDefaults, Text};
pub use detok::IncrementalDecoder;
pub use reply::{ReplyConfig, ReplyDelta, ReplyParser, ReplySummary, ToolCallDelta};
pub use stop::StopMatcher;
pub use template::{ChatMessage, ChatTemplate};
pub use token_bound::TokenBound;
pub use tools::{ToolCall, ToolChoice, ToolFormat, ToolSpec};
