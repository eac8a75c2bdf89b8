//! What one request may cost, and the checks every front door (the gRPC handlers, the
//! engine thread, any other API built on them) shares so that a request that cannot be
//! served is refused before it costs memory or time.
//!
//! - A gRPC message is at most [`MAX_REQUEST_BYTES`] (tonic refuses a bigger one with
//!   RESOURCE_EXHAUSTED before decoding it).
//! - Text is tokenized with [`colibri_engine::text::Text::encode_within`]: a text that cannot
//!   fit the room left in the context is refused after at most about a context's worth of
//!   tokenization (O(1) when the tokenizer has a bytes-per-token bound).
//! - Score answers at most [`MAX_SCORE_LOGITS_BYTES`] of logits; Detokenize at most
//!   [`MAX_DETOKENIZE_IDS`] ids.

use crate::wire::{self, status_from_engine};
use colibri_engine::text::{ChatMessage, Text};
use colibri_engine::{Error, Model};
use tonic::Status;

/// The largest request message the server decodes. A prompt that fills the longest
/// contexts (1M tokens of ~4 bytes) fits with room to spare.
pub const MAX_REQUEST_BYTES: usize = 64 << 20;

/// The largest logits block a Score answers (positions x vocabulary x 4 bytes), below
/// protobuf's 2 GiB message limit; `argmax_only` is not limited.
pub const MAX_SCORE_LOGITS_BYTES: usize = 1 << 30;

/// The largest answer message (Score's logits plus their framing).
pub const MAX_RESPONSE_BYTES: usize = MAX_SCORE_LOGITS_BYTES + (64 << 20);

/// Ids one Detokenize may turn into text (not bound by the context).
pub const MAX_DETOKENIZE_IDS: usize = 1 << 20;

/// The status for a text that does not fit, naming the request's field.
pub fn text_status(field: &str, e: &Error) -> Status {
    match e {
        Error::TextTooLong { .. } | Error::ContextOverflow { .. } => {
            // Marked like every context refusal, for front ends with their own error shape.
            let mut st = wire::invalid(field, e);
            st.metadata_mut().insert(
                wire::ERROR_KIND_KEY,
                tonic::metadata::MetadataValue::from_static(wire::CONTEXT_LENGTH_EXCEEDED),
            );
            st
        }
        e => status_from_engine(e),
    }
}

/// Tokenizes `s` if it fits in `room` tokens (see the module doc).
pub fn encode_text(
    text: &Text,
    s: &str,
    add_special: bool,
    room: usize,
    field: &str,
) -> Result<Vec<u32>, Status> {
    crate::memory::note_large(s.len());
    text.encode_within(s, add_special, room)
        .map_err(|e| text_status(field, &e))
}

/// Renders a conversation with the model's template (generation prompt added) and
/// tokenizes it if it fits in `room` tokens. Returns the rendered text too.
pub fn encode_chat(
    text: &Text,
    msgs: &[ChatMessage],
    room: usize,
    field: &str,
) -> Result<(Vec<u32>, String), Status> {
    if msgs.is_empty() {
        return Err(wire::invalid("messages", "is empty"));
    }
    let rendered = text
        .render_chat(msgs, true)
        .map_err(|e| status_from_engine(&e))?;
    // The template wrote the special tokens itself.
    let ids = encode_text(text, &rendered, false, room, field)?;
    Ok((ids, rendered))
}

/// The O(1) check a handler makes before queueing a text prompt: it must be able to fit an
/// empty context (the engine thread checks the exact room, a session's included).
pub fn check_prompt_bytes(model: &Model, bytes: usize, field: &str) -> Result<(), Status> {
    crate::memory::note_large(bytes);
    match &model.text {
        Some(t) => t
            .check_text_bytes(bytes, model.info.max_context)
            .map_err(|e| text_status(field, &e)),
        None => Ok(()),
    }
}

/// A Score request's size: ids within the context (checked exactly, ids included, on the
/// engine thread) and an answer within [`MAX_SCORE_LOGITS_BYTES`].
pub fn check_score(model: &Model, ids: usize, argmax_only: bool) -> Result<(), Status> {
    if ids > model.info.max_context {
        return Err(wire::invalid(
            "ids",
            format!(
                "{ids} ids do not fit the context of {} tokens",
                model.info.max_context
            ),
        ));
    }
    let bytes = ids.saturating_mul(model.info.vocab_size).saturating_mul(4);
    if !argmax_only && bytes > MAX_SCORE_LOGITS_BYTES {
        return Err(wire::invalid(
            "ids",
            format!(
                "the logits of {ids} positions x {} ids are {} MiB, more than the {} MiB one answer \
                 may carry; score fewer ids per request or set argmax_only",
                model.info.vocab_size,
                bytes >> 20,
                MAX_SCORE_LOGITS_BYTES >> 20
            ),
        ));
    }
    Ok(())
}

pub fn check_detokenize(ids: usize) -> Result<(), Status> {
    if ids > MAX_DETOKENIZE_IDS {
        return Err(wire::invalid(
            "ids",
            format!("{ids} ids are more than the {MAX_DETOKENIZE_IDS} one request may detokenize"),
        ));
    }
    Ok(())
}
