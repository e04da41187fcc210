//! The GGUF's vocabulary as a Hugging Face tokenizer: `tokenizer.json`
//! rebuilt with the `tokenizers` crate, the special tokens, the padding
//! choice and `tokenizer_config.json`.

use serde_json::json;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::meta::Meta;

/// llama.cpp's `token_type` values.
const TOKEN_NORMAL: i64 = 1;
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// The split regexes of the `tokenizer.ggml.pre` names that llama.cpp runs
/// with a regex of their own, as Hugging Face's `tokenizer.json` spells them
/// (a `Split` pre-tokenizer, then byte-level without GPT-2's regex).
pub(super) const SPLIT_PATTERNS: [(&str, &str); 2] = [
    (
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    (
        "llama-bpe",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
];

/// How text is split before the byte-level BPE, by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pre {
    /// GPT-2's regex (`gpt2`, `mpt`, `olmo`).
    Gpt2,
    /// Each digit alone, then GPT-2's regex (`smollm`, `starcoder`, ...).
    Digits,
    /// A regex of [`SPLIT_PATTERNS`] (`qwen2`, `llama-bpe`), with Unicode
    /// NFC first for `qwen2`, as Qwen's own `tokenizer.json` has it.
    Split(&'static str, &'static str),
}

/// The vocabulary and the tokenizer settings.
pub(super) struct GgufVocab {
    pub(super) tokens: Vec<String>,
    /// llama.cpp `token_type` per token.
    pub(super) types: Vec<i64>,
    pub(super) merges: Vec<(String, String)>,
    /// How text is split before BPE.
    pub(super) pre: Pre,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) unk: Option<u32>,
    pub(super) pad: Pad,
    pub(super) add_bos: bool,
    pub(super) add_eos: bool,
    pub(super) chat_template: Option<String>,
}

/// The padding token and why it was chosen.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Pad {
    pub(super) id: Option<u32>,
    /// Set when the choice differs from the GGUF's `padding_token_id`.
    pub(super) note: Option<String>,
}

/// Picks the padding token: the GGUF's own unless it is the eos, else the
/// unknown token if it is a control token, else the first control token
/// that is neither bos nor eos, else none (pad by attention mask only).
///
/// Why not the eos: SmolLM2's GGUF pads with `<|im_end|>`, its eos. A
/// trainer that masks padding out of the loss by id would then mask every
/// real end of turn, and the model would learn never to stop.
fn choose_pad(
    tokens: &[String],
    types: &[i64],
    gguf_pad: Option<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
) -> Pad {
    if let Some(p) = gguf_pad
        && Some(p) != eos
    {
        return Pad {
            id: Some(p),
            note: None,
        };
    }
    let control = |id: u32| types.get(id as usize) == Some(&TOKEN_CONTROL);
    let usable = |id: u32| control(id) && Some(id) != eos && Some(id) != bos;
    let chosen = unk
        .filter(|&u| usable(u))
        .or_else(|| (0..types.len() as u32).find(|&i| usable(i)));
    let name = |id: u32| format!("`{}` (id {id})", tokens[id as usize]);
    let why = match gguf_pad {
        Some(p) => format!("the GGUF pads with its eos {}", name(p)),
        None => "the GGUF names no padding token".to_owned(),
    };
    let note = match chosen {
        Some(id) => format!(
            "{why}; padding with {} instead, so that masking padding never masks the eos",
            name(id)
        ),
        None => format!(
            "{why} and has no other control token; no pad token is set: pad by attention mask, never by the eos id"
        ),
    };
    Pad {
        id: chosen,
        note: Some(note),
    }
}

pub(super) fn read_vocab(meta: &Meta, problems: &mut Vec<String>) -> Option<GgufVocab> {
    let start = problems.len();
    match meta.string("tokenizer.ggml.model") {
        Some("gpt2") => {}
        Some(other) => problems.push(format!(
            "tokenizer model `{other}` (`tokenizer.ggml.model`) is not supported; only `gpt2` (byte-level BPE) is"
        )),
        None => problems.push("missing metadata `tokenizer.ggml.model`".to_owned()),
    }
    // The regex lists llama.cpp's `llama_vocab::impl::load` gives each
    // pre-tokenizer: a `\p{N}` split first, or GPT-2's regex alone.
    let pre_name = meta.string("tokenizer.ggml.pre");
    let split = pre_name.and_then(|n| SPLIT_PATTERNS.iter().find(|(name, _)| *name == n));
    let pre = match (pre_name, split) {
        (_, Some((name, pattern))) => Pre::Split(name, pattern),
        (Some("smollm" | "starcoder" | "refact" | "codeshell"), _) => Pre::Digits,
        (Some("gpt2" | "mpt" | "olmo"), _) => Pre::Gpt2,
        (other, _) => {
            problems.push(format!(
                "pre-tokenizer {} (`tokenizer.ggml.pre`) is not supported; supported: smollm, starcoder, refact, codeshell, gpt2, mpt, olmo, qwen2, llama-bpe",
                other.map_or("absent".to_owned(), |p| format!("`{p}`"))
            ));
            Pre::Gpt2
        }
    };
    let tokens = meta.strings("tokenizer.ggml.tokens");
    if tokens.is_none() {
        problems.push("missing metadata `tokenizer.ggml.tokens` (a string array)".to_owned());
    }
    let tokens = tokens.unwrap_or_default();
    let n = tokens.len();
    let types = meta
        .ints("tokenizer.ggml.token_type")
        .unwrap_or_else(|| vec![TOKEN_NORMAL; n]);
    if types.len() != n {
        problems.push(format!(
            "`tokenizer.ggml.token_type` has {} entries for {n} tokens",
            types.len()
        ));
    }
    let merges = meta
        .strings("tokenizer.ggml.merges")
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            // Byte-level symbols never hold a space, so one space separates
            // the pair.
            let pair = m.split_once(' ').filter(|(_, b)| !b.contains(' '));
            pair.map(|(a, b)| (a.to_owned(), b.to_owned())).ok_or(m)
        })
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|m| {
            problems.push(format!(
                "merge `{m}` in `tokenizer.ggml.merges` is not two symbols separated by one space"
            ));
            Vec::new()
        });
    let id = |key: &str, problems: &mut Vec<String>| {
        let id = meta.uint(key)?;
        if id as usize >= n {
            problems.push(format!("`{key}` {id} is outside the {n}-token vocabulary"));
            return None;
        }
        Some(id as u32)
    };
    let bos = id("tokenizer.ggml.bos_token_id", problems);
    let eos = id("tokenizer.ggml.eos_token_id", problems);
    let unk = id("tokenizer.ggml.unknown_token_id", problems);
    let gguf_pad = id("tokenizer.ggml.padding_token_id", problems);
    if problems.len() > start {
        return None;
    }
    let pad = choose_pad(&tokens, &types, gguf_pad, bos, eos, unk);
    Some(GgufVocab {
        tokens,
        types,
        merges,
        pre,
        bos,
        eos,
        unk,
        pad,
        add_bos: meta
            .boolean("tokenizer.ggml.add_bos_token")
            .unwrap_or(false),
        add_eos: meta
            .boolean("tokenizer.ggml.add_eos_token")
            .unwrap_or(false),
        chat_template: meta.string("tokenizer.chat_template").map(str::to_owned),
    })
}

/// The added tokens, by id: control and unknown tokens as special, user
/// defined ones as plain added tokens. None is normalized or stripped.
fn added_tokens(v: &GgufVocab) -> Vec<(u32, AddedToken)> {
    v.types
        .iter()
        .enumerate()
        .filter_map(|(id, &ty)| {
            let special = match ty {
                TOKEN_CONTROL | TOKEN_UNKNOWN => true,
                TOKEN_USER_DEFINED => false,
                _ => return None,
            };
            let token = AddedToken::from(v.tokens[id].clone(), special).normalized(false);
            Some((id as u32, token))
        })
        .collect()
}

/// The byte-level BPE tokenizer of the vocabulary, as llama.cpp runs it.
pub(super) fn build_tokenizer(v: &GgufVocab) -> Result<Tokenizer, String> {
    let ids: Vocab = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    if ids.len() != v.tokens.len() {
        return Err("`tokenizer.ggml.tokens` holds the same token twice".to_owned());
    }
    let bpe = BPE::builder()
        .vocab_and_merges(ids, v.merges.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let byte_level = ByteLevel::new(false, true, true);
    let pre: PreTokenizerWrapper = match v.pre {
        Pre::Gpt2 => byte_level.into(),
        Pre::Digits => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
        Pre::Split(_, pattern) => {
            let split = Split::new(
                SplitPattern::Regex(pattern.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| e.to_string())?;
            Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])
            .into()
        }
    };
    let mut tokenizer = Tokenizer::new(bpe);
    if matches!(v.pre, Pre::Split("qwen2", _)) {
        tokenizer
            .with_normalizer(Some(NFC))
            .map_err(|e| e.to_string())?;
    }
    tokenizer
        .with_pre_tokenizer(Some(pre))
        .with_decoder(Some(ByteLevel::default()))
        // Offsets only: the byte-level post-processor adds no tokens.
        .with_post_processor(Some(ByteLevel::new(true, false, true)));
    let (special, plain): (Vec<_>, Vec<_>) =
        added_tokens(v).into_iter().partition(|(_, t)| t.special);
    tokenizer
        .add_special_tokens(special.into_iter().map(|(_, t)| t))
        .map_err(|e| e.to_string())?;
    tokenizer
        .add_tokens(plain.into_iter().map(|(_, t)| t))
        .map_err(|e| e.to_string())?;
    Ok(tokenizer)
}

impl GgufVocab {
    /// `tokenizer_config.json`: special tokens, the chat template, and the
    /// generic fast tokenizer class, which uses `tokenizer.json` as it is.
    pub(super) fn tokenizer_config(&self, model_max_length: usize) -> serde_json::Value {
        let v = self;
        let token = |id: Option<u32>| id.map(|i| v.tokens[i as usize].clone());
        let added: serde_json::Map<String, serde_json::Value> = added_tokens(v)
            .into_iter()
            .map(|(id, t)| {
                (
                    id.to_string(),
                    json!({
                        "content": t.content,
                        "lstrip": t.lstrip,
                        "normalized": t.normalized,
                        "rstrip": t.rstrip,
                        "single_word": t.single_word,
                        "special": t.special,
                    }),
                )
            })
            .collect();
        let mut config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "add_bos_token": v.add_bos,
            "add_eos_token": v.add_eos,
            "added_tokens_decoder": added,
            "bos_token": token(v.bos),
            "eos_token": token(v.eos),
            "unk_token": token(v.unk),
            "pad_token": token(v.pad.id),
            "clean_up_tokenization_spaces": false,
            "model_max_length": model_max_length,
        });
        if let Some(t) = &v.chat_template {
            config["chat_template"] = json!(t);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pad_is_never_the_eos() {
        let tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<x>", "a"]
            .map(String::from)
            .to_vec();
        let types = [3, 3, 3, 3, 1];
        // SmolLM2: pad = eos = 2, unk = 0.
        let pad = choose_pad(&tokens, &types, Some(2), Some(1), Some(2), Some(0));
        assert_eq!(pad.id, Some(0));
        assert!(pad.note.unwrap().contains("`<|im_end|>` (id 2)"));
        // A distinct pad is kept, silently.
        let pad = choose_pad(&tokens, &types, Some(3), Some(1), Some(2), Some(0));
        assert_eq!(
            pad,
            Pad {
                id: Some(3),
                note: None
            }
        );
        // No pad, no unk: the first control token that is neither bos nor eos.
        let pad = choose_pad(&tokens, &types, None, Some(0), Some(2), None);
        assert_eq!(pad.id, Some(1));
        // Nothing usable: no pad at all, never the eos.
        let pad = choose_pad(&tokens, &[1, 3, 3, 1, 1], Some(2), Some(1), Some(2), None);
        assert_eq!(pad.id, None);
        assert!(pad.note.unwrap().contains("no pad token is set"));
    }
}
