//! `coli synth --format hf`: the synth model's random weights as a Hub checkpoint, so other
//! engines run exactly the model colibri runs (llama.cpp's `convert_hf_to_gguf.py`, then
//! `coli convert` of the same folder for colibri's own formats).
//!
//! Every matrix is bf16 under the Hub's names (per-expert tensors), sharded at 5 GB with a
//! `model.safetensors.index.json` as `save_pretrained` writes it, next to `config.json`,
//! `generation_config.json` and a byte-level BPE tokenizer (`tokenizer.json`,
//! `tokenizer_config.json` with a chat template). The tokenizer is made up (see
//! [`tokenizer_json`]): it covers the whole vocabulary and round-trips any text, which is all
//! a random-weight model needs from one.

use crate::convert::{write_atomic, Item, Progress};
use crate::error::{Error, Result};
use rayon::prelude::*;
use serde_json::json;
use std::io::Write;
use std::path::Path;

/// Shard size `save_pretrained` uses by default (`max_shard_size="5GB"`).
const MAX_SHARD_BYTES: u64 = 5_000_000_000;

/// The special tokens of an architecture's tokenizer: id and text.
fn specials(cfg: &serde_json::Value) -> Vec<(u32, &'static str)> {
    match cfg["model_type"].as_str().unwrap_or("") {
        "mixtral" => vec![(0, "<unk>"), (1, "<s>"), (2, "</s>")],
        "qwen3_moe" => vec![
            (151643, "<|endoftext|>"),
            (151644, "<|im_start|>"),
            (151645, "<|im_end|>"),
        ],
        // OLMoE: eos 50279 as published; the chat markers just above it.
        _ => vec![
            (50279, "<|endoftext|>"),
            (50280, "<|im_start|>"),
            (50281, "<|im_end|>"),
        ],
    }
}

/// GPT-2's byte-to-character map of byte-level BPE: printable bytes stand for themselves,
/// the others are shifted to 256 + n so every token is printable text.
fn byte_chars() -> [char; 256] {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = ['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).expect("latin-1");
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).expect("below the surrogates");
            printable.push(b);
            n += 1;
        }
    }
    chars
}

/// A byte-level BPE tokenizer (tokenizer.json) of exactly `vocab` ids: `specials` at their
/// ids, the 256 byte tokens, then merges built in a fixed order from lowercase letters
/// (" a", "ab", " ab", "abc", " abc", "abcd", ...) until every other id is used. Not trained
/// on anything: any text still encodes (bytes are always there) and decodes back exactly.
pub fn tokenizer_json(vocab: usize, specials: &[(u32, &str)]) -> Result<serde_json::Value> {
    let regular = vocab.saturating_sub(specials.len());
    if regular < 256 || specials.iter().any(|&(id, _)| id as usize >= vocab) {
        return Err(Error::invalid(
            "vocab_size",
            format!("{vocab} ids cannot hold the 256 byte tokens and the special tokens"),
        ));
    }
    let bytes = byte_chars();
    let space = bytes[b' ' as usize].to_string();
    let letters: Vec<String> = "etaoinshrdlcumwfgypbvkjxqz"
        .chars()
        .map(|c| c.to_string())
        .collect();
    let mut tokens: Vec<String> = bytes.iter().map(|c| c.to_string()).collect();
    let mut merges: Vec<String> = Vec::new();
    // Each level extends the previous level's words by one letter; words with a leading
    // space are their own level, as in a trained byte-level vocabulary.
    let mut words: Vec<String> = letters.clone();
    let mut spaced: Vec<String> = vec![space.clone()];
    'levels: loop {
        let mut next_spaced = Vec::new();
        for w in &spaced {
            for l in &letters {
                if tokens.len() == regular {
                    break 'levels;
                }
                merges.push(format!("{w} {l}"));
                tokens.push(format!("{w}{l}"));
                next_spaced.push(format!("{w}{l}"));
            }
        }
        let mut next_words = Vec::new();
        for w in &words {
            for l in &letters {
                if tokens.len() == regular {
                    break 'levels;
                }
                merges.push(format!("{w} {l}"));
                tokens.push(format!("{w}{l}"));
                next_words.push(format!("{w}{l}"));
            }
        }
        spaced = next_spaced;
        words = next_words;
    }
    let mut ids = (0..vocab as u32).filter(|id| specials.iter().all(|s| s.0 != *id));
    let mut map = serde_json::Map::new();
    for t in tokens {
        let id = ids.next().expect("regular ids = vocab - specials");
        map.insert(t, json!(id));
    }
    let mut added = Vec::new();
    for &(id, text) in specials {
        map.insert(text.to_string(), json!(id));
        added.push(
            json!({"id": id, "content": text, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}),
        );
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": map, "merges": merges}
    }))
}

/// tokenizer_config.json: the special tokens and a chat template in the family's style.
fn tokenizer_config(cfg: &serde_json::Value, specials: &[(u32, &str)]) -> serde_json::Value {
    let decoder: serde_json::Map<String, serde_json::Value> = specials
        .iter()
        .map(|&(id, t)| {
            (
                id.to_string(),
                json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false,
                    "single_word": false, "special": true}),
            )
        })
        .collect();
    let (bos, eos, template) = if cfg["model_type"] == "mixtral" {
        (
            json!("<s>"),
            "</s>",
            "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}\
             {{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}\
             {{ message['content'] + eos_token }}{% endif %}{% endfor %}",
        )
    } else {
        (
            serde_json::Value::Null,
            if cfg["model_type"] == "qwen3_moe" {
                "<|im_end|>"
            } else {
                "<|endoftext|>"
            },
            "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
             message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}\
             {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
        )
    };
    json!({
        "add_bos_token": cfg["model_type"] == "mixtral",
        "add_eos_token": false,
        "added_tokens_decoder": decoder,
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": template,
        "clean_up_tokenization_spaces": false,
        "model_max_length": cfg["max_position_embeddings"],
        "tokenizer_class": "PreTrainedTokenizerFast"
    })
}

/// Writes one plain safetensors file (`{"__metadata__": {"format": "pt"}}`, tensors in
/// `items` order) through `path.partial`, fsynced, renamed into place.
fn write_shard(path: &Path, items: &[Item<'_>], progress: &dyn Progress) -> Result<()> {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut pos = 0usize;
    for it in items {
        let n = it.shape.iter().product::<usize>() * 2;
        header.push_str(&format!(
            ",{}:{{\"dtype\":\"BF16\",\"shape\":{},\"data_offsets\":[{pos},{}]}}",
            serde_json::to_string(&it.name).expect("string"),
            serde_json::to_string(&it.shape).expect("ints"),
            pos + n
        ));
        pos += n;
    }
    header.push('}');
    // Data starts 8-byte aligned, as the safetensors writers pad it.
    while (8 + header.len()) % 8 != 0 {
        header.push(' ');
    }
    let tmp = path.with_extension("safetensors.partial");
    let io = |e| Error::io(&tmp, e);
    let f = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, f);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(header.as_bytes()).map_err(io)?;
    // A few items in flight at a time: every core busy, memory bounded.
    let batch = (rayon::current_num_threads() * 2).max(4);
    for chunk in items.chunks(batch) {
        let produced: Vec<Vec<u8>> = chunk.par_iter().map(|it| it.produce().0).collect();
        for (it, data) in chunk.iter().zip(produced) {
            let want = it.shape.iter().product::<usize>() * 2;
            if data.len() != want {
                return Err(Error::invalid(
                    "synth",
                    format!(
                        "{}: {} bytes produced, {want} expected",
                        it.name,
                        data.len()
                    ),
                ));
            }
            w.write_all(&data).map_err(io)?;
            progress.advance(data.len() as u64);
        }
    }
    let f = w.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Writes the Hub checkpoint of `cfg` with the synth model's random weights (`seed`), all
/// bf16; returns the tensor bytes.
pub(super) fn write(
    cfg: &serde_json::Value,
    out: &Path,
    seed: u64,
    progress: &dyn Progress,
) -> Result<u64> {
    let vocab = cfg["vocab_size"].as_u64().unwrap_or(0) as usize;
    let specials = specials(cfg);
    // The tokenizer first: a vocabulary it cannot hold fails before gigabytes are written.
    let tok = tokenizer_json(vocab, &specials)?;
    let hidden = cfg["hidden_size"].as_u64().unwrap_or(1) as f32;
    let bf16 = crate::format::WeightFormat::BF16;
    let items: Vec<Item<'static>> = super::weights::tensors(cfg)?
        .into_iter()
        .map(|(name, shape)| super::weights::random_item(name, shape, seed, bf16, bf16, hidden))
        .collect();
    let bytes = |it: &Item<'_>| it.shape.iter().product::<usize>() as u64 * 2;
    let mut shards: Vec<Vec<Item<'static>>> = vec![Vec::new()];
    let mut in_shard = 0u64;
    for it in items {
        let b = bytes(&it);
        if in_shard > 0 && in_shard + b > MAX_SHARD_BYTES {
            shards.push(Vec::new());
            in_shard = 0;
        }
        in_shard += b;
        shards.last_mut().expect("one shard").push(it);
    }
    let total: u64 = shards.iter().flatten().map(bytes).sum();
    progress.begin(total, shards.len(), 0);
    let mut weight_map = std::collections::BTreeMap::new();
    let n = shards.len();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        progress.message(&file);
        write_shard(&out.join(&file), shard, progress)?;
        for it in shard {
            weight_map.insert(it.name.clone(), file.clone());
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let pretty = |v: &serde_json::Value| serde_json::to_vec_pretty(v).expect("json");
    write_atomic(&out.join("model.safetensors.index.json"), &pretty(&index))?;
    write_atomic(&out.join("tokenizer.json"), &pretty(&tok))?;
    write_atomic(
        &out.join("tokenizer_config.json"),
        &pretty(&tokenizer_config(cfg, &specials)),
    )?;
    let mut gen = json!({"eos_token_id": cfg["eos_token_id"]});
    if !cfg["bos_token_id"].is_null() {
        gen["bos_token_id"] = cfg["bos_token_id"].clone();
    }
    write_atomic(&out.join("generation_config.json"), &pretty(&gen))?;
    write_atomic(&out.join("config.json"), &pretty(cfg))?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_tokenizer_covers_every_id_and_round_trips_text() {
        let specials = [(5u32, "<|endoftext|>"), (999, "<|im_end|>")];
        let j = tokenizer_json(1000, &specials).unwrap();
        let model = &j["model"];
        let vocab = model["vocab"].as_object().unwrap();
        assert_eq!(vocab.len(), 1000);
        let mut ids: Vec<u64> = vocab.values().map(|v| v.as_u64().unwrap()).collect();
        ids.sort();
        assert_eq!(ids, (0..1000).collect::<Vec<_>>());
        assert_eq!(vocab["<|endoftext|>"], 5);
        let tok = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&j).unwrap()).unwrap();
        assert_eq!(tok.get_vocab_size(true), 1000);
        let text = "the sea <|im_end|> Ünïcödé, 42!";
        let enc = tok.encode(text, false).unwrap();
        // Merges apply: " the" is fewer tokens than its 4 bytes; the special stays whole.
        assert!(enc.get_ids().len() < text.len());
        assert!(enc.get_ids().contains(&999));
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
        assert!(tokenizer_json(200, &specials).is_err());
    }
}
