//! A Hugging Face folder's tokenizer as GGUF metadata: the byte-level BPE
//! of `tokenizer.json` as `tokenizer.ggml.*` (tokens by id, token types,
//! merges, the pre-tokenizer's llama.cpp name), the special token ids from
//! `tokenizer_config.json` then `config.json` (as llama.cpp's
//! `gguf.SpecialVocab` reads them), and the chat template from
//! `tokenizer_config.json` or `chat_template.jinja`.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::vocab::SPLIT_PATTERNS;
use super::writer::MetaValue;

/// llama.cpp's `token_type` values.
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;

/// The vocabulary as GGUF metadata.
pub(super) struct HfVocab {
    /// One token a row of the embeddings; ids the tokenizer leaves unused
    /// are `[PAD<id>]`, as llama.cpp's converter names them.
    pub(super) tokens: Vec<String>,
    pub(super) types: Vec<i32>,
    pub(super) merges: Vec<String>,
    /// `tokenizer.ggml.pre`.
    pub(super) pre: &'static str,
    /// Whether `tokenizer.json` normalizes to NFC, which llama.cpp does not.
    pub(super) nfc: bool,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) unk: Option<u32>,
    pub(super) pad: Option<u32>,
    pub(super) add_bos: Option<bool>,
    pub(super) add_eos: Option<bool>,
    pub(super) chat_template: Option<String>,
}

impl HfVocab {
    /// The `tokenizer.*` metadata llama.cpp reads.
    pub(super) fn metadata(&self) -> Vec<(String, MetaValue)> {
        let mut md = vec![
            ("tokenizer.ggml.model", MetaValue::Str("gpt2".to_owned())),
            ("tokenizer.ggml.pre", MetaValue::Str(self.pre.to_owned())),
            (
                "tokenizer.ggml.tokens",
                MetaValue::Strs(self.tokens.clone()),
            ),
            (
                "tokenizer.ggml.token_type",
                MetaValue::I32s(self.types.clone()),
            ),
            (
                "tokenizer.ggml.merges",
                MetaValue::Strs(self.merges.clone()),
            ),
        ];
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", self.bos),
            ("tokenizer.ggml.eos_token_id", self.eos),
            ("tokenizer.ggml.unknown_token_id", self.unk),
            ("tokenizer.ggml.padding_token_id", self.pad),
        ] {
            if let Some(id) = id {
                md.push((key, MetaValue::U32(id)));
            }
        }
        for (key, on) in [
            ("tokenizer.ggml.add_bos_token", self.add_bos),
            ("tokenizer.ggml.add_eos_token", self.add_eos),
        ] {
            if let Some(on) = on {
                md.push((key, MetaValue::Bool(on)));
            }
        }
        if let Some(t) = &self.chat_template {
            md.push(("tokenizer.chat_template", MetaValue::Str(t.clone())));
        }
        md.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }
}

fn read(path: &Path) -> Result<Option<Value>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| format!("`{}` is not JSON: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
    }
}

/// Reads the tokenizer of the model folder `dir` whose embeddings have
/// `vocab_size` rows. Every problem is pushed to `problems`.
pub(super) fn read_hf_vocab(
    dir: &Path,
    vocab_size: usize,
    problems: &mut Vec<String>,
) -> Option<HfVocab> {
    let path = dir.join(super::TOKENIZER_FILE);
    let shown = path.display().to_string();
    let tokenizer = match read(&path) {
        Ok(Some(t)) => t,
        Ok(None) => {
            problems.push(format!(
                "`{shown}` is missing; a GGUF needs the model's tokenizer (a fast, byte-level BPE `tokenizer.json`)"
            ));
            return None;
        }
        Err(e) => {
            problems.push(e);
            return None;
        }
    };
    let read_or_note = |name: &str, problems: &mut Vec<String>| match read(&dir.join(name)) {
        Ok(v) => v.unwrap_or(Value::Null),
        Err(e) => {
            problems.push(e);
            Value::Null
        }
    };
    let tok_config = read_or_note(super::TOKENIZER_CONFIG_FILE, problems);
    let config = read_or_note(crate::common::CONFIG_FILE, problems);
    let start = problems.len();
    let model = &tokenizer["model"];
    if model["type"].as_str() != Some("BPE") {
        problems.push(format!(
            "`{shown}`: model type {} is not `BPE`; only byte-level BPE tokenizers export (`tokenizer.ggml.model` gpt2)",
            model["type"]
        ));
    }
    if model["byte_fallback"].as_bool() == Some(true) {
        problems.push(format!(
            "`{shown}`: `byte_fallback` BPE (a SentencePiece-style vocabulary) is not supported; only byte-level BPE is"
        ));
    }
    // Qwen's tokenizers normalize to NFC; llama.cpp does not normalize, so
    // the GGUF tokenizes NFC text alike and other text as llama.cpp does.
    let nfc = tokenizer["normalizer"]["type"] == "NFC";
    if !tokenizer["normalizer"].is_null() && !nfc {
        problems.push(format!(
            "`{shown}`: normalizer {} is not supported; byte-level BPE tokenizers have none, or NFC",
            tokenizer["normalizer"]
        ));
    }
    let pre = pre_tokenizer_name(&tokenizer["pre_tokenizer"]);
    if pre.is_none() {
        problems.push(format!(
            "`{shown}`: pre-tokenizer {} is not one llama.cpp names (GPT-2's byte-level split, SmolLM's digits then byte-level, Qwen2's or Llama 3's split regex)",
            tokenizer["pre_tokenizer"]
        ));
    }
    let mut by_id: HashMap<u32, (String, i32)> = HashMap::new();
    if let Some(vocab) = model["vocab"].as_object() {
        for (token, id) in vocab {
            match id.as_u64() {
                Some(id) => {
                    by_id.insert(id as u32, (token.clone(), TOKEN_NORMAL));
                }
                None => problems.push(format!("`{shown}`: token `{token}` has id {id}")),
            }
        }
    } else {
        problems.push(format!("`{shown}`: `model.vocab` is not an object"));
    }
    for added in tokenizer["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (added["id"].as_u64(), added["content"].as_str()) else {
            problems.push(format!(
                "`{shown}`: added token {added} has no id or content"
            ));
            continue;
        };
        let ty = if added["special"].as_bool() == Some(true) {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        };
        by_id.insert(id as u32, (content.to_owned(), ty));
    }
    if let Some(&max) = by_id.keys().max()
        && max as usize >= vocab_size
    {
        problems.push(format!(
            "`{shown}` has token id {max}, but the model's embeddings have {vocab_size} rows (`vocab_size`)"
        ));
    }
    let merges: Vec<String> = model["merges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| match m {
            // Older files: "a b"; newer ones: ["a", "b"].
            Value::String(s) => Some(s.clone()),
            Value::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Value::String(a)), Some(Value::String(b))) => Some(format!("{a} {b}")),
                _ => None,
            },
            _ => None,
        })
        .collect();
    if merges.len() != model["merges"].as_array().map_or(0, Vec::len) {
        problems.push(format!(
            "`{shown}`: a merge is neither \"a b\" nor [\"a\", \"b\"]"
        ));
    }
    let chat_template = match chat_template(dir, &tok_config) {
        Ok(t) => t,
        Err(e) => {
            problems.push(e);
            None
        }
    };
    if problems.len() > start {
        return None;
    }
    let (tokens, types): (Vec<String>, Vec<i32>) = (0..vocab_size as u32)
        .map(|i| {
            by_id
                .remove(&i)
                .unwrap_or_else(|| (format!("[PAD{i}]"), TOKEN_UNUSED))
        })
        .unzip();
    let index: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i as u32))
        .collect();
    // tokenizer_config.json names the token; config.json gives the id.
    let special = |name: &str| {
        let named = match &tok_config[format!("{name}_token")] {
            Value::String(s) => Some(s.as_str()),
            Value::Object(o) => o.get("content").and_then(Value::as_str),
            _ => None,
        };
        named.and_then(|t| index.get(t).copied()).or_else(|| {
            let id = &config[format!("{name}_token_id")];
            id.as_u64()
                .or_else(|| id.get(0).and_then(Value::as_u64))
                .map(|i| i as u32)
                .filter(|&i| (i as usize) < vocab_size)
        })
    };
    Some(HfVocab {
        pre: pre.expect("checked above"),
        nfc,
        bos: special("bos"),
        eos: special("eos"),
        unk: special("unk"),
        pad: special("pad"),
        add_bos: tok_config["add_bos_token"].as_bool(),
        add_eos: tok_config["add_eos_token"].as_bool(),
        chat_template,
        tokens,
        types,
        merges,
    })
}

/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named
/// templates of which `default` is taken), else `chat_template.jinja`.
fn chat_template(dir: &Path, tok_config: &Value) -> Result<Option<String>, String> {
    match &tok_config["chat_template"] {
        Value::String(t) => return Ok(Some(t.clone())),
        Value::Array(named) => {
            return Ok(named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .map(str::to_owned));
        }
        _ => {}
    }
    let path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read `{}`: {e}", path.display())),
    }
}

/// llama.cpp's name for a `tokenizer.json` pre-tokenizer, when it has one.
fn pre_tokenizer_name(pre: &Value) -> Option<&'static str> {
    let byte_level = |v: &Value, regex: bool| {
        v["type"] == "ByteLevel"
            && v["add_prefix_space"].as_bool() != Some(true)
            && v["use_regex"].as_bool().unwrap_or(true) == regex
    };
    if byte_level(pre, true) {
        return Some("gpt2");
    }
    if pre["type"] != "Sequence" {
        return None;
    }
    match pre["pretokenizers"].as_array()?.as_slice() {
        [digits, last]
            if digits["type"] == "Digits"
                && digits["individual_digits"] == true
                && byte_level(last, true) =>
        {
            Some("smollm")
        }
        [split, last] if split["type"] == "Split" && byte_level(last, false) => {
            let pattern = split["pattern"]["Regex"].as_str()?;
            SPLIT_PATTERNS
                .iter()
                .find(|(_, p)| *p == pattern)
                .map(|(name, _)| *name)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn pre_tokenizers_map_to_llama_cpp_names() {
        let bl = |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": regex});
        assert_eq!(pre_tokenizer_name(&bl(true)), Some("gpt2"));
        assert_eq!(pre_tokenizer_name(&bl(false)), None);
        let smollm = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, bl(true)]});
        assert_eq!(pre_tokenizer_name(&smollm), Some("smollm"));
        let qwen = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_PATTERNS[0].1}, "behavior": "Isolated", "invert": false},
            bl(false)]});
        assert_eq!(pre_tokenizer_name(&qwen), Some("qwen2"));
        let other = json!({"type": "Metaspace"});
        assert_eq!(pre_tokenizer_name(&other), None);
    }
}
