//! Typed configuration: `config/pipeline_config.json` (model, hardware and
//! one section a stage) and one file a stage (`config/generate.json`, ...).
//!
//! Every struct rejects unknown fields and documents its defaults; a file may
//! leave out any field. CLI flags override file values (see `cli`).

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
    let value: T = serde_json::from_str(text).map_err(|e| {
        let message = e.to_string();
        let hint = if message.contains("unknown field") {
            "remove the field or check its spelling; the expected fields are listed above"
        } else {
            "the file must be a JSON object; see the shipped files in `config/` for examples"
        };
        ConfigError::Parse {
            path: path.to_owned(),
            line: e.line(),
            column: e.column(),
            message,
            hint: hint.into(),
        }
    })?;
    let problems = value.problems();
    if problems.is_empty() {
        Ok(value)
    } else {
        Err(ConfigError::Invalid {
            path: path.to_owned(),
            problems,
        })
    }
}

/// Semantic checks beyond the types; all problems are gathered at once.
pub trait Validate {
    fn problems(&self) -> Vec<String>;
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
    /// Stage 3: online RL.
    pub stage3: RlConfig,
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
        ] {
            p.extend(v.into_iter().map(|m| format!("{name}.{m}")));
        }
        p
    }
}

/// The base model.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Hub id or local folder. Default `Qwen/Qwen3-4B`.
    pub name: String,
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
}

impl Default for HardwareConfig {
    fn default() -> Self {
        HardwareConfig {
            device: "auto".into(),
            num_gpus: None,
            gradient_checkpointing: true,
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
    /// Drop transformed programs whose output has no `__DBG_` line. Default true.
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
            require_dbg: true,
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
    /// (HumanEval.jsonl[.gz]), or a hub dataset id. Default `builtin`.
    pub dataset: String,
    /// File inside a hub dataset. Default `python_dataset.jsonl`.
    pub hub_file: String,
    /// Output folder. Default `datasets/trace_training`.
    pub output_dir: PathBuf,
    /// Use at most this many rows (null: all). Default null.
    pub max_samples: Option<usize>,
    /// Transformed variants a program. Default 3.
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

/// Stages 1 and 2: LoRA SFT.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Training JSONL (null: the stage's file under `datasets/trace_training`).
    pub train_file: Option<PathBuf>,
    /// Evaluation JSONL (null: the stage's test file).
    pub eval_file: Option<PathBuf>,
    /// Output folder (null: `checkpoints/<stage>`).
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
        p
    }
}

/// Stage 3: online RL against the trace environment.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RlConfig {
    /// `ppo` or `grpo`. Default `grpo`.
    pub algorithm: String,
    /// Prompts a step. Default 8.
    pub batch_size: usize,
    /// Completions a prompt. Default 8.
    pub group_size: usize,
    /// Default 1e-6.
    pub learning_rate: f64,
    /// KL penalty to the reference policy. Default 0.04.
    pub kl_coef: f64,
    /// PPO clip range. Default 0.2.
    pub clip_range: f64,
    /// Sampling temperature. Default 0.7.
    pub temperature: f64,
    /// Longest completion in tokens. Default 1024.
    pub max_new_tokens: usize,
    /// Optimizer steps. Default 200.
    pub steps: usize,
    /// Order prompts from easy to hard. Default false.
    pub curriculum: bool,
    /// Default 42.
    pub seed: u64,
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig {
            algorithm: "grpo".into(),
            batch_size: 8,
            group_size: 8,
            learning_rate: 1e-6,
            kl_coef: 0.04,
            clip_range: 0.2,
            temperature: 0.7,
            max_new_tokens: 1024,
            steps: 200,
            curriculum: false,
            seed: 42,
        }
    }
}

impl Validate for RlConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !matches!(self.algorithm.as_str(), "ppo" | "grpo") {
            p.push(format!(
                "algorithm: `{}` is not ppo or grpo",
                self.algorithm
            ));
        }
        if self.group_size < 2 {
            p.push("group_size: needs at least 2 completions for an advantage".into());
        }
        if self.batch_size == 0 || self.steps == 0 {
            p.push("batch_size and steps: must be at least 1".into());
        }
        if self.temperature <= 0.0 {
            p.push("temperature: must be positive".into());
        }
        p
    }
}

#[cfg(test)]
mod tests {
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
