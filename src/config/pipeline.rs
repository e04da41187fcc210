//! The pipeline config (`config/pipeline_config.json`): its sections, the
//! model and the hardware every stage shares, and the gate between stages.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::*;
use crate::model::layers::lora::BasePrecision;

/// The whole pipeline, as `config/pipeline_config.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
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
        // `model.base_precision` and its older names, each a switch
        // ([`PRECISION_SWITCHES`]): one of them may say it.
        let switches = [
            ("model.load_in_4bit", self.model.load_in_4bit.take()),
            ("hardware.no_4bit", self.hardware.no_4bit.take()),
        ];
        let mut named: Vec<&str> = Vec::new();
        if file.pointer("/model/base_precision").is_some() {
            named.push("model.base_precision");
        }
        let mut folded = None;
        for (key, on) in switches {
            if let Some(on) = on {
                named.push(key);
                folded = switch_precision(key, on);
            }
        }
        match (named.as_slice(), folded) {
            ([_, _, ..], _) => p.push(format!(
                "{}: each sets how the frozen base weights are held (older names of model.base_precision: {}); keep one (hint: write `model.base_precision` alone, `bf16`, `nf4` or `fp8`)",
                named.join(" and "),
                PRECISION_SWITCHES
                    .iter()
                    .map(|(k, on, off)| {
                        format!("{k} true is {}, false {}", on.as_str(), off.as_str())
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            (_, Some(precision)) => self.model.base_precision = precision,
            _ => {}
        }
        p
    }
}

impl PipelineConfig {
    /// The preset for one large GPU (B200, H200, H100 80 GB), as `--b200`
    /// or `hardware.b200_mode: true` ask: bf16 base weights where they
    /// would be NF4 (an FP8 base, never a default, was asked for and
    /// stays), no gradient checkpointing, micro-batches of 8 with 4
    /// accumulation steps, over what the file says. Measured on an H200
    /// at the Qwen3-4B shape: without checkpointing and 4-bit weights a
    /// step runs 1.35x faster than with them, and 4 x 1024 tokens take 20
    /// GiB of which 8 are weights; 8 x 2048 tokens then need about 56 GiB
    /// (an estimate from that figure, activations growing with tokens).
    /// Stage 3 gets the same bf16 base without checkpointing and training
    /// micro-batches of [`B200_MICRO_BATCH_TOKENS`]. `by` names what asked
    /// for it, for `sources`.
    pub fn apply_b200(&mut self, sources: &mut Sources, by: &str) {
        self.hardware.b200_mode = true;
        self.model.dtype = "bf16".into();
        if self.model.base_precision == BasePrecision::Nf4 {
            self.model.base_precision = BasePrecision::Bf16;
            sources.set("model.base_precision", Source::Preset { by: by.to_owned() });
        }
        self.hardware.gradient_checkpointing = false;
        for s in [&mut self.stage1, &mut self.stage2] {
            s.batch_size = 8;
            s.gradient_accumulation_steps = 4;
        }
        self.stage3.ppo.micro_batch_tokens = Some(B200_MICRO_BATCH_TOKENS);
        for key in [
            "model.dtype",
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Hub id or local folder (the Python pipeline's `base_model`). Default
    /// `Qwen/Qwen3-4B`.
    #[serde(alias = "base_model")]
    pub name: String,
    /// With a hub id: the branch, tag or commit (null: `main`). Default null.
    pub revision: Option<String>,
    /// How the frozen base weights are held: `bf16` (as loaded, in the
    /// training dtype), `nf4` (4 bits with double quantisation, QLoRA's,
    /// dequantised for each product) or `fp8` (8 bits, E4M3 with a scale
    /// an output channel, the forward products in FP8). Every stage loads
    /// its base so; on the CPU `nf4` is not applied (a CPU run keeps its
    /// dtype) and `fp8` is emulated. `eval` and `serve` read no config
    /// file: they hold `bf16` unless their `--base_precision` says
    /// otherwise, and the pipeline's gate and eval measure in `bf16`. The
    /// older names are accepted: `load_in_4bit` (true: `nf4`, false:
    /// `bf16`) and `hardware.no_4bit` (true: `bf16`). Default `nf4`.
    #[schemars(schema_with = "base_precision_schema")]
    pub base_precision: BasePrecision,
    /// The older name of `base_precision`: true is `nf4`, false `bf16`
    /// (`--no_4bit` is `--base_precision bf16`); folded into it on load,
    /// so it is never set after loading. Default absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_in_4bit: Option<bool>,
    /// Training and inference dtype: `bf16`, `f16` or `f32`. Default `bf16`.
    pub dtype: String,
    /// Longest sequence in tokens. Default 2048.
    pub max_length: usize,
    /// Special-token strings inside chat messages (`<|im_end|>`, ...)
    /// become the control tokens they name. Off, they are plain text, so a
    /// message cannot close its turn or open another role's (as Hugging
    /// Face's `split_special_tokens`); turn it on only for data that writes
    /// control tokens inside messages on purpose. Default false (and then
    /// left out of a run's recorded settings, so runs recorded before the
    /// setting existed resume as they were).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub special_tokens_in_messages: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            name: "Qwen/Qwen3-4B".into(),
            revision: None,
            base_precision: BasePrecision::Nf4,
            load_in_4bit: None,
            dtype: "bf16".into(),
            max_length: 2048,
            special_tokens_in_messages: false,
        }
    }
}

/// `base_precision`'s values, for the reference: the model crate's type
/// knows no schema.
fn base_precision_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = BasePrecision::ALL.iter().map(|p| p.as_str()).collect();
    schemars::json_schema!({"type": "string", "enum": names})
}

impl ModelConfig {
    /// The section as runs recorded it before `base_precision` existed,
    /// for what a resume compares with an earlier run's record (the
    /// pipeline's stage hashes): `load_in_4bit` for `nf4` and `bf16`;
    /// `base_precision` for `fp8`, which no earlier run could ask for.
    pub fn as_recorded(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("the model section serialises");
        if let Some(m) = v.as_object_mut() {
            let four_bit = match self.base_precision {
                BasePrecision::Nf4 => Some(true),
                BasePrecision::Bf16 => Some(false),
                BasePrecision::Fp8 => None,
            };
            if let Some(on) = four_bit {
                m.remove("base_precision");
                m.insert("load_in_4bit".into(), on.into());
            }
        }
        v
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
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
    /// The `--b200` preset for one large GPU (B200, H200, H100 80 GB):
    /// bf16 base weights (not NF4), no gradient checkpointing,
    /// micro-batches of 8 with 4 accumulation steps, and Stage 3's
    /// training passes of 12,288 tokens, over what the file says (see
    /// [`PipelineConfig::apply_b200`]). Default false.
    pub b200_mode: bool,
    /// The Python pipeline's spelling of `model.base_precision: bf16`
    /// (true; false is `nf4`), as `--no_4bit`; folded into
    /// `model.base_precision` on load, so it is never set after loading.
    /// Default absent.
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

    /// Opens the device, with a hint when CUDA is asked for and missing, or
    /// when `auto` finds a driver whose GPU cannot be opened.
    pub fn open(self) -> anyhow::Result<candle_core::Device> {
        use anyhow::Context;
        use candle_core::Device;
        let device = match self {
            Self::Cpu => Device::Cpu,
            Self::Auto => Device::cuda_if_available(0).context(
                "the CUDA driver answered but GPU 0 could not be opened\nhint: check the GPU with `nvidia-smi` (and `trace-train env`), or pass --device cpu to run on the CPU",
            )?,
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
