//! The engine's one error type. Every failure that a user can cause (a bad file, a bad
//! request) is a variant here with enough context to act on; nothing in the engine panics on
//! untrusted input.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file whose bytes cannot be trusted: bad header, offsets out of bounds, ...
    #[error("{file}: corrupt or unsupported file: {msg}")]
    CorruptFile { file: PathBuf, msg: String },
    /// A tensor exists but does not fit the model's configuration.
    #[error("{file}: tensor '{tensor}': {msg}")]
    BadTensor {
        file: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("model directory {dir}: tensor '{tensor}' is missing (needed by {family})")]
    MissingTensor {
        dir: PathBuf,
        tensor: String,
        family: String,
    },
    #[error("tensor '{tensor}' appears in both {first} and {second}")]
    DuplicateTensor {
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("unsupported model_type '{got}'; supported: {}", supported.join(", "))]
    UnsupportedModelType { got: String, supported: Vec<String> },
    #[error("{file}: {msg}")]
    Config { file: PathBuf, msg: String },
    #[error("prompt of {needed} tokens does not fit the context of {max} tokens")]
    ContextOverflow { needed: usize, max: usize },
    /// A text refused before it was tokenized in full (`Text::encode_within`): `at_least`
    /// is a lower bound of its length in tokens.
    #[error("text of {bytes} bytes is at least {at_least} tokens, more than the {max} the context has room for")]
    TextTooLong {
        bytes: usize,
        at_least: usize,
        max: usize,
    },
    #[error("invalid argument '{field}': {msg}")]
    InvalidArgument { field: String, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
    pub fn invalid(field: impl Into<String>, msg: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            msg: msg.into(),
        }
    }
}
