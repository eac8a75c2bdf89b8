//! [`TokenBound`]: what a tokenizer's configuration says about the cost of a text, the most
//! input bytes one token can stand for: step 1 of refusing a text that cannot fit
//! (`bounded.rs` tells both steps and runs them in
//! [`Text::encode_within`](super::Text::encode_within)).

use serde_json::Value;

/// What a tokenizer's configuration says about the cost of a text, derived once at load.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBound {
    /// The most input bytes one token can cover, if that is bounded.
    pub max_bytes_per_token: Option<usize>,
    /// Bytes before a prefix's cut whose tokens may differ from the whole text's.
    pub tail: usize,
    /// The model maps whole pre-tokens (words) at once (WordPiece, WordLevel): a word's
    /// tokens depend on its end, so a prefix's last words do not count.
    pub whole_words: bool,
}

/// Bytes a prefix's cut can influence before it whatever the tokenizer (pre-token lookahead,
/// a special token cut in half, a combining sequence): generous, it only costs a bigger prefix.
const MIN_TAIL: usize = 1024;

impl TokenBound {
    /// Analyses a loaded tokenizer. Anything not understood gives no byte bound (step 2
    /// still applies), never a wrong one.
    pub fn of(tokenizer: &tokenizers::Tokenizer) -> TokenBound {
        let normalizer = tokenizer
            .get_normalizer()
            .and_then(|n| serde_json::to_value(n).ok())
            .unwrap_or(Value::Null);
        let pre_tokenizer = tokenizer
            .get_pre_tokenizer()
            .and_then(|p| serde_json::to_value(p).ok())
            .unwrap_or(Value::Null);
        let byte_level =
            mentions_type(&normalizer, "ByteLevel") || mentions_type(&pre_tokenizer, "ByteLevel");
        let shrink = normalizer_shrink(&normalizer);
        let keeps_input = pre_tokenizer_keeps_input(&pre_tokenizer);

        let vocab = tokenizer.get_vocab(false);
        // Byte-level vocabularies spell every byte as one char; others are plain text in
        // which a marker ("▁", "##", "<0x41>") is never shorter than what it stands for.
        let token_len = |t: &str| {
            if byte_level {
                t.chars().count()
            } else {
                t.len()
            }
        };
        let longest_token = vocab.keys().map(|t| token_len(t)).max().unwrap_or(1).max(1);

        use tokenizers::models::ModelWrapper;
        let (model_ok, whole_words) = match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) => {
                let ok = if byte_level {
                    // Every byte must have its token, or an unknown one is dropped (no unk)
                    // or fused (fuse_unk) without limit.
                    byte_level_alphabet().all(|c| vocab.contains_key(&c.to_string()))
                        || bpe.byte_fallback
                        || (bpe.unk_token.is_some() && !bpe.fuse_unk)
                } else {
                    bpe.byte_fallback || (bpe.unk_token.is_some() && !bpe.fuse_unk)
                };
                (ok && bpe.dropout.is_none_or(|d| d == 0.0), false)
            }
            // Unknown runs are fused into one token unless they fall back to bytes.
            ModelWrapper::Unigram(u) => (u.byte_fallback(), false),
            // A word that is too long or has an unknown piece becomes one [UNK].
            ModelWrapper::WordPiece(_) | ModelWrapper::WordLevel(_) => (false, true),
        };

        let mut added_ok = true;
        let mut longest_added = 0;
        for t in tokenizer.get_added_tokens_decoder().values() {
            // lstrip/rstrip tokens swallow any amount of whitespace next to them.
            added_ok &= !(t.lstrip || t.rstrip);
            longest_added = longest_added.max(t.content.len());
        }

        let max_bytes_per_token = match (shrink, keeps_input && model_ok && added_ok) {
            // An unknown character is one token of at most 4 bytes.
            (Some(f), true) => Some(longest_token.max(longest_added).max(4) * f),
            _ => None,
        };
        TokenBound {
            max_bytes_per_token,
            tail: MIN_TAIL.max(4 * longest_token.max(longest_added)),
            whole_words,
        }
    }

    /// The fewest tokens a text of `bytes` bytes can be, from the byte bound alone.
    pub fn min_tokens(&self, bytes: usize) -> usize {
        match self.max_bytes_per_token {
            Some(b) => bytes.div_ceil(b),
            None => 0,
        }
    }
}

/// The 256 chars a GPT-2 style byte-level vocabulary spells the bytes with.
fn byte_level_alphabet() -> impl Iterator<Item = char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut shifted = 0;
    (0u32..256).map(move |b| {
        if printable(b) {
            char::from_u32(b).expect("Latin-1")
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).expect("Latin Extended")
        }
    })
}

fn mentions_type(v: &Value, ty: &str) -> bool {
    match v {
        Value::Object(o) => {
            o.get("type").and_then(Value::as_str) == Some(ty)
                || o.values().any(|x| mentions_type(x, ty))
        }
        Value::Array(a) => a.iter().any(|x| mentions_type(x, ty)),
        _ => false,
    }
}

/// By how much a normalizer can shrink text at most (input bytes per output byte), or None
/// when it can delete text (so nothing bounds it).
fn normalizer_shrink(n: &Value) -> Option<usize> {
    if n.is_null() {
        return Some(1);
    }
    let flag = |k: &str| n.get(k).and_then(Value::as_bool).unwrap_or(false);
    match n.get("type").and_then(Value::as_str)? {
        // Lengthen or keep.
        "Prepend" | "ByteLevel" => Some(1),
        // A character of up to 4 bytes can become one of 1 (U+1D400 -> "A" under NFKC,
        // KELVIN SIGN -> "k" when lowercased); compositions of several characters into one
        // shrink less than that.
        "NFC" | "NFD" | "NFKC" | "NFKD" | "Lowercase" => Some(4),
        "Replace" => {
            let pattern = n.get("pattern")?.get("String")?.as_str()?;
            let content = n.get("content")?.as_str()?;
            if content.is_empty() {
                None
            } else {
                Some(pattern.len().div_ceil(content.len()).max(1))
            }
        }
        // clean_text removes control characters; strip_accents removes combining marks
        // (absent, it follows lowercase, as in BERT).
        "BertNormalizer" if !flag("clean_text") && !bert_strips_accents(n) => {
            Some(if flag("lowercase") { 4 } else { 1 })
        }
        "Sequence" => n
            .get("normalizers")?
            .as_array()?
            .iter()
            .try_fold(1usize, |acc, x| {
                Some(acc.saturating_mul(normalizer_shrink(x)?))
            }),
        // Strip, StripAccents, Nmt and Precompiled (a SentencePiece charsmap) can delete.
        _ => None,
    }
}

fn bert_strips_accents(n: &Value) -> bool {
    match n.get("strip_accents").and_then(Value::as_bool) {
        Some(strip) => strip,
        None => n.get("lowercase").and_then(Value::as_bool).unwrap_or(false),
    }
}

/// Whether a pre-tokenizer keeps every byte of its input (splits without removing).
fn pre_tokenizer_keeps_input(p: &Value) -> bool {
    if p.is_null() {
        return true;
    }
    let behavior_keeps = || p.get("behavior").and_then(Value::as_str) != Some("Removed");
    match p.get("type").and_then(Value::as_str) {
        Some("ByteLevel" | "Metaspace" | "Digits" | "UnicodeScripts" | "FixedLength") => true,
        Some("Split" | "Punctuation") => behavior_keeps(),
        Some("Sequence") => p
            .get("pretokenizers")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().all(pre_tokenizer_keeps_input)),
        // Whitespace, WhitespaceSplit, BertPreTokenizer and CharDelimiterSplit drop their
        // separators.
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn byte_level_alphabet_is_gpt2s() {
        let a: Vec<char> = byte_level_alphabet().collect();
        assert_eq!(a.len(), 256);
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[b'A' as usize], 'A');
        let mut u = a.clone();
        u.sort();
        u.dedup();
        assert_eq!(u.len(), 256);
    }

    #[test]
    fn what_breaks_a_byte_bound() {
        let none = |n: Value| normalizer_shrink(&n);
        assert_eq!(none(Value::Null), Some(1));
        assert_eq!(none(json!({"type": "NFKC"})), Some(4));
        assert_eq!(
            none(json!({"type": "Strip", "strip_left": true, "strip_right": true})),
            None
        );
        assert_eq!(
            none(json!({"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]})),
            Some(1)
        );
        assert_eq!(
            none(json!({"type": "Replace", "pattern": {"String": "  "}, "content": ""})),
            None
        );
        assert_eq!(
            none(json!({"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "})),
            None
        );
        // BERT: strip_accents absent follows lowercase (accents stripped: no bound).
        let bert = |c: bool, s: Value, l: bool| {
            none(
                json!({"type": "BertNormalizer", "clean_text": c, "handle_chinese_chars": true,
                        "strip_accents": s, "lowercase": l}),
            )
        };
        assert_eq!(bert(false, Value::Null, true), None);
        assert_eq!(bert(false, json!(false), true), Some(4));
        assert_eq!(bert(false, Value::Null, false), Some(1));
        assert_eq!(bert(true, json!(false), false), None);
        let keeps = |p: Value| pre_tokenizer_keeps_input(&p);
        assert!(keeps(json!({"type": "ByteLevel"})));
        assert!(!keeps(json!({"type": "Whitespace"})));
        assert!(keeps(json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel"}]})));
        assert!(!keeps(
            json!({"type": "Split", "pattern": {"Regex": "x"}, "behavior": "Removed", "invert": false})
        ));
    }
}
