//! Tokenizers shipped as a tiktoken BPE file (`tiktoken.model`: one `base64(token) rank` per
//! line) rather than tokenizer.json — Kimi-K2 / K2.5 (`tokenization_kimi.py`'s
//! `TikTokenTokenizer`). Read into a `tokenizers` BPE that encodes exactly as tiktoken does:
//!
//! - the ranks are the ids, each token's bytes spelled in the byte-level alphabet;
//! - tiktoken merges the adjacent pair whose concatenation has the lowest rank, so every split
//!   of a token into two tokens is a merge ranked by the token's rank (`ignore_merges`: a piece
//!   that is itself a token is taken whole, as tiktoken does);
//! - the pre-tokenizer splits with the family's pattern (fancy-regex, the engine tiktoken
//!   itself uses), then maps bytes to the byte-level alphabet;
//! - the special tokens follow the ranks: `len(ranks) + i` for `i` in `0..258`, named by
//!   tokenizer_config.json's `added_tokens_decoder`, else `<|reserved_token_{id}|>`, and
//!   matched anywhere in a text (tiktoken's `allowed_special="all"`, what `encode` does).

use crate::error::{Error, Result};
use base64::Engine as _;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

pub const FILE: &str = "tiktoken.model";

/// `TikTokenTokenizer.pat_str` of Kimi's tokenization_kimi.py.
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "|",
    r"\p{N}{1,3}",
    "|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    "|",
    r"\s*[\r\n]+",
    "|",
    r"\s+(?!\S)",
    "|",
    r"\s+",
);

/// `num_reserved_special_tokens + 2` of tokenization_kimi.py: the special ids after the ranks.
pub const KIMI_SPECIALS: usize = 258;

/// The pattern a folder's tiktoken tokenizer splits with: Kimi's, when its
/// tokenizer_config.json names `TikTokenTokenizer` (tokenization_kimi.py); anything else is not
/// known well enough to be reproduced.
fn pattern_for(dir: &Path, tok_cfg: &Value) -> Result<&'static str> {
    let class = tok_cfg.get("tokenizer_class").and_then(Value::as_str);
    let auto = tok_cfg
        .get("auto_map")
        .map(|a| a.to_string())
        .unwrap_or_default();
    if class == Some("TikTokenTokenizer")
        || auto.contains("tokenization_kimi")
        || dir.join("tokenization_kimi.py").exists()
    {
        return Ok(KIMI_PATTERN);
    }
    Err(Error::Tokenizer(format!(
        "{}: a tiktoken BPE file without tokenizer.json, but tokenizer_config.json does not name \
         a tokenizer whose pattern is known (tokenization_kimi's TikTokenTokenizer is read)",
        dir.join(FILE).display()
    )))
}

/// GPT-2's byte-level alphabet: the char each byte is spelled with.
pub fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).expect("a latin-1 char")
        } else {
            n += 1;
            char::from_u32(255 + n).expect("a char")
        };
    }
    out
}

/// The ranks of a tiktoken file: token bytes in rank order, ranks checked to be `0..n`
/// without gaps or repeats.
pub fn read_ranks(path: &Path) -> Result<Vec<Vec<u8>>> {
    let bad = |line: usize, msg: String| {
        Error::Tokenizer(format!("{}: line {line}: {msg}", path.display()))
    };
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut tokens: Vec<Option<Vec<u8>>> = Vec::new();
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let (b64, rank) = line
            .split_once(' ')
            .ok_or_else(|| bad(i + 1, "expected 'base64-token rank'".into()))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| bad(i + 1, format!("token is not base64: {e}")))?;
        let rank: usize = rank
            .trim()
            .parse()
            .map_err(|_| bad(i + 1, format!("rank '{rank}' is not a number")))?;
        if bytes.is_empty() || rank > 1 << 24 {
            return Err(bad(
                i + 1,
                format!("empty token or rank {rank} out of range"),
            ));
        }
        if let Some(prev) = seen.insert(bytes.clone(), rank) {
            return Err(bad(
                i + 1,
                format!("token repeats (ranks {prev} and {rank})"),
            ));
        }
        if tokens.len() <= rank {
            tokens.resize(rank + 1, None);
        }
        if tokens[rank].is_some() {
            return Err(bad(i + 1, format!("rank {rank} given twice")));
        }
        tokens[rank] = Some(bytes);
    }
    let tokens: Vec<Vec<u8>> = tokens
        .into_iter()
        .enumerate()
        .map(|(r, t)| t.ok_or_else(|| bad(0, format!("no token has rank {r}"))))
        .collect::<Result<_>>()?;
    for b in 0..=255u8 {
        if !seen.contains_key(&vec![b]) {
            return Err(bad(
                0,
                format!("byte {b:#04x} has no token (every byte needs one)"),
            ));
        }
    }
    Ok(tokens)
}

/// The special tokens of a Kimi tiktoken tokenizer: `(id, content)` from `n_base` on.
fn specials(n_base: usize, tok_cfg: &Value) -> Vec<(u32, String)> {
    let named: HashMap<u64, String> = tok_cfg
        .get("added_tokens_decoder")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(id, t)| {
                    Some((id.parse().ok()?, t.get("content")?.as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    (n_base..n_base + KIMI_SPECIALS)
        .map(|id| {
            let name = named
                .get(&(id as u64))
                .cloned()
                .unwrap_or_else(|| format!("<|reserved_token_{id}|>"));
            (id as u32, name)
        })
        .collect()
}

/// The folder's tiktoken tokenizer as a `tokenizers` tokenizer (see the module doc).
pub fn load(dir: &Path, tok_cfg: &Value) -> Result<Tokenizer> {
    let path = dir.join(FILE);
    let pattern = pattern_for(dir, tok_cfg)?;
    let ranks = read_ranks(&path)?;
    let err = |e: tokenizers::Error| Error::Tokenizer(format!("{}: {e}", path.display()));
    let chars = byte_chars();
    let spell = |b: &[u8]| b.iter().map(|&x| chars[x as usize]).collect::<String>();
    let rank_of: HashMap<&[u8], usize> = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| (t.as_slice(), r))
        .collect();
    // Every split of a token into two tokens, ranked by the token (then its halves).
    let mut merges: Vec<(usize, usize, usize, usize)> = Vec::new();
    for (r, t) in ranks.iter().enumerate() {
        for k in 1..t.len() {
            if let (Some(&a), Some(&b)) = (rank_of.get(&t[..k]), rank_of.get(&t[k..])) {
                merges.push((r, a, b, k));
            }
        }
    }
    merges.sort_unstable();
    let vocab: Vocab = ranks
        .iter()
        .enumerate()
        .map(|(r, t)| (spell(t), r as u32))
        .collect();
    let merges = merges
        .into_iter()
        .map(|(_, a, b, _)| (spell(&ranks[a]), spell(&ranks[b])))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .build()
        .map_err(err)?;
    let mut tok = Tokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(err)?;
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
    ])));
    tok.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    let specials = specials(ranks.len(), tok_cfg);
    let added: Vec<AddedToken> = specials
        .iter()
        .map(|(_, s)| AddedToken::from(s.clone(), true))
        .collect();
    tok.add_special_tokens(added).map_err(err)?;
    for (id, s) in &specials {
        if tok.token_to_id(s) != Some(*id) {
            return Err(Error::Tokenizer(format!(
                "{}: special token '{s}' (tokenizer_config.json) does not land on id {id}: \
                 a name given twice, or also a rank of the BPE file",
                path.display()
            )));
        }
    }
    Ok(tok)
}

/// Every token's bytes by id, as llguidance's trie takes them (a special token is `0xFF` and
/// its text): what `token_bytes_from_tokenizer_json` gives for a tokenizer.json.
pub fn token_bytes(tok: &Tokenizer) -> Vec<Vec<u8>> {
    let chars = byte_chars();
    let byte_of: HashMap<char, u8> = chars
        .iter()
        .enumerate()
        .map(|(b, c)| (*c, b as u8))
        .collect();
    let n = tok.get_vocab_size(true);
    let added = tok.get_added_tokens_decoder();
    (0..n as u32)
        .map(|id| match added.get(&id) {
            Some(t) => {
                let mut v = vec![toktrie::TokTrie::SPECIAL_TOKEN_MARKER];
                v.extend_from_slice(t.content.as_bytes());
                v
            }
            None => tok
                .id_to_token(id)
                .map(|s| s.chars().filter_map(|c| byte_of.get(&c).copied()).collect())
                .unwrap_or_default(),
        })
        .collect()
}
