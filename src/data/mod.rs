//! Training data: from chat records to padded token batches.
//!
//! Owns the path from a JSONL training record (`messages`: user prompt,
//! assistant answer) to the plain vectors the trainer turns into tensors:
//! - [`records`]: reads and validates the records, with errors naming file
//!   and line;
//! - [`tokenizer`]: a model folder's `tokenizer.json` and
//!   `tokenizer_config.json` (special tokens, chat template);
//! - [`template`]: renders chats with the model's own Jinja chat template,
//!   thinking disabled for Qwen3;
//! - [`example`]: one record → token ids with the answer (and the
//!   end-of-turn token that teaches the model to stop) as the only labels;
//! - [`batch`]: a deterministic, resumable, length-bucketed batcher;
//! - [`buckets`]: a record's difficulty and the buckets that stats, eval
//!   and the curriculum count by.
//!
//! Nothing here knows about tensors or devices: batches are `Vec`s in
//! row-major `(B, L)` layout.

pub mod batch;
pub mod buckets;
pub mod example;
pub mod records;
pub mod template;
pub mod tokenizer;

use std::path::PathBuf;

pub use batch::{Batch, Batcher, Position};
pub use example::{BuildStats, Example, IGNORE_INDEX, build_examples};
pub use records::{Record, read_records};
pub use template::{ChatTemplate, Message, Role};
pub use tokenizer::ChatTokenizer;

/// Training data or a tokenizer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("missing `{}`\nhint: {hint}", path.display())]
    Missing { path: PathBuf, hint: String },
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file, or one field of it, is unusable.
    #[error("invalid `{}`{}: {message}\nhint: {hint}", path.display(), field_suffix(field))]
    Invalid {
        path: PathBuf,
        field: Option<String>,
        message: String,
        hint: String,
    },
    /// One line of a JSONL file.
    #[error("`{}`: line {line}: {message}\nhint: {hint}", path.display())]
    Line {
        path: PathBuf,
        line: u64,
        message: String,
        hint: String,
    },
    #[error("chat template: {message}\nhint: {hint}")]
    Template { message: String, hint: String },
    /// One record could not become a training example.
    #[error("record at line {line}: {message}\nhint: {hint}")]
    Example {
        line: u64,
        message: String,
        hint: String,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(
        "the tokenizer has ids up to {} but the model's vocabulary has {model} rows\nhint: use the tokenizer that ships with the model (its folder's `tokenizer.json`)",
        tokenizer - 1
    )]
    VocabTooLarge { tokenizer: usize, model: usize },
    #[error("{0}")]
    Batch(String),
}

fn field_suffix(field: &Option<String>) -> String {
    match field {
        Some(f) => format!(" field `{f}`"),
        None => String::new(),
    }
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// A tiny byte-level BPE tokenizer and a Qwen3-like template, built in
/// code, so unit tests need no fixture files.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;

    use serde_json::json;

    use super::ChatTokenizer;

    /// GPT-2's byte → printable char map (what `ByteLevel` uses).
    fn byte_chars() -> Vec<char> {
        let mut out = vec!['\0'; 256];
        let mut extra = 0;
        for b in 0..256u32 {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            out[b as usize] = if printable {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            };
        }
        out
    }

    pub const IM_START: u32 = 262;
    pub const IM_END: u32 = 263;
    pub const ENDOFTEXT: u32 = 264;

    /// A Qwen3-style template cut down to what the tests need: ChatML turns,
    /// an empty think block when `enable_thinking` is false.
    pub const TEMPLATE: &str = "{%- for message in messages %}\
{{- '<|im_start|>' + message.role + '\\n' }}\
{%- if message.role == 'assistant' and loop.last %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\
{{- message.content + '<|im_end|>\\n' }}\
{%- endfor %}\
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}\
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}\
{%- endif %}";

    /// `tokenizer.json`: 256 byte tokens, 6 merges, ChatML specials.
    pub fn tokenizer_json() -> serde_json::Value {
        let chars = byte_chars();
        let mut vocab = serde_json::Map::new();
        for (i, c) in chars.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i));
        }
        let merges = [
            ("h", "e"),
            ("l", "l"),
            ("he", "ll"),
            ("Ġ", "w"),
            ("o", "r"),
            ("Ċ", "Ċ"),
        ];
        for (i, (a, b)) in merges.iter().enumerate() {
            vocab.insert(format!("{a}{b}"), json!(256 + i));
        }
        let added = |id: u32, content: &str, special: bool| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": special})
        };
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [
                added(IM_START, "<|im_start|>", true),
                added(IM_END, "<|im_end|>", true),
                added(ENDOFTEXT, "<|endoftext|>", true),
                added(265, "<think>", false),
                added(266, "</think>", false),
            ],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
                 "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
            ]},
            "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab,
                "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
            }
        })
    }

    pub fn config_json() -> serde_json::Value {
        json!({
            "eos_token": "<|im_end|>",
            "pad_token": {"__type": "AddedToken", "content": "<|endoftext|>"},
            "bos_token": null,
            "chat_template": TEMPLATE,
            "added_tokens_decoder": {
                "262": {"content": "<|im_start|>", "special": true},
                "263": {"content": "<|im_end|>", "special": true},
                "264": {"content": "<|endoftext|>", "special": true},
            }
        })
    }

    pub fn write_dir(dir: &Path, tokenizer: &serde_json::Value, config: &serde_json::Value) {
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }

    /// The tiny tokenizer, loaded through [`ChatTokenizer::from_dir`].
    pub fn tokenizer() -> ChatTokenizer {
        let dir = tempfile::tempdir().unwrap();
        write_dir(dir.path(), &tokenizer_json(), &config_json());
        ChatTokenizer::from_dir(dir.path()).unwrap()
    }
}
