//! Text assets of a model folder. (Placeholder signatures; the full implementation replaces
//! this file: tokenizer.json via `tokenizers`, chat template via `minijinja`, incremental
//! detokenization, stop strings.)

use crate::error::{Error, Result};
use std::path::Path;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct Text {
    tokenizer: tokenizers::Tokenizer,
    eos_ids: Vec<u32>,
}

impl Text {
    /// Loads tokenizer.json, tokenizer_config.json and generation_config.json from `dir`;
    /// `config` is the parsed config.json (its eos_token_id counts too).
    pub fn load(dir: &Path, config: &serde_json::Value) -> Result<Text> {
        let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let eos_ids = config
            .get("eos_token_id")
            .and_then(|v| v.as_u64())
            .map(|v| vec![v as u32])
            .unwrap_or_default();
        Ok(Text { tokenizer, eos_ids })
    }
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec())
    }
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }
    pub fn render_chat(&self, _messages: &[ChatMessage], _add_generation_prompt: bool) -> Result<String> {
        Err(Error::Template("not implemented yet".into()))
    }
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

/// Turns a stream of token ids into text deltas, never splitting a UTF-8 character.
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    emitted: usize,
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        IncrementalDecoder { ids: Vec::new(), emitted: 0 }
    }
    /// Adds a token; returns the newly complete text (possibly empty).
    pub fn push(&mut self, text: &Text, id: u32) -> Result<String> {
        self.ids.push(id);
        let s = text.decode(&self.ids, true)?;
        if s.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = s.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = s.len();
        Ok(delta)
    }
}

impl Default for IncrementalDecoder {
    fn default() -> Self {
        Self::new()
    }
}

/// Stop-string matcher over streamed text: holds back text that may be the start of a stop
/// string, cuts the output at the first full match.
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops, held: String::new() }
    }
    /// Feeds a text delta; returns (text safe to emit now, whether a stop string matched).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        self.held.push_str(delta);
        for s in &self.stops {
            if let Some(i) = self.held.find(s.as_str()) {
                let out = self.held[..i].to_string();
                self.held.clear();
                return (out, true);
            }
        }
        (std::mem::take(&mut self.held), false)
    }
    /// Whatever is still held back, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
