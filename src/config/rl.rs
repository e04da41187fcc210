//! Stage 3's settings (`config/stage3_ppo_config.json`, the pipeline's
//! `stage3`): online RL, its algorithm and its curriculum.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::groups::stage_defaults;
use super::*;

/// The sampling temperature of each RL step: `initial` at step 0, moving
/// linearly to `final` over `warmup_steps` steps, then `final`. A function
/// of the step alone, so a resumed run samples as the uninterrupted one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TemperatureSchedule {
    /// Use the schedule. Default false (the stage's `temperature`
    /// throughout).
    pub enabled: bool,
    /// The temperature at step 0. Default 1.0.
    pub initial: f64,
    /// The temperature from `warmup_steps` on. Default 0.7.
    #[serde(rename = "final")]
    pub r#final: f64,
    /// Steps over which the temperature moves from `initial` to `final`.
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
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
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
    #[serde(flatten, deserialize_with = "rl_optim")]
    pub optim: OptimSettings,
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
    /// earlier answers and feedback or observations); an episode that
    /// would pass it ends. 0: `max_prompt_tokens + turns x
    /// (max_new_tokens + 256)`, where turns is `max_turns`, or
    /// `max_steps_per_episode` for a multi-step environment. Default 0.
    pub max_episode_tokens: usize,
    /// Actions an episode of a multi-step environment (a `python:` file
    /// with an `Episode` class, an `http://` server) takes at most; it
    /// ends sooner when the environment says done. Each action trains as
    /// a completion of the conversation so far (the observations sit in
    /// its prompt, never trained). PPO's advantages run over the steps
    /// (GAE with `gamma` and `lam`, each step's value read at its action's
    /// last token), GRPO's over whole episodes (their return, the sum of
    /// the step rewards). Default 20.
    pub max_steps_per_episode: usize,
    /// Multi-step episodes (PPO, GRPO, Dr. GRPO): train each episode as one
    /// sequence (its first prompt, then every action and the observation
    /// after it; only the actions' tokens train) instead of one sequence
    /// an action holding the conversation before it. The same gradient
    /// where a minibatch holds every episode's actions (PPO's values read
    /// at each action's last token, as apart); far fewer tokens through
    /// the model. A minibatch (`mini_batch_size`) then counts episodes.
    /// An episode whose prompts are not each the one before it plus its
    /// answer (a template that rewrites earlier turns) trains an action a
    /// sequence as before. Default false.
    pub episode_sequences: bool,
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
    #[serde(flatten, deserialize_with = "rl_lora")]
    pub lora: LoraSettings,
    /// Hidden width of the value head. Default 256.
    pub value_hidden: usize,
    /// `trace` (the Trace task, programs run in the sandbox), another
    /// environment of `eval --environment` (`sat`, `abd`, `ded`,
    /// `answers`, `word` and `word_steps` for tests, `python:FILE.py`, an
    /// `http://` server), or a mixture joined by `+`, each optionally
    /// weighted (`trace:2+abd+ded`; ABD reads `abd_dataset`, DED
    /// `ded_dataset`, answers `answers_dataset` or its own file,
    /// `answers:FILE`). Default `trace`.
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
    /// Questions of `answers` in a mixture: `builtin` (arithmetic word
    /// problems made from the task id) or a JSONL path of GSM8K
    /// (`question`, `answer` ending in `#### N`), MATH (`problem`,
    /// `solution` with `\boxed{}`), plain (`question`, `answer`) or
    /// multiple-choice (`question`, `choices`, `answer`) rows. Default
    /// `builtin`.
    pub answers_dataset: String,
    /// How `answers` rewards a completion: `exact` (1 right, 0 wrong) or
    /// `tiered` (1 right after `####` or in `\boxed{}`, 0.7 right without
    /// the mark or a marked number within 1%, 0.4 the right answer shown but
    /// another final, 0.2 a wrong answer in the asked form, 0 otherwise).
    /// Default `exact`.
    pub answers_reward: String,
    /// File inside a hub dataset. Default `python_dataset.jsonl`.
    pub hub_file: String,
    /// Most injected prints a task. Default 6.
    pub max_injections: usize,
    /// Sandbox worker slots (0: two a core). Default 0.
    pub num_workers: usize,
    /// Interpreter for the sandbox. Default `/usr/bin/python3`.
    pub python: PathBuf,
    #[serde(flatten, deserialize_with = "rl_save")]
    pub save: SaveSettings,
    /// Seeds the adapter's and value head's initial weights, the task
    /// draws and the sampler. Default 42.
    pub seed: u64,
}

impl Default for RlConfig {
    fn default() -> Self {
        RlConfig {
            algorithm: "ppo".into(),
            batch_size: 16,
            group_size: None,
            optim: OptimSettings {
                learning_rate: 5e-7,
                ..OptimSettings::default()
            },
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
            max_steps_per_episode: 20,
            episode_sequences: false,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 512,
            sample_max_rows: 0,
            max_prompt_tokens: 1536,
            micro_batch_tokens: None,
            gradient_checkpointing: None,
            lora: LoraSettings::default(),
            value_hidden: 256,
            environment: "trace".into(),
            dataset: "builtin".into(),
            abd_dataset: "builtin".into(),
            answers_dataset: "builtin".into(),
            answers_reward: "exact".into(),
            ded_dataset: "ded-builtin".into(),
            hub_file: "python_dataset.jsonl".into(),
            max_injections: 6,
            num_workers: 0,
            python: PathBuf::from("/usr/bin/python3"),
            save: SaveSettings {
                output_dir: None,
                save_steps: 1000,
                save_total_limit: 0,
            },
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

/// The values `answers_reward` takes (`env::answers::Grading`).
pub const ANSWERS_REWARDS: [&str; 2] = ["exact", "tiered"];

impl Validate for RlConfig {
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if !ANSWERS_REWARDS.contains(&self.answers_reward.as_str()) {
            p.push(format!(
                "answers_reward: `{}` is not one of {}",
                self.answers_reward,
                ANSWERS_REWARDS.join(", ")
            ));
        }
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
        p.extend(at_least_one(&[
            ("batch_size", self.batch_size),
            ("num_train_steps", self.num_train_steps),
            ("ppo_epochs", self.ppo_epochs),
            ("mini_batch_size", self.mini_batch_size),
            ("max_new_tokens", self.max_new_tokens),
            ("value_hidden", self.value_hidden),
            ("group_size", self.group_size()),
        ]));
        p.extend(self.optim.problems());
        p.extend(self.lora.problems());
        if !(self.value_learning_rate.is_finite() && self.value_learning_rate > 0.0) {
            p.push(format!(
                "value_learning_rate: {} must be positive",
                self.value_learning_rate
            ));
        }
        for (name, v) in [
            ("clip_low", self.clip_low),
            ("clip_high", self.clip_high),
            ("value_clip", self.value_clip),
            ("vf_coef", self.vf_coef),
            ("entropy_coef", self.entropy_coef),
            ("kl_coef", self.kl_coef()),
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
        if self.episode_sequences && self.algorithm == "gspo" {
            p.push(
                "episode_sequences: not with algorithm gspo: its ratio is a sequence's, so it reads each action as its own sequence\nhint: use grpo, dr_grpo or ppo, or leave episode_sequences off".into(),
            );
        }
        if self.max_steps_per_episode == 0 {
            p.push("max_steps_per_episode: must be at least 1".into());
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
        // The names are the environment registry's to check (it is above
        // the configs): `ppo` and the pipeline parse this before they run.
        if self
            .environment
            .split(['+', ','])
            .any(|part| part.trim().is_empty())
        {
            p.push(format!(
                "environment: `{}` has an empty part\nhint: name environments joined by `+`, each optionally weighted (`trace:2+abd`)",
                self.environment
            ));
        }
        p
    }
}

/// Stage 3's curriculum: tasks from the easiest difficulty bucket first,
/// the next one once the rolling accuracy passes the threshold.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CurriculumConfig {
    /// Use the curriculum (off: tasks of every bucket from the start).
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

stage_defaults! {
    rl_optim: RlConfig.optim as OptimSettings,
    rl_lora: RlConfig.lora as LoraSettings,
    rl_save: RlConfig.save as SaveSettings,
}
