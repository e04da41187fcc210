//! Causal language models with LoRA, on candle: the crate every other part
//! of trace-train runs a model through. Nothing here knows about datasets,
//! environments or training loops; the compiler keeps it so, since this
//! crate depends on nothing of the project's but `trace-train-base`.
//!
//! Owns loading a Hugging Face model folder (`config.json` plus
//! `model.safetensors` or a sharded `model.safetensors.index.json`) into a
//! [`LoadedModel`]: the architecture with frozen, mmapped base weights and,
//! optionally, LoRA factors in a `VarMap` (the only parameters an optimizer
//! should see). The folders, by concern:
//!
//! - [`arch`]: each architecture as a config adapter onto the shared decoder
//!   ([`arch::qwen3`], [`arch::llama`]) and [`arch::tiny`], small random
//!   models for tests.
//! - [`layers`]: the building blocks, one a file: [`layers::decoder`] (the
//!   decoder both architectures share, with gradient checkpointing),
//!   [`layers::attention`] (with the KV cache), [`layers::lora`],
//!   [`layers::nf4`], [`layers::norm`], [`layers::rope`], [`layers::ops`]
//!   (linear layers with hand-written backward passes), [`layers::fused`],
//!   [`layers::segments`] (packed rows).
//! - [`decode`]: batched decoding ([`decode::generate`], greedy or sampled),
//!   the scheduler's rows ([`decode::slots`]), prefill, the sampling rule
//!   ([`decode::draw`]) and, on CUDA, the fused decode step.
//! - [`cuda`]: the project's own CUDA kernels (`kernels/*.cu`, compiled by
//!   this crate's `build.rs`) and, with the `cudnn` feature, fused attention
//!   with a backward through cuDNN.
//! - [`io`]: adapters on disk in PEFT's format ([`io::adapter`]), finding a
//!   model folder ([`io::resolve`]), importing a llama.cpp GGUF ([`io::gguf`]).
//!
//! Tensor code takes its device from the weights or a `&Device`, so the same
//! code runs on CPU and CUDA.

pub mod arch;
pub mod cuda;
pub mod decode;
pub mod io;
pub mod layers;

/// Fused-attention graphs built so far in this process and the seconds
/// their builds took (one a new shape and direction; none without the
/// `cudnn` feature).
pub fn attention_graph_builds() -> (u64, f64) {
    #[cfg(feature = "cudnn")]
    {
        cuda::sdpa_cudnn::graph_builds()
    }
    #[cfg(not(feature = "cudnn"))]
    {
        (0, 0.0)
    }
}

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

pub use decode::generate::{Generation, Sampling, greedy, sample};
pub use io::resolve::resolve;
pub use layers::attention::Cache;
pub use layers::lora::{BaseLinear, LoraAdapter, LoraConfig, LoraInit, LoraLinear, TargetModule};

/// The model's configuration file.
pub const CONFIG_FILE: &str = "config.json";
/// A single-file checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// A model folder or adapter could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("missing `{}`\nhint: {hint}", path.display())]
    Missing { path: PathBuf, hint: String },
    #[error("cannot read `{}`: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write `{}`: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid `{}`: {message}\nhint: {hint}", path.display())]
    Parse {
        path: PathBuf,
        message: String,
        hint: String,
    },
    #[error("unsupported model in `{}`:\n{}", path.display(), list(problems))]
    Unsupported {
        path: PathBuf,
        problems: Vec<Unsupported>,
    },
    #[error("invalid LoRA config:\n{}", list(problems))]
    InvalidLora { problems: Vec<String> },
    #[error("the model has no LoRA adapter\nhint: load it with a LoRA config")]
    NoAdapter,
    #[error("adapter `{}` does not fit the model:\n{}", path.display(), list(problems))]
    AdapterMismatch {
        path: PathBuf,
        problems: Vec<String>,
    },
    #[error("unsupported dtype {dtype:?}\nhint: load models as f32, bf16 or f16")]
    Dtype { dtype: DType },
    #[error(
        "model `{spec}` is neither a folder nor in the Hugging Face cache `{}`\nhint: pass a folder holding `config.json`, or download the model into the cache (`hf download {spec}`)",
        cache.display()
    )]
    NotFound { spec: String, cache: PathBuf },
    #[error("cannot download `{repo}` from the Hugging Face hub: {message}")]
    Hub { repo: String, message: String },
    #[error("{context}: {source}")]
    Tensor {
        context: String,
        source: candle_core::Error,
    },
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|p| format!("  - {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// One `config.json` value this code cannot run.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported {
    pub field: String,
    pub value: String,
    pub hint: String,
}

impl Unsupported {
    pub fn new(field: &str, value: impl fmt::Display, hint: &str) -> Self {
        Self {
            field: field.to_owned(),
            value: value.to_string(),
            hint: hint.to_owned(),
        }
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "field `{}` is {}\n    hint: {}",
            self.field, self.value, self.hint
        )
    }
}

/// The architectures this module implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Qwen3,
    Llama,
}

impl Architecture {
    const KNOWN: [(Architecture, &'static str, &'static str); 2] = [
        (Self::Qwen3, "qwen3", "Qwen3ForCausalLM"),
        (Self::Llama, "llama", "LlamaForCausalLM"),
    ];

    /// Reads `model_type`, else `architectures[0]`, of a parsed `config.json`.
    fn detect(config: &serde_json::Value) -> std::result::Result<Self, Unsupported> {
        let supported =
            "supported: `qwen3` (Qwen3ForCausalLM), `llama` (LlamaForCausalLM, e.g. SmolLM2)";
        if let Some(model_type) = config.get("model_type").and_then(|v| v.as_str()) {
            return Self::KNOWN
                .iter()
                .find(|(_, t, _)| *t == model_type)
                .map(|(a, _, _)| *a)
                .ok_or_else(|| {
                    Unsupported::new("model_type", format!("`{model_type}`"), supported)
                });
        }
        let first = config
            .get("architectures")
            .and_then(|v| v.get(0))
            .and_then(|v| v.as_str());
        match first {
            Some(name) => Self::KNOWN
                .iter()
                .find(|(_, _, n)| *n == name)
                .map(|(a, _, _)| *a)
                .ok_or_else(|| Unsupported::new("architectures", format!("[`{name}`]"), supported)),
            None => Err(Unsupported::new(
                "model_type",
                "absent, and so is `architectures`",
                &format!("name the architecture; {supported}"),
            )),
        }
    }
}

/// A causal LM of one of the implemented architectures: the decoder they
/// share, built from the architecture's own config (`arch::qwen3::Config`,
/// `arch::llama::Config`: each reads its `config.json` and gives the decoder's
/// [`layers::decoder::Spec`]).
#[derive(Debug, Clone)]
pub struct Model {
    decoder: layers::decoder::Decoder,
    vocab_size: usize,
}

impl Model {
    fn build(
        spec: &layers::decoder::Spec,
        vb: VarBuilder,
        lora: Option<LoraInit>,
    ) -> candle_core::Result<Self> {
        Ok(Self {
            decoder: layers::decoder::Decoder::new(spec, vb, lora)?,
            vocab_size: spec.vocab_size,
        })
    }

    /// The decoder both architectures share.
    pub fn decoder(&self) -> &layers::decoder::Decoder {
        &self.decoder
    }

    pub fn decoder_mut(&mut self) -> &mut layers::decoder::Decoder {
        &mut self.decoder
    }

    /// `ids: (B, L)` u32, `attention_mask: (B, L)` (1 = token, 0 = right
    /// padding) -> logits `(B, L, vocab)`. `train` turns on LoRA dropout and
    /// gradient tracking of the factors.
    pub fn forward(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        train: bool,
    ) -> candle_core::Result<Tensor> {
        self.decoder().forward(ids, attention_mask, train)
    }

    /// As [`Self::forward`], stopping before `lm_head`: final-normed hidden
    /// states `(B, L, hidden)`, for losses that apply the head themselves
    /// (`train::loss::lm_head_cross_entropy`).
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        train: bool,
    ) -> candle_core::Result<Tensor> {
        self.decoder().forward_hidden(ids, attention_mask, train)
    }

    /// [`Self::forward_hidden`] over a packed row of several examples
    /// ([`layers::decoder::Decoder::forward_hidden_packed`]).
    pub fn forward_hidden_packed(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        segments: &layers::segments::Segments,
        train: bool,
    ) -> candle_core::Result<Tensor> {
        self.decoder()
            .forward_hidden_packed(ids, positions, segments, train)
    }

    /// The output projection `hidden -> vocab`.
    pub fn lm_head(&self) -> &BaseLinear {
        self.decoder().lm_head()
    }

    /// Backward pass from `loss`: every trainable tensor's gradient,
    /// including those computed inside checkpointed layers.
    pub fn backward(&self, loss: &Tensor) -> candle_core::Result<GradStore> {
        self.decoder().backward(loss)
    }

    /// Holds every projection's frozen weight in 4 bits (NF4 with double
    /// quantisation, as QLoRA); the adapters and everything else stay.
    pub fn quantize_base(&mut self) -> candle_core::Result<()> {
        self.decoder_mut().quantize_projections()
    }

    /// Turns per-layer gradient checkpointing on or off for training.
    pub fn set_gradient_checkpointing(&mut self, on: bool) {
        self.decoder_mut().set_checkpointing(on);
    }

    /// `ids: (B, L)` in columns `offset..`, reading and extending `cache`
    /// -> last-column logits `(B, vocab)`. A cache made with
    /// [`Cache::with_left_padding`] runs left-padded rows at their own
    /// positions.
    pub fn forward_with_cache(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Cache,
    ) -> candle_core::Result<Tensor> {
        self.decoder().forward_with_cache(ids, offset, cache)
    }

    /// [`Self::forward_with_cache`] through decoding's folded weights.
    pub fn forward_with_view(
        &self,
        ids: &Tensor,
        offset: usize,
        cache: &mut Cache,
        view: &layers::decoder::DecodeView,
    ) -> candle_core::Result<Tensor> {
        self.decoder().forward_with_view(ids, offset, cache, view)
    }

    /// Decoding's folded weights from the LoRA factors' current values
    /// ([`layers::decoder::DecodeView`]).
    pub fn decode_view(&self) -> candle_core::Result<layers::decoder::DecodeView> {
        self.decoder().decode_view()
    }

    /// An empty KV cache for this model; see [`Cache`] for capacity and
    /// padding.
    pub fn new_cache(&self) -> Cache {
        self.decoder().new_cache()
    }

    /// Every q/k/v/o/gate/up/down projection, in checkpoint order.
    pub fn projections(&self) -> Vec<&LoraLinear> {
        self.decoder().projections()
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// A model ready to run or train.
pub struct LoadedModel {
    pub model: Model,
    pub architecture: Architecture,
    /// LoRA factors only; empty without LoRA.
    pub varmap: VarMap,
    pub lora: Option<LoraConfig>,
    /// The folder the base weights came from.
    pub dir: PathBuf,
    pub dtype: DType,
    pub device: Device,
}

impl fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("LoadedModel")
            .field("architecture", &self.architecture)
            .field("dir", &self.dir)
            .field("dtype", &self.dtype)
            .field("lora", &self.lora)
            .field("trainable_vars", &self.varmap.all_vars().len())
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// The LoRA factors with their names, sorted by name: what the
    /// optimizer trains.
    pub fn named_trainable_vars(&self) -> Vec<(String, Var)> {
        let vars = self.varmap.data().lock().expect("VarMap lock poisoned");
        let mut named: Vec<_> = vars.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }

    /// [`Self::named_trainable_vars`] without the names.
    pub fn trainable_vars(&self) -> Vec<Var> {
        self.named_trainable_vars()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }
}

/// Loads the model in `dir` as `dtype` onto `device`, with fresh LoRA
/// factors (B = 0) on the projections `lora` targets.
pub fn load(
    dir: &Path,
    lora: Option<&LoraConfig>,
    dtype: DType,
    device: &Device,
) -> Result<LoadedModel> {
    if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return Err(ModelError::Dtype { dtype });
    }
    let (_, config) = read_config(dir)?;
    let files = weight_files(dir)?;
    // SAFETY: the files are mapped read-only; they must not change while the
    // model lives, as with any mmapped checkpoint.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device) }.map_err(
        |source| ModelError::Tensor {
            context: format!("cannot map the weights in `{}`", dir.display()),
            source,
        },
    )?;
    build(config, vb, lora, dtype, device, dir)
}

/// Builds a model from a parsed `config.json` and the weights `vb` serves
/// (a checkpoint's, or random ones for benchmarks), with fresh LoRA
/// factors on the projections `lora` targets. `dir` names the model in
/// errors and in the result.
pub fn build(
    config: serde_json::Value,
    vb: VarBuilder,
    lora: Option<&LoraConfig>,
    dtype: DType,
    device: &Device,
    dir: &Path,
) -> Result<LoadedModel> {
    if let Some(problems) = lora.map(LoraConfig::problems).filter(|p| !p.is_empty()) {
        return Err(ModelError::InvalidLora { problems });
    }
    let architecture = Architecture::detect(&config).map_err(|p| ModelError::Unsupported {
        path: dir.join(CONFIG_FILE),
        problems: vec![p],
    })?;
    let varmap = VarMap::new();
    let init = lora.map(|config| LoraInit {
        config,
        varmap: &varmap,
    });
    let config_path = dir.join(CONFIG_FILE);
    let typed = |e: serde_json::Error| ModelError::Parse {
        path: config_path.clone(),
        message: e.to_string(),
        hint: "the file does not match the architecture its `model_type` names".to_owned(),
    };
    let model = match architecture {
        Architecture::Qwen3 => {
            let cfg: arch::qwen3::Config = serde_json::from_value(config).map_err(typed)?;
            check_supported(&config_path, cfg.unsupported())?;
            Model::build(&cfg.spec(), vb, init)
        }
        Architecture::Llama => {
            let cfg: arch::llama::Config = serde_json::from_value(config).map_err(typed)?;
            check_supported(&config_path, cfg.unsupported())?;
            Model::build(&cfg.spec(), vb, init)
        }
    }
    .map_err(|source| ModelError::Tensor {
        context: format!(
            "cannot build the model from the weights in `{}`",
            dir.display()
        ),
        source,
    })?;
    Ok(LoadedModel {
        model,
        architecture,
        varmap,
        lora: lora.cloned(),
        dir: dir.to_owned(),
        dtype,
        device: device.clone(),
    })
}

fn check_supported(path: &Path, problems: Vec<Unsupported>) -> Result<()> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ModelError::Unsupported {
            path: path.to_owned(),
            problems,
        })
    }
}

/// Reads `dir/config.json`: its architecture and the whole JSON object.
/// Rejects checkpoints whose stored dtype is not a plain float format.
fn read_config(dir: &Path) -> Result<(Architecture, serde_json::Value)> {
    let path = dir.join(CONFIG_FILE);
    let value = read_json(
        &path,
        "a model folder holds `config.json` and its safetensors weights",
    )?;
    let mut problems = Vec::new();
    let architecture = Architecture::detect(&value)
        .map_err(|p| problems.push(p))
        .ok();
    for field in ["torch_dtype", "dtype"] {
        if let Some(stored) = value.get(field).and_then(|v| v.as_str())
            && !matches!(stored, "float32" | "float16" | "bfloat16")
        {
            problems.push(Unsupported::new(
                field,
                format!("`{stored}`"),
                "only float32, float16 and bfloat16 checkpoints load; use an unquantised checkpoint",
            ));
        }
    }
    if value
        .get("quantization_config")
        .is_some_and(|v| !v.is_null())
    {
        problems.push(Unsupported::new(
            "quantization_config",
            "present",
            "quantised checkpoints are not supported yet; use an unquantised checkpoint",
        ));
    }
    match architecture {
        Some(a) if problems.is_empty() => Ok((a, value)),
        _ => Err(ModelError::Unsupported { path, problems }),
    }
}

/// Reads a JSON file; `missing_hint` explains a missing file.
pub(crate) fn read_json(path: &Path, missing_hint: &str) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            ModelError::Missing {
                path: path.to_owned(),
                hint: missing_hint.to_owned(),
            }
        } else {
            ModelError::Read {
                path: path.to_owned(),
                source,
            }
        }
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
        hint: "the file must be a JSON object".to_owned(),
    })
}

/// The largest absolute elementwise difference of two same-shaped tensors
/// (tests: this crate's and those of the parts built on it).
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .and_then(|d| d.abs()?.max_all()?.to_dtype(DType::F32)?.to_scalar())
        .expect("tensors of the same shape")
}

/// The safetensors files of the checkpoint in `dir`: the shards its index
/// names, else `model.safetensors`.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index_path = dir.join(WEIGHTS_INDEX_FILE);
    if index_path.exists() {
        let index = read_json(&index_path, "")?;
        let Some(map) = index.get("weight_map").and_then(|m| m.as_object()) else {
            return Err(ModelError::Parse {
                path: index_path,
                message: "no `weight_map` object".to_owned(),
                hint: "a shard index maps each tensor name to its file under `weight_map`"
                    .to_owned(),
            });
        };
        let shards: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        let files: Vec<PathBuf> = shards.into_iter().map(|s| dir.join(s)).collect();
        if let Some(missing) = files.iter().find(|f| !f.exists()) {
            return Err(ModelError::Missing {
                path: missing.clone(),
                hint: format!(
                    "`{}` names this shard; copy every shard into the folder",
                    index_path.display()
                ),
            });
        }
        return Ok(files);
    }
    let single = dir.join(WEIGHTS_FILE);
    if single.exists() {
        return Ok(vec![single]);
    }
    let hint = if dir.join("pytorch_model.bin").exists() {
        "only safetensors checkpoints load; convert `pytorch_model.bin` to `model.safetensors`"
    } else {
        "a model folder holds `model.safetensors`, or `model.safetensors.index.json` and its shards"
    };
    Err(ModelError::Missing {
        path: single,
        hint: hint.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn architecture_comes_from_model_type_or_architectures() {
        let detect = |v| Architecture::detect(&v);
        assert_eq!(
            detect(json!({"model_type": "qwen3"})),
            Ok(Architecture::Qwen3)
        );
        assert_eq!(
            detect(json!({"architectures": ["LlamaForCausalLM"]})),
            Ok(Architecture::Llama)
        );
        assert_eq!(
            detect(json!({"model_type": "gpt2"})).unwrap_err().field,
            "model_type"
        );
        assert_eq!(
            detect(json!({"architectures": ["Foo"]})).unwrap_err().field,
            "architectures"
        );
        assert_eq!(detect(json!({})).unwrap_err().field, "model_type");
    }

    #[test]
    fn unsupported_messages_list_field_and_hint() {
        let err = ModelError::Unsupported {
            path: "m/config.json".into(),
            problems: vec![Unsupported::new(
                "hidden_act",
                "`gelu`",
                "only `silu` is implemented",
            )],
        };
        assert_eq!(
            err.to_string(),
            "unsupported model in `m/config.json`:\n  - field `hidden_act` is `gelu`\n    hint: only `silu` is implemented"
        );
    }
}
