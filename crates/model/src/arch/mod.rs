//! The model: each architecture reads its `config.json` into the shared
//! decoder's spec ([`qwen3`], [`llama`]; tiny random models for tests in
//! [`tiny`]), [`Model`] is the decoder built from it, and [`load`] makes a
//! [`LoadedModel`] of a model folder (frozen base weights, LoRA factors).

pub mod llama;
pub mod qwen3;
pub mod tiny;

use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use crate::common::{CONFIG_FILE, ModelError, Result, Unsupported, read_json, weight_files};
use crate::layers;
use crate::layers::attention::Cache;
use crate::layers::lora::{BaseLinear, LoraConfig, LoraInit, LoraLinear};

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
/// share, built from the architecture's own config (`qwen3::Config`,
/// `llama::Config`: each reads its `config.json` and gives the decoder's
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

    /// Holds every projection's frozen weight in `precision` (4 bits: NF4
    /// with double quantisation, as QLoRA; 8 bits: FP8); the adapters and
    /// everything else stay.
    pub fn hold_base(
        &mut self,
        precision: crate::layers::lora::BasePrecision,
    ) -> candle_core::Result<()> {
        self.decoder_mut().hold_projections(precision)
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
    let spec = spec_of(architecture, config, &dir.join(CONFIG_FILE))?;
    let model = Model::build(&spec, vb, init).map_err(|source| ModelError::Tensor {
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

/// The architecture and decoder shape of the model in `dir`, read from its
/// `config.json` and checked as [`load`] checks them, without the weights.
pub fn read_spec(dir: &Path) -> Result<(Architecture, layers::decoder::Spec)> {
    let (architecture, config) = read_config(dir)?;
    let spec = spec_of(architecture, config, &dir.join(CONFIG_FILE))?;
    Ok((architecture, spec))
}

/// The decoder `config` (the file `config_path`) describes, through its
/// architecture's config adapter.
fn spec_of(
    architecture: Architecture,
    config: serde_json::Value,
    config_path: &Path,
) -> Result<layers::decoder::Spec> {
    let typed = |e: serde_json::Error| ModelError::Parse {
        path: config_path.to_owned(),
        message: e.to_string(),
        hint: "the file does not match the architecture its `model_type` names".to_owned(),
    };
    match architecture {
        Architecture::Qwen3 => {
            let cfg: qwen3::Config = serde_json::from_value(config).map_err(typed)?;
            check_supported(config_path, cfg.unsupported())?;
            Ok(cfg.spec())
        }
        Architecture::Llama => {
            let cfg: llama::Config = serde_json::from_value(config).map_err(typed)?;
            check_supported(config_path, cfg.unsupported())?;
            Ok(cfg.spec())
        }
    }
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
