//! Stages 1 and 2's settings (`config/warmup.json`, `config/sft.json`, the
//! pipeline's `stage1` and `stage2`): LoRA SFT and checkpoint selection.

use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::groups::stage_defaults;
use super::*;

/// The most real tokens a packed pass holds unless `micro_batch_tokens`
/// says otherwise: at the Qwen3-4B shape on an H100, `bench train`'s
/// tokens a second level off by 4,096-8,192 tokens a pass (QLoRA with
/// checkpointing and bf16 without), while memory keeps growing with the
/// pass (bf16 without checkpointing: 55 GiB at 16,384, 26-29 at about 8,000).
pub const PACK_TOKENS: usize = 8192;

/// Stages 1 and 2: LoRA SFT.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Training JSONL (null: the stage's file under `datasets/trace_training`).
    pub train_file: Option<PathBuf>,
    /// Evaluation JSONL (null: the stage's test file).
    pub eval_file: Option<PathBuf>,
    /// Passes over the training records. Default 1.
    pub epochs: usize,
    /// Sequences a micro-batch. Default 4.
    pub batch_size: usize,
    /// Micro-batches whose gradients add up to one optimizer step.
    /// Default 4.
    pub gradient_accumulation_steps: usize,
    #[serde(flatten, deserialize_with = "sft_optim")]
    pub optim: OptimSettings,
    #[serde(flatten, deserialize_with = "sft_schedule")]
    pub schedule: ScheduleSettings,
    #[serde(flatten, deserialize_with = "sft_lora")]
    pub lora: LoraSettings,
    /// Dropout on the adapter's input during training. Default 0.05.
    pub lora_dropout: f64,
    /// Evaluate every N optimizer steps. Default 50.
    pub eval_steps: usize,
    #[serde(flatten, deserialize_with = "sft_save")]
    pub save: SaveSettings,
    /// Seeds the adapter's initial weights, dropout and the records'
    /// order. Default 42.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
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
            epochs: 1,
            batch_size: 4,
            gradient_accumulation_steps: 4,
            optim: OptimSettings {
                learning_rate: 2e-4,
                ..OptimSettings::default()
            },
            schedule: ScheduleSettings {
                warmup_ratio: 0.03,
                min_lr_ratio: 0.1,
            },
            lora: LoraSettings::default(),
            lora_dropout: 0.05,
            eval_steps: 50,
            save: SaveSettings {
                output_dir: None,
                save_steps: 100,
                save_total_limit: 2,
            },
            seed: 42,
            micro_batch_tokens: None,
            packing: None,
            select: None,
        }
    }
}

impl Validate for SftConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = epoch_run_problems(
            [
                self.epochs,
                self.batch_size,
                self.gradient_accumulation_steps,
            ],
            &self.optim,
            &self.schedule,
            &self.lora,
            self.lora_dropout,
        );
        if let Some(s) = &self.select {
            p.extend(s.problems());
        }
        p
    }
}

/// The checks of an epoch-counted LoRA run, SFT's and DPO's alike: its
/// `[epochs, batch_size, gradient_accumulation_steps]`, its shared groups
/// and its dropout.
pub(super) fn epoch_run_problems(
    [epochs, batch_size, accumulation]: [usize; 3],
    optim: &OptimSettings,
    schedule: &ScheduleSettings,
    lora: &LoraSettings,
    lora_dropout: f64,
) -> Vec<String> {
    let mut p = at_least_one(&[
        ("epochs", epochs),
        ("batch_size", batch_size),
        ("gradient_accumulation_steps", accumulation),
    ]);
    p.extend(optim.problems());
    p.extend(schedule.problems());
    p.extend(lora.problems());
    if !(0.0..=1.0).contains(&lora_dropout) {
        p.push(format!("lora_dropout: {lora_dropout} is not in [0, 1]"));
    }
    p
}

stage_defaults! {
    sft_optim: SftConfig.optim as OptimSettings,
    sft_schedule: SftConfig.schedule as ScheduleSettings,
    sft_lora: SftConfig.lora as LoraSettings,
    sft_save: SftConfig.save as SaveSettings,
}
