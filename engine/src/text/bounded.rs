//! Refusing a text that cannot fit before paying for it.
//!
//! Tokenizing costs time and memory in proportion to the text: the `tokenizers` pipeline keeps
//! an alignment per normalized byte and a string per pre-token, so a 4 MB prompt took 2.8 s of
//! CPU and ~500 MB of memory just to learn that it does not fit a 4096-token context. A text
//! that must fit in `max_tokens` tokens is therefore checked in two steps, each of which only
//! ever refuses what provably does not fit:
//!
//! 1. **Bytes per token.** From the tokenizer's own configuration, [`TokenBound`] derives the
//!    most input bytes one token can stand for (the longest vocabulary entry or added token,
//!    scaled by how much the normalizer can shrink text). A text of `n` bytes is then at
//!    least `ceil(n / that)` tokens: O(1), before any tokenization. Pipelines that can fold an
//!    unbounded run of input into one token or drop input altogether (whitespace-removing
//!    pre-tokenizers, `Strip`, fused unknown tokens, lstrip/rstrip added tokens, ...) have no
//!    such bound and skip this step.
//! 2. **Prefixes.** Otherwise growing prefixes of the text are tokenized, starting at about
//!    what `max_tokens` tokens usually take. The tokens of a prefix that end well before the
//!    cut (more than [`TokenBound::tail`] bytes, and for word-level models outside the last
//!    word) are tokens of the whole text too, so their number is a lower bound; as soon as it
//!    exceeds `max_tokens` the text is refused. When a prefix reaches the end of the text, its
//!    tokenization is the answer. The work is bounded by what `max_tokens` tokens (plus the
//!    growth factor) cost, not by the text.
//!
//! A text that fits is always tokenized exactly as `encode` does (the whole text, in one
//! call); only refusals use the bounds.

use super::token_bound::TokenBound;
use super::Text;
use crate::error::{Error, Result};

/// Typical bytes per token of text; only sizes the first prefix.
const FIRST_GUESS_BYTES_PER_TOKEN: usize = 4;

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Text {
    /// What this model's tokenizer says about the cost of a text.
    pub fn token_bound(&self) -> &TokenBound {
        &self.bound
    }

    /// The O(1) part of [`encode_within`](Self::encode_within): refuses a text of `bytes`
    /// bytes that is longer than `max_tokens` tokens whatever it says.
    pub fn check_text_bytes(&self, bytes: usize, max_tokens: usize) -> Result<()> {
        let at_least = self.bound.min_tokens(bytes);
        if at_least > max_tokens {
            return Err(Error::TextTooLong {
                bytes,
                at_least,
                max: max_tokens,
            });
        }
        Ok(())
    }

    /// Tokenizes `text` (exactly as [`encode`](Self::encode) does) when it is at most
    /// `max_tokens` tokens; otherwise fails with [`Error::TextTooLong`] (or
    /// [`Error::ContextOverflow`] when the whole text was tokenized anyway) having spent
    /// about what tokenizing `max_tokens` tokens costs, whatever the size of the text.
    pub fn encode_within(
        &self,
        text: &str,
        add_special_tokens: bool,
        max_tokens: usize,
    ) -> Result<Vec<u32>> {
        let first_cut = max_tokens
            .saturating_add(1)
            .saturating_mul(FIRST_GUESS_BYTES_PER_TOKEN)
            .saturating_add(self.bound.tail);
        self.encode_within_from(text, add_special_tokens, max_tokens, first_cut)
    }

    /// [`encode_within`](Self::encode_within) with the first prefix's length given.
    fn encode_within_from(
        &self,
        text: &str,
        add_special_tokens: bool,
        max_tokens: usize,
        first_cut: usize,
    ) -> Result<Vec<u32>> {
        self.check_text_bytes(text.len(), max_tokens)?;
        let tail = self.bound.tail;
        let mut cut = first_cut;
        while cut < text.len() {
            let end = floor_char_boundary(text, cut);
            let prefix = &text[..end];
            let enc = self
                .tokenizer
                .encode(prefix, false)
                .map_err(|e| self.tok_err(e))?;
            let settled = self.settled_tokens(&enc, end);
            if settled > max_tokens {
                return Err(Error::TextTooLong {
                    bytes: text.len(),
                    at_least: settled,
                    max: max_tokens,
                });
            }
            // Aim past the limit at the rate seen so far, at least doubling.
            let rate = (end.saturating_sub(tail)).max(1) as f64 / settled.max(1) as f64;
            let aim = ((max_tokens + 1) as f64 * rate * 1.25) as usize + tail;
            cut = aim.max(cut.saturating_mul(2));
        }
        let ids = self.encode(text, add_special_tokens)?;
        if ids.len() > max_tokens {
            return Err(Error::ContextOverflow {
                needed: ids.len(),
                max: max_tokens,
            });
        }
        Ok(ids)
    }

    /// Tokens of a prefix encoding that the whole text certainly has too: those ending more
    /// than `tail` bytes before the cut, and with whole-word models, not in a word reaching
    /// into that tail.
    fn settled_tokens(&self, enc: &tokenizers::Encoding, cut: usize) -> usize {
        let limit = cut.saturating_sub(self.bound.tail);
        let offsets = enc.get_offsets();
        // Offsets end in order except around zero-width tokens; the first one past the limit
        // ends the settled run.
        let first_unsettled = offsets
            .iter()
            .position(|&(_, e)| e > limit)
            .unwrap_or(offsets.len());
        if !self.bound.whole_words {
            return first_unsettled;
        }
        let words = enc.get_word_ids();
        match words.get(first_unsettled).copied().flatten() {
            Some(w) => words[..first_unsettled]
                .iter()
                .position(|x| *x == Some(w))
                .unwrap_or(first_unsettled),
            None => first_unsettled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::Value;
    use std::path::Path;

    fn olmoe() -> Text {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe");
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        Text::load(&dir, &cfg).unwrap()
    }

    #[test]
    fn fixture_has_a_byte_bound_and_refuses_in_o1() {
        let t = olmoe();
        let b = t.token_bound().max_bytes_per_token.unwrap();
        // The fixture's longest entry is 13 chars; added tokens are 13 bytes.
        assert_eq!(b, 13);
        let huge = "x".repeat(4 << 20);
        let e = t.encode_within(&huge, true, 256).unwrap_err();
        match e {
            Error::TextTooLong {
                bytes,
                at_least,
                max,
            } => {
                assert_eq!((bytes, max), (4 << 20, 256));
                assert_eq!(at_least, (4usize << 20).div_ceil(13));
            }
            e => panic!("{e}"),
        }
    }

    /// Texts of every kind near the limit: refused exactly when their tokenization is longer
    /// than the limit, and accepted ones give exactly `encode`'s ids.
    #[test]
    fn refusals_are_exact_and_accepted_texts_match_encode() {
        let t = olmoe();
        let pieces = [
            "The sea is ",
            "blue",
            "  ",
            "\n\n",
            "🚀",
            "日本語",
            "<|im_start|>",
            "<|im_end|>",
            "naïve ",
            "1234567",
            "!!",
            " \t ",
            "e\u{301}",
            "aaaaaaaa",
            "Ġ",
            "’s",
            " 's",
        ];
        let mut rng = 0x2545F4914F6CDD1Du64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        for case in 0..300 {
            let len = 1 + next(4000);
            let mut s = String::new();
            while s.len() < len {
                s.push_str(pieces[next(pieces.len())]);
            }
            let add = case % 2 == 0;
            let full = t.encode(&s, add).unwrap();
            for limit in [
                full.len().saturating_sub(2),
                full.len().saturating_sub(1),
                full.len(),
                full.len() + 1,
                full.len() / 3,
            ] {
                match t.encode_within(&s, add, limit) {
                    Ok(ids) => {
                        assert!(full.len() <= limit, "case {case}: accepted over the limit");
                        assert_eq!(ids, full, "case {case}");
                    }
                    Err(Error::TextTooLong { at_least, .. }) => {
                        assert!(full.len() > limit, "case {case}: refused a text that fits");
                        assert!(
                            at_least <= full.len(),
                            "case {case}: bound {at_least} > {}",
                            full.len()
                        );
                    }
                    Err(Error::ContextOverflow { needed, .. }) => {
                        assert_eq!(needed, full.len());
                        assert!(full.len() > limit);
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }

    /// The prefix bound under stress: a tail of 32 bytes (instead of >= 1 KiB) and prefixes
    /// from 64 bytes, on texts of every kind near the limit, with no byte bound to help.
    #[test]
    fn prefix_bound_is_a_lower_bound_even_with_a_short_tail() {
        let mut t = olmoe();
        t.bound.tail = 32;
        t.bound.max_bytes_per_token = None;
        let pieces = [
            "The sea is ",
            "blue",
            "  ",
            "\n\n",
            "🚀",
            "日本語",
            "<|im_start|>",
            "<|im_end|>",
            "naïve ",
            "1234567",
            "!!",
            " \t ",
            "e\u{301}",
            "aaaaaaaa",
            "’s",
            " 's",
            "    x",
        ];
        let mut rng = 0x9E3779B97F4A7C15u64;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let mut refused_by_prefix = 0;
        for case in 0..400 {
            let len = 200 + next(3000);
            let mut s = String::new();
            while s.len() < len {
                s.push_str(pieces[next(pieces.len())]);
            }
            let full = t.encode(&s, false).unwrap();
            for limit in [
                full.len() - 1,
                full.len(),
                full.len() * 9 / 10,
                full.len() / 2,
                full.len() / 4,
            ] {
                match t.encode_within_from(&s, false, limit, 64) {
                    Ok(ids) => assert_eq!(ids, full, "case {case}"),
                    Err(Error::TextTooLong { at_least, .. }) => {
                        assert!(
                            limit < at_least && at_least <= full.len(),
                            "case {case}: {s:?}"
                        );
                        refused_by_prefix += 1;
                    }
                    Err(Error::ContextOverflow { needed, .. }) => {
                        assert!(limit < needed && needed == full.len(), "case {case}")
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        // The half and quarter limits are refused from a prefix.
        assert!(refused_by_prefix >= 700, "{refused_by_prefix}");
    }

    /// A tokenizer.json that asks for truncation does not cut prompts.
    #[test]
    fn truncation_in_tokenizer_json_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe/tokenizer.json");
        let mut tok: Value = serde_json::from_slice(&std::fs::read(src).unwrap()).unwrap();
        tok["truncation"] =
            json!({"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0});
        tok["padding"] = json!({"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "<|endoftext|>"});
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
        let t = Text::load(dir.path(), &json!({})).unwrap();
        let text = "The sea is blue and the sky is grey.";
        assert_eq!(
            t.encode(text, false).unwrap(),
            olmoe().encode(text, false).unwrap()
        );
        assert!(t.encode(text, false).unwrap().len() > 4);
    }

    /// A pipeline without a byte bound (whitespace dropped) still refuses by prefixes, and
    /// the prefix bound is a true lower bound.
    #[test]
    fn prefixes_refuse_when_no_byte_bound_exists() {
        let dir = tempfile::tempdir().unwrap();
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/olmoe/tokenizer.json");
        let mut tok: Value = serde_json::from_slice(&std::fs::read(src).unwrap()).unwrap();
        // Strip: leading/trailing whitespace is deleted, so no bytes-per-token bound holds.
        tok["normalizer"] = json!({"type": "Strip", "strip_left": true, "strip_right": true});
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
        let t = Text::load(dir.path(), &json!({})).unwrap();
        assert_eq!(t.token_bound().max_bytes_per_token, None);
        // 3.7 MB of text: refused from its first prefix.
        let text = "The sea is blue and the sky is grey. ".repeat(100_000);
        let limit = 1000;
        let t0 = std::time::Instant::now();
        match t.encode_within(&text, true, limit).unwrap_err() {
            Error::TextTooLong { at_least, .. } => assert!(at_least > limit),
            e => panic!("{e}"),
        }
        // Only a prefix was tokenized (the whole text takes seconds).
        assert!(t0.elapsed().as_secs_f64() < 2.0);
        let small = "The sea is blue. ".repeat(20);
        assert_eq!(
            t.encode_within(&small, true, limit).unwrap(),
            t.encode(&small, true).unwrap()
        );
    }
}
