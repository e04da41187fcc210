//! What every folder of the crate shares: the model folder's file names,
//! the error type, reading a JSON file, the checkpoint's weight files, and
//! comparing two tensors (tests).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};

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
    #[error(
        "adapter `{}` does not fit the model in `{}`:\n{}\nhint: an adapter loads only on the model it was trained on{}",
        path.display(),
        model.display(),
        list(problems),
        trained_on.as_ref().map(|b| format!(" (its `adapter_config.json` names `{b}`)")).unwrap_or_default()
    )]
    AdapterMismatch {
        path: PathBuf,
        /// The model folder the adapter was loaded onto.
        model: PathBuf,
        /// `base_model_name_or_path` of the adapter's config, when set.
        trained_on: Option<String>,
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

pub(crate) fn list<T: fmt::Display>(items: &[T]) -> String {
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

/// Reads a JSON file; `missing_hint` explains a missing file.
pub fn read_json(path: &Path, missing_hint: &str) -> Result<serde_json::Value> {
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

/// Writes `tensors` to `path` as safetensors, readable by everyone like
/// every other file a run writes (0644). The safetensors crate writes a
/// temp file, which is owner-only, and renames it into place.
pub fn save_safetensors<K: AsRef<str> + Ord + std::fmt::Display>(
    tensors: &std::collections::HashMap<K, Tensor>,
    path: impl AsRef<Path>,
) -> candle_core::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let path = path.as_ref();
    candle_core::safetensors::save(tensors, path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}
