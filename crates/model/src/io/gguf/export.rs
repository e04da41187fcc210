//! Exporting a Hugging Face model folder (Llama or Qwen3, as `crate::arch`
//! reads them), optionally with a LoRA adapter merged in, as a llama.cpp
//! GGUF (version 3) that llama.cpp and Ollama run.
//!
//! The file holds what llama.cpp's `convert_hf_to_gguf.py` writes for these
//! architectures: `general.*` (architecture, name, file type), the
//! `<arch>.*` hyperparameters (context, embedding and feed-forward lengths,
//! block count, head counts, RoPE base, RMS epsilon; Qwen3's key and value
//! lengths), the tokenizer (`tokenizer.ggml.*` and the chat template, see
//! `hf_vocab`), and the tensors under llama.cpp's names: the importer's
//! [`super::hf_name`] read backwards, Llama's q and k rows permuted with
//! [`super::permute_rope_rows`] (the importer's module header explains
//! why), one-dimensional tensors (norms) kept in f32 as the converter
//! keeps them. A tied `lm_head` is left out, as llama.cpp expects.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::Serialize;

use super::writer::{self, MetaValue, TensorEntry, TensorType};
use super::{GgufArch, Shapes, expected_tensors, hf_name, permute_rope_rows};
use crate::arch::Architecture;
use crate::io::adapter;

/// The tensor type asked for (`--outtype`); norms stay f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    BF16,
    Q8_0,
}

impl OutType {
    fn tensor_type(self) -> TensorType {
        match self {
            Self::F32 => TensorType::F32,
            Self::F16 => TensorType::F16,
            Self::BF16 => TensorType::BF16,
            Self::Q8_0 => TensorType::Q8_0,
        }
    }

    /// llama.cpp's `general.file_type` (`enum llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q8_0 => 7,
            Self::BF16 => 32,
        }
    }
}

/// A model folder that cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot export `{}` as a GGUF:\n{}", dir.display(), crate::common::list(problems))]
    Unsupported { dir: PathBuf, problems: Vec<String> },
    #[error(
        "`{}` exists\nhint: choose another file name, or pass --force to replace it",
        path.display()
    )]
    Exists { path: PathBuf },
    #[error("cannot write `{}`: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What [`export_gguf`] wrote.
#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub model: PathBuf,
    pub adapter: Option<PathBuf>,
    pub file: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
    pub tensors: usize,
    pub parameters: usize,
    /// How many tensors were stored in each type (`F32`, `Q8_0`, ...).
    pub types: BTreeMap<String, usize>,
    pub vocab_size: usize,
    /// `tokenizer.ggml.pre`.
    pub pre_tokenizer: String,
    pub chat_template: bool,
    /// Choices the export made that a user should know about.
    pub notes: Vec<String>,
}

/// Writes the model in `model_dir` (with the adapter in `adapter_dir`
/// merged, when given) to the GGUF `file`, its tensors stored as
/// `outtype`. Refuses an existing `file` unless `force`. The file appears
/// whole or not at all: it is written beside as a hidden partial file and
/// renamed.
pub fn export_gguf(
    model_dir: &Path,
    adapter_dir: Option<&Path>,
    file: &Path,
    outtype: OutType,
    force: bool,
) -> anyhow::Result<ExportReport> {
    if file.exists() && !force {
        return Err(ExportError::Exists {
            path: file.to_owned(),
        }
        .into());
    }
    let (architecture, spec) = crate::arch::read_spec(model_dir)?;
    let arch = match architecture {
        Architecture::Llama => GgufArch::Llama,
        Architecture::Qwen3 => GgufArch::Qwen3,
    };
    let mut problems = Vec::new();
    for (on, field) in [
        (spec.attention_bias, "attention_bias"),
        (spec.mlp_bias, "mlp_bias"),
    ] {
        if on {
            problems.push(format!(
                "`{field}` is true; biases are not exported (llama.cpp's llama and qwen3 have none)"
            ));
        }
    }
    let vocab = super::hf_vocab::read_hf_vocab(model_dir, spec.vocab_size, &mut problems);
    let unsupported = |problems| ExportError::Unsupported {
        dir: model_dir.to_owned(),
        problems,
    };
    let Some(vocab) = vocab.filter(|_| problems.is_empty()) else {
        return Err(unsupported(problems).into());
    };

    let mut weights = match adapter_dir {
        Some(a) => {
            let loaded = adapter::load(model_dir, a, DType::F32, &Device::Cpu)?;
            adapter::merged_tensors(&loaded, None)?
        }
        None => read_weights(model_dir)?,
    };
    let shapes = Shapes {
        vocab: spec.vocab_size,
        hidden: spec.hidden_size,
        intermediate: spec.intermediate_size,
        layers: spec.num_hidden_layers,
        heads: spec.num_attention_heads,
        kv_heads: spec.num_key_value_heads,
        head_dim: spec.head_dim,
    };
    let mut notes = Vec::new();
    if vocab.nfc {
        notes.push(
            "`tokenizer.json` normalizes text to Unicode NFC; llama.cpp does not, so text not in NFC may tokenize differently there".to_owned(),
        );
    }
    let tied = spec.tie_word_embeddings || !weights.contains_key("lm_head.weight");
    if tied && !spec.tie_word_embeddings {
        notes.push("no `lm_head.weight`: the output is tied to the embeddings".to_owned());
    }
    let mut plan = Vec::new();
    for (gguf, (shape, rope_heads)) in expected_tensors(arch, &shapes, tied) {
        let hf = hf_name(&gguf).expect("every expected name maps");
        match weights.remove(&hf) {
            None => problems.push(format!("tensor `{hf}` is missing")),
            Some(t) if t.dims() != shape.as_slice() => problems.push(format!(
                "tensor `{hf}` has shape {:?}; `config.json` implies {shape:?}",
                t.dims()
            )),
            Some(t) => plan.push((gguf, shape, rope_heads, t)),
        }
    }
    if tied {
        weights.remove("lm_head.weight");
    }
    let mut left: Vec<_> = weights
        .into_keys()
        .filter(|n| !n.ends_with("rotary_emb.inv_freq"))
        .collect();
    left.sort();
    problems.extend(
        left.into_iter()
            .map(|n| format!("tensor `{n}` has no llama.cpp name")),
    );
    if !problems.is_empty() {
        return Err(unsupported(problems).into());
    }
    // llama.cpp's order: the embeddings, the blocks in order, then the rest.
    plan.sort_by_key(|(gguf, ..)| gguf_order(gguf));

    let asked = outtype.tensor_type();
    let mut entries = Vec::new();
    let mut types = BTreeMap::new();
    let mut parameters = 0;
    let mut fallback = 0;
    for (gguf, shape, _, _) in &plan {
        let ty = if shape.len() == 1 {
            TensorType::F32
        } else if asked.fits(shape[shape.len() - 1]) {
            asked
        } else {
            fallback += 1;
            TensorType::F16
        };
        *types.entry(ty.name().to_owned()).or_insert(0) += 1;
        parameters += shape.iter().product::<usize>();
        entries.push(TensorEntry {
            name: gguf.clone(),
            shape: shape.clone(),
            ty,
        });
    }
    if fallback > 0 {
        notes.push(format!(
            "{fallback} tensors have rows not a multiple of 32 values and are stored as F16 instead of Q8_0, as llama.cpp's converter does"
        ));
    }

    let name = model_dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".to_owned());
    let metadata = metadata(arch, &spec, &name, outtype, &vocab);

    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| ExportError::Write { path, source }
    };
    let partial = partial_path(file);
    let result = (|| -> anyhow::Result<()> {
        let f = File::create(&partial).map_err(write_err(&partial))?;
        let mut w = BufWriter::new(f);
        writer::write::<_, anyhow::Error>(&mut w, &metadata, &entries, |i| {
            let (gguf, _, rope_heads, t) = &plan[i];
            let t = match rope_heads {
                Some(heads) => permute_rope_rows(t, *heads)?,
                None => t.clone(),
            };
            let values = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>();
            values.map_err(|e| anyhow::anyhow!("tensor `{gguf}`: {e}"))
        })?;
        let f = w
            .into_inner()
            .map_err(|e| write_err(&partial)(e.into_error()))?;
        f.sync_all().map_err(write_err(&partial))?;
        std::fs::rename(&partial, file).map_err(write_err(file))?;
        Ok(())
    })();
    if result.is_err() {
        // Only the partial file, which this call created.
        let _ = std::fs::remove_file(&partial);
    }
    result?;
    Ok(ExportReport {
        model: model_dir.to_owned(),
        adapter: adapter_dir.map(Path::to_owned),
        file: file.to_owned(),
        architecture: arch.name().to_owned(),
        tensors: entries.len(),
        parameters,
        types,
        vocab_size: vocab.tokens.len(),
        pre_tokenizer: vocab.pre.to_owned(),
        chat_template: vocab.chat_template.is_some(),
        notes,
    })
}

/// `.NAME.partial` beside `file`.
fn partial_path(file: &Path) -> PathBuf {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    file.with_file_name(format!(".{name}.partial"))
}

/// Sort key: `token_embd` first, the blocks by number, then the rest.
fn gguf_order(name: &str) -> (usize, String) {
    if name == "token_embd.weight" {
        return (0, String::new());
    }
    match name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(n, rest)| Some((n.parse::<usize>().ok()?, rest)))
    {
        Some((n, rest)) => (1 + n, rest.to_owned()),
        None => (usize::MAX, name.to_owned()),
    }
}

/// Every tensor of the checkpoint in `dir`, on the host.
fn read_weights(dir: &Path) -> anyhow::Result<HashMap<String, Tensor>> {
    let mut weights = HashMap::new();
    for file in crate::common::weight_files(dir)? {
        let tensors = candle_core::safetensors::load(&file, &Device::Cpu)
            .map_err(|e| anyhow::anyhow!("cannot read `{}`: {e}", file.display()))?;
        weights.extend(tensors);
    }
    Ok(weights)
}

/// The `general.*`, `<arch>.*` and `tokenizer.*` metadata.
fn metadata(
    arch: GgufArch,
    spec: &crate::layers::decoder::Spec,
    name: &str,
    outtype: OutType,
    vocab: &super::hf_vocab::HfVocab,
) -> Vec<(String, MetaValue)> {
    let a = arch.name();
    let u = |v: usize| MetaValue::U32(v as u32);
    let mut md = vec![
        (
            "general.architecture".to_owned(),
            MetaValue::Str(a.to_owned()),
        ),
        (
            "general.type".to_owned(),
            MetaValue::Str("model".to_owned()),
        ),
        ("general.name".to_owned(), MetaValue::Str(name.to_owned())),
        (
            "general.file_type".to_owned(),
            MetaValue::U32(outtype.file_type()),
        ),
        ("general.quantization_version".to_owned(), MetaValue::U32(2)),
    ];
    let mut hp = vec![
        ("vocab_size", u(spec.vocab_size)),
        ("context_length", u(spec.max_position_embeddings)),
        ("embedding_length", u(spec.hidden_size)),
        ("block_count", u(spec.num_hidden_layers)),
        ("feed_forward_length", u(spec.intermediate_size)),
        ("attention.head_count", u(spec.num_attention_heads)),
        ("attention.head_count_kv", u(spec.num_key_value_heads)),
        ("rope.freq_base", MetaValue::F32(spec.rope_theta as f32)),
        (
            "attention.layer_norm_rms_epsilon",
            MetaValue::F32(spec.rms_norm_eps as f32),
        ),
    ];
    if arch == GgufArch::Llama {
        hp.push(("rope.dimension_count", u(spec.head_dim)));
    }
    if arch == GgufArch::Qwen3 || spec.head_dim * spec.num_attention_heads != spec.hidden_size {
        hp.push(("attention.key_length", u(spec.head_dim)));
        hp.push(("attention.value_length", u(spec.head_dim)));
    }
    md.extend(hp.into_iter().map(|(k, v)| (format!("{a}.{k}"), v)));
    md.extend(vocab.metadata());
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_come_in_llama_cpp_order() {
        let mut names = vec![
            "output.weight",
            "blk.10.attn_q.weight",
            "output_norm.weight",
            "blk.2.ffn_up.weight",
            "token_embd.weight",
            "blk.2.attn_k.weight",
        ];
        names.sort_by_key(|n| gguf_order(n));
        assert_eq!(
            names,
            [
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.ffn_up.weight",
                "blk.10.attn_q.weight",
                "output.weight",
                "output_norm.weight",
            ]
        );
        assert_eq!(
            partial_path(Path::new("out/m.gguf")),
            Path::new("out/.m.gguf.partial")
        );
    }
}
