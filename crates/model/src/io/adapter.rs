//! LoRA adapters on disk in PEFT's format, and merging them into the base.
//!
//! An adapter folder holds `adapter_config.json` (PEFT's `LoraConfig`:
//! `peft_type` LORA, `r`, `lora_alpha`, `lora_dropout`, `target_modules`,
//! ...) and `adapter_model.safetensors` with PEFT's tensor names,
//! `base_model.model.<module>.lora_A.weight` / `.lora_B.weight`, so that
//! PEFT's `PeftModel.from_pretrained` reads what [`save`] writes and [`load`]
//! reads what PEFT writes (for the options implemented here).
//!
//! [`merge`] writes a plain model folder with `W + (alpha / r) B A` in place
//! of each adapted weight, in the checkpoint's own dtype ([`merge_as`]: in
//! a dtype of the caller's choice), loadable by [`crate::arch::load`] and
//! by transformers.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::{
    arch::LoadedModel, common::CONFIG_FILE, common::ModelError, common::Result,
    common::Unsupported, common::WEIGHTS_FILE, layers::lora::LoraConfig,
    layers::lora::TargetModule,
};

pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// PEFT's prefix in front of the base model's module paths.
const PEFT_PREFIX: &str = "base_model.model.";
/// Files besides the weights that a merged folder keeps, when present.
pub const COPIED_FILES: [&str; 8] = [
    CONFIG_FILE,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
];

/// PEFT's `adapter_config.json`: the fields written, and the ones that must
/// keep their defaults for [`load`] to read the adapter. Others are ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterConfig {
    pub peft_type: String,
    #[serde(default)]
    pub task_type: Option<String>,
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    pub r: usize,
    pub lora_alpha: f64,
    #[serde(default)]
    pub lora_dropout: f32,
    pub target_modules: Vec<String>,
    #[serde(default = "bias_none")]
    pub bias: String,
    #[serde(default)]
    pub fan_in_fan_out: bool,
    #[serde(default)]
    pub use_rslora: bool,
    #[serde(default)]
    pub use_dora: bool,
    #[serde(default)]
    pub lora_bias: bool,
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    #[serde(default)]
    pub layers_to_transform: Option<serde_json::Value>,
    #[serde(default)]
    pub rank_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub alpha_pattern: BTreeMap<String, serde_json::Value>,
    #[serde(default = "yes")]
    pub inference_mode: bool,
}

fn bias_none() -> String {
    "none".to_owned()
}

fn yes() -> bool {
    true
}

impl AdapterConfig {
    /// The config PEFT would write for `lora` on the base `base_model`.
    pub fn from_lora(lora: &LoraConfig, base_model: &str) -> Self {
        let mut targets: Vec<TargetModule> = lora.target_modules.clone();
        targets.sort();
        targets.dedup();
        Self {
            peft_type: "LORA".to_owned(),
            task_type: Some("CAUSAL_LM".to_owned()),
            base_model_name_or_path: Some(base_model.to_owned()),
            r: lora.r,
            lora_alpha: lora.alpha,
            lora_dropout: lora.dropout,
            target_modules: targets.iter().map(|t| t.as_str().to_owned()).collect(),
            bias: bias_none(),
            fan_in_fan_out: false,
            use_rslora: false,
            use_dora: false,
            lora_bias: false,
            modules_to_save: None,
            layers_to_transform: None,
            rank_pattern: BTreeMap::new(),
            alpha_pattern: BTreeMap::new(),
            inference_mode: true,
        }
    }

    /// The LoRA config this adapter needs, or every option it uses that is
    /// not implemented.
    pub fn to_lora(&self) -> std::result::Result<LoraConfig, Vec<Unsupported>> {
        let mut problems = Vec::new();
        let mut unsupported = |field: &str, value: String, hint: &str| {
            problems.push(Unsupported::new(field, value, hint))
        };
        if self.peft_type != "LORA" {
            unsupported(
                "peft_type",
                format!("`{}`", self.peft_type),
                "only LORA adapters load",
            );
        }
        if self.bias != "none" {
            unsupported(
                "bias",
                format!("`{}`", self.bias),
                "only `none` is implemented",
            );
        }
        for (field, on) in [
            ("fan_in_fan_out", self.fan_in_fan_out),
            ("use_rslora", self.use_rslora),
            ("use_dora", self.use_dora),
            ("lora_bias", self.lora_bias),
        ] {
            if on {
                unsupported(
                    field,
                    "true".to_owned(),
                    "not implemented; train the adapter without it",
                );
            }
        }
        if self.modules_to_save.as_ref().is_some_and(|m| !m.is_empty()) {
            unsupported(
                "modules_to_save",
                format!("{:?}", self.modules_to_save),
                "fully trained modules are not implemented",
            );
        }
        if self
            .layers_to_transform
            .as_ref()
            .is_some_and(|l| !l.is_null())
        {
            unsupported(
                "layers_to_transform",
                format!("{:?}", self.layers_to_transform),
                "adapters must cover every layer",
            );
        }
        if !self.rank_pattern.is_empty() || !self.alpha_pattern.is_empty() {
            unsupported(
                "rank_pattern",
                "non-empty".to_owned(),
                "per-module ranks and alphas are not implemented",
            );
        }
        let mut targets = Vec::new();
        for name in &self.target_modules {
            match TargetModule::parse(name) {
                Some(t) => targets.push(t),
                None => unsupported(
                    "target_modules",
                    format!("`{name}`"),
                    "only q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and down_proj can be adapted",
                ),
            }
        }
        if problems.is_empty() {
            Ok(LoraConfig {
                r: self.r,
                alpha: self.lora_alpha,
                dropout: self.lora_dropout,
                target_modules: targets,
                seed: 0,
            })
        } else {
            Err(problems)
        }
    }
}

/// Writes `model`'s adapter into `dir` (created if needed);
/// `base_model` goes into `base_model_name_or_path`.
pub fn save(model: &LoadedModel, dir: &Path, base_model: &str) -> Result<()> {
    let Some(lora) = &model.lora else {
        return Err(ModelError::NoAdapter);
    };
    let mut tensors = HashMap::new();
    for proj in model.model.projections() {
        if let Some(ad) = proj.adapter() {
            let name = format!("{PEFT_PREFIX}{}", proj.name());
            tensors.insert(
                format!("{name}.lora_A.weight"),
                to_cpu(ad.a.as_detached_tensor())?,
            );
            tensors.insert(
                format!("{name}.lora_B.weight"),
                to_cpu(ad.b.as_detached_tensor())?,
            );
        }
    }
    create_dir(dir)?;
    let config = AdapterConfig::from_lora(lora, base_model);
    write_file(
        &dir.join(ADAPTER_CONFIG_FILE),
        serde_json::to_string_pretty(&config).expect("serialises"),
    )?;
    save_tensors(&tensors, &dir.join(ADAPTER_WEIGHTS_FILE))
}

/// Loads the base model in `base_dir` with the adapter in `adapter_dir`.
pub fn load(
    base_dir: &Path,
    adapter_dir: &Path,
    dtype: DType,
    device: &Device,
) -> Result<LoadedModel> {
    let (config, lora) = read_config(adapter_dir)?;
    let model = crate::arch::load(base_dir, Some(&lora), dtype, device)?;
    let factors = read_factors(adapter_dir, &config, &lora, &model, base_dir, device)?;
    for proj in model.model.projections() {
        let Some(ad) = proj.adapter() else { continue };
        let (a, b) = &factors[proj.name()];
        for (suffix, var, t) in [("lora_A", &ad.a, a), ("lora_B", &ad.b, b)] {
            t.to_dtype(DType::F32)
                .and_then(|t| var.set(&t))
                .map_err(|source| ModelError::Tensor {
                    context: format!("cannot set `{PEFT_PREFIX}{}.{suffix}.weight`", proj.name()),
                    source,
                })?;
        }
    }
    Ok(model)
}

/// Loads the base model in `base_dir` once with every adapter in
/// `adapter_dirs` beside it, unmerged: a forward runs each batch row
/// through the adapter [`crate::layers::lora::with_row_adapters`] names
/// (0: the base alone; `k`: `adapter_dirs[k - 1]`). What `serve` runs when
/// it serves several adapters. The adapters may differ in rank, scale and
/// target modules.
pub fn load_bank(
    base_dir: &Path,
    adapter_dirs: &[PathBuf],
    dtype: DType,
    device: &Device,
) -> Result<LoadedModel> {
    let mut model = crate::arch::load(base_dir, None, dtype, device)?;
    let mut adapters = Vec::with_capacity(adapter_dirs.len());
    for dir in adapter_dirs {
        let (config, lora) = read_config(dir)?;
        let factors = read_factors(dir, &config, &lora, &model, base_dir, device)?;
        adapters.push((lora, factors));
    }
    let rank = adapters
        .iter()
        .map(|(l, _)| l.r)
        .max()
        .unwrap_or(1)
        .div_ceil(8)
        * 8;
    for proj in model.model.decoder_mut().projections_mut() {
        let bank =
            bank_of(proj, &adapters, rank, dtype, device).map_err(|source| ModelError::Tensor {
                context: format!("cannot put the adapters of `{}` side by side", proj.name()),
                source,
            })?;
        proj.set_bank(bank);
    }
    Ok(model)
}

/// `proj`'s factors of every adapter as blocks of `rank` (see
/// [`crate::layers::lora::AdapterBank`]).
fn bank_of(
    proj: &crate::layers::lora::LoraLinear,
    adapters: &[(LoraConfig, Factors)],
    rank: usize,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<crate::layers::lora::AdapterBank> {
    let (out, inp) = proj.base().dims()?;
    let (mut a_blocks, mut b_blocks) = (Vec::new(), Vec::new());
    for (lora, factors) in adapters {
        let (a, b) = match factors.get(proj.name()) {
            Some((a, b)) => {
                let pad = rank - lora.r;
                let scaled = (b.to_dtype(DType::F32)? * lora.scale())?;
                (
                    a.to_dtype(DType::F32)?.pad_with_zeros(0, 0, pad)?,
                    scaled.pad_with_zeros(1, 0, pad)?,
                )
            }
            None => (
                Tensor::zeros((rank, inp), DType::F32, device)?,
                Tensor::zeros((out, rank), DType::F32, device)?,
            ),
        };
        a_blocks.push(a);
        b_blocks.push(b);
    }
    Ok(crate::layers::lora::AdapterBank {
        a: Tensor::cat(&a_blocks, 0)?.to_dtype(dtype)?,
        b: Tensor::cat(&b_blocks, 1)?.to_dtype(dtype)?,
        rank,
        count: adapters.len(),
    })
}

/// An adapter's `(A, B)` of each projection it adapts, by module path.
type Factors = HashMap<String, (Tensor, Tensor)>;

/// An adapter folder's `adapter_config.json`, and the LoRA it describes.
fn read_config(adapter_dir: &Path) -> Result<(AdapterConfig, LoraConfig)> {
    let config_path = adapter_dir.join(ADAPTER_CONFIG_FILE);
    let value = crate::common::read_json(
        &config_path,
        "an adapter folder holds `adapter_config.json` and `adapter_model.safetensors`",
    )?;
    let config: AdapterConfig = serde_json::from_value(value).map_err(|e| ModelError::Parse {
        path: config_path.clone(),
        message: e.to_string(),
        hint: "expected PEFT's LoraConfig fields; `target_modules` must be a list of names"
            .to_owned(),
    })?;
    let lora = config
        .to_lora()
        .map_err(|problems| ModelError::Unsupported {
            path: config_path,
            problems,
        })?;
    Ok((config, lora))
}

/// The factors `(A, B)` of each projection `lora` targets, by module path,
/// read from `adapter_dir` and checked against `model`'s projections: every
/// tensor present with its shape, none left over.
fn read_factors(
    adapter_dir: &Path,
    config: &AdapterConfig,
    lora: &LoraConfig,
    model: &LoadedModel,
    base_dir: &Path,
    device: &Device,
) -> Result<Factors> {
    let weights_path = adapter_dir.join(ADAPTER_WEIGHTS_FILE);
    if !weights_path.exists() {
        return Err(ModelError::Missing {
            path: weights_path,
            hint: "an adapter folder holds `adapter_config.json` and `adapter_model.safetensors`"
                .to_owned(),
        });
    }
    let mut stored = candle_core::safetensors::load(&weights_path, device).map_err(|source| {
        ModelError::Tensor {
            context: format!("cannot read `{}`", weights_path.display()),
            source,
        }
    })?;
    let mut problems = Vec::new();
    let mut factors = HashMap::new();
    for proj in model.model.projections() {
        let module = proj.name().rsplit('.').next().and_then(TargetModule::parse);
        if !module.is_some_and(|m| lora.targets(m)) {
            continue;
        }
        let (out, inp) = proj.base().dims().map_err(|source| ModelError::Tensor {
            context: format!("cannot read the shape of `{}`", proj.name()),
            source,
        })?;
        let mut pair = Vec::with_capacity(2);
        for (suffix, dims) in [("lora_A", [lora.r, inp]), ("lora_B", [out, lora.r])] {
            let name = format!("{PEFT_PREFIX}{}.{suffix}.weight", proj.name());
            match stored.remove(&name) {
                None => problems.push(format!("tensor `{name}` is missing")),
                Some(t) if t.dims() != dims => problems.push(format!(
                    "tensor `{name}` has shape {:?}, the model needs {:?}",
                    t.dims(),
                    dims
                )),
                Some(t) => pair.push(t),
            }
        }
        if let [a, b] = &pair[..] {
            factors.insert(proj.name().to_owned(), (a.clone(), b.clone()));
        }
    }
    let mut unexpected: Vec<_> = stored.into_keys().collect();
    unexpected.sort();
    problems.extend(
        unexpected
            .into_iter()
            .map(|n| format!("tensor `{n}` matches no adapted module")),
    );
    if problems.is_empty() {
        Ok(factors)
    } else {
        Err(ModelError::AdapterMismatch {
            path: weights_path,
            model: base_dir.to_owned(),
            trained_on: config.base_model_name_or_path.clone(),
            problems,
        })
    }
}

/// Writes `model` with its adapter merged into `out_dir`: every tensor of
/// the base checkpoint, adapted weights replaced by `W + scale B A` (summed
/// in f32, stored in the checkpoint's dtype), plus `config.json` and the
/// tokenizer files. Holds the whole model in host memory while writing.
pub fn merge(model: &LoadedModel, out_dir: &Path) -> Result<()> {
    merge_as(model, out_dir, None)
}

/// [`merge`], with every floating-point tensor stored as `dtype` when it is
/// given (f32, bf16 or f16), and `config.json`'s `torch_dtype` saying so.
/// Writes [`WEIGHTS_FILE`] and the [`COPIED_FILES`] the base has, and no
/// other file.
pub fn merge_as(model: &LoadedModel, out_dir: &Path, dtype: Option<DType>) -> Result<()> {
    if same_dir(&model.dir, out_dir) {
        return Err(ModelError::Write {
            path: out_dir.to_owned(),
            source: std::io::Error::other(
                "the merged model cannot overwrite its base; choose another folder",
            ),
        });
    }
    let merged = merged_tensors(model, dtype)?;
    create_dir(out_dir)?;
    save_tensors(&merged, &out_dir.join(WEIGHTS_FILE))?;
    for file in COPIED_FILES {
        let from = model.dir.join(file);
        if from.exists() {
            let to = out_dir.join(file);
            std::fs::copy(&from, &to).map_err(|source| ModelError::Write {
                path: to.clone(),
                source,
            })?;
            if file == CONFIG_FILE
                && let Some(dtype) = dtype
            {
                set_torch_dtype(&to, dtype)?;
            }
        }
    }
    Ok(())
}

/// Every tensor of `model`'s base checkpoint on the host, adapted weights
/// replaced by `W + scale B A` (summed in f32, stored in the checkpoint's
/// dtype), each floating-point tensor then converted to `dtype` when given
/// (f32, bf16 or f16). [`merge_as`] writes them; the GGUF export reads them.
pub fn merged_tensors(
    model: &LoadedModel,
    dtype: Option<DType>,
) -> Result<HashMap<String, Tensor>> {
    if let Some(dtype) = dtype
        && !matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
    {
        return Err(ModelError::Dtype { dtype });
    }
    let mut deltas = HashMap::new();
    for proj in model.model.projections() {
        let delta = proj.delta_weight().map_err(|source| ModelError::Tensor {
            context: format!("cannot compute the update of `{}`", proj.name()),
            source,
        })?;
        if let Some(delta) = delta {
            deltas.insert(format!("{}.weight", proj.name()), delta);
        }
    }
    let files = crate::common::weight_files(&model.dir)?;
    let tensor_err = |context: String| move |source| ModelError::Tensor { context, source };
    // SAFETY: read-only mapping of files that must not change meanwhile.
    let source = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }.map_err(
        tensor_err(format!(
            "cannot map the weights in `{}`",
            model.dir.display()
        )),
    )?;
    let mut merged = HashMap::new();
    for (name, _) in source.tensors() {
        let w = source
            .load(&name, &Device::Cpu)
            .map_err(tensor_err(format!("cannot read `{name}`")))?;
        let w = match deltas.remove(&name) {
            Some(delta) => delta
                .to_device(&Device::Cpu)
                .and_then(|d| w.to_dtype(DType::F32)? + d)
                .and_then(|m| m.to_dtype(w.dtype()))
                .map_err(tensor_err(format!("cannot merge `{name}`")))?,
            None => w,
        };
        let w = match dtype {
            Some(dtype) if w.dtype().is_float() && w.dtype() != dtype => w
                .to_dtype(dtype)
                .map_err(tensor_err(format!("cannot convert `{name}` to {dtype:?}")))?,
            _ => w,
        };
        merged.insert(name, w);
    }
    if let Some(name) = deltas.keys().next() {
        return Err(ModelError::Tensor {
            context: format!("cannot merge into `{}`", model.dir.display()),
            source: candle_core::Error::Msg(format!("no tensor `{name}` in the base checkpoint")),
        });
    }
    Ok(merged)
}

/// Rewrites `config.json`'s `torch_dtype` (and `dtype`, transformers' newer
/// name, when present) as transformers spells `dtype`.
fn set_torch_dtype(path: &Path, dtype: DType) -> Result<()> {
    let mut config = crate::common::read_json(path, "")?;
    let name = match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    };
    if let Some(object) = config.as_object_mut() {
        object.insert("torch_dtype".to_owned(), name.into());
        if object.contains_key("dtype") {
            object.insert("dtype".to_owned(), name.into());
        }
    }
    write_file(
        path,
        serde_json::to_string_pretty(&config).expect("a JSON value serialises"),
    )
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn to_cpu(t: Tensor) -> Result<Tensor> {
    t.to_device(&Device::Cpu)
        .map_err(|source| ModelError::Tensor {
            context: "cannot copy an adapter to the host".to_owned(),
            source,
        })
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| ModelError::Write {
        path: dir.to_owned(),
        source,
    })
}

fn write_file(path: &Path, text: String) -> Result<()> {
    std::fs::write(path, text).map_err(|source| ModelError::Write {
        path: path.to_owned(),
        source,
    })
}

fn save_tensors(tensors: &HashMap<String, Tensor>, path: &PathBuf) -> Result<()> {
    crate::common::save_safetensors(tensors, path).map_err(|source| ModelError::Tensor {
        context: format!("cannot write `{}`", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_config_has_peft_fields_and_reads_back() {
        let lora = LoraConfig {
            r: 8,
            alpha: 16.0,
            dropout: 0.05,
            target_modules: vec![TargetModule::VProj, TargetModule::QProj],
            seed: 0,
        };
        let config = AdapterConfig::from_lora(&lora, "Qwen/Qwen3-4B");
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["peft_type"], "LORA");
        assert_eq!(json["task_type"], "CAUSAL_LM");
        assert_eq!(json["bias"], "none");
        assert_eq!(json["lora_alpha"], 16.0);
        assert_eq!(
            json["target_modules"],
            serde_json::json!(["q_proj", "v_proj"])
        );
        assert_eq!(json["base_model_name_or_path"], "Qwen/Qwen3-4B");
        let back = config.to_lora().unwrap();
        assert_eq!((back.r, back.alpha, back.dropout), (8, 16.0, 0.05));
    }

    #[test]
    fn unimplemented_peft_options_are_all_reported() {
        let text = r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "lm_head"],
                       "use_dora": true, "bias": "all", "unknown_field": 1}"#;
        let config: AdapterConfig = serde_json::from_str(text).unwrap();
        let fields: Vec<_> = config
            .to_lora()
            .unwrap_err()
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(fields, ["bias", "use_dora", "target_modules"]);
    }
}
