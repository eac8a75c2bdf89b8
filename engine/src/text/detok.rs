//! Incremental detokenization for streaming.
//!
//! Decoding token by token is wrong in two ways: a byte-level BPE or byte-fallback token can
//! carry only part of a multi-byte UTF-8 character, and SentencePiece-style decoders strip the
//! leading space of the first token they see. So, as TGI and vLLM do, each step decodes a short
//! window that starts a few tokens back (`prefix_offset`) and emits only what the new tokens
//! add beyond the text the window already covered (`read_offset`). The window stays a handful
//! of tokens long, so each step costs O(1), not a re-decode of the whole sequence.

use super::Text;
use crate::error::Result;

/// A valid UTF-8 character spans at most 4 bytes, hence at most 4 tokens; a decode still
/// ending in U+FFFD after more pending tokens than that holds genuinely invalid bytes,
/// which are then emitted rather than held forever.
const MAX_PENDING: usize = 4;

/// Turns a stream of token ids into text deltas, never splitting a UTF-8 character.
/// Special tokens are skipped, except those it was told to keep (tool-call and think markup
/// some tokenizers mark special, which the reply parser must see).
pub struct IncrementalDecoder {
    /// Special tokens that come out as text; None = all are skipped.
    keep: Option<Vec<u32>>,
    /// Tokens from `prefix_offset` on (older ones are dropped: they never matter again).
    ids: Vec<u32>,
    /// Start of the decode window within `ids`.
    prefix_offset: usize,
    /// End of the text already emitted within `ids`.
    read_offset: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        IncrementalDecoder {
            keep: None,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// A decoder that writes the special tokens in `keep` as their text.
    pub fn keeping(keep: Vec<u32>) -> Self {
        IncrementalDecoder {
            keep: (!keep.is_empty()).then_some(keep),
            ..Self::new()
        }
    }

    /// Adds a token; returns the newly complete text (possibly empty).
    pub fn push(&mut self, text: &Text, id: u32) -> Result<String> {
        if let Some(keep) = &self.keep {
            if text.is_special(id) && !keep.contains(&id) {
                return Ok(String::new());
            }
        }
        self.ids.push(id);
        self.step(text, false)
    }

    /// Everything still held back (an incomplete character at the end of generation comes
    /// out as U+FFFD, as a full decode would show it). Resets the decoder.
    pub fn finish(&mut self, text: &Text) -> Result<String> {
        let out = self.step(text, true)?;
        *self = IncrementalDecoder {
            keep: self.keep.take(),
            ..IncrementalDecoder::new()
        };
        Ok(out)
    }

    fn step(&mut self, text: &Text, force: bool) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        // With kept specials the others never enter `ids`, so nothing needs skipping.
        let skip = self.keep.is_none();
        let prefix = text.decode(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let full = text.decode(&self.ids[self.prefix_offset..], skip)?;
        let pending = self.ids.len() - self.read_offset;
        let incomplete = full.ends_with('\u{FFFD}') && pending <= MAX_PENDING;
        if full.len() <= prefix.len() || (incomplete && !force) {
            // Nothing new yet (special tokens only, or half a character).
            return Ok(String::new());
        }
        // The window's decode normally extends the prefix's; if a decoder rewrote earlier
        // text, emit from the nearest character boundary rather than fail.
        let mut cut = prefix.len();
        while !full.is_char_boundary(cut) {
            cut += 1;
        }
        let delta = full[cut..].to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Drop tokens before the window so memory stays bounded on long generations.
        self.ids.drain(..self.prefix_offset);
        self.read_offset -= self.prefix_offset;
        self.prefix_offset = 0;
        Ok(delta)
    }
}

impl Default for IncrementalDecoder {
    fn default() -> Self {
        Self::new()
    }
}
