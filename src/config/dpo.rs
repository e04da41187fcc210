//! DPO's settings (`config/dpo.json`, the pipeline's `stage3.dpo`): one
//! run on pairs, and the rounds that make pairs from the model's own
//! rollouts.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::groups::stage_defaults;
use super::*;

/// The pipeline's Stage 3 as DPO from the model's own rollouts: `rounds`
/// rounds, each sampling `num_samples` answers to `num_prompts` prompts of
/// the Stage 3 environment (`ppo.environment`, `ppo.dataset`) from the
/// round's model, pairing them (`trace-train prefs`) and training on the
/// pairs (`trace-train dpo`, settings in `train`); a round's merged model is
/// the next round's base.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DpoRounds {
    /// Rounds of rollouts, pairs and DPO, each from the model the last
    /// one trained. Default 1.
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
        p.extend(at_least_one(&[
            ("rounds", self.rounds),
            ("num_prompts", self.num_prompts),
            ("num_samples", self.num_samples),
            ("max_new_tokens", self.max_new_tokens),
        ]));
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
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DpoConfig {
    /// The pairs file (`trace-train prefs` output). Default null: given on
    /// the command line.
    pub pairs_file: Option<PathBuf>,
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
    /// Passes over the pairs. Default 1.
    pub epochs: usize,
    /// Pairs a micro-batch. Default 4.
    pub batch_size: usize,
    /// Micro-batches whose gradients add up to one optimizer step.
    /// Default 1.
    pub gradient_accumulation_steps: usize,
    #[serde(flatten, deserialize_with = "dpo_optim")]
    pub optim: OptimSettings,
    #[serde(flatten, deserialize_with = "dpo_schedule")]
    pub schedule: ScheduleSettings,
    #[serde(flatten, deserialize_with = "dpo_lora")]
    pub lora: LoraSettings,
    /// Dropout on the adapter's input during training. Default 0 (TRL
    /// turns dropout off: the reference must see the same network).
    pub lora_dropout: f64,
    #[serde(flatten, deserialize_with = "dpo_save")]
    pub save: SaveSettings,
    /// Recompute each decoder layer in the backward pass (null: on a GPU,
    /// as SFT). Default null.
    pub gradient_checkpointing: Option<bool>,
    /// Seeds the adapter's initial weights, dropout and the pairs' order.
    /// Default 42.
    pub seed: u64,
}

impl Default for DpoConfig {
    fn default() -> Self {
        DpoConfig {
            pairs_file: None,
            loss: "sigmoid".into(),
            beta: 0.1,
            epsilon: 0.1,
            nll_coef: 0.0,
            reference: "adapter_off".into(),
            epochs: 1,
            batch_size: 4,
            gradient_accumulation_steps: 1,
            optim: OptimSettings {
                learning_rate: 1e-5,
                ..OptimSettings::default()
            },
            schedule: ScheduleSettings {
                warmup_ratio: 0.1,
                min_lr_ratio: 0.1,
            },
            lora: LoraSettings::default(),
            lora_dropout: 0.0,
            save: SaveSettings {
                output_dir: None,
                save_steps: 100,
                save_total_limit: 2,
            },
            gradient_checkpointing: None,
            seed: 42,
        }
    }
}

impl Validate for DpoConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = super::sft::epoch_run_problems(
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
        if !(self.nll_coef.is_finite() && self.nll_coef >= 0.0) {
            p.push(format!(
                "nll_coef: {} must be finite and >= 0",
                self.nll_coef
            ));
        }
        p
    }
}

stage_defaults! {
    dpo_optim: DpoConfig.optim as OptimSettings,
    dpo_schedule: DpoConfig.schedule as ScheduleSettings,
    dpo_lora: DpoConfig.lora as LoraSettings,
    dpo_save: DpoConfig.save as SaveSettings,
}
