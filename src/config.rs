//! Typed configuration: `config/pipeline_config.json` (model, hardware and
//! one section a stage) and one file a stage (`config/generate.json`, ...).
//!
//! Every struct rejects unknown fields and documents its defaults; a file may
//! leave out any field. CLI flags override file values (see `cli`).
//!
//! Files written for the Python pipeline load as they are: its names
//! ([`USER_NAMES`]: `model.base_model`, `hardware.no_4bit`,
//! `stage0.variants_per_sample`, `stage3.num_steps`) are accepted beside
//! ours, and `hardware.b200_mode` is the `--b200` preset. A file that gives
//! one setting under both names is refused. [`Sources`] records where each
//! resolved value came from (default, file, preset, flag) for
//! `trace-train config` and the run's record.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::sandbox::Limits;

/// A configuration file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config `{path}`: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config `{path}` at line {line}, column {column}: {message}\nhint: {hint}")]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
        hint: String,
    },
    #[error("invalid config `{path}`:\n{}", problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// Reads and validates a JSON config file.
pub fn load<T: for<'de> Deserialize<'de> + Validate>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// Parses and validates config text; `path` names it in errors.
pub fn parse<T: for<'de> Deserialize<'de> + Validate>(
    text: &str,
    path: &Path,
) -> Result<T, ConfigError> {
    let parse_error = |e: serde_json::Error| {
        let message = e.to_string();
        let hint = if message.contains("unknown field") {
            let mut hint = String::from(
                "remove the field or check its spelling; the expected fields are listed above",
            );
            // serde lists our names only; say which also go by the Python
            // pipeline's.
            if let Some(expected) = message.split("expected one of").nth(1) {
                for (_, theirs, ours) in USER_NAMES {
                    if expected.contains(&format!("`{ours}`")) {
                        hint += &format!(" (`{ours}` may also be written `{theirs}`)");
                    }
                }
            }
            hint
        } else if let Some((theirs, ours)) = USER_NAMES
            .iter()
            .find(|(_, _, ours)| message.contains(&format!("duplicate field `{ours}`")))
            .map(|(_, theirs, ours)| (theirs, ours))
        {
            format!(
                "`{theirs}` (the Python pipeline's name) and `{ours}` are one setting; keep one of them"
            )
        } else if message.contains("duplicate field") {
            "a key appears twice in one object; keep one".into()
        } else if let Some(key) = (message.starts_with("invalid type")
            || message.starts_with("invalid value"))
        .then(|| key_before(text, e.line(), e.column()))
        .flatten()
        {
            let expected = message
                .split("expected ")
                .nth(1)
                .and_then(|x| x.split(" at line").next())
                .unwrap_or("another value");
            let wanted = match expected {
                "usize" | "u64" | "u32" | "u16" | "u8" => "a whole number, 0 or more".to_owned(),
                "i64" | "i32" => "a whole number".to_owned(),
                "f64" | "f32" => "a number".to_owned(),
                other => other.to_owned(),
            };
            format!(
                "`{key}` takes {wanted} (each key's meaning and default are documented in src/config.rs)"
            )
        } else {
            "the file must be a JSON object; see the shipped files in `config/` for examples".into()
        };
        ConfigError::Parse {
            path: path.to_owned(),
            line: e.line(),
            column: e.column(),
            message,
            hint,
        }
    };
    let mut value: T = serde_json::from_str(text).map_err(parse_error)?;
    let tree: serde_json::Value = serde_json::from_str(text).map_err(parse_error)?;
    let mut problems = value.settle(&tree);
    problems.extend(value.problems());
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            problems,
        })
    }
}

/// The last object key written before `line`:`column` (1-based, as
/// serde_json reports an error) of `text`: the key whose value a type
/// error is about.
fn key_before(text: &str, line: usize, column: usize) -> Option<String> {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let end = (start + column).min(text.len());
    let before = text.get(..end)?;
    let re = regex::Regex::new(r#""((?:[^"\\]|\\.)*)"\s*:"#).expect("valid regex");
    re.captures_iter(before).last().map(|c| c[1].to_owned())
}

/// Semantic checks beyond the types; all problems are gathered at once.
pub trait Validate {
    fn problems(&self) -> Vec<String>;

    /// Folds settings a file may give in another section (the Python
    /// pipeline's `hardware.no_4bit`) into ours, given the file as parsed
    /// JSON; returns the conflicts. Most configs have none.
    fn settle(&mut self, _file: &serde_json::Value) -> Vec<String> {
        Vec::new()
    }
}

/// The Python pipeline's names for our settings: (section, its key, ours).
/// Either loads; a file that gives both is refused. `hardware.no_4bit`
/// (the negation of `model.load_in_4bit`, in another section) is folded by
/// [`PipelineConfig`]'s [`Validate::settle`].
pub const USER_NAMES: [(&str, &str, &str); 3] = [
    ("model", "base_model", "name"),
    ("stage0", "variants_per_sample", "variants"),
    ("stage3", "num_steps", "ppo.num_train_steps"),
];

/// Where a resolved setting came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "from")]
pub enum Source {
    /// The built-in default.
    Default,
    /// A config file, under the key as written there.
    File { path: PathBuf, key: String },
    /// A preset switched on by a flag or a file key (`--b200`).
    Preset { by: String },
    /// A command-line flag.
    Flag { flag: String },
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File { path, key } => write!(f, "file {} ({key})", path.display()),
            Source::Preset { by } => write!(f, "preset {by}"),
            Source::Flag { flag } => write!(f, "flag {flag}"),
        }
    }
}

/// Where each resolved value came from, by dotted key in our names
/// (`stage1.epochs`); a key not recorded is a default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sources(std::collections::BTreeMap<String, Source>);

impl Sources {
    /// The keys a config file sets. `file` is the file as parsed JSON;
    /// `section` is the pipeline section its top level stands for (`""`
    /// for pipeline_config.json, `stage0` for generate.json), so that the
    /// Python pipeline's names map to ours.
    pub fn from_file(path: &Path, file: &serde_json::Value, section: &str) -> Self {
        let mut out = Sources::default();
        let mut leaves = Vec::new();
        leaf_keys(file, "", &mut leaves);
        for key in leaves {
            let (parent, last) = key.rsplit_once('.').unwrap_or(("", key.as_str()));
            let full_parent = match (section, parent) {
                ("", p) => p.to_owned(),
                (s, "") => s.to_owned(),
                (s, p) => format!("{s}.{p}"),
            };
            let ours = if full_parent == "hardware" && last == "no_4bit" {
                "model.load_in_4bit".to_owned()
            } else {
                let name = USER_NAMES
                    .iter()
                    .find(|(s, theirs, _)| *s == full_parent && *theirs == last)
                    .map_or(last, |(_, _, ours)| ours);
                if parent.is_empty() {
                    name.to_owned()
                } else {
                    format!("{parent}.{name}")
                }
            };
            out.0.insert(
                ours,
                Source::File {
                    path: path.to_owned(),
                    key,
                },
            );
        }
        out
    }

    /// Records that `key` was set by `source` (later calls win).
    pub fn set(&mut self, key: &str, source: Source) {
        self.0.insert(key.to_owned(), source);
    }

    /// Records a flag's setting of `key`.
    pub fn flag(&mut self, key: &str, flag: &str) {
        self.set(
            key,
            Source::Flag {
                flag: flag.to_owned(),
            },
        );
    }

    /// Where `key` came from.
    pub fn get(&self, key: &str) -> Source {
        self.0.get(key).cloned().unwrap_or(Source::Default)
    }

    /// Every leaf of `resolved` (settings serialised to JSON) with its
    /// value and source, in key order: what `trace-train config` prints.
    pub fn table(&self, resolved: &serde_json::Value) -> Vec<(String, serde_json::Value, Source)> {
        let mut leaves = Vec::new();
        leaf_keys(resolved, "", &mut leaves);
        leaves
            .into_iter()
            .map(|k| {
                let v = resolved
                    .pointer(&format!("/{}", k.replace('.', "/")))
                    .cloned()
                    .unwrap_or(serde_json::Value::Null);
                let src = self.get(&k);
                (k, v, src)
            })
            .collect()
    }

    /// [`Self::table`] as JSON: `{key: {"value": v, "from": ...}}`.
    pub fn to_json(&self, resolved: &serde_json::Value) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (k, v, src) in self.table(resolved) {
            let mut entry = serde_json::to_value(&src).expect("serialises");
            entry["value"] = v;
            m.insert(k, entry);
        }
        serde_json::Value::Object(m)
    }
}

/// The dotted keys of every non-object value under `v`.
fn leaf_keys(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaf_keys(child, &key, out);
            }
        }
        _ if !prefix.is_empty() => out.push(prefix.to_owned()),
        _ => {}
    }
}

/// A config file parsed as `T`, with the keys it set.
pub fn load_with_sources<T: for<'de> Deserialize<'de> + Validate>(
    path: &Path,
    section: &str,
) -> Result<(T, Sources), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let value = parse(&text, path)?;
    let tree: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    Ok((value, Sources::from_file(path, &tree, section)))
}

/// The whole pipeline, as `config/pipeline_config.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    pub model: ModelConfig,
    pub hardware: HardwareConfig,
    /// Stage 0: data generation.
    pub stage0: GenerateConfig,
    /// Stage 1: warmup SFT on original programs.
    pub stage1: SftConfig,
    /// Stage 2: SFT on transformed programs.
    pub stage2: SftConfig,
    /// Stage 3: online RL, as `config/stage3_ppo_config.json`.
    pub stage3: Stage3Config,
    /// The held-out gate after each training stage.
    pub gate: GateConfig,
}

impl Validate for PipelineConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (name, v) in [
            ("model", self.model.problems()),
            ("hardware", self.hardware.problems()),
            ("stage0", self.stage0.problems()),
            ("stage1", self.stage1.problems()),
            ("stage2", self.stage2.problems()),
            ("stage3", self.stage3.problems()),
            ("gate", self.gate.problems()),
        ] {
            p.extend(v.into_iter().map(|m| format!("{name}.{m}")));
        }
        p
    }

    fn settle(&mut self, file: &serde_json::Value) -> Vec<String> {
        let mut p = Vec::new();
        if let Some(steps) = self.stage3.num_steps.take() {
            if file.pointer("/stage3/ppo/num_train_steps").is_some() {
                p.push(
                    "stage3.num_steps and stage3.ppo.num_train_steps: both set Stage 3's steps (num_steps is the Python pipeline's name); keep one".into(),
                );
            } else {
                self.stage3.ppo.num_train_steps = steps;
            }
        }
        if let Some(no_4bit) = self.hardware.no_4bit.take() {
            if file.pointer("/model/load_in_4bit").is_some() {
                p.push(
                    "hardware.no_4bit and model.load_in_4bit: both set 4-bit loading (no_4bit is the Python pipeline's name for the opposite of load_in_4bit); keep one".into(),
                );
            } else {
                self.model.load_in_4bit = !no_4bit;
            }
        }
        p
    }
}

impl PipelineConfig {
    /// The preset for one large GPU (B200, H200, H100 80 GB), as `--b200`
    /// or `hardware.b200_mode: true` ask: bf16 base weights (no 4-bit), no
    /// gradient checkpointing, micro-batches of 8 with 4 accumulation
    /// steps, over what the file says. Measured on an H200 at the Qwen3-4B
    /// shape: without checkpointing and 4-bit weights a step runs 1.35x
    /// faster than with them, and 4 x 1024 tokens take 20 GiB of which 8
    /// are weights; 8 x 2048 tokens then need about 56 GiB (an estimate
    /// from that figure, activations growing with tokens). Stage 3 gets
    /// the same bf16 base without checkpointing and training micro-batches
    /// of [`B200_MICRO_BATCH_TOKENS`]. `by` names what asked for it, for
    /// `sources`.
    pub fn apply_b200(&mut self, sources: &mut Sources, by: &str) {
        self.hardware.b200_mode = true;
        self.model.dtype = "bf16".into();
        self.model.load_in_4bit = false;
        self.hardware.gradient_checkpointing = false;
        for s in [&mut self.stage1, &mut self.stage2] {
            s.batch_size = 8;
            s.gradient_accumulation_steps = 4;
        }
        self.stage3.ppo.micro_batch_tokens = Some(B200_MICRO_BATCH_TOKENS);
        for key in [
            "model.dtype",
            "model.load_in_4bit",
            "hardware.gradient_checkpointing",
            "stage1.batch_size",
            "stage1.gradient_accumulation_steps",
            "stage2.batch_size",
            "stage2.gradient_accumulation_steps",
            "stage3.ppo.micro_batch_tokens",
        ] {
            sources.set(key, Source::Preset { by: by.to_owned() });
        }
    }
}

/// What the gate does when a set fell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateMode {
    /// No gate: no model is evaluated between stages.
    Off,
    /// Print the table and a warning naming the set; go on.
    Warn,
    /// Print the table, write the report and stop the pipeline.
    Stop,
    /// Go on; the pipeline's final model is the best gated model
    /// (`eval::gate::GateReport::best`).
    KeepBest,
}

impl GateMode {
    /// The config's spelling.
    pub const NAMES: [&'static str; 4] = ["off", "warn", "stop", "keep_best"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Self::Off),
            "warn" => Some(Self::Warn),
            "stop" => Some(Self::Stop),
            "keep_best" => Some(Self::KeepBest),
            _ => None,
        }
    }
}

/// The pipeline's gate between stages (`eval::gate`): after Stages 1, 2
/// and 3 the stage's merged model is evaluated on the held-out sets below
/// and compared with the model it started from (the base model before
/// Stage 1); the comparison goes into `gate.json` under the pipeline's
/// output folder and is printed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateConfig {
    /// What the gate does when a set's exact match fell beyond its 80%
    /// interval: `warn` (print a warning naming the set, go on), `stop`
    /// (stop the pipeline with an error), `keep_best` (go on; the final
    /// eval and report use the gated model with the highest mean exact
    /// match over the sets, ties to the earlier stage), or `off` (no gate,
    /// no evaluation between stages). Default `warn`.
    pub mode: String,
    /// The built-in sets the gate evaluates on: `heldout_short` (the
    /// held-out short set, original prompts), `original_test` (Stage 0's
    /// `stage1_original_test.jsonl`), `transformed_test` (Stage 0's
    /// `stage2_transformed_test.jsonl`). Default all three.
    pub sets: Vec<String>,
    /// More held-out sets: JSONL files of `generate`'s records, each a set
    /// named by its path. Default none.
    pub files: Vec<PathBuf>,
    /// Items a set (the first N; null: all). Default 200.
    pub limit: Option<usize>,
    /// Longest answer in tokens; longer ones are cut and scored as they
    /// are (wrong, alike for every stage). Default 512.
    pub max_new_tokens: usize,
    /// Prompts decoded together. Default 16.
    pub batch_size: usize,
}

/// The gate's built-in sets, as `gate.sets` names them.
pub const GATE_SETS: [&str; 3] = ["heldout_short", "original_test", "transformed_test"];

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            mode: "warn".into(),
            sets: GATE_SETS.map(String::from).to_vec(),
            files: Vec::new(),
            limit: Some(200),
            max_new_tokens: 512,
            batch_size: 16,
        }
    }
}

impl GateConfig {
    /// The mode (valid once [`Validate::problems`] found nothing).
    pub fn mode(&self) -> GateMode {
        GateMode::parse(&self.mode).unwrap_or(GateMode::Warn)
    }
}

impl Validate for GateConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if GateMode::parse(&self.mode).is_none() {
            p.push(format!(
                "mode: `{}` is not one of {} (hint: `warn` prints a warning and goes on, `stop` stops the pipeline, `keep_best` keeps the best stage's model, `off` skips the gate)",
                self.mode,
                GateMode::NAMES.join(", ")
            ));
        }
        for (i, set) in self.sets.iter().enumerate() {
            if !GATE_SETS.contains(&set.as_str()) {
                p.push(format!(
                    "sets: `{set}` is not one of {} (hint: name other JSONL files in gate.files)",
                    GATE_SETS.join(", ")
                ));
            } else if self.sets[..i].contains(set) {
                p.push(format!("sets: `{set}` is named twice"));
            }
        }
        for (i, f) in self.files.iter().enumerate() {
            if self.files[..i].contains(f) {
                p.push(format!("files: `{}` is named twice", f.display()));
            }
        }
        if self.mode != "off" && self.sets.is_empty() && self.files.is_empty() {
            p.push(
                "sets, files: the gate has no set to evaluate on (hint: name a set, or set gate.mode to `off`)".into(),
            );
        }
        if self.limit == Some(0) {
            p.push("limit: must be at least 1 (null: every item)".into());
        }
        for (name, v) in [
            ("max_new_tokens", self.max_new_tokens),
            ("batch_size", self.batch_size),
        ] {
            if v == 0 {
                p.push(format!("{name}: must be at least 1"));
            }
        }
        p
    }
}

/// Stage 3's training micro-batch under the `--b200` preset, in tokens
/// (six rows of the default 1536 + 512): what `rl::memory`'s model gives
/// room for on an 80 GB card with a bf16 Qwen3-4B, no checkpointing and
/// plain attention (4.6 MiB a token, 55.5 GiB, beside 7.5 GiB of weights
/// and 3.5 GiB for the head's chunk and margin); between two and three
/// times the auto budget of QLoRA with checkpointing on a 24 GB card.
pub const B200_MICRO_BATCH_TOKENS: usize = 12_288;

/// The base model.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Hub id or local folder (the Python pipeline's `base_model`). Default
    /// `Qwen/Qwen3-4B`.
    #[serde(alias = "base_model")]
    pub name: String,
    /// With a hub id: the branch, tag or commit (null: `main`). Default null.
    pub revision: Option<String>,
    /// Load the frozen base weights in 4 bits (QLoRA). Default true.
    pub load_in_4bit: bool,
    /// Training and inference dtype: `bf16`, `f16` or `f32`. Default `bf16`.
    pub dtype: String,
    /// Longest sequence in tokens. Default 2048.
    pub max_length: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            name: "Qwen/Qwen3-4B".into(),
            revision: None,
            load_in_4bit: true,
            dtype: "bf16".into(),
            max_length: 2048,
        }
    }
}

impl Validate for ModelConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.name.trim().is_empty() {
            p.push("name: must name a hub id or a local folder".into());
        }
        if !matches!(self.dtype.as_str(), "bf16" | "f16" | "f32") {
            p.push(format!(
                "dtype: `{}` is not one of bf16, f16, f32",
                self.dtype
            ));
        }
        if self.max_length < 16 {
            p.push(format!(
                "max_length: {} is too small (>= 16)",
                self.max_length
            ));
        }
        p
    }
}

/// Where training runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HardwareConfig {
    /// `auto` (CUDA when built with it and present, else CPU), `cpu`, `cuda`,
    /// or `cuda:N`. Default `auto`.
    pub device: String,
    /// GPUs a training run uses, one process each (data parallel). Default
    /// `null`: every visible GPU when the device is CUDA, 1 on the CPU.
    pub num_gpus: Option<usize>,
    /// Trade compute for memory by recomputing activations. Default true.
    pub gradient_checkpointing: bool,
    /// The `--b200` preset for one large GPU (see
    /// [`PipelineConfig::apply_b200`]). Default false.
    pub b200_mode: bool,
    /// The Python pipeline's spelling of `model.load_in_4bit: false`
    /// (`--no_4bit`); folded into `model.load_in_4bit` on load, so it is
    /// never set after loading. Default absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_4bit: Option<bool>,
}

impl Default for HardwareConfig {
    fn default() -> Self {
        HardwareConfig {
            device: "auto".into(),
            num_gpus: None,
            gradient_checkpointing: true,
            b200_mode: false,
            no_4bit: None,
        }
    }
}

impl Validate for HardwareConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if DeviceSpec::parse(&self.device).is_none() {
            p.push(format!(
                "device: `{}` is not auto, cpu, cuda or cuda:N",
                self.device
            ));
        }
        if self.num_gpus == Some(0) {
            p.push("num_gpus: must be at least 1".into());
        }
        p
    }
}

/// A `device` setting: `auto`, `cpu`, `cuda` (the first GPU) or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// CUDA device 0 when the binary was built with CUDA and one is present,
    /// else the CPU.
    Auto,
    Cpu,
    Cuda(usize),
}

impl DeviceSpec {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "cpu" => Some(Self::Cpu),
            "cuda" => Some(Self::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda),
        }
    }

    /// Opens the device, with a hint when CUDA is asked for and missing.
    pub fn open(self) -> anyhow::Result<candle_core::Device> {
        use anyhow::Context;
        use candle_core::Device;
        let device = match self {
            Self::Cpu => Device::Cpu,
            Self::Auto => Device::cuda_if_available(0)?,
            Self::Cuda(n) => Device::new_cuda(n).with_context(|| {
                format!(
                    "cannot open CUDA device {n}\nhint: build with `--features cuda` on a machine with that GPU, or pass --device cpu"
                )
            })?,
        };
        crate::gpu::keep_freed_memory(&device)?;
        Ok(device)
    }
}

/// How variant seeds are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SeedScheme {
    /// The environment's: task_id in [0, 10^6), row = task_id mod N,
    /// seed = task_id. Variant v of row r has seed r + v*N.
    Env,
    /// The peer pipeline's: seed = row * 1000 + variant.
    Peer,
}

impl SeedScheme {
    /// Seed of variant `variant` of row `row` in a dataset of `rows` rows.
    pub fn seed(self, row: u64, variant: u64, rows: u64) -> u64 {
        match self {
            SeedScheme::Env => row + variant * rows.max(1),
            SeedScheme::Peer => row * 1000 + variant,
        }
    }
}

/// Which rows are kept for training (the peer pipeline's filters, with the
/// line-count limits set per stage).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Filters {
    /// Longest program source in characters. Default 10000.
    pub max_source_chars: usize,
    /// Longest expected output in characters. Default 5000.
    pub max_output_chars: usize,
    /// The older spelling of `transformed.min_output_lines`, still read so
    /// that older config files load; when present it sets the transformed
    /// set's minimum (the original set keeps its own). Default absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_output_lines: Option<usize>,
    /// Output-line limits of the original programs (Stage 1). Default: every
    /// length (at least 1 line, no maximum).
    pub original: LineFilter,
    /// Output-line limits of the transformed programs (Stage 2). Default:
    /// every length (at least 1 line, no maximum), as the environment asks
    /// them.
    pub transformed: LineFilter,
    /// Drop runs that wrote anything on stderr. Default true.
    pub drop_stderr: bool,
    /// Drop empty outputs. Default true.
    pub drop_empty: bool,
    /// Drop transformed programs whose output has no `__DBG_` line (the
    /// injected prints never ran). Default false: the environment asks such
    /// tasks too, and without them no Stage 2 answer has a single line, so
    /// Stage 2 teaches a model to write more than one (docs/BENCHMARKS.md,
    /// "Fourth run"). The peer pipeline's filter sets it.
    pub require_dbg: bool,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            max_source_chars: 10_000,
            max_output_chars: 5_000,
            min_output_lines: None,
            original: LineFilter::default(),
            transformed: LineFilter::default(),
            drop_stderr: true,
            drop_empty: true,
            require_dbg: false,
        }
    }
}

impl Filters {
    /// The line limits in force for one stage's set (`transformed` or not),
    /// with the older `min_output_lines` applied.
    pub fn lines(&self, transformed: bool) -> LineFilter {
        if transformed {
            let mut f = self.transformed;
            if let Some(min) = self.min_output_lines {
                f.min_output_lines = min;
            }
            f
        } else {
            self.original
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (name, f) in [
            ("original", self.original),
            ("transformed", self.lines(true)),
        ] {
            if let Some(max) = f.max_output_lines
                && max < f.min_output_lines
            {
                p.push(format!(
                    "filters.{name}: max_output_lines {max} is below min_output_lines {}",
                    f.min_output_lines
                ));
            }
        }
        p
    }
}

/// How many lines a kept output may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LineFilter {
    /// Fewest output lines. Default 1 (every non-empty output).
    pub min_output_lines: usize,
    /// Most output lines (null: no limit). Default null.
    pub max_output_lines: Option<usize>,
}

impl Default for LineFilter {
    fn default() -> Self {
        LineFilter {
            min_output_lines: 1,
            max_output_lines: None,
        }
    }
}

impl LineFilter {
    /// Whether an output of `lines` lines passes.
    pub fn admits(&self, lines: usize) -> bool {
        lines >= self.min_output_lines && self.max_output_lines.is_none_or(|max| lines <= max)
    }
}

/// Stage 0: `generate`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerateConfig {
    /// `builtin` (the shipped corpus), a local JSONL path, `humaneval:PATH`
    /// (HumanEval.jsonl[.gz]), `synthetic:N[:SEED]` (N programs made from a
    /// seed), or a hub dataset id; several joined by `+`
    /// are read one after another. Default `builtin`.
    pub dataset: String,
    /// File inside a hub dataset. Default `python_dataset.jsonl`.
    pub hub_file: String,
    /// Output folder. Default `datasets/trace_training`.
    pub output_dir: PathBuf,
    /// Use at most this many rows (null: all). Default null.
    pub max_samples: Option<usize>,
    /// Transformed variants a program (the Python pipeline's
    /// `variants_per_sample`). Default 3.
    #[serde(alias = "variants_per_sample")]
    pub variants: usize,
    /// `env` or `peer`. Default `env`.
    pub seed_scheme: SeedScheme,
    /// Seed of the train/test split. Default 42.
    pub seed: u64,
    /// Share of programs held out for test. Default 0.05.
    pub test_ratio: f64,
    /// Most injected prints a program. Default 6.
    pub max_injections: usize,
    /// Sandbox worker slots (0: two a core). Default 0.
    pub num_workers: usize,
    /// Interpreter, readable by every uid. Default `/usr/bin/python3`.
    pub python: PathBuf,
    /// Count and skip malformed lines instead of stopping. Default false.
    pub skip_bad: bool,
    pub filters: Filters,
    /// Balance each training split by output-line bucket (1, 2-3, 4-10,
    /// 11+), or by the joint buckets of `balance_by`: a bucket keeps at
    /// most `balance_ratio` times the records of the smallest non-empty
    /// bucket, chosen by a hash of `seed` and the record (deterministic).
    /// Test splits are never changed. Default false.
    pub balance_lines: bool,
    /// See `balance_lines`. At least 1. Default 2.0.
    pub balance_ratio: f64,
    /// The features `balance_lines` balances by, jointly: any of
    /// `output_lines`, `loop_depth`, `lines`, `injections`. Default
    /// `["output_lines"]`.
    pub balance_by: Vec<String>,
    /// Limits of each run. Default: 10 s CPU, 10 s wall (the environment's
    /// timeout), 512 MiB, 1 MiB a stream.
    pub limits: Limits,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        GenerateConfig {
            dataset: "builtin".into(),
            hub_file: "python_dataset.jsonl".into(),
            output_dir: PathBuf::from("datasets/trace_training"),
            max_samples: None,
            variants: 3,
            seed_scheme: SeedScheme::Env,
            seed: 42,
            test_ratio: 0.05,
            max_injections: 6,
            num_workers: 0,
            python: PathBuf::from("/usr/bin/python3"),
            skip_bad: false,
            filters: Filters::default(),
            balance_lines: false,
            balance_ratio: 2.0,
            balance_by: vec!["output_lines".into()],
            limits: Limits {
                wall_ms: 10_000,
                ..Limits::default()
            },
        }
    }
}

impl Validate for GenerateConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.dataset.trim().is_empty() {
            p.push("dataset: empty; use `builtin`, a path or a hub id".into());
        }
        if self.variants == 0 {
            p.push("variants: must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.test_ratio) {
            p.push(format!("test_ratio: {} is not in [0, 1)", self.test_ratio));
        }
        if self.max_injections == 0 || self.max_injections > 100 {
            p.push(format!(
                "max_injections: {} is not in 1..=100",
                self.max_injections
            ));
        }
        if self.limits.cpu_seconds == 0 || self.limits.wall_ms == 0 {
            p.push("limits: cpu_seconds and wall_ms must be positive".into());
        }
        if !(self.balance_ratio.is_finite() && self.balance_ratio >= 1.0) {
            p.push(format!(
                "balance_ratio: {} must be at least 1 (1 gives every line bucket the size of the smallest)",
                self.balance_ratio
            ));
        }
        let known = ["output_lines", "loop_depth", "lines", "injections"];
        if self.balance_by.is_empty() {
            p.push("balance_by: name at least one feature".into());
        }
        for f in &self.balance_by {
            if !known.contains(&f.as_str()) {
                p.push(format!(
                    "balance_by: `{f}` is not one of {}",
                    known.join(", ")
                ));
            }
        }
        p.extend(self.filters.problems());
        p
    }
}

/// The most real tokens a packed pass holds unless `micro_batch_tokens`
/// says otherwise: at the Qwen3-4B shape on an H100, `bench train`'s
/// tokens a second level off by 4,096-8,192 tokens a pass (QLoRA with
/// checkpointing and bf16 without), while memory keeps growing with the
/// pass (bf16 without checkpointing: 55 GiB at 16,384, 26-29 at about 8,000).
pub const PACK_TOKENS: usize = 8192;

/// Stages 1 and 2: LoRA SFT.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Training JSONL (null: the stage's file under `datasets/trace_training`).
    pub train_file: Option<PathBuf>,
    /// Evaluation JSONL (null: the stage's test file).
    pub eval_file: Option<PathBuf>,
    /// Output folder (null: `checkpoints/stage1_warmup` for Stage 1,
    /// `checkpoints/stage2_sft` for Stage 2).
    pub output_dir: Option<PathBuf>,
    /// Default 1.
    pub epochs: usize,
    /// Sequences a micro-batch. Default 4.
    pub batch_size: usize,
    /// Default 4.
    pub gradient_accumulation_steps: usize,
    /// Peak learning rate. Default 2e-4.
    pub learning_rate: f64,
    /// Share of steps spent warming up. Default 0.03.
    pub warmup_ratio: f64,
    /// Final learning rate as a share of the peak. Default 0.1.
    pub min_lr_ratio: f64,
    /// Default 0.0.
    pub weight_decay: f64,
    /// Gradient clipping norm. Default 1.0.
    pub max_grad_norm: f64,
    /// LoRA rank. Default 16.
    pub lora_r: usize,
    /// LoRA alpha. Default 32.
    pub lora_alpha: f64,
    /// Default 0.05.
    pub lora_dropout: f64,
    /// Default q, k, v, o, gate, up, down projections.
    pub target_modules: Vec<String>,
    /// Evaluate every N optimizer steps. Default 50.
    pub eval_steps: usize,
    /// Checkpoint every N optimizer steps. Default 100.
    pub save_steps: usize,
    /// Periodic checkpoints kept. Default 2.
    pub save_total_limit: usize,
    /// Default 42.
    pub seed: u64,
    /// With `packing`: the most real tokens a packed pass holds (default
    /// null: `batch_size x max_length`, at most [`PACK_TOKENS`]).
    /// Without: positions one forward/backward pass holds (rows x the row
    /// length, padding included); set, each step's `batch_size x
    /// gradient_accumulation_steps` records are regrouped, longest first,
    /// into passes of at most this many (the same records and the same
    /// token-weighted loss, in fewer and fuller passes); null or 0:
    /// micro-batches of `batch_size` rows. Unpacked at the Qwen3-4B shape
    /// with QLoRA and checkpointing on an H100, `batch_size x max_length`
    /// passes computed 16% more positions a second than micro-batches of 4
    /// rows but carried 17-49% padding against 5-22%, for the same tokens a
    /// second (docs/BENCHMARKS.md); packing removes the padding.
    pub micro_batch_tokens: Option<usize>,
    /// Packing: each pass's examples end to end in one row, attention kept
    /// inside each example and positions restarting at each, so no
    /// position goes to padding between examples and a step is one or a
    /// few full passes. Passes hold at most `micro_batch_tokens` real
    /// tokens, or `batch_size x max_length` (the most a micro-batch of
    /// `batch_size` rows could hold) up to [`PACK_TOKENS`]. The same
    /// examples a step and the same token-weighted loss as unpacked.
    /// Default null: on a GPU, off on the CPU.
    pub packing: Option<bool>,
    /// Choosing the checkpoint that becomes `final/` ([`SelectConfig`]).
    /// Default null: no selection, the last weights are `final/`.
    pub select: Option<SelectConfig>,
}

/// Checkpoint selection in Stages 1-2 (`stage1.select`, `stage2.select`,
/// the `select` section of `config/warmup.json` and `config/sft.json`):
/// every `every_steps` optimizer steps and at the end the current adapter
/// is scored on a held-out set by greedy decoding, exactly as `eval` and
/// the pipeline's gate score a model; the best-scoring adapter is kept in
/// `best/` (ties: the earlier step) and, unless `metric` is `last`,
/// becomes `final/` and `merged/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelectConfig {
    /// What chooses `final/`: `heldout_exact_match` (the highest exact
    /// match on `set`), `eval_loss` (the lowest eval loss on the stage's
    /// `eval_file`), or `last` (the last weights, as without selection;
    /// exact match is still scored, logged and its best kept in `best/`).
    /// Default `heldout_exact_match`.
    pub metric: String,
    /// Score every N optimizer steps (and after the last). Default 50.
    pub every_steps: usize,
    /// The items exact match is scored on: one of the gate's sets
    /// (`heldout_short`, `original_test`, `transformed_test`; the test
    /// files under the stage's dataset folder), or a path ending in
    /// `.jsonl` of `generate`'s records. Default `heldout_short`.
    pub set: String,
    /// Items scored (the first N; null: all). Default 200.
    pub limit: Option<usize>,
    /// Longest answer in tokens; longer ones are cut and scored as they
    /// are. Default 512.
    pub max_new_tokens: usize,
    /// Prompts decoded together. Default 16.
    pub batch_size: usize,
}

/// [`SelectConfig::metric`]'s values.
pub const SELECT_METRICS: [&str; 3] = ["heldout_exact_match", "eval_loss", "last"];

impl Default for SelectConfig {
    fn default() -> Self {
        SelectConfig {
            metric: "heldout_exact_match".into(),
            every_steps: 50,
            set: "heldout_short".into(),
            limit: Some(200),
            max_new_tokens: 512,
            batch_size: 16,
        }
    }
}

impl SelectConfig {
    /// `set` as a file of records (not one of the gate's set names).
    pub fn file(&self) -> Option<&Path> {
        (!GATE_SETS.contains(&self.set.as_str())).then(|| Path::new(&self.set))
    }
}

impl Validate for SelectConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !SELECT_METRICS.contains(&self.metric.as_str()) {
            p.push(format!(
                "select.metric: `{}` is not one of {} (hint: `heldout_exact_match` keeps the adapter with the best exact match on select.set, `eval_loss` the one with the lowest eval loss, `last` the last weights)",
                self.metric,
                SELECT_METRICS.join(", ")
            ));
        }
        if self.every_steps == 0 {
            p.push(
                "select.every_steps: must be at least 1 (hint: the adapter is scored every N optimizer steps; leave out `select` for no selection)".into(),
            );
        }
        match self.file() {
            Some(_) if !self.set.ends_with(".jsonl") => p.push(format!(
                "select.set: `{}` is not one of {} nor a `.jsonl` file (hint: name a built-in set, or a JSONL file of `generate`'s records)",
                self.set,
                GATE_SETS.join(", ")
            )),
            Some(f) if !f.is_file() => p.push(format!(
                "select.set: the file `{}` does not exist (hint: check the path, relative to the folder the command runs in, or run `trace-train generate` first)",
                f.display()
            )),
            _ => {}
        }
        if self.limit == Some(0) {
            p.push("select.limit: must be at least 1 (null: every item)".into());
        }
        for (name, v) in [
            ("max_new_tokens", self.max_new_tokens),
            ("batch_size", self.batch_size),
        ] {
            if v == 0 {
                p.push(format!("select.{name}: must be at least 1"));
            }
        }
        p
    }
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            train_file: None,
            eval_file: None,
            output_dir: None,
            epochs: 1,
            batch_size: 4,
            gradient_accumulation_steps: 4,
            learning_rate: 2e-4,
            warmup_ratio: 0.03,
            min_lr_ratio: 0.1,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            lora_r: 16,
            lora_alpha: 32.0,
            lora_dropout: 0.05,
            target_modules: [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ]
            .map(String::from)
            .to_vec(),
            eval_steps: 50,
            save_steps: 100,
            save_total_limit: 2,
            seed: 42,
            micro_batch_tokens: None,
            packing: None,
            select: None,
        }
    }
}

impl Validate for SftConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (name, v) in [
            ("epochs", self.epochs),
            ("batch_size", self.batch_size),
            (
                "gradient_accumulation_steps",
                self.gradient_accumulation_steps,
            ),
            ("lora_r", self.lora_r),
        ] {
            if v == 0 {
                p.push(format!("{name}: must be at least 1"));
            }
        }
        if !(self.learning_rate > 0.0 && self.learning_rate.is_finite()) {
            p.push(format!(
                "learning_rate: {} must be positive",
                self.learning_rate
            ));
        }
        for (name, v) in [
            ("warmup_ratio", self.warmup_ratio),
            ("min_lr_ratio", self.min_lr_ratio),
            ("lora_dropout", self.lora_dropout),
        ] {
            if !(0.0..=1.0).contains(&v) {
                p.push(format!("{name}: {v} is not in [0, 1]"));
            }
        }
        if self.target_modules.is_empty() {
            p.push("target_modules: name at least one projection".into());
        }
        if let Some(s) = &self.select {
            p.extend(s.problems());
        }
        p
    }
}

/// The sampling temperature of each RL step: `initial` at step 0, moving
/// linearly to `final` over `warmup_steps` steps, then `final`. A function
/// of the step alone, so a resumed run samples as the uninterrupted one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TemperatureSchedule {
    /// Default false (the stage's `temperature` throughout).
    pub enabled: bool,
    /// Default 1.0.
    pub initial: f64,
    /// Default 0.7.
    #[serde(rename = "final")]
    pub r#final: f64,
    /// Default 100.
    pub warmup_steps: u64,
}

impl Default for TemperatureSchedule {
    fn default() -> Self {
        Self {
            enabled: false,
            initial: 1.0,
            r#final: 0.7,
            warmup_steps: 100,
        }
    }
}

impl TemperatureSchedule {
    /// The temperature of step `step` (from 0), or `fixed` when off.
    pub fn at(&self, step: u64, fixed: f64) -> f64 {
        if !self.enabled {
            return fixed;
        }
        if step >= self.warmup_steps {
            return self.r#final;
        }
        let f = step as f64 / self.warmup_steps as f64;
        self.initial + (self.r#final - self.initial) * f
    }
}

/// Stage 3 as `config/stage3_ppo_config.json` holds it: the user's
/// `{"ppo": {...}, "curriculum": {...}}`, any subset of keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stage3Config {
    /// The pipeline's Stage 3 recipe: `ppo` (the RL recipe, `ppo.algorithm`
    /// choosing PPO, GRPO, Dr. GRPO or GSPO) or `dpo` (rounds of rollouts -> prefs -> dpo,
    /// `dpo` below). Default `ppo`.
    pub algorithm: String,
    pub ppo: RlConfig,
    pub curriculum: CurriculumConfig,
    /// Stage 3 as DPO from the model's own rollouts.
    pub dpo: DpoRounds,
    /// The Python pipeline's `stage3.num_steps` in `pipeline_config.json`:
    /// `ppo.num_train_steps`, folded into it on load.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_steps: Option<usize>,
}

impl Default for Stage3Config {
    fn default() -> Self {
        Stage3Config {
            algorithm: "ppo".into(),
            ppo: RlConfig::default(),
            curriculum: CurriculumConfig::default(),
            dpo: DpoRounds::default(),
            num_steps: None,
        }
    }
}

impl Stage3Config {
    pub fn is_dpo(&self) -> bool {
        self.algorithm == "dpo"
    }
}

impl Validate for Stage3Config {
    fn problems(&self) -> Vec<String> {
        let mut p: Vec<String> = self
            .ppo
            .problems()
            .into_iter()
            .map(|m| format!("ppo.{m}"))
            .collect();
        if !matches!(self.algorithm.as_str(), "ppo" | "dpo") {
            p.push(format!(
                "algorithm: `{}` is not ppo or dpo (ppo.algorithm chooses the RL algorithm)",
                self.algorithm
            ));
        }
        p.extend(self.dpo.problems().into_iter().map(|m| format!("dpo.{m}")));
        p.extend(
            self.curriculum
                .problems()
                .into_iter()
                .map(|m| format!("curriculum.{m}")),
        );
        p
    }
}

/// Stage 3: online RL (PPO, GRPO, Dr. GRPO or GSPO) against an environment. The user's
/// keys are `batch_size`, `learning_rate` and `num_train_steps`; the rest
/// are ours, with the peers' defaults (docs in `src/rl/` and `src/recipes/ppo/`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// `ppo` (value head, GAE, KL in the reward), `grpo` (group-relative
    /// advantages, KL in the loss), `dr_grpo` (GRPO without the std and
    /// length normalisations) or `gspo` (GRPO with a sequence-level
    /// importance ratio; its paper clips at 3e-4 / 4e-4). Default `ppo`.
    pub algorithm: String,
    /// Prompts a step. Default 16.
    pub batch_size: usize,
    /// Completions a prompt (null: 1 for PPO, 8 for the group-relative
    /// algorithms).
    pub group_size: Option<usize>,
    /// Peak learning rate of the LoRA factors. Default 5e-7.
    pub learning_rate: f64,
    /// Learning rate of the value head (PPO). Default 1e-4.
    pub value_learning_rate: f64,
    /// Optimizer steps. Default 5000.
    pub num_train_steps: usize,
    /// Passes over each batch. Default 1.
    pub ppo_epochs: usize,
    /// Completions a minibatch (one optimizer step each). Default 16.
    pub mini_batch_size: usize,
    /// Clip range below 1 of the probability ratio. Default 0.2.
    pub clip_low: f64,
    /// Clip range above 1 (DAPO's clip-higher). Default 0.28.
    pub clip_high: f64,
    /// Truncated importance sampling: each token's policy-gradient term
    /// weighted by `min(exp(old - sampler), tis_cap)`, the trainer's
    /// log-prob over the sampler's for the same token (Yao et al. 2025),
    /// correcting for the sampler's numerics (its kernels, batching and
    /// dtype) differing from the trainer's, and, off-policy, for the
    /// sampler's weights being one update old. At least 1; 0 turns it off,
    /// except with `sampler_ranks`, where it means 2. Default 0.
    pub tis_cap: f64,
    /// One-step off-policy on several GPUs: this many of the run's GPUs
    /// (the last ones) only sample, making step k+1's completions from the
    /// weights of step k while the others train on step k's; the new
    /// weights go to them after each step. Each batch but the first is
    /// trained on one update after it was sampled, which `tis_cap`
    /// corrects. Pays where sampling takes as long as training on the GPUs
    /// given to each. At least one GPU must train. 0: every GPU samples its
    /// share, then every GPU trains (synchronous). Default 0.
    pub sampler_ranks: usize,
    /// Value clip range (PPO). Default 0.2.
    pub value_clip: f64,
    /// Weight of the value loss (PPO). Default 0.1.
    pub vf_coef: f64,
    /// Weight of the entropy bonus. Default 0.
    pub entropy_coef: f64,
    /// KL coefficient to the reference policy (null: 0.05 for PPO, k1 in
    /// the reward; 0.001 for GRPO, in the loss). 0 turns it off.
    pub kl_coef: Option<f64>,
    /// Estimator of the KL term in the loss (GRPO): `k1`, `k2` or `k3`.
    /// Default `k3`.
    pub kl_estimator: String,
    /// GAE discount. Default 1.
    pub gamma: f64,
    /// GAE lambda. Default 0.95.
    pub lam: f64,
    /// Whiten PPO advantages over the batch's tokens. Default true.
    pub whiten_advantages: bool,
    /// `token_mean`, `seq_mean` or `dr_grpo`. Default `token_mean`.
    pub loss_aggregation: String,
    /// Divide GRPO advantages by the group's standard deviation. Default true.
    pub scale_rewards: bool,
    /// Drop groups whose rewards are all equal and sample fresh ones (GRPO).
    /// Default true.
    pub dynamic_sampling: bool,
    /// Most extra sampling rounds a step spends replacing dropped groups.
    /// Default 3.
    pub max_resample_rounds: usize,
    /// Leave answers cut at `max_new_tokens` out of the loss. Default false.
    pub mask_truncated: bool,
    /// Sampling temperature. Default 1.
    pub temperature: f64,
    /// The sampling temperature by step, in place of `temperature` when
    /// enabled (the GRPO guide's schedule). Default off.
    pub temperature_schedule: TemperatureSchedule,
    /// Turns of an episode: after a wrong answer the environment says so
    /// (`feedback`) as a user turn and the model answers again, up to this
    /// many answers; the episode ends at a right one. Each answer trains as
    /// a completion of the conversation so far (the environment's tokens
    /// sit in its prompt, never trained), rewarded with the episode's
    /// outcome; GRPO's group advantages are taken over episodes. 1: one
    /// answer, no feedback. Default 1.
    pub max_turns: usize,
    /// What a feedback turn says: `verdict` (wrong, try again),
    /// `first_diff` (also the first output line that differs) or `line`
    /// (also what that line should be). Default `first_diff`.
    pub feedback: String,
    /// The episode's reward is its last answer's times this to the power
    /// of the answers before it (1: a late right answer counts in full).
    /// Default 1.
    pub turn_discount: f64,
    /// Longest conversation a turn may start from, in tokens (prompt,
    /// earlier answers and feedback); an episode that would pass it ends.
    /// 0: `max_prompt_tokens + max_turns x (max_new_tokens + 256)`.
    /// Default 0.
    pub max_episode_tokens: usize,
    /// Nucleus sampling mass (1 = off). Default 1.
    pub top_p: f64,
    /// Top-k sampling (0 = off). Default 0.
    pub top_k: usize,
    /// Longest completion in tokens. Default 512.
    pub max_new_tokens: usize,
    /// Completions the sampler decodes at once (rows that finish take
    /// waiting prompts); 0: all of a step's at once. Default 0.
    pub sample_max_rows: usize,
    /// Longest prompt in tokens; longer tasks are skipped and counted.
    /// Default 1536.
    pub max_prompt_tokens: usize,
    /// Tokens one training pass holds at once (old and reference
    /// log-probs, values, the clipped update): a pass's completions go
    /// through the model in micro-batches of at most this many, counted as
    /// rows x the longest row's prompt + response tokens (padding
    /// included); the update sums their gradients and still steps once a
    /// minibatch, so this decides memory, not what is learned. A completion
    /// longer than the budget runs alone. Null or 0: chosen at load time
    /// from the GPU's free memory, the model's shape, `max_prompt_tokens +
    /// max_new_tokens` and checkpointing (`rl::memory`), 8192 on the CPU.
    /// The `--b200` preset sets 12288. Default null.
    pub micro_batch_tokens: Option<usize>,
    /// Recompute each decoder layer in the backward pass instead of keeping
    /// its activations (the same gradients; far less memory). Null: the
    /// pipeline config's `hardware.gradient_checkpointing`, applied on a
    /// GPU (so on by default there, off on the CPU); true or false applies
    /// on any device. Default null.
    pub gradient_checkpointing: Option<bool>,
    /// Default 1.0.
    pub max_grad_norm: f64,
    /// Default 0.
    pub weight_decay: f64,
    /// LoRA rank. Default 16.
    pub lora_r: usize,
    /// LoRA alpha. Default 32.
    pub lora_alpha: f64,
    /// Default q, k, v, o, gate, up, down projections.
    pub target_modules: Vec<String>,
    /// Hidden width of the value head. Default 256.
    pub value_hidden: usize,
    /// `trace` (the Trace task, programs run in the sandbox), `word`
    /// (answer with a given word; tests), or a mixture of trace, sat, abd
    /// and ded joined by `+`, each optionally weighted (`trace:2+abd+ded`;
    /// ABD reads `abd_dataset`, DED `ded_dataset`). Default `trace`.
    pub environment: String,
    /// Rows the trace environment draws from: `builtin`, a JSONL path, a
    /// hub dataset id, or several joined by `+` (as `generate`'s `dataset`).
    /// Default `builtin`.
    pub dataset: String,
    /// Rows of ABD in a mixture (`program`, `inputs`, `output`): `builtin`,
    /// a JSONL path or a hub id; several joined by `+`. Default `builtin`.
    pub abd_dataset: String,
    /// Rows of DED in a mixture (`prompt`, `test_cases` or
    /// `verification_info`): `ded-builtin`, `humaneval:PATH`, a JSONL path
    /// or a hub id; several joined by `+`. Default `ded-builtin`.
    pub ded_dataset: String,
    /// File inside a hub dataset. Default `python_dataset.jsonl`.
    pub hub_file: String,
    /// Most injected prints a task. Default 6.
    pub max_injections: usize,
    /// Sandbox worker slots (0: two a core). Default 0.
    pub num_workers: usize,
    /// Interpreter for the sandbox. Default `/usr/bin/python3`.
    pub python: PathBuf,
    /// Output folder (null: `checkpoints/stage3_ppo`).
    pub output_dir: Option<PathBuf>,
    /// Checkpoint every N steps (`step_N/`). Default 1000.
    pub save_steps: usize,
    /// Periodic checkpoints kept (0: all). Default 0.
    pub save_total_limit: usize,
    /// Default 42.
    pub seed: u64,
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig {
            algorithm: "ppo".into(),
            batch_size: 16,
            group_size: None,
            learning_rate: 5e-7,
            value_learning_rate: 1e-4,
            num_train_steps: 5000,
            ppo_epochs: 1,
            mini_batch_size: 16,
            clip_low: 0.2,
            clip_high: 0.28,
            tis_cap: 0.0,
            sampler_ranks: 0,
            value_clip: 0.2,
            vf_coef: 0.1,
            entropy_coef: 0.0,
            kl_coef: None,
            kl_estimator: "k3".into(),
            gamma: 1.0,
            lam: 0.95,
            whiten_advantages: true,
            loss_aggregation: "token_mean".into(),
            scale_rewards: true,
            dynamic_sampling: true,
            max_resample_rounds: 3,
            mask_truncated: false,
            temperature: 1.0,
            temperature_schedule: TemperatureSchedule::default(),
            max_turns: 1,
            feedback: "first_diff".into(),
            turn_discount: 1.0,
            max_episode_tokens: 0,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 512,
            sample_max_rows: 0,
            max_prompt_tokens: 1536,
            micro_batch_tokens: None,
            gradient_checkpointing: None,
            max_grad_norm: 1.0,
            weight_decay: 0.0,
            lora_r: 16,
            lora_alpha: 32.0,
            target_modules: SftConfig::default().target_modules,
            value_hidden: 256,
            environment: "trace".into(),
            dataset: "builtin".into(),
            abd_dataset: "builtin".into(),
            ded_dataset: "ded-builtin".into(),
            hub_file: "python_dataset.jsonl".into(),
            max_injections: 6,
            num_workers: 0,
            python: PathBuf::from("/usr/bin/python3"),
            output_dir: None,
            save_steps: 1000,
            save_total_limit: 0,
            seed: 42,
        }
    }
}

/// The RL algorithm `ppo.algorithm` names: what it is and its defaults.
/// How each turns rewards into advantages and ratios into a loss is
/// `rl::algorithm`'s (the seam the recipe calls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// PPO: a value head, GAE, the KL penalty in the reward.
    Ppo,
    /// GRPO: group-relative advantages, the KL term in the loss.
    Grpo,
    /// Dr. GRPO: GRPO without the std and length normalisations.
    DrGrpo,
    /// GSPO: GRPO's advantages, a sequence-level importance ratio.
    Gspo,
}

impl Algorithm {
    /// Every algorithm, in the order the settings' docs list them.
    pub const ALL: [Self; 4] = [Self::Ppo, Self::Grpo, Self::DrGrpo, Self::Gspo];

    /// The settings' spellings, [`Algorithm::ALL`]'s names.
    pub const NAMES: [&'static str; 4] = [
        Self::ALL[0].name(),
        Self::ALL[1].name(),
        Self::ALL[2].name(),
        Self::ALL[3].name(),
    ];

    /// The name the settings and the command line use: the one spelling.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ppo => "ppo",
            Self::Grpo => "grpo",
            Self::DrGrpo => "dr_grpo",
            Self::Gspo => "gspo",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether a value head learns beside the policy and advantages come
    /// from GAE over its values (PPO); otherwise they are group-relative,
    /// over the completions of one prompt.
    pub fn has_critic(self) -> bool {
        self == Self::Ppo
    }

    /// Whether advantages compare the completions of one prompt (a group
    /// whose rewards are all equal then teaches nothing).
    pub fn group_relative(self) -> bool {
        !self.has_critic()
    }

    /// Completions a prompt when the settings do not say.
    pub fn default_group_size(self) -> usize {
        if self.has_critic() { 1 } else { 8 }
    }

    /// The KL coefficient when the settings do not say: PPO pays it in the
    /// reward, the group-relative methods as a loss term.
    pub fn default_kl_coef(self) -> f64 {
        if self.has_critic() { 0.05 } else { 0.001 }
    }
}

impl RlConfig {
    /// The algorithm the settings name (`ppo` when the name is unknown,
    /// which validation refuses).
    pub fn rl_algorithm(&self) -> Algorithm {
        Algorithm::parse(&self.algorithm).unwrap_or(Algorithm::Ppo)
    }

    /// Completions a prompt: the setting, else the algorithm's default (1
    /// for PPO, 8 for the group-relative ones).
    pub fn group_size(&self) -> usize {
        self.group_size
            .unwrap_or(self.rl_algorithm().default_group_size())
    }

    /// The KL coefficient: the setting, else the algorithm's default (0.05
    /// for PPO, 0.001 for the group-relative ones).
    pub fn kl_coef(&self) -> f64 {
        self.kl_coef
            .unwrap_or(self.rl_algorithm().default_kl_coef())
    }
}

impl Validate for RlConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if Algorithm::parse(&self.algorithm).is_none() {
            p.push(format!(
                "algorithm: `{}` is not one of {}",
                self.algorithm,
                Algorithm::NAMES.join(", ")
            ));
        }
        if self.rl_algorithm().group_relative() && self.group_size() < 2 {
            p.push(format!(
                "group_size: {} needs at least 2 completions a prompt",
                self.algorithm
            ));
        }
        for (name, v) in [
            ("batch_size", self.batch_size),
            ("num_train_steps", self.num_train_steps),
            ("ppo_epochs", self.ppo_epochs),
            ("mini_batch_size", self.mini_batch_size),
            ("max_new_tokens", self.max_new_tokens),
            ("lora_r", self.lora_r),
            ("value_hidden", self.value_hidden),
            ("group_size", self.group_size()),
        ] {
            if v == 0 {
                p.push(format!("{name}: must be at least 1"));
            }
        }
        for (name, v) in [
            ("learning_rate", self.learning_rate),
            ("value_learning_rate", self.value_learning_rate),
        ] {
            if !(v.is_finite() && v > 0.0) {
                p.push(format!("{name}: {v} must be positive"));
            }
        }
        for (name, v) in [
            ("clip_low", self.clip_low),
            ("clip_high", self.clip_high),
            ("value_clip", self.value_clip),
            ("vf_coef", self.vf_coef),
            ("entropy_coef", self.entropy_coef),
            ("kl_coef", self.kl_coef()),
            ("max_grad_norm", self.max_grad_norm),
            ("weight_decay", self.weight_decay),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                p.push(format!("{name}: {v} must be finite and >= 0"));
            }
        }
        if self.clip_low >= 1.0 {
            p.push(format!("clip_low: {} must be below 1", self.clip_low));
        }
        if !(self.tis_cap == 0.0 || (self.tis_cap.is_finite() && self.tis_cap >= 1.0)) {
            p.push(format!(
                "tis_cap: {} must be 0 (off) or at least 1",
                self.tis_cap
            ));
        }
        for (name, v) in [("gamma", self.gamma), ("lam", self.lam)] {
            if !(0.0..=1.0).contains(&v) {
                p.push(format!("{name}: {v} is not in [0, 1]"));
            }
        }
        if !matches!(self.kl_estimator.as_str(), "k1" | "k2" | "k3") {
            p.push(format!(
                "kl_estimator: `{}` is not k1, k2 or k3",
                self.kl_estimator
            ));
        }
        if !matches!(
            self.loss_aggregation.as_str(),
            "token_mean" | "seq_mean" | "dr_grpo"
        ) {
            p.push(format!(
                "loss_aggregation: `{}` is not token_mean, seq_mean or dr_grpo",
                self.loss_aggregation
            ));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            p.push("temperature: must be positive".into());
        }
        if self.max_turns == 0 {
            p.push("max_turns: must be at least 1".into());
        }
        if !crate::reward::FEEDBACK_KINDS.contains(&self.feedback.as_str()) {
            p.push(format!(
                "feedback: `{}` is not verdict, first_diff or line",
                self.feedback
            ));
        }
        if !(self.turn_discount > 0.0 && self.turn_discount <= 1.0) {
            p.push(format!(
                "turn_discount: {} is not in (0, 1]",
                self.turn_discount
            ));
        }
        let t = &self.temperature_schedule;
        for (name, v) in [("initial", t.initial), ("final", t.r#final)] {
            if !(v.is_finite() && v > 0.0) {
                p.push(format!("temperature_schedule.{name}: {v} must be positive"));
            }
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            p.push(format!("top_p: {} is not in (0, 1]", self.top_p));
        }
        let known = |part: &str| {
            let (name, weight) = part.split_once(':').unwrap_or((part, "1"));
            matches!(name, "trace" | "sat" | "abd" | "ded")
                && weight
                    .parse::<f64>()
                    .is_ok_and(|w| w.is_finite() && w > 0.0)
        };
        if self.environment != "word" && !self.environment.split(['+', ',']).all(known) {
            p.push(format!(
                "environment: `{}` is not `word` or trace, sat, abd, ded joined by `+` (each optionally weighted, `abd:2`)",
                self.environment
            ));
        }
        p
    }
}

/// The pipeline's Stage 3 as DPO from the model's own rollouts: `rounds`
/// rounds, each sampling `num_samples` answers to `num_prompts` prompts of
/// the Stage 3 environment (`ppo.environment`, `ppo.dataset`) from the
/// round's model, pairing them (`trace-train prefs`) and training on the
/// pairs (`trace-train dpo`, settings in `train`); a round's merged model is
/// the next round's base.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpoRounds {
    /// Default 1.
    pub rounds: usize,
    /// Prompts a round. Default 64.
    pub num_prompts: usize,
    /// Answers a prompt. Default 8.
    pub num_samples: usize,
    /// Sampling temperature. Default 1.
    pub temperature: f64,
    /// Also one greedy answer a prompt, the one the gate's eval gives
    /// (`rollouts --greedy`); its pairs are kept first under
    /// `max_pairs_per_prompt`. Default false.
    pub greedy: bool,
    /// Longest answer in tokens. Default 512.
    pub max_new_tokens: usize,
    /// Also pair correct answers by `shorter` or `fewer_lines`. Default null.
    pub among_correct: Option<String>,
    /// Drop pairs fewer than this many character edits apart. Default 0.
    pub min_edit_distance: usize,
    /// Most pairs a prompt (0: all). Default 4.
    pub max_pairs_per_prompt: usize,
    /// Where none of a prompt's answers is right, pair the environment's
    /// own right answer over each wrong one (`prefs --demonstrations`).
    /// Default false.
    pub demonstrations: bool,
    /// Keep a right-over-wrong pair only where both answers have the same
    /// number of lines (`prefs --same_lines`): with `last_bucket` "1", the
    /// pairs otherwise teach the model to stop after one line. Default
    /// false.
    pub same_lines: bool,
    /// Also pair, for each wrong answer, the expected line over its first
    /// wrong one after the lines it got right (`prefs --first_error`).
    /// Default false.
    pub first_error: bool,
    /// Only prompts up to this bucket of `bucket_feature` (`rollouts
    /// --last_bucket`), e.g. `"1"`: programs that print one line, where
    /// the model is right often enough for a prompt to give pairs.
    /// Default null: every prompt.
    pub last_bucket: Option<String>,
    /// The feature `last_bucket` counts by: `output_lines`, `loop_depth`,
    /// `lines` or `injections`. Default `output_lines`.
    pub bucket_feature: String,
    /// The DPO settings of every round.
    pub train: DpoConfig,
}

impl Default for DpoRounds {
    fn default() -> Self {
        DpoRounds {
            rounds: 1,
            num_prompts: 64,
            num_samples: 8,
            temperature: 1.0,
            greedy: false,
            max_new_tokens: 512,
            among_correct: None,
            min_edit_distance: 0,
            max_pairs_per_prompt: 4,
            demonstrations: false,
            same_lines: false,
            first_error: false,
            last_bucket: None,
            bucket_feature: "output_lines".into(),
            train: DpoConfig::default(),
        }
    }
}

impl Validate for DpoRounds {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (name, v) in [
            ("rounds", self.rounds),
            ("num_prompts", self.num_prompts),
            ("num_samples", self.num_samples),
            ("max_new_tokens", self.max_new_tokens),
        ] {
            if v == 0 {
                p.push(format!("{name}: must be at least 1"));
            }
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            p.push("temperature: must be positive".into());
        }
        if let Some(c) = self
            .among_correct
            .as_deref()
            .filter(|c| !matches!(*c, "shorter" | "fewer_lines"))
        {
            p.push(format!(
                "among_correct: `{c}` is not shorter or fewer_lines"
            ));
        }
        if let Err(e) = crate::data::buckets::UpToBucket::from_settings(
            &self.bucket_feature,
            self.last_bucket.as_deref(),
        ) {
            p.push(e.named("bucket_feature", "last_bucket"));
        }
        p.extend(
            self.train
                .problems()
                .into_iter()
                .map(|m| format!("train.{m}")),
        );
        p
    }
}

/// DPO on preference pairs (`trace-train dpo`, and the pipeline's Stage 3
/// with `stage3.algorithm: "dpo"`). Defaults are TRL's `DPOConfig` where it
/// has one (beta 0.1, sigmoid loss, no dropout), with its suggested LoRA
/// learning rate.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpoConfig {
    /// The pairs file (`trace-train prefs` output). Default null: given on
    /// the command line.
    pub pairs_file: Option<PathBuf>,
    /// Output folder (null: `checkpoints/stage3_dpo`).
    pub output_dir: Option<PathBuf>,
    /// `sigmoid` (DPO), `ipo`, `robust` or `hinge`. Default `sigmoid`.
    pub loss: String,
    /// Strength of the pull to the reference. Default 0.1.
    pub beta: f64,
    /// Robust DPO's label-flip rate, in [0, 0.5). Default 0.1.
    pub epsilon: f64,
    /// Weight of the chosen answer's length-normalised NLL (RPO); 0 turns
    /// it off. Default 0.
    pub nll_coef: f64,
    /// The reference policy: `adapter_off` (the model with its adapter
    /// switched off: a fresh adapter on a merged model), `initial` (a
    /// frozen copy of the starting adapter, for training on from a trained
    /// one) or `precomputed` (the starting model's log-probs of every pair,
    /// computed once before training). Default `adapter_off`.
    pub reference: String,
    /// Default 1.
    pub epochs: usize,
    /// Pairs a micro-batch. Default 4.
    pub batch_size: usize,
    /// Default 1.
    pub gradient_accumulation_steps: usize,
    /// Peak learning rate of the LoRA factors. Default 1e-5.
    pub learning_rate: f64,
    /// Default 0.1.
    pub warmup_ratio: f64,
    /// Default 0.1.
    pub min_lr_ratio: f64,
    /// Default 0.
    pub weight_decay: f64,
    /// Default 1.
    pub max_grad_norm: f64,
    /// LoRA rank. Default 16.
    pub lora_r: usize,
    /// LoRA alpha. Default 32.
    pub lora_alpha: f64,
    /// Default 0 (TRL turns dropout off: the reference must see the same
    /// network).
    pub lora_dropout: f64,
    /// Default q, k, v, o, gate, up, down projections.
    pub target_modules: Vec<String>,
    /// Checkpoint every N optimizer steps. Default 100.
    pub save_steps: usize,
    /// Periodic checkpoints kept (0: all). Default 2.
    pub save_total_limit: usize,
    /// Recompute each decoder layer in the backward pass (null: on a GPU,
    /// as SFT). Default null.
    pub gradient_checkpointing: Option<bool>,
    /// Default 42.
    pub seed: u64,
}

impl Default for DpoConfig {
    fn default() -> Self {
        DpoConfig {
            pairs_file: None,
            output_dir: None,
            loss: "sigmoid".into(),
            beta: 0.1,
            epsilon: 0.1,
            nll_coef: 0.0,
            reference: "adapter_off".into(),
            epochs: 1,
            batch_size: 4,
            gradient_accumulation_steps: 1,
            learning_rate: 1e-5,
            warmup_ratio: 0.1,
            min_lr_ratio: 0.1,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            lora_r: 16,
            lora_alpha: 32.0,
            lora_dropout: 0.0,
            target_modules: SftConfig::default().target_modules,
            save_steps: 100,
            save_total_limit: 2,
            gradient_checkpointing: None,
            seed: 42,
        }
    }
}

impl Validate for DpoConfig {
    fn problems(&self) -> Vec<String> {
        // The loop, schedule and adapter keys SFT has too, under SFT's rules.
        let mut p = SftConfig {
            epochs: self.epochs,
            batch_size: self.batch_size,
            gradient_accumulation_steps: self.gradient_accumulation_steps,
            learning_rate: self.learning_rate,
            warmup_ratio: self.warmup_ratio,
            min_lr_ratio: self.min_lr_ratio,
            lora_r: self.lora_r,
            lora_dropout: self.lora_dropout,
            target_modules: self.target_modules.clone(),
            ..SftConfig::default()
        }
        .problems();
        if !matches!(self.loss.as_str(), "sigmoid" | "ipo" | "robust" | "hinge") {
            p.push(format!(
                "loss: `{}` is not one of sigmoid, ipo, robust, hinge",
                self.loss
            ));
        }
        if !matches!(
            self.reference.as_str(),
            "adapter_off" | "initial" | "precomputed"
        ) {
            p.push(format!(
                "reference: `{}` is not one of adapter_off, initial, precomputed",
                self.reference
            ));
        }
        if !(self.beta.is_finite() && self.beta > 0.0) {
            p.push(format!("beta: {} must be positive", self.beta));
        }
        if !(0.0..0.5).contains(&self.epsilon) {
            p.push(format!("epsilon: {} is not in [0, 0.5)", self.epsilon));
        }
        for (name, v) in [
            ("nll_coef", self.nll_coef),
            ("weight_decay", self.weight_decay),
            ("max_grad_norm", self.max_grad_norm),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                p.push(format!("{name}: {v} must be finite and >= 0"));
            }
        }
        p
    }
}

/// Stage 3's curriculum: tasks from the easiest difficulty bucket first,
/// the next one once the rolling accuracy passes the threshold.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CurriculumConfig {
    /// Default false.
    pub enabled: bool,
    /// Rolling accuracy at which the next bucket opens. Default 0.7.
    pub promotion_threshold: f64,
    /// Scored completions the rolling accuracy is taken over. Default 64.
    pub window: usize,
    /// The feature whose buckets make the levels: `output_lines`,
    /// `loop_depth`, `lines` or `injections`. Default `output_lines`.
    pub feature: String,
    /// The hardest bucket the curriculum opens, by its label as the eval
    /// report prints it (`"2-3"`): training stays on the buckets up to it.
    /// Default none (every bucket).
    pub last_bucket: Option<String>,
}

impl Default for CurriculumConfig {
    fn default() -> Self {
        CurriculumConfig {
            enabled: false,
            promotion_threshold: 0.7,
            window: 64,
            feature: "output_lines".into(),
            last_bucket: None,
        }
    }
}

impl Validate for CurriculumConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !(0.0..=1.0).contains(&self.promotion_threshold) {
            p.push(format!(
                "promotion_threshold: {} is not in [0, 1]",
                self.promotion_threshold
            ));
        }
        if self.window == 0 {
            p.push("window: must be at least 1".into());
        }
        if let Err(e) = crate::data::buckets::UpToBucket::from_settings(
            &self.feature,
            self.last_bucket.as_deref(),
        ) {
            p.push(e.named("feature", "last_bucket"));
        }
        p
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn temperature_schedule_moves_linearly_then_holds() {
        let off = TemperatureSchedule::default();
        assert_eq!(off.at(0, 0.9), 0.9);
        let t: TemperatureSchedule = serde_json::from_str(
            r#"{"enabled": true, "initial": 1.5, "final": 0.5, "warmup_steps": 4}"#,
        )
        .unwrap();
        let got: Vec<f64> = (0..7).map(|s| t.at(s, 9.0)).collect();
        assert_eq!(got, [1.5, 1.25, 1.0, 0.75, 0.5, 0.5, 0.5]);
        let now = TemperatureSchedule {
            warmup_steps: 0,
            ..t.clone()
        };
        assert_eq!(now.at(0, 9.0), 0.5);
        assert!(serde_json::from_str::<TemperatureSchedule>(r#"{"start": 1}"#).is_err());
        let bad = RlConfig {
            temperature_schedule: TemperatureSchedule { r#final: 0.0, ..t },
            ..RlConfig::default()
        };
        assert!(
            bad.problems()
                .iter()
                .any(|p| p.contains("temperature_schedule.final")),
            "{:?}",
            bad.problems()
        );
    }

    use super::*;

    #[test]
    fn unknown_fields_are_rejected_with_location() {
        let err = parse::<GenerateConfig>("{\n  \"variantz\": 3\n}", Path::new("x.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.json"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("variantz"), "{err}");
        assert!(err.contains("hint:"), "{err}");
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let err =
            parse::<GenerateConfig>(r#"{"variants": 0, "test_ratio": 2.0}"#, Path::new("g.json"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("variants") && err.contains("test_ratio"),
            "{err}"
        );
    }

    #[test]
    fn empty_object_gives_documented_defaults() {
        let g: GenerateConfig = parse("{}", Path::new("g.json")).unwrap();
        assert_eq!(g.variants, 3);
        assert_eq!(g.seed_scheme, SeedScheme::Env);
        // Every output length is kept by default, in both sets.
        assert_eq!(g.filters.lines(false), LineFilter::default());
        assert_eq!(g.filters.lines(true).min_output_lines, 1);
        assert!(!g.balance_lines);
        assert_eq!(g.limits.wall_ms, 10_000);
    }

    #[test]
    fn line_filters_are_per_stage_and_the_old_key_still_loads() {
        let g: GenerateConfig = parse(
            r#"{"filters": {"original": {"min_output_lines": 2, "max_output_lines": 5}, "transformed": {"min_output_lines": 3}}}"#,
            Path::new("g.json"),
        )
        .unwrap();
        assert_eq!(
            (
                g.filters.lines(false).min_output_lines,
                g.filters.lines(true).min_output_lines
            ),
            (2, 3)
        );
        assert!(!g.filters.lines(false).admits(1) && g.filters.lines(false).admits(5));
        assert!(!g.filters.lines(false).admits(6) && g.filters.lines(true).admits(60));
        // The older layout: `filters.min_output_lines` is the transformed
        // set's minimum; the originals keep every length.
        let old: GenerateConfig = parse(
            r#"{"filters": {"min_output_lines": 3, "drop_empty": true}}"#,
            Path::new("old.json"),
        )
        .unwrap();
        assert_eq!(old.filters.lines(true).min_output_lines, 3);
        assert_eq!(old.filters.lines(false).min_output_lines, 1);
        let err = parse::<GenerateConfig>(
            r#"{"filters": {"original": {"max_output_lines": 0}}, "balance_ratio": 0.5}"#,
            Path::new("bad.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("filters.original: max_output_lines 0") && err.contains("balance_ratio"),
            "{err}"
        );
        let err = parse::<GenerateConfig>(
            r#"{"filters": {"original": {"min_lines": 2}}}"#,
            Path::new("typo.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("min_lines") && err.contains("typo.json"),
            "{err}"
        );
    }

    /// The Python pipeline's `config/pipeline_config.json`, whole.
    const USER_PIPELINE: &str = include_str!("../tests/fixtures/user_pipeline_config.json");

    #[test]
    fn the_python_pipelines_names_load_and_mean_ours() {
        let p: PipelineConfig = parse(USER_PIPELINE, Path::new("p.json")).unwrap();
        assert_eq!(p.model.name, "Qwen/Qwen3-4B");
        assert!(p.hardware.b200_mode);
        // `no_4bit: false` keeps 4-bit loading; folded away on load.
        assert!(p.model.load_in_4bit && p.hardware.no_4bit.is_none());
        assert_eq!((p.stage0.variants, p.stage0.num_workers), (3, 32));
        assert_eq!((p.stage1.epochs, p.stage2.epochs), (2, 3));
        assert_eq!(p.stage3.ppo.num_train_steps, 5000);
        let p: PipelineConfig =
            parse(r#"{"hardware": {"no_4bit": true}}"#, Path::new("p.json")).unwrap();
        assert!(!p.model.load_in_4bit);
        // Any subset loads; the rest are defaults.
        let p: PipelineConfig =
            parse(r#"{"stage3": {"num_steps": 7}}"#, Path::new("p.json")).unwrap();
        assert_eq!((p.stage3.ppo.num_train_steps, p.stage1.epochs), (7, 1));
        // The sources name the key as the file wrote it.
        let tree: serde_json::Value = serde_json::from_str(USER_PIPELINE).unwrap();
        let s = Sources::from_file(Path::new("p.json"), &tree, "");
        let key = |k: &str| match s.get(k) {
            Source::File { key, .. } => key,
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(key("model.name"), "model.base_model");
        assert_eq!(key("model.load_in_4bit"), "hardware.no_4bit");
        assert_eq!(key("stage0.variants"), "stage0.variants_per_sample");
        assert_eq!(key("stage3.ppo.num_train_steps"), "stage3.num_steps");
        assert_eq!(key("stage1.epochs"), "stage1.epochs");
        assert_eq!(s.get("stage1.seed"), Source::Default);
        // A stage file: `generate.json` stands for `stage0`.
        let tree = serde_json::json!({"variants_per_sample": 2, "filters": {"drop_empty": false}});
        let s = Sources::from_file(Path::new("g.json"), &tree, "stage0");
        assert!(
            matches!(s.get("variants"), Source::File { key, .. } if key == "variants_per_sample")
        );
        assert!(matches!(s.get("filters.drop_empty"), Source::File { .. }));
    }

    #[test]
    fn one_setting_under_both_names_is_refused() {
        let err = parse::<PipelineConfig>(
            "{\n  \"model\": {\"base_model\": \"a/b\",\n \"name\": \"c/d\"}\n}",
            Path::new("both.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("both.json") && err.contains("line 3") && err.contains("`base_model`"),
            "{err}"
        );
        assert!(err.contains("hint:") && err.contains("keep one"), "{err}");
        let err = parse::<GenerateConfig>(
            r#"{"variants": 2, "variants_per_sample": 3}"#,
            Path::new("g.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("variants_per_sample"), "{err}");
        let err = parse::<PipelineConfig>(
            r#"{"model": {"load_in_4bit": true}, "hardware": {"no_4bit": true}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("hardware.no_4bit") && err.contains("model.load_in_4bit"),
            "{err}"
        );
    }

    #[test]
    fn a_misspelled_key_names_file_line_and_the_expected_keys() {
        let err =
            parse::<PipelineConfig>(r#"{"model": {"base_modle": "a/b"}}"#, Path::new("p.json"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("`name` may also be written `base_model`"),
            "{err}"
        );
        let text = USER_PIPELINE.replace("\"epochs\": 3", "\"epoch\": 3");
        let err = parse::<PipelineConfig>(&text, Path::new("config/pipeline_config.json"))
            .unwrap_err()
            .to_string();
        for want in [
            "config/pipeline_config.json",
            "line 6",
            "unknown field `epoch`",
            "`epochs`",
            "`learning_rate`",
            "hint:",
        ] {
            assert!(err.contains(want), "missing {want}: {err}");
        }
    }

    #[test]
    fn the_b200_preset_is_recorded_as_such() {
        let mut p: PipelineConfig = parse(USER_PIPELINE, Path::new("p.json")).unwrap();
        let mut s = Sources::default();
        p.apply_b200(&mut s, "hardware.b200_mode");
        assert!(!p.model.load_in_4bit && !p.hardware.gradient_checkpointing);
        assert_eq!(
            (p.stage2.batch_size, p.stage2.gradient_accumulation_steps),
            (8, 4)
        );
        assert_eq!(
            p.stage3.ppo.micro_batch_tokens,
            Some(B200_MICRO_BATCH_TOKENS)
        );
        assert_eq!(
            s.get("stage3.ppo.micro_batch_tokens"),
            Source::Preset {
                by: "hardware.b200_mode".into()
            }
        );
        assert_eq!(
            s.get("stage1.batch_size"),
            Source::Preset {
                by: "hardware.b200_mode".into()
            }
        );
        let table = s.table(&serde_json::to_value(&p).unwrap());
        assert!(
            table
                .iter()
                .any(|(k, v, _)| k == "stage3.ppo.num_train_steps" && v == 5000)
        );
    }

    #[test]
    fn the_users_stage3_file_parses_as_written() {
        let text = r#"{"ppo": {"batch_size": 16, "learning_rate": 5e-7, "num_train_steps": 5000}, "curriculum": {"enabled": true, "promotion_threshold": 0.7}}"#;
        let c: Stage3Config = parse(text, Path::new("stage3_ppo_config.json")).unwrap();
        assert_eq!(c.ppo.batch_size, 16);
        assert_eq!(c.ppo.learning_rate, 5e-7);
        assert_eq!(c.ppo.num_train_steps, 5000);
        assert!(c.curriculum.enabled);
        assert_eq!(c.curriculum.promotion_threshold, 0.7);
        assert_eq!(c.ppo.algorithm, "ppo");
        assert_eq!((c.ppo.group_size(), c.ppo.kl_coef()), (1, 0.05));
        let err =
            parse::<Stage3Config>("{\n  \"ppo\": {\"batch_sise\": 4}\n}", Path::new("s3.json"))
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("s3.json")
                && err.contains("line 2")
                && err.contains("batch_sise")
                && err.contains("num_train_steps"),
            "{err}"
        );
        let err = parse::<Stage3Config>(
            r#"{"ppo": {"algorithm": "a2c"}, "curriculum": {"promotion_threshold": 2}}"#,
            Path::new("s3.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("ppo.algorithm") && err.contains("curriculum.promotion_threshold"),
            "{err}"
        );
    }

    #[test]
    fn dpo_settings_are_checked_all_at_once_with_their_keys() {
        let c: DpoConfig = parse(r#"{"loss": "ipo", "beta": 0.2}"#, Path::new("dpo.json")).unwrap();
        assert_eq!(
            (c.loss.as_str(), c.beta, c.reference.as_str()),
            ("ipo", 0.2, "adapter_off")
        );
        let err = parse::<DpoConfig>(
            r#"{"loss": "kto", "beta": 0, "epsilon": 0.5, "batch_size": 0, "reference": "x", "warmup_ratio": 2}"#,
            Path::new("dpo.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "loss: `kto`",
            "beta: 0",
            "epsilon: 0.5",
            "batch_size: must be at least 1",
            "reference: `x`",
            "warmup_ratio: 2",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        let err = parse::<DpoConfig>("{\n  \"betaa\": 0.1\n}", Path::new("dpo.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2") && err.contains("betaa"), "{err}");
        // In the pipeline: Stage 3's recipe and its rounds, under their path.
        let p: PipelineConfig = parse(
            r#"{"stage3": {"algorithm": "dpo", "dpo": {"rounds": 3, "train": {"nll_coef": 1}}}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        assert!(p.stage3.is_dpo());
        assert_eq!((p.stage3.dpo.rounds, p.stage3.dpo.train.nll_coef), (3, 1.0));
        assert!(!PipelineConfig::default().stage3.is_dpo());
        let err = parse::<PipelineConfig>(
            r#"{"stage3": {"algorithm": "kto", "dpo": {"rounds": 0, "train": {"loss": "x"}}}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "stage3.algorithm: `kto`",
            "stage3.dpo.rounds",
            "stage3.dpo.train.loss",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn stage3_memory_keys_load_and_bad_values_name_the_key() {
        let c: Stage3Config = parse(
            r#"{"ppo": {"micro_batch_tokens": 4096, "gradient_checkpointing": true}}"#,
            Path::new("s3.json"),
        )
        .unwrap();
        assert_eq!(
            (c.ppo.micro_batch_tokens, c.ppo.gradient_checkpointing),
            (Some(4096), Some(true))
        );
        let d = Stage3Config::default();
        assert_eq!(
            (d.ppo.micro_batch_tokens, d.ppo.gradient_checkpointing),
            (None, None)
        );
        for (text, want) in [
            (
                "{\"ppo\": {\"batch_size\": 4,\n  \"micro_batch_tokens\": -512}}",
                "a whole number, 0 or more",
            ),
            (
                r#"{"ppo": {"micro_batch_tokens": "lots", "seed": 1}}"#,
                "a whole number, 0 or more",
            ),
            (r#"{"ppo": {"gradient_checkpointing": "yes"}}"#, "a boolean"),
        ] {
            let err = parse::<Stage3Config>(text, Path::new("config/stage3_ppo_config.json"))
                .unwrap_err()
                .to_string();
            let key = if text.contains("gradient_checkpointing") {
                "`gradient_checkpointing` takes"
            } else {
                "`micro_batch_tokens` takes"
            };
            assert!(
                err.contains("config/stage3_ppo_config.json")
                    && err.contains(key)
                    && err.contains(want)
                    && err.contains("hint:"),
                "{err}"
            );
        }
        // The pipeline file's section names it too.
        let err = parse::<PipelineConfig>(
            r#"{"stage3": {"ppo": {"micro_batch_tokens": 1.5}}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`micro_batch_tokens` takes"), "{err}");
    }

    #[test]
    fn the_gate_section_loads_with_defaults_and_bad_values_name_the_key() {
        let d = PipelineConfig::default().gate;
        assert_eq!(d.mode, "warn");
        assert_eq!(d.mode(), GateMode::Warn);
        assert_eq!(d.sets, GATE_SETS.map(String::from).to_vec());
        assert_eq!((d.limit, d.max_new_tokens), (Some(200), 512));
        let p: PipelineConfig = parse(
            r#"{"gate": {"mode": "keep_best", "sets": ["heldout_short"], "files": ["extra.jsonl"], "limit": null}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        assert_eq!(p.gate.mode(), GateMode::KeepBest);
        assert_eq!(p.gate.files, [PathBuf::from("extra.jsonl")]);
        assert_eq!(p.gate.limit, None);
        let off: PipelineConfig = parse(
            r#"{"gate": {"mode": "off", "sets": []}}"#,
            Path::new("p.json"),
        )
        .unwrap();
        assert_eq!(off.gate.mode(), GateMode::Off);
        let err = parse::<PipelineConfig>(
            r#"{"gate": {"mode": "halt", "sets": ["heldout_short", "cruxeval", "heldout_short"], "limit": 0, "batch_size": 0}}"#,
            Path::new("p.json"),
        )
        .unwrap_err()
        .to_string();
        for want in [
            "gate.mode: `halt` is not one of off, warn, stop, keep_best",
            "hint:",
            "gate.sets: `cruxeval`",
            "gate.sets: `heldout_short` is named twice",
            "gate.limit: must be at least 1",
            "gate.batch_size: must be at least 1",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
        let err = parse::<PipelineConfig>(r#"{"gate": {"sets": []}}"#, Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gate.sets, files: the gate has no set"),
            "{err}"
        );
        let err = parse::<PipelineConfig>(r#"{"gate": {"mod": "warn"}}"#, Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `mod`") && err.contains("`mode`"),
            "{err}"
        );
        let err = parse::<PipelineConfig>("{\"gate\": {\"mode\": 1}}", Path::new("p.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`mode` takes"), "{err}");
    }

    #[test]
    fn seed_schemes() {
        assert_eq!(SeedScheme::Peer.seed(7, 2, 100), 7002);
        // Env: task ids r, r+N, r+2N, ... all map back to row r.
        let n = 23_303;
        for v in 0..3 {
            assert_eq!(SeedScheme::Env.seed(5, v, n) % n, 5);
        }
    }
}
