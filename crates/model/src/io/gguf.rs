//! Importing a llama.cpp GGUF as a Hugging Face model folder.
//!
//! Owns [`import_gguf`]: a GGUF of the `llama` architecture (Llama 2/3
//! without RoPE scaling, SmolLM2) or the `qwen3` one (dense Qwen3) whose
//! vocabulary is byte-level BPE (`tokenizer.ggml.model` = `gpt2`) becomes a
//! folder that [`crate::arch::load`] and transformers' `LlamaForCausalLM` /
//! `Qwen3ForCausalLM` read: `model.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json` (with the chat template),
//! `generation_config.json` and, written last so that a half-written folder
//! never loads, `config.json`.
//!
//! Weights are dequantized with candle and written as f32: candle
//! dequantizes to f32 (a Q4_1 value is an f16 scale times a 4-bit integer
//! plus an f16 minimum), so f32 keeps every value as dequantized and the
//! folder is the GGUF's model and nothing else; bf16 would round the weights
//! a second time. SmolLM2-135M is 540 MB in f32, and `load` casts to bf16
//! when asked.
//!
//! Names map block by block (`blk.N.attn_q` → `model.layers.N.self_attn.q_proj`,
//! see [`hf_name`]); a GGUF without `output.weight` ties `lm_head` to the
//! embeddings. The opposite direction, a model folder written as a GGUF,
//! is [`export`].
//!
//! The RoPE permutation. HF Llama rotates each head's dimension in halves:
//! channel `i` pairs with `i + D/2` (`rotate_half`). llama.cpp rotates
//! adjacent channels `(2i, 2i+1)`, Meta's original layout, so its converter
//! (`convert_hf_to_gguf.py`, `permute`) reorders the output rows of q and k
//! within each head: `w.reshape(H, 2, D/2, in).swapaxes(1, 2)`. GGUF row
//! `h*D + 2i + s` is HF row `h*D + s*D/2 + i` (`s` in {0, 1}, `i < D/2`;
//! `H` is the query heads for q, the key/value heads for k). The inverse,
//! [`unpermute_rope_rows`], reads the rows as `(H, D/2, 2, in)` and swaps the
//! same two axes back. Without it the model loads and runs but rotates the
//! wrong channel pairs, and its output is noise. v, o and the MLP are not
//! permuted, and neither is anything of `qwen3`: llama.cpp runs Qwen3 with
//! the half-split ("NEOX") RoPE that HF uses, and its converter writes the
//! rows as they are.
//!
//! The tokenizer is rebuilt with the `tokenizers` crate from
//! `tokenizer.ggml.tokens` (id = position) and `tokenizer.ggml.merges`
//! (rank = position), with the pre-tokenizer llama.cpp uses for the GGUF's
//! `tokenizer.ggml.pre` (SmolLM2: each digit alone, then GPT-2's byte-level
//! split; Qwen2/3 and Llama 3: their split regex, then byte-level, with
//! Qwen's NFC normalizer). Control tokens (`token_type` 3) become special
//! added tokens.
//! The padding token is never the eos: a trainer that masks padding by id
//! would otherwise stop teaching the model to end its turn (see
//! `vocab::choose_pad`).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Tensor};
use serde::Serialize;
use serde_json::json;

use crate::{common::CONFIG_FILE, common::WEIGHTS_FILE};
use meta::{Hparams, Meta, read_hparams};
use vocab::{GgufVocab, build_tokenizer, read_vocab};

pub mod export;
mod hf_vocab;
mod meta;
mod vocab;
pub mod writer;

/// The tokenizer file of a model folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Special tokens and the chat template, as transformers reads them.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// Default generation ids (bos, eos, pad), as transformers reads them.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// A GGUF that cannot be imported. Paths are the GGUF's unless the variant
/// says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("GGUF file `{}` does not exist\nhint: pass the path of a llama.cpp `.gguf` file", path.display())]
    Missing { path: PathBuf },
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "`{}` is not a GGUF file: it starts with {found}, not `GGUF`\nhint: pass a llama.cpp `.gguf` file; Hugging Face folders load without import",
        path.display()
    )]
    NotGguf { path: PathBuf, found: String },
    #[error("invalid GGUF `{}`: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error(
        "`{}` holds a `{architecture}` model; only `llama` and `qwen3` GGUFs can be imported\nhint: Llama 2/3 and SmolLM2 GGUFs have `general.architecture` = `llama`, Qwen3 ones `qwen3`",
        path.display()
    )]
    Architecture { path: PathBuf, architecture: String },
    #[error(
        "`{}` holds a tensor of ggml type {ggml_type} ({name}), which this importer cannot read\nhint: convert the GGUF to F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 or a Q2_K..Q6_K type (llama.cpp's `llama-quantize`)",
        path.display()
    )]
    TensorType {
        path: PathBuf,
        ggml_type: u32,
        name: &'static str,
    },
    #[error("cannot import `{}`:\n{}", path.display(), crate::common::list(problems))]
    Unsupported {
        path: PathBuf,
        problems: Vec<String>,
    },
    #[error("cannot build the tokenizer of `{}`: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    #[error("cannot write `{}`: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What [`import_gguf`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImportReport {
    pub file: PathBuf,
    pub out: PathBuf,
    /// `general.name`, when the GGUF has one.
    pub name: Option<String>,
    pub tensors: usize,
    pub parameters: usize,
    /// How many tensors the GGUF stored in each ggml type (`Q4_1`, `F32`, ...).
    pub source_types: BTreeMap<String, usize>,
    /// The dtype written: always `float32`.
    pub dtype: String,
    pub vocab_size: usize,
    pub tie_word_embeddings: bool,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    /// Files written into `out`, in writing order.
    pub files: Vec<String>,
    /// Choices the import made that a user should know about.
    pub notes: Vec<String>,
}

/// Imports the GGUF `file` into the folder `out` (created if needed; files
/// of the same names are replaced, each atomically).
pub fn import_gguf(file: &Path, out: &Path) -> anyhow::Result<ImportReport> {
    let (content, mut reader) = read_gguf(file)?;
    let plan = Plan::new(file, &content)?;
    let tokenizer = build_tokenizer(&plan.vocab).map_err(|message| GgufError::Tokenizer {
        path: file.to_owned(),
        message,
    })?;
    std::fs::create_dir_all(out).map_err(|source| GgufError::Write {
        path: out.to_owned(),
        source,
    })?;

    let mut tensors = HashMap::new();
    let mut source_types = BTreeMap::new();
    let mut parameters = 0;
    for t in &plan.tensors {
        let info = &content.tensor_infos[&t.gguf];
        *source_types
            .entry(format!("{:?}", info.ggml_dtype))
            .or_insert(0) += 1;
        let invalid = |e: candle_core::Error| GgufError::Invalid {
            path: file.to_owned(),
            message: format!("tensor `{}`: {}", t.gguf, candle_message(&e)),
        };
        let weight = content
            .tensor(&mut reader, &t.gguf, &Device::Cpu)
            .and_then(|q| q.dequantize(&Device::Cpu))
            .map_err(invalid)?;
        let weight = match t.rope_heads {
            Some(heads) => unpermute_rope_rows(&weight, heads).map_err(invalid)?,
            None => weight,
        };
        parameters += weight.elem_count();
        tensors.insert(t.hf.clone(), weight);
    }

    let mut files = Vec::new();
    write_weights(&tensors, out)?;
    files.push(WEIGHTS_FILE.to_owned());
    drop(tensors);
    let tokenizer_json = tokenizer
        .to_string(true)
        .map_err(|e| GgufError::Tokenizer {
            path: file.to_owned(),
            message: e.to_string(),
        })?;
    trace_train_base::atomic::write(&out.join(TOKENIZER_FILE), tokenizer_json.as_bytes())?;
    files.push(TOKENIZER_FILE.to_owned());
    for (name, value) in [
        (
            TOKENIZER_CONFIG_FILE,
            plan.vocab
                .tokenizer_config(plan.hparams.max_position_embeddings),
        ),
        (GENERATION_CONFIG_FILE, plan.generation_config()),
        (CONFIG_FILE, plan.config()),
    ] {
        let text = serde_json::to_string_pretty(&value).expect("a JSON value serialises");
        trace_train_base::atomic::write(&out.join(name), text.as_bytes())?;
        files.push(name.to_owned());
    }

    let vocab = &plan.vocab;
    let token = |id: Option<u32>| id.map(|i| vocab.tokens[i as usize].clone());
    Ok(ImportReport {
        file: file.to_owned(),
        out: out.to_owned(),
        name: plan.name.clone(),
        tensors: plan.tensors.len(),
        parameters,
        source_types,
        dtype: "float32".to_owned(),
        vocab_size: vocab.tokens.len(),
        tie_word_embeddings: plan.tied,
        bos_token: token(vocab.bos),
        eos_token: token(vocab.eos),
        pad_token: token(vocab.pad.id),
        files,
        notes: plan.notes.clone(),
    })
}

/// Opens `file`, checks its magic and reads its header.
fn read_gguf(file: &Path) -> Result<(Content, BufReader<File>), GgufError> {
    let read_err = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::NotFound {
            GgufError::Missing {
                path: file.to_owned(),
            }
        } else {
            GgufError::Read {
                path: file.to_owned(),
                source,
            }
        }
    };
    let f = File::open(file).map_err(read_err)?;
    if f.metadata().map_err(read_err)?.is_dir() {
        return Err(GgufError::NotGguf {
            path: file.to_owned(),
            found: "nothing (it is a folder)".to_owned(),
        });
    }
    let mut reader = BufReader::new(f);
    let mut magic = Vec::with_capacity(4);
    (&mut reader)
        .take(4)
        .read_to_end(&mut magic)
        .map_err(read_err)?;
    if magic != b"GGUF" {
        let found = if magic.is_empty() {
            "nothing (it is empty)".to_owned()
        } else {
            format!("`{}`", magic.escape_ascii())
        };
        return Err(GgufError::NotGguf {
            path: file.to_owned(),
            found,
        });
    }
    std::io::Seek::rewind(&mut reader).map_err(read_err)?;
    let content = Content::read(&mut reader).map_err(|e| {
        let message = candle_message(&e);
        // candle rejects ggml types it has no kernels for while it reads the
        // tensor index: "unknown dtype for tensor 20".
        match message
            .rsplit_once("unknown dtype for tensor ")
            .and_then(|(_, n)| n.trim().parse::<u32>().ok())
        {
            Some(ggml_type) => GgufError::TensorType {
                path: file.to_owned(),
                ggml_type,
                name: ggml_type_name(ggml_type),
            },
            None => GgufError::Invalid {
                path: file.to_owned(),
                message,
            },
        }
    })?;
    Ok((content, reader))
}

/// A candle error's message without the backtrace candle attaches when
/// `RUST_BACKTRACE` is set.
fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        e => e.to_string(),
    }
}

/// ggml's names for its type ids (ggml.h `enum ggml_type`).
fn ggml_type_name(id: u32) -> &'static str {
    #[rustfmt::skip]
    const NAMES: [&str; 40] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
        "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
        "IQ1_M", "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
        "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

/// Maps a llama.cpp tensor name to its Hugging Face name.
pub fn hf_name(gguf: &str) -> Option<String> {
    const TOP: [(&str, &str); 3] = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    const BLOCK: [(&str, &str); 11] = [
        ("attn_q", "self_attn.q_proj"),
        ("attn_k", "self_attn.k_proj"),
        ("attn_v", "self_attn.v_proj"),
        ("attn_output", "self_attn.o_proj"),
        ("ffn_gate", "mlp.gate_proj"),
        ("ffn_up", "mlp.up_proj"),
        ("ffn_down", "mlp.down_proj"),
        ("attn_norm", "input_layernorm"),
        ("ffn_norm", "post_attention_layernorm"),
        ("attn_q_norm", "self_attn.q_norm"),
        ("attn_k_norm", "self_attn.k_norm"),
    ];
    if let Some((_, hf)) = TOP.iter().find(|(g, _)| *g == gguf) {
        return Some((*hf).to_owned());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let part = rest.strip_suffix(".weight")?;
    let (_, hf) = BLOCK.iter().find(|(g, _)| *g == part)?;
    Some(format!("model.layers.{layer}.{hf}.weight"))
}

/// llama.cpp's q/k row permutation (`convert_hf_to_gguf.py`, `permute`):
/// `w: (H*D, ...)` in HF order -> GGUF order, row `h*D + s*D/2 + i` moving
/// to `h*D + 2i + s`. The importer needs only the inverse; this one writes
/// GGUFs in tests.
pub fn permute_rope_rows(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    swap_rope_axes(w, heads, true)
}

/// The inverse of [`permute_rope_rows`]: `w: (H*D, ...)` in GGUF order ->
/// HF order (the module header derives it).
pub fn unpermute_rope_rows(w: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    swap_rope_axes(w, heads, false)
}

/// `(H*D, rest)` viewed as `(H, 2, D/2, rest)` when `to_gguf`, else as
/// `(H, D/2, 2, rest)`; axes 1 and 2 swapped; flattened back.
fn swap_rope_axes(w: &Tensor, heads: usize, to_gguf: bool) -> candle_core::Result<Tensor> {
    let dims = w.dims().to_vec();
    let Some(&rows) = dims.first() else {
        candle_core::bail!("cannot permute the rows of a scalar");
    };
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        candle_core::bail!("{rows} rows do not split into {heads} heads of even size");
    }
    let half = rows / heads / 2;
    let mut view = if to_gguf {
        vec![heads, 2, half]
    } else {
        vec![heads, half, 2]
    };
    view.extend(&dims[1..]);
    w.reshape(view)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)
}

/// One tensor to convert.
struct TensorPlan {
    gguf: String,
    hf: String,
    /// Heads to un-permute over, for q and k.
    rope_heads: Option<usize>,
}

/// The GGUF architectures this module reads and writes, by
/// `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GgufArch {
    Llama,
    Qwen3,
}

impl GgufArch {
    fn parse(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Self::Llama),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen3 => "qwen3",
        }
    }

    /// Whether q and k rows are stored in llama.cpp's interleaved RoPE
    /// order (the module header).
    fn permutes_rope(self) -> bool {
        self == Self::Llama
    }

    /// Whether each block has per-head q and k norms (Qwen3).
    fn has_qk_norm(self) -> bool {
        self == Self::Qwen3
    }
}

/// The model's shape as the tensor index needs it.
struct Shapes {
    vocab: usize,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// Every tensor a GGUF of `arch` holds, under llama.cpp's names, with its
/// row-major shape and, for q and k of a permuting architecture, the heads
/// its rows are permuted over; `output.weight` only when not `tied`.
fn expected_tensors(
    arch: GgufArch,
    s: &Shapes,
    tied: bool,
) -> BTreeMap<String, (Vec<usize>, Option<usize>)> {
    let (hidden, inter, d) = (s.hidden, s.intermediate, s.head_dim);
    let (q_out, kv_out) = (s.heads * d, s.kv_heads * d);
    let rope = |heads| arch.permutes_rope().then_some(heads);
    let mut expected = BTreeMap::new();
    expected.insert("token_embd.weight".into(), (vec![s.vocab, hidden], None));
    expected.insert("output_norm.weight".into(), (vec![hidden], None));
    if !tied {
        expected.insert("output.weight".into(), (vec![s.vocab, hidden], None));
    }
    for i in 0..s.layers {
        let mut parts = vec![
            ("attn_q", vec![q_out, hidden], rope(s.heads)),
            ("attn_k", vec![kv_out, hidden], rope(s.kv_heads)),
            ("attn_v", vec![kv_out, hidden], None),
            ("attn_output", vec![hidden, q_out], None),
            ("ffn_gate", vec![inter, hidden], None),
            ("ffn_up", vec![inter, hidden], None),
            ("ffn_down", vec![hidden, inter], None),
            ("attn_norm", vec![hidden], None),
            ("ffn_norm", vec![hidden], None),
        ];
        if arch.has_qk_norm() {
            parts.push(("attn_q_norm", vec![d], None));
            parts.push(("attn_k_norm", vec![d], None));
        }
        for (part, shape, heads) in parts {
            expected.insert(format!("blk.{i}.{part}.weight"), (shape, heads));
        }
    }
    expected
}

/// Everything read and checked before any file is written.
struct Plan {
    arch: GgufArch,
    name: Option<String>,
    hparams: Hparams,
    vocab: GgufVocab,
    tensors: Vec<TensorPlan>,
    tied: bool,
    notes: Vec<String>,
}

impl Plan {
    /// Reads the metadata and tensor index; reports every problem at once.
    fn new(path: &Path, content: &Content) -> Result<Self, GgufError> {
        let meta = Meta(&content.metadata);
        let architecture = meta.string("general.architecture").unwrap_or("");
        let Some(arch) = GgufArch::parse(architecture) else {
            return Err(GgufError::Architecture {
                path: path.to_owned(),
                architecture: if architecture.is_empty() {
                    "unnamed (no `general.architecture`)".to_owned()
                } else {
                    architecture.to_owned()
                },
            });
        };
        let mut problems = Vec::new();
        let vocab = read_vocab(&meta, &mut problems);
        let hparams = read_hparams(
            &meta,
            arch.name(),
            vocab.as_ref().map(|v| v.tokens.len()),
            &mut problems,
        );
        let (tensors, tied) = match &hparams {
            Some(h) => plan_tensors(content, arch, h, &mut problems),
            None => (Vec::new(), false),
        };
        match (hparams, vocab) {
            (Some(hparams), Some(vocab)) if problems.is_empty() => {
                let mut notes: Vec<String> = vocab.pad.note.iter().cloned().collect();
                if vocab.chat_template.is_none() {
                    notes.push("the GGUF has no `tokenizer.chat_template`".to_owned());
                }
                Ok(Plan {
                    arch,
                    name: meta.string("general.name").map(str::to_owned),
                    hparams,
                    vocab,
                    tensors,
                    tied,
                    notes,
                })
            }
            _ => Err(GgufError::Unsupported {
                path: path.to_owned(),
                problems,
            }),
        }
    }

    /// `config.json` for transformers' `LlamaForCausalLM` and
    /// [`crate::arch::llama`], or `Qwen3ForCausalLM` and [`crate::arch::qwen3`].
    fn config(&self) -> serde_json::Value {
        let h = &self.hparams;
        let mut config = json!({
            "vocab_size": h.vocab_size,
            "hidden_size": h.hidden_size,
            "intermediate_size": h.intermediate_size,
            "num_hidden_layers": h.num_hidden_layers,
            "num_attention_heads": h.num_attention_heads,
            "num_key_value_heads": h.num_key_value_heads,
            "head_dim": h.head_dim,
            "max_position_embeddings": h.max_position_embeddings,
            "rms_norm_eps": h.rms_norm_eps,
            "rope_theta": h.rope_theta,
            "rope_scaling": null,
            "hidden_act": "silu",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "tie_word_embeddings": self.tied,
            "use_cache": true,
            "bos_token_id": self.vocab.bos,
            "eos_token_id": self.vocab.eos,
            "pad_token_id": self.vocab.pad.id,
            "torch_dtype": "float32",
        });
        // What each architecture's config has beside the shared keys.
        let own = match self.arch {
            GgufArch::Qwen3 => json!({
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "use_sliding_window": false,
                "sliding_window": null,
            }),
            GgufArch::Llama => json!({
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "mlp_bias": false,
                "pretraining_tp": 1,
            }),
        };
        let map = config.as_object_mut().expect("an object");
        map.extend(own.as_object().expect("an object").clone());
        config
    }

    fn generation_config(&self) -> serde_json::Value {
        json!({
            "bos_token_id": self.vocab.bos,
            "eos_token_id": self.vocab.eos,
            "pad_token_id": self.vocab.pad.id,
        })
    }
}

/// Maps every tensor, checks its shape against the metadata, and finds the
/// ones missing. Returns the plan in name order and whether `lm_head` is tied.
fn plan_tensors(
    content: &Content,
    arch: GgufArch,
    h: &Hparams,
    problems: &mut Vec<String>,
) -> (Vec<TensorPlan>, bool) {
    let shapes = Shapes {
        vocab: h.vocab_size,
        hidden: h.hidden_size,
        intermediate: h.intermediate_size,
        layers: h.num_hidden_layers,
        heads: h.num_attention_heads,
        kv_heads: h.num_key_value_heads,
        head_dim: h.head_dim,
    };
    let tied = !content.tensor_infos.contains_key("output.weight");
    let mut expected = expected_tensors(arch, &shapes, tied);
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut plan = Vec::new();
    for name in names {
        let Some((shape, rope_heads)) = expected.remove(name.as_str()) else {
            let why = if name == "rope_freqs.weight" {
                "Llama 3.1 RoPE scaling is not supported"
            } else {
                "no Hugging Face weight corresponds to it"
            };
            problems.push(format!("tensor `{name}`: {why}"));
            continue;
        };
        let found = content.tensor_infos[name].shape.dims();
        if found != shape.as_slice() {
            problems.push(format!(
                "tensor `{name}` has shape {found:?}; the metadata implies {shape:?}"
            ));
        }
        plan.push(TensorPlan {
            gguf: name.clone(),
            hf: hf_name(name).expect("every expected name maps"),
            rope_heads,
        });
    }
    for name in expected.keys() {
        problems.push(format!("tensor `{name}` is missing"));
    }
    (plan, tied)
}

/// Writes `model.safetensors` atomically: candle writes a hidden partial
/// file, which is synced and renamed over the target.
fn write_weights(tensors: &HashMap<String, Tensor>, out: &Path) -> anyhow::Result<()> {
    let target = out.join(WEIGHTS_FILE);
    let partial = out.join(format!(".{WEIGHTS_FILE}.partial"));
    let result = crate::common::save_safetensors(tensors, &partial)
        .with_context(|| format!("cannot write `{}`", partial.display()))
        .and_then(|()| {
            File::open(&partial)
                .and_then(|f| f.sync_all())
                .and_then(|()| std::fs::rename(&partial, &target))
                .and_then(|()| File::open(out).and_then(|d| d.sync_all()))
                .map_err(|source| {
                    GgufError::Write {
                        path: target.clone(),
                        source,
                    }
                    .into()
                })
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

#[cfg(test)]
mod tests {
    use candle_core::{D, DType, IndexOp};

    use super::*;

    /// `(rows, cols)` with entry `r * 100 + c`.
    fn indexed(rows: usize, cols: usize) -> Tensor {
        Tensor::arange(0u32, (rows * cols) as u32, &Device::Cpu)
            .unwrap()
            .reshape((rows, cols))
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
    }

    #[test]
    fn permutation_moves_rows_as_llama_cpp_does() {
        // 3 heads of size 8, 5 input columns.
        let (heads, d, cols) = (3, 8, 5);
        let hf = indexed(heads * d, cols);
        let gguf = permute_rope_rows(&hf, heads).unwrap();
        let (hf_rows, gguf_rows) = (hf.to_vec2::<f32>().unwrap(), gguf.to_vec2::<f32>().unwrap());
        // GGUF row h*D + 2i + s holds HF row h*D + s*D/2 + i.
        for h in 0..heads {
            for i in 0..d / 2 {
                for s in 0..2 {
                    assert_eq!(
                        gguf_rows[h * d + 2 * i + s],
                        hf_rows[h * d + s * d / 2 + i],
                        "h {h} i {i} s {s}"
                    );
                }
            }
        }
        assert_eq!(
            unpermute_rope_rows(&gguf, heads)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap(),
            hf_rows
        );
        // And the other way round: un-permuting then permuting is the identity.
        let back = permute_rope_rows(&unpermute_rope_rows(&hf, heads).unwrap(), heads).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), hf_rows);
    }

    #[test]
    fn permutation_applies_to_biases_and_checks_head_sizes() {
        let bias = Tensor::arange(0f32, 8., &Device::Cpu).unwrap();
        let gguf = permute_rope_rows(&bias, 2).unwrap();
        assert_eq!(
            gguf.to_vec1::<f32>().unwrap(),
            [0., 2., 1., 3., 4., 6., 5., 7.]
        );
        let back = unpermute_rope_rows(&gguf, 2).unwrap();
        assert_eq!(
            back.to_vec1::<f32>().unwrap(),
            [0., 1., 2., 3., 4., 5., 6., 7.]
        );
        assert!(unpermute_rope_rows(&indexed(6, 2), 2).is_err()); // odd head size
        assert!(unpermute_rope_rows(&indexed(8, 2), 0).is_err());
    }

    /// Why the permutation exists: llama.cpp's interleaved RoPE on the GGUF
    /// weights gives the same attention scores as HF's half-split RoPE on
    /// the un-permuted weights.
    #[test]
    fn interleaved_rope_on_gguf_rows_equals_half_rope_on_hf_rows() {
        let dev = Device::Cpu;
        let (heads, d, hidden, len) = (2, 8, 6, 5);
        let w_gguf = Tensor::arange(0f32, (heads * d * hidden) as f32, &dev)
            .unwrap()
            .affine(0.37, 0.1)
            .unwrap()
            .sin()
            .unwrap()
            .reshape((heads * d, hidden))
            .unwrap();
        let w_hf = unpermute_rope_rows(&w_gguf, heads).unwrap();
        let x = Tensor::arange(0f32, (len * hidden) as f32, &dev)
            .unwrap()
            .affine(0.11, -1.0)
            .unwrap()
            .cos()
            .unwrap()
            .reshape((len, hidden))
            .unwrap();
        let positions = Tensor::arange(0f32, len as f32, &dev)
            .unwrap()
            .reshape((len, 1))
            .unwrap();
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / d as f32))
            .collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, d / 2), &dev).unwrap();
        let freqs = positions.matmul(&inv_freq).unwrap(); // (L, D/2)
        let (cos, sin) = (freqs.cos().unwrap(), freqs.sin().unwrap());
        // (L, hidden) @ (hidden, H*D) -> (1, H, L, D)
        let project = |w: &Tensor| {
            x.matmul(&w.t().unwrap())
                .unwrap()
                .reshape((1, len, heads, d))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .contiguous()
                .unwrap()
        };
        let q_gguf = candle_nn::rotary_emb::rope_i(&project(&w_gguf), &cos, &sin).unwrap();
        let q_hf = candle_nn::rotary_emb::rope(&project(&w_hf), &cos, &sin).unwrap();
        // q.q^T per head: the scores attention sees.
        let scores = |q: &Tensor| q.matmul(&q.t().unwrap()).unwrap();
        let diff: f32 = crate::common::max_abs_diff(&scores(&q_gguf), &scores(&q_hf));
        assert!(diff < 1e-4, "{diff}");
        // Not vacuous: the permuted weights with half-split RoPE differ.
        let wrong = candle_nn::rotary_emb::rope(&project(&w_gguf), &cos, &sin).unwrap();
        let off: f32 = crate::common::max_abs_diff(&scores(&wrong), &scores(&q_hf));
        assert!(off > 1e-2, "{off}");
        // The rotated vectors themselves are the HF ones, channel-permuted.
        let q_gguf_as_hf = unpermute_rope_rows(
            &q_gguf
                .i(0)
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape((heads * d, len))
                .unwrap(),
            heads,
        )
        .unwrap();
        let q_hf_rows = q_hf
            .i(0)
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .reshape((heads * d, len))
            .unwrap();
        let diff: f32 = (q_gguf_as_hf - q_hf_rows)
            .unwrap()
            .abs()
            .unwrap()
            .max_keepdim(D::Minus1)
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn names_map_to_hugging_face_llama() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.0.attn_q.weight",
                "model.layers.0.self_attn.q_proj.weight",
            ),
            (
                "blk.12.attn_k.weight",
                "model.layers.12.self_attn.k_proj.weight",
            ),
            (
                "blk.3.attn_v.weight",
                "model.layers.3.self_attn.v_proj.weight",
            ),
            (
                "blk.29.attn_output.weight",
                "model.layers.29.self_attn.o_proj.weight",
            ),
            (
                "blk.1.ffn_gate.weight",
                "model.layers.1.mlp.gate_proj.weight",
            ),
            ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
            (
                "blk.1.ffn_down.weight",
                "model.layers.1.mlp.down_proj.weight",
            ),
            (
                "blk.7.attn_norm.weight",
                "model.layers.7.input_layernorm.weight",
            ),
            (
                "blk.7.ffn_norm.weight",
                "model.layers.7.post_attention_layernorm.weight",
            ),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_name(gguf).as_deref(), Some(hf), "{gguf}");
        }
        for unknown in [
            "rope_freqs.weight",
            "blk.x.attn_q.weight",
            "blk.0.attn_q.bias",
            "blk.0.ffn_gate_exps.weight",
        ] {
            assert_eq!(hf_name(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let path = PathBuf::from("m/x.gguf");
        let e = GgufError::TensorType {
            path: path.clone(),
            ggml_type: 20,
            name: ggml_type_name(20),
        };
        assert!(e.to_string().starts_with(
            "`m/x.gguf` holds a tensor of ggml type 20 (IQ4_NL), which this importer cannot read\nhint: "
        ));
        let e = GgufError::Unsupported {
            path,
            problems: vec![
                "tensor `a` is missing".into(),
                "tensor `b` is missing".into(),
            ],
        };
        assert_eq!(
            e.to_string(),
            "cannot import `m/x.gguf`:\n  - tensor `a` is missing\n  - tensor `b` is missing"
        );
        assert_eq!(ggml_type_name(3), "Q4_1");
        assert_eq!(ggml_type_name(30), "BF16");
        assert_eq!(ggml_type_name(99), "unknown");
    }
}
