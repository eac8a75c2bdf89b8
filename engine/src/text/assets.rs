//! [`Text`]: a model folder's text assets as loaded: the tokenizer (tokenizer.json via the
//! `tokenizers` crate, or a tiktoken BPE file read into one: `tiktoken.rs`), the chat template, end/begin-of-sequence ids gathered from every file
//! that declares them ([`id_list`]), and generation_config defaults.

use super::reply::{self, ReplyConfig};
use super::template::{ChatMessage, ChatTemplate};
use super::token_bound::TokenBound;
use super::tools::{self, ToolFormat, ToolSpec};
use crate::error::{Error, Result};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Sampling defaults a model ships in generation_config.json; `None` where it says nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_new_tokens: Option<usize>,
}

impl GenerationDefaults {
    fn from_json(v: &Value) -> Self {
        let f = |k: &str| v.get(k).and_then(Value::as_f64).map(|x| x as f32);
        let u = |k: &str| v.get(k).and_then(Value::as_u64).map(|x| x as usize);
        GenerationDefaults {
            do_sample: v.get("do_sample").and_then(Value::as_bool),
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: u("top_k"),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
            max_new_tokens: u("max_new_tokens"),
        }
    }
}

/// Where the chat template stands: absent, usable, or present but unusable (kept as an error
/// so that the model still loads and serves raw prompts).
enum TemplateState {
    Missing,
    Ready(Box<ChatTemplate>),
    Broken(String),
}

pub struct Text {
    pub(super) tokenizer: tokenizers::Tokenizer,
    tokenizer_path: PathBuf,
    eos_ids: Vec<u32>,
    bos_ids: Vec<u32>,
    /// Special tokens by role (bos_token, eos_token, ...), as tokenizer_config.json names them.
    special_tokens: BTreeMap<String, String>,
    template: TemplateState,
    generation_defaults: GenerationDefaults,
    /// Ids of added tokens marked special (a plain decode drops them).
    special_ids: HashSet<u32>,
    /// Every token's bytes (from tokenizer.json, as llguidance reads it), built on first use:
    /// structured output and logprobs need them.
    token_bytes: OnceLock<std::result::Result<Vec<Vec<u8>>, String>>,
    /// What a text can cost, for refusing one that cannot fit before tokenizing it.
    pub(super) bound: TokenBound,
}

/// The special-token entries of tokenizer_config.json that transformers passes to templates.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

impl Text {
    /// Whether `dir` holds a tokenizer this engine reads: tokenizer.json, or a tiktoken BPE
    /// file (Kimi's `tiktoken.model`).
    pub fn present(dir: &Path) -> bool {
        dir.join("tokenizer.json").exists() || dir.join(super::tiktoken::FILE).exists()
    }

    /// Loads tokenizer.json, and when present tokenizer_config.json, generation_config.json
    /// and chat_template.jinja / chat_template.json from `dir`; `config` is the parsed
    /// config.json (its eos/bos ids count too).
    pub fn load(dir: &Path, config: &Value) -> Result<Text> {
        let tok_cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let json_path = dir.join("tokenizer.json");
        let tiktoken_path = dir.join(super::tiktoken::FILE);
        // A tokenizer.json wins; Kimi ships only its tiktoken BPE file.
        let (mut tokenizer, tokenizer_path) = if !json_path.exists() && tiktoken_path.exists() {
            (super::tiktoken::load(dir, &tok_cfg)?, tiktoken_path)
        } else {
            let t = tokenizers::Tokenizer::from_file(&json_path)
                .map_err(|e| Error::Tokenizer(format!("{}: {e}", json_path.display())))?;
            (t, json_path)
        };
        // A tokenizer.json may ask for truncation or padding (saved from a training setup):
        // prompts are never silently cut, and ids are never padded.
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", tokenizer_path.display())))?;
        tokenizer.with_padding(None);
        let bound = TokenBound::of(&tokenizer);
        let gen_cfg = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);

        let special_tokens: BTreeMap<String, String> = SPECIAL_TOKEN_KEYS
            .iter()
            .filter_map(|k| token_content(tok_cfg.get(*k)?).map(|c| (k.to_string(), c)))
            .collect();

        // Every file may name the end token; a generation must stop on any of them (e.g.
        // instruct models whose generation_config adds <|im_end|> to config.json's id).
        let union = |key: &str, token_key: &str| {
            let mut ids = id_list(config, key);
            ids.extend(id_list(&gen_cfg, key));
            if let Some(id) = special_tokens
                .get(token_key)
                .and_then(|t| tokenizer.token_to_id(t))
            {
                ids.push(id);
            }
            let mut seen = Vec::new();
            ids.retain(|id| {
                let new = !seen.contains(id);
                seen.push(*id);
                new
            });
            ids
        };
        let eos_ids = union("eos_token_id", "eos_token");
        let bos_ids = union("bos_token_id", "bos_token");

        let template = match find_template(dir, &tok_cfg)?.or_builtin(config) {
            TemplateSource::None => TemplateState::Missing,
            TemplateSource::Unusable(msg) => TemplateState::Broken(msg),
            TemplateSource::Found { source, origin } => {
                match ChatTemplate::new(source, origin, special_tokens.clone()) {
                    Ok(t) => TemplateState::Ready(Box::new(t)),
                    Err(e) => TemplateState::Broken(e.to_string()),
                }
            }
        };

        let special_ids = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        Ok(Text {
            tokenizer,
            tokenizer_path,
            eos_ids,
            bos_ids,
            special_tokens,
            template,
            generation_defaults: GenerationDefaults::from_json(&gen_cfg),
            special_ids,
            token_bytes: OnceLock::new(),
            bound,
        })
    }

    /// Whether `id` is an added token marked special.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Every token's bytes, indexed by id (a special token's are `0xFF` + its text, as
    /// llguidance's token trie expects). Read from tokenizer.json on first use.
    pub fn token_bytes(&self) -> Result<&[Vec<u8>]> {
        let r = self.token_bytes.get_or_init(|| {
            if self.tokenizer_path.ends_with(super::tiktoken::FILE) {
                return Ok(super::tiktoken::token_bytes(&self.tokenizer));
            }
            let bytes = std::fs::read(&self.tokenizer_path).map_err(|e| e.to_string())?;
            let json: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            // llguidance asserts on malformed byte-fallback names; a hostile file must not
            // take the process down.
            std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
                .map_err(|_| "malformed vocabulary".to_string())?
                .map_err(|e| e.to_string())
        });
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.tok_err(format!(
                "cannot read the token bytes (needed for structured output and logprobs): {e}"
            ))),
        }
    }

    /// One token's bytes as it appears in text (a special token's text without the marker).
    pub fn token_text_bytes(&self, id: u32) -> Vec<u8> {
        match self.token_bytes().ok().and_then(|t| t.get(id as usize)) {
            Some(b) if b.first() == Some(&toktrie::TokTrie::SPECIAL_TOKEN_MARKER) => {
                b[1..].to_vec()
            }
            Some(b) => b.clone(),
            None => self
                .tokenizer
                .id_to_token(id)
                .unwrap_or_default()
                .into_bytes(),
        }
    }

    /// The syntax this model's chat template writes tool calls in; None when it has none
    /// (no chat template, or one without tool calls).
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.chat_template_source().and_then(ToolFormat::detect)
    }

    /// Whether the chat template uses think tags (replies carry reasoning).
    pub fn has_think_tags(&self) -> bool {
        self.chat_template_source()
            .is_some_and(|s| s.contains(reply::THINK_OPEN) || s.contains(reply::THINK_CLOSE))
    }

    /// Ids of those of `markers` that are single special tokens: the detokenizer keeps them.
    pub fn special_marker_ids(&self, markers: &[&str]) -> Vec<u32> {
        markers
            .iter()
            .filter_map(|m| self.tokenizer.token_to_id(m))
            .filter(|id| self.is_special(*id))
            .collect()
    }

    /// How a reply to this rendered prompt should be split: reasoning when the template has
    /// think tags (starting inside a think block the prompt left open), tool calls in the
    /// template's syntax when tools were offered.
    pub fn reply_config(
        &self,
        rendered_prompt: &str,
        tools: &[ToolSpec],
        id_prefix: &str,
    ) -> ReplyConfig {
        let think = self
            .has_think_tags()
            .then(|| prompt_opens_think(rendered_prompt));
        let tools = if tools.is_empty() {
            None
        } else {
            self.tool_format().map(|f| (f, tools.to_vec()))
        };
        ReplyConfig {
            think,
            tools,
            id_prefix: id_prefix.to_string(),
            ..Default::default()
        }
    }

    pub(super) fn tok_err(&self, e: impl std::fmt::Display) -> Error {
        Error::Tokenizer(format!("{}: {e}", self.tokenizer_path.display()))
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| self.tok_err(e))?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.tok_err(e))
    }

    /// Renders a conversation with the model's chat template.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        match &self.template {
            TemplateState::Ready(t) => t.render(messages, add_generation_prompt),
            TemplateState::Broken(msg) => Err(Error::Template(msg.clone())),
            TemplateState::Missing => {
                Err(Error::Template(format!(
                "the model in {} has no chat template (no chat_template in tokenizer_config.json, \
                 no chat_template.jinja); send raw text or token ids instead",
                self.tokenizer_path.parent().unwrap_or(Path::new(".")).display()
            )))
            }
        }
    }

    /// Renders a conversation with tools offered and extra template variables (e.g.
    /// `enable_thinking`). Templates that do not render `tools` themselves (DeepSeek's) get
    /// the family's tool section in the system prompt. Tools on a model whose template has
    /// no tool-call syntax are an InvalidArgument error.
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        tools: &[ToolSpec],
        vars: &serde_json::Map<String, Value>,
    ) -> Result<String> {
        let t = match &self.template {
            TemplateState::Ready(t) => t,
            _ => return self.render_chat(messages, add_generation_prompt),
        };
        if tools.is_empty() {
            return t.render_with(messages, add_generation_prompt, &[], vars);
        }
        let Some(format) = ToolFormat::detect(t.source()) else {
            return Err(Error::invalid(
                "tools",
                "this model's chat template has no tool-call syntax, so the model cannot be given tools",
            ));
        };
        if tools::renders_tools(t.source()) {
            return t.render_with(messages, add_generation_prompt, tools, vars);
        }
        let section = tools::deepseek_tool_prompt(format, tools);
        let mut msgs = messages.to_vec();
        match msgs.iter_mut().find(|m| m.role == "system") {
            Some(sys) => sys.content = format!("{}\n\n{section}", sys.content),
            None => msgs.insert(0, ChatMessage::new("system", section)),
        }
        t.render_with(&msgs, add_generation_prompt, &[], vars)
    }

    /// Renders the conversation and tokenizes it as transformers' `apply_chat_template`
    /// does: the template already wrote the special tokens, so none are added.
    pub fn encode_chat(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<Vec<u32>> {
        self.encode(&self.render_chat(messages, add_generation_prompt)?, false)
    }

    /// The template's Jinja source, if the model has a usable one.
    pub fn chat_template_source(&self) -> Option<&str> {
        match &self.template {
            TemplateState::Ready(t) => Some(t.source()),
            _ => None,
        }
    }

    pub fn has_chat_template(&self) -> bool {
        matches!(self.template, TemplateState::Ready(_))
    }

    /// Every id that ends a generation: config.json, generation_config.json, then the
    /// tokenizer's eos_token; no duplicates.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// The begin-of-sequence id (config.json first, then generation_config.json, then the
    /// tokenizer's bos_token).
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_ids.first().copied()
    }

    /// A special token's text by role ("bos_token", "eos_token", "pad_token", ...).
    pub fn special_token(&self, role: &str) -> Option<&str> {
        self.special_tokens.get(role).map(String::as_str)
    }

    pub fn generation_defaults(&self) -> &GenerationDefaults {
        &self.generation_defaults
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Tokens the tokenizer knows, added tokens included (`len(tokenizer)` in transformers).
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    pub fn tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.tokenizer
    }
}

/// Whether a rendered prompt ends inside a think block (its last `<think>` is not closed),
/// so the reply starts with reasoning.
pub fn prompt_opens_think(rendered: &str) -> bool {
    match (
        rendered.rfind(reply::THINK_OPEN),
        rendered.rfind(reply::THINK_CLOSE),
    ) {
        (Some(o), Some(c)) => o > c,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Token ids under `key`, which configs write as an int or a list of ints.
pub fn id_list(v: &Value, key: &str) -> Vec<u32> {
    match v.get(key) {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64())
            .map(|x| x as u32)
            .collect(),
        _ => Vec::new(),
    }
}

/// A special token in tokenizer_config.json: a plain string or an AddedToken object
/// `{"content": ..., "lstrip": ...}`.
fn token_content(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// Parses a JSON file that may be absent.
fn read_json(path: &Path) -> Result<Option<Value>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| Error::Config {
            file: path.to_path_buf(),
            msg: format!("invalid JSON: {e}"),
        })
}

enum TemplateSource {
    None,
    Found { source: String, origin: String },
    Unusable(String),
}

/// Chat formats whose Hub repositories ship a Python encoder instead of a Jinja template,
/// written as templates here (each checked against the encoder's published test vectors):
/// used when the folder has no template of its own, by `model_type`.
const BUILTIN_TEMPLATES: &[(&str, &str, &str)] = &[(
    "deepseek_v32",
    "built-in DeepSeek-V3.2 chat format (encoding_dsv32.py as a template)",
    include_str!("builtin/deepseek_v32.jinja"),
)];

impl TemplateSource {
    /// A folder without a template of its own gets its family's built-in one, if any.
    fn or_builtin(self, config: &Value) -> TemplateSource {
        let TemplateSource::None = self else {
            return self;
        };
        let model_type = config.get("model_type").and_then(Value::as_str);
        match BUILTIN_TEMPLATES
            .iter()
            .find(|(t, _, _)| Some(*t) == model_type)
        {
            Some((_, origin, source)) => TemplateSource::Found {
                source: source.to_string(),
                origin: origin.to_string(),
            },
            None => TemplateSource::None,
        }
    }
}

/// Finds the chat template with transformers' precedence: a separate chat_template.jinja
/// (the Hub's newer layout) overrides chat_template.json, which overrides tokenizer_config's
/// `chat_template` (a string, or a list of named templates of which "default" is used).
fn find_template(dir: &Path, tok_cfg: &Value) -> Result<TemplateSource> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read(&jinja) {
        Ok(bytes) => {
            return Ok(match String::from_utf8(bytes) {
                Ok(source) => TemplateSource::Found {
                    source,
                    origin: "chat_template.jinja".into(),
                },
                Err(_) => TemplateSource::Unusable(format!("{}: not UTF-8 text", jinja.display())),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(jinja, e)),
    }
    let json_file = dir.join("chat_template.json");
    if let Some(v) = read_json(&json_file)? {
        return Ok(template_from_value(
            v.get("chat_template"),
            "chat_template.json",
        ));
    }
    Ok(template_from_value(
        tok_cfg.get("chat_template"),
        "tokenizer_config.json",
    ))
}

fn template_from_value(v: Option<&Value>, file: &str) -> TemplateSource {
    match v {
        None | Some(Value::Null) => TemplateSource::None,
        Some(Value::String(s)) => TemplateSource::Found {
            source: s.clone(),
            origin: format!("{file} chat_template"),
        },
        Some(Value::Array(list)) => {
            let named = |want: &str| {
                list.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == want)
                        .then(|| t.get("template")?.as_str())
                        .flatten()
                })
            };
            match named("default") {
                Some(s) => TemplateSource::Found {
                    source: s.to_string(),
                    origin: format!("{file} chat_template \"default\""),
                },
                None => {
                    let names: Vec<&str> = list
                        .iter()
                        .filter_map(|t| t.get("name")?.as_str())
                        .collect();
                    TemplateSource::Unusable(format!(
                        "{file}: chat_template lists templates {names:?} but none named \"default\""
                    ))
                }
            }
        }
        Some(_) => TemplateSource::Unusable(format!(
            "{file}: chat_template must be a string or a list of {{name, template}}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::IncrementalDecoder;
    use serde_json::json;

    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
    }

    fn fixture_text(family: &str) -> Text {
        let dir = fixture_dir().join(family);
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        Text::load(&dir, &cfg).unwrap()
    }

    /// Decodes `ids` one by one and checks the streaming invariants against a full decode.
    fn stream(text: &Text, ids: &[u32]) -> Vec<String> {
        let mut d = IncrementalDecoder::new();
        let mut deltas: Vec<String> = ids.iter().map(|&id| d.push(text, id).unwrap()).collect();
        deltas.push(d.finish(text).unwrap());
        for x in &deltas {
            assert!(
                !x.contains('\u{FFFD}'),
                "half a character leaked: {deltas:?}"
            );
        }
        assert_eq!(deltas.concat(), text.decode(ids, true).unwrap());
        deltas
    }

    #[test]
    fn fixture_tokenizer_matches_transformers() {
        // ids and decodes recorded from transformers by tools/oracle.
        let cases: Value = serde_json::from_slice(
            &std::fs::read(fixture_dir().join("tokenizer_cases.json")).unwrap(),
        )
        .unwrap();
        let text = fixture_text("olmoe");
        for c in cases["cases"].as_array().unwrap() {
            let s = c["text"].as_str().unwrap();
            let want: Vec<u32> = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(text.encode(s, false).unwrap(), want, "{s:?}");
            assert_eq!(
                text.decode(&want, false).unwrap(),
                c["decoded"].as_str().unwrap()
            );
            for (id, tok) in want.iter().zip(c["tokens"].as_array().unwrap()) {
                assert_eq!(text.id_to_token(*id).as_deref(), tok.as_str());
            }
        }
        // Chat rendering and its ids, as apply_chat_template produced them.
        let chat = &cases["chat"];
        let messages: Vec<ChatMessage> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap().into(),
                ..Default::default()
            })
            .collect();
        let agp = chat["add_generation_prompt"].as_bool().unwrap();
        assert_eq!(
            text.render_chat(&messages, agp).unwrap(),
            chat["rendered"].as_str().unwrap()
        );
        let ids: Vec<u32> = chat["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(text.encode_chat(&messages, agp).unwrap(), ids);
    }

    #[test]
    fn fixture_ids_and_defaults() {
        let t = fixture_text("olmoe");
        assert_eq!(t.eos_ids(), &[0]);
        assert_eq!(t.bos_id(), Some(0));
        assert_eq!(t.vocab_size(), 512);
        assert_eq!(t.special_token("eos_token"), Some("<|endoftext|>"));
        assert_eq!(t.token_to_id("<|im_end|>"), Some(2));
        assert_eq!(t.generation_defaults().do_sample, Some(false));
        assert_eq!(t.generation_defaults().temperature, None);
        assert!(t.chat_template_source().unwrap().contains("<|im_start|>"));
        // qwen3_moe's generation_config lists [0, 2]: the union keeps config's 0 first.
        assert_eq!(fixture_text("qwen3_moe").eos_ids(), &[0, 2]);
    }

    #[test]
    fn multibyte_streaming_never_splits_characters() {
        let text = fixture_text("olmoe");
        for s in [
            "café 日本 🙂",
            "日本語と東京",
            "rockets 🚀🚀 and 🙂",
            "  two  spaces\n\nnewlines",
            "naïve — ünïcödé ½ 𝕏",
        ] {
            let ids = text.encode(s, false).unwrap();
            let deltas = stream(&text, &ids);
            assert_eq!(deltas.concat(), s);
        }
        // The fixture splits 🚀 over two tokens ("ðŁ", "ļĢ"): the first gives no text, the
        // second the whole character.
        let ids = text.encode("🚀🚀", false).unwrap();
        assert_eq!(ids, vec![274, 330, 274, 330]);
        assert_eq!(stream(&text, &ids), vec!["", "🚀", "", "🚀", ""]);
        // Special tokens are skipped in the stream.
        let ids = text.encode("<|im_start|>hi<|im_end|>", false).unwrap();
        assert_eq!(stream(&text, &ids).concat(), "hi");
    }

    #[test]
    fn incomplete_character_at_the_end_is_flushed_by_finish() {
        let text = fixture_text("olmoe");
        let mut d = IncrementalDecoder::new();
        // "ðŁ" alone is the first half of an emoji's UTF-8 bytes.
        assert_eq!(d.push(&text, 274).unwrap(), "");
        assert_eq!(d.finish(&text).unwrap(), "\u{FFFD}");
        assert_eq!(d.finish(&text).unwrap(), "");
    }

    /// A Llama/Mistral-style SentencePiece tokenizer: "▁" marks spaces, the decoder strips the
    /// first leading space, and byte-fallback tokens carry raw UTF-8 bytes.
    fn sentencepiece_text(dir: &Path) -> Text {
        let tok = json!({
            "version": "1.0",
            "added_tokens": [
                {"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true},
                {"id": 1, "content": "</s>", "single_word": false, "lstrip": false,
                 "rstrip": false, "normalized": false, "special": true}
            ],
            "normalizer": null,
            "pre_tokenizer": null,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}
            ]},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": false, "byte_fallback": true,
                "vocab": {"<s>": 0, "</s>": 1, "▁Hello": 2, "▁world": 3, "!": 4,
                          "<0xE6>": 5, "<0x97>": 6, "<0xA5>": 7, "▁": 8},
                "merges": []}
        });
        std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
        Text::load(dir, &json!({"eos_token_id": 1, "bos_token_id": 0})).unwrap()
    }

    #[test]
    fn leading_space_decoders_stream_correctly() {
        let dir = tempfile::tempdir().unwrap();
        let text = sentencepiece_text(dir.path());
        // <s> ▁Hello ▁world ▁ <0xE6><0x97><0xA5> ! </s>
        let ids = [0, 2, 3, 8, 5, 6, 7, 4, 1];
        assert_eq!(text.decode(&ids, true).unwrap(), "Hello world 日!");
        let deltas = stream(&text, &ids);
        assert_eq!(
            deltas,
            vec!["", "Hello", " world", " ", "", "", "日", "!", "", ""]
        );
        // Decoding tokens one at a time would have lost the space before "world".
        assert_eq!(text.decode(&[3], true).unwrap(), "world");
        assert_eq!(text.eos_ids(), &[1]);
        assert_eq!(text.bos_id(), Some(0));
        // No tokenizer_config.json, so no template: a clear error.
        let e = text.render_chat(&[], true).unwrap_err().to_string();
        assert!(e.contains("has no chat template"), "{e}");
    }

    fn write_min_tokenizer(dir: &Path) {
        std::fs::copy(
            fixture_dir().join("olmoe/tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
    }

    #[test]
    fn chatml_template_with_bos_and_generation_prompt() {
        let dir = tempfile::tempdir().unwrap();
        write_min_tokenizer(dir.path());
        let cfg = json!({
            "bos_token": {"content": "<|endoftext|>", "lstrip": false},
            "eos_token": "<|im_end|>",
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
            ]
        });
        std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        std::fs::write(
            dir.path().join("generation_config.json"),
            json!({"eos_token_id": [7, 0], "temperature": 0.6, "top_p": 0.95, "top_k": 20})
                .to_string(),
        )
        .unwrap();
        let text = Text::load(dir.path(), &json!({"eos_token_id": 0})).unwrap();
        let msgs = vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
                ..Default::default()
            },
            ChatMessage {
                role: "user".into(),
                content: "Hi 🙂".into(),
                ..Default::default()
            },
        ];
        assert_eq!(
            text.render_chat(&msgs, true).unwrap(),
            "<|endoftext|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi 🙂<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            text.render_chat(&msgs[1..], false).unwrap(),
            "<|endoftext|><|im_start|>user\nHi 🙂<|im_end|>\n"
        );
        // config 0, generation_config 7 (0 again), tokenizer eos <|im_end|> = 2.
        assert_eq!(text.eos_ids(), &[0, 7, 2]);
        assert_eq!(text.bos_id(), Some(0));
        let g = text.generation_defaults();
        assert_eq!(
            (g.temperature, g.top_p, g.top_k),
            (Some(0.6), Some(0.95), Some(20))
        );

        // A chat_template.jinja file takes precedence over tokenizer_config.json.
        std::fs::write(dir.path().join("chat_template.jinja"), "{{ eos_token }}").unwrap();
        let text = Text::load(dir.path(), &json!({})).unwrap();
        assert_eq!(text.render_chat(&msgs, true).unwrap(), "<|im_end|>");
    }

    #[test]
    fn template_problems_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        write_min_tokenizer(dir.path());
        let cfg_path = dir.path().join("tokenizer_config.json");
        let load = || Text::load(dir.path(), &json!({})).unwrap();

        std::fs::write(
            &cfg_path,
            json!({"chat_template": [{"name": "rag", "template": "x"}]}).to_string(),
        )
        .unwrap();
        let e = load().render_chat(&[], true).unwrap_err().to_string();
        assert!(
            e.contains("none named \"default\"") && e.contains("rag"),
            "{e}"
        );

        std::fs::write(&cfg_path, json!({"chat_template": "{% if %}"}).to_string()).unwrap();
        let t = load();
        assert!(!t.has_chat_template());
        let e = t.render_chat(&[], true).unwrap_err();
        assert!(matches!(e, Error::Template(_)));
        assert!(e.to_string().contains("does not compile"), "{e}");

        std::fs::write(&cfg_path, "{not json").unwrap();
        let e = Text::load(dir.path(), &json!({})).err().unwrap();
        assert!(matches!(e, Error::Config { .. }), "{e}");
        assert!(e.to_string().contains("tokenizer_config.json"), "{e}");
    }

    #[test]
    fn tokenizer_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tokenizer.json"), "{\"broken\": ").unwrap();
        let e = Text::load(dir.path(), &json!({})).err().unwrap();
        assert!(matches!(e, Error::Tokenizer(_)), "{e}");
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
    }
}
