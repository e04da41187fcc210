//! `bench rl`: one real Stage 3 step on random weights of a model's shape
//! (or a model folder), timed phase by phase, for the peer
//! `benches/trl_rl_peer.py` (TRL's GRPOTrainer) to be measured beside it.
//!
//! The step is the recipe's own: a [`Policy`] built as Stage 3 builds it
//! (a fresh LoRA adapter from [`RlConfig`]'s defaults, a value head for
//! PPO, AdamW), then [`Policy::sample_until`] with no stop id (every
//! completion is exactly `new` tokens, as the peer's
//! `min_new_tokens = max_new_tokens`), the completions decoded and scored,
//! [`Policy::score_old`] (old log-probs, values, and the reference with the
//! adapter off), [`Policy::advantages`] and [`Policy::update`]. What it
//! leaves out is what depends on the task: drawing tasks in the sandbox,
//! the curriculum, and GRPO's resampling of groups whose rewards are all
//! equal (such groups are counted instead).
//!
//! Prompts are `batch` rows of `prompt` token ids (the same formula as
//! `bench gen`), each sampled `group` times. The reward is a deterministic
//! function of the sampled tokens, the share of even token ids, so that
//! rewards differ within a group and GRPO's advantages are not all zero.
//! A shape's random weights come with the tokenizer of `trace-train model
//! tiny` (byte-level, ChatML; ids below every shape's vocabulary): the step
//! needs a tokenizer only for its pad and stop ids and for decoding.

use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use serde::Serialize;

use crate::config::{RlConfig, Validate};
use crate::data::ChatTokenizer;
use crate::kit::load;
use crate::model;
use crate::recipes::ppo::{Policy, Sample, UpdateStats};

/// What `bench rl` measures.
#[derive(Debug, Clone)]
pub struct RlBench {
    /// A shape of [`super::train::SHAPES`] (random weights), or a model
    /// folder with its tokenizer.
    pub model: String,
    /// `ppo`, `grpo`, `dr_grpo` or `gspo`.
    pub algorithm: String,
    /// Prompts a step.
    pub batch: usize,
    /// Completions a prompt (`None`: the recipe's default, 1 for PPO and 8
    /// for GRPO).
    pub group: Option<usize>,
    /// Tokens a prompt.
    pub prompt: usize,
    /// Tokens every completion has.
    pub new: usize,
    /// Completions a minibatch (one optimizer step each).
    pub mini_batch: usize,
    /// Timed steps, after one untimed warm-up step.
    pub steps: usize,
    pub gradient_checkpointing: bool,
    /// Frozen projections in NF4 (QLoRA).
    pub four_bit: bool,
}

/// What `bench rl` measured: the timed steps' mean, phase by phase.
#[derive(Debug, Serialize)]
pub struct RlResult {
    pub ours: &'static str,
    pub job: &'static str,
    pub model: String,
    pub algorithm: String,
    pub batch: usize,
    pub group: usize,
    pub prompt: usize,
    pub new: usize,
    /// Completions an optimizer step (at most the step's).
    pub mini_batch: usize,
    pub rank: usize,
    #[serde(rename = "4bit")]
    pub four_bit: bool,
    pub grad_ckpt: bool,
    pub steps: usize,
    /// Sampling `batch x group` completions of `new` tokens.
    pub sample_s: f64,
    /// Decoding and scoring them (the environment's part).
    pub score_s: f64,
    /// The no-grad passes: old log-probs (and values) and the reference.
    pub old_ref_s: f64,
    /// Advantages and the minibatches' forward, backward and AdamW.
    pub update_s: f64,
    /// The whole step, start to end.
    pub step_s: f64,
    /// The untimed first step, whole.
    pub warmup_step_s: f64,
    /// New tokens sampled a second of `sample_s`.
    pub new_tokens_per_s: f64,
    /// The step's tokens (`batch x group x (prompt + new)`) a second of
    /// `step_s`.
    pub tokens_per_s: f64,
    /// Peak device memory in use during the timed steps (weights
    /// included), from the device's memory pool; absent on the CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_mem_gib: Option<f64>,
    /// Optimizer steps a step (minibatches).
    pub minibatches: usize,
    pub reward_mean: f64,
    /// Groups whose rewards were all equal (no GRPO signal; the recipe
    /// would sample them again).
    pub zero_variance_groups: usize,
    pub policy_loss: f64,
}

/// The share of even ids among `tokens`: deterministic, in [0, 1], and
/// different between most pairs of sampled completions.
pub fn reward_of(tokens: &[u32]) -> f64 {
    if tokens.is_empty() {
        return 0.0;
    }
    tokens.iter().filter(|&&t| t % 2 == 0).count() as f64 / tokens.len() as f64
}

/// The settings of the step: the recipe's defaults with the bench's sizes.
/// Every problem names the flag that set it.
pub fn rl_config(b: &RlBench) -> anyhow::Result<RlConfig> {
    let flag =
        |what: &str, hint: &str| -> anyhow::Error { anyhow::anyhow!("{what}\nhint: {hint}") };
    for (name, v) in [
        ("--batch", b.batch),
        ("--prompt", b.prompt),
        ("--new", b.new),
        ("--mini_batch_size", b.mini_batch),
        ("--steps", b.steps),
    ] {
        if v == 0 {
            return Err(flag(
                &format!("{name}: must be at least 1"),
                &format!("pass {name} 1 or more"),
            ));
        }
    }
    if b.group == Some(0) {
        return Err(flag(
            "--group: must be at least 1",
            "pass --group 1 or more",
        ));
    }
    let mut cfg = RlConfig {
        algorithm: b.algorithm.clone(),
        batch_size: b.batch,
        group_size: b.group,
        max_new_tokens: b.new,
        mini_batch_size: b.mini_batch,
        gradient_checkpointing: Some(b.gradient_checkpointing),
        ..RlConfig::default()
    };
    if cfg.rl_algorithm().group_relative() && cfg.group_size() < 2 {
        return Err(flag(
            &format!(
                "--group {}: GRPO needs at least 2 completions a prompt",
                cfg.group_size()
            ),
            "pass --group 2 or more, or --algorithm ppo",
        ));
    }
    let problems = cfg.problems();
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}\nhint: see `trace-train bench rl --help`",
        problems.join("\n  - ")
    );
    // The sampler's prompt limit never cuts a bench prompt.
    cfg.max_prompt_tokens = cfg.max_prompt_tokens.max(b.prompt);
    Ok(cfg)
}

/// The policy of the bench: random weights of a shape with the tiny chat
/// model's tokenizer, or a model folder with its own.
fn policy(b: &RlBench, cfg: &RlConfig, device: &Device) -> anyhow::Result<Policy> {
    let dtype = load::train_dtype("bf16", device);
    let lora = Policy::lora_config(cfg)?;
    let folder = std::path::Path::new(&b.model);
    let (mut loaded, tok) = if folder.is_dir() {
        let tok = ChatTokenizer::from_dir(folder).with_context(|| {
            format!(
                "`{}` has no usable tokenizer\nhint: bench rl needs a model folder with its tokenizer files, or a shape name",
                folder.display()
            )
        })?;
        (model::load(folder, Some(&lora), dtype, device)?, tok)
    } else {
        let loaded = super::train::random_model_with(&b.model, Some(&lora), dtype, device)?;
        let dir = tempfile::tempdir()?;
        model::arch::tiny::write_tiny_chat_model(dir.path(), 7)?;
        (loaded, ChatTokenizer::from_dir(dir.path())?)
    };
    // Policy::new turns checkpointing on or off from the config.
    if b.four_bit {
        loaded.model.hold_base(crate::model::BasePrecision::Nf4)?;
    }
    Policy::new(loaded, tok, cfg)
}

/// One step's phases, in seconds, and what it computed.
struct Step {
    sample: f64,
    score: f64,
    old_ref: f64,
    update: f64,
    total: f64,
    rewards: Vec<f64>,
    zero_variance_groups: usize,
    stats: UpdateStats,
}

/// One Stage 3 step through `policy`'s own methods (see the module header).
fn step(
    policy: &mut Policy,
    prompts: &[Vec<u32>],
    group: usize,
    new: usize,
    index: u64,
) -> anyhow::Result<Step> {
    let device = policy.loaded.device.clone();
    let seed = policy.cfg.seed;
    let lr = policy.cfg.optim.learning_rate;
    device.synchronize()?;
    let t0 = Instant::now();
    let rows: Vec<Vec<u32>> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), group))
        .collect();
    // No stop id: every completion runs to `new` tokens.
    let gens = policy.sample_until(&rows, crate::rng::keyed(seed, index, 0), 0, &[])?;
    let t1 = Instant::now();
    for g in &gens {
        anyhow::ensure!(
            g.tokens.len() == new && !g.stopped,
            "a completion has {} tokens, not the {new} asked for",
            g.tokens.len()
        );
    }
    let mut batch = Vec::with_capacity(gens.len());
    let mut zero_variance_groups = 0;
    for (k, (prompt, members)) in prompts.iter().zip(gens.chunks(group)).enumerate() {
        let mut rewards = Vec::with_capacity(group);
        for g in members {
            // Decoded as the recipe decodes for the environment.
            let _text = policy.tok.decode(&g.tokens, true)?;
            let r = reward_of(&g.tokens);
            rewards.push(r);
            batch.push(Sample::new(k, prompt.clone(), g, policy.stop_id(), r));
        }
        if group > 1 && rewards.iter().all(|&r| r == rewards[0]) {
            zero_variance_groups += 1;
        }
    }
    let t2 = Instant::now();
    policy.score_old(&mut batch)?;
    let t3 = Instant::now();
    policy.advantages(&mut batch);
    let stats = policy.update(&batch, index, lr)?;
    device.synchronize()?;
    let t4 = Instant::now();
    let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
    Ok(Step {
        sample: secs(t0, t1),
        score: secs(t1, t2),
        old_ref: secs(t2, t3),
        update: secs(t3, t4),
        total: secs(t0, t4),
        rewards: batch.iter().map(|s| s.reward).collect(),
        zero_variance_groups,
        stats,
    })
}

/// A warm-up step, then `steps` timed ones; the timed steps' mean.
pub fn rl_step(b: &RlBench, device: &Device) -> anyhow::Result<RlResult> {
    let cfg = rl_config(b)?;
    let group = cfg.group_size();
    let mut policy = policy(b, &cfg, device)?;
    let vocab = policy.loaded.model.vocab_size() as u64;
    let prompts: Vec<Vec<u32>> = (0..b.batch)
        .map(|r| {
            (0..b.prompt)
                .map(|i| (((r * b.prompt + i) as u64 * 2_654_435_761) % (vocab - 1)) as u32 + 1)
                .collect()
        })
        .collect();
    let warmup = step(&mut policy, &prompts, group, b.new, 0)?;
    crate::gpu::reset_peak_memory(device)?;
    let mut timed = Vec::with_capacity(b.steps);
    for k in 0..b.steps {
        timed.push(step(&mut policy, &prompts, group, b.new, 1 + k as u64)?);
    }
    let peak = crate::gpu::peak_memory_gib(device)?;
    let mean = |f: &dyn Fn(&Step) -> f64| timed.iter().map(f).sum::<f64>() / timed.len() as f64;
    let (sample_s, step_s) = (mean(&|s| s.sample), mean(&|s| s.total));
    let last = timed.last().expect("steps >= 1");
    anyhow::ensure!(
        last.stats.policy_loss.is_finite(),
        "the policy loss is not finite: {}",
        last.stats.policy_loss
    );
    let completions = b.batch * group;
    Ok(RlResult {
        ours: "trace-train",
        job: "rl_step",
        model: b.model.clone(),
        algorithm: cfg.algorithm.clone(),
        batch: b.batch,
        group,
        prompt: b.prompt,
        new: b.new,
        // A minibatch never holds more than the step's completions.
        mini_batch: b.mini_batch.min(completions),
        rank: cfg.lora.r,
        four_bit: b.four_bit,
        grad_ckpt: b.gradient_checkpointing,
        steps: b.steps,
        sample_s,
        score_s: mean(&|s| s.score),
        old_ref_s: mean(&|s| s.old_ref),
        update_s: mean(&|s| s.update),
        step_s,
        warmup_step_s: warmup.total,
        new_tokens_per_s: (completions * b.new) as f64 / sample_s,
        tokens_per_s: (completions * (b.prompt + b.new)) as f64 / step_s,
        peak_mem_gib: peak,
        minibatches: last.stats.minibatches,
        reward_mean: last.rewards.iter().sum::<f64>() / last.rewards.len() as f64,
        zero_variance_groups: last.zero_variance_groups,
        policy_loss: last.stats.policy_loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(algorithm: &str, group: Option<usize>) -> RlBench {
        RlBench {
            model: "tiny".into(),
            algorithm: algorithm.into(),
            batch: 2,
            group,
            prompt: 8,
            new: 4,
            mini_batch: 16,
            steps: 1,
            gradient_checkpointing: false,
            four_bit: false,
        }
    }

    #[test]
    fn the_reward_is_the_share_of_even_ids() {
        assert_eq!(reward_of(&[2, 3, 4, 5]), 0.5);
        assert_eq!(reward_of(&[1]), 0.0);
        assert_eq!(reward_of(&[]), 0.0);
    }

    #[test]
    fn a_step_of_each_algorithm_runs_on_the_cpu() {
        let cpu = Device::Cpu;
        let g = rl_step(&bench("grpo", Some(2)), &cpu).unwrap();
        assert_eq!((g.group, g.minibatches, g.new), (2, 1, 4));
        let parts = g.sample_s + g.score_s + g.old_ref_s + g.update_s;
        assert!((g.step_s - parts).abs() < 1e-6, "{} vs {parts}", g.step_s);
        assert!((0.0..=1.0).contains(&g.reward_mean));
        assert!(g.peak_mem_gib.is_none());
        // PPO defaults to one completion a prompt; minibatches of 1 make
        // two optimizer steps.
        let p = rl_step(
            &RlBench {
                mini_batch: 1,
                ..bench("ppo", None)
            },
            &cpu,
        )
        .unwrap();
        assert_eq!((p.group, p.minibatches), (1, 2));
        assert!(p.policy_loss.is_finite());
    }

    #[test]
    fn bad_sizes_name_their_flag() {
        let err = |b: RlBench| rl_config(&b).unwrap_err().to_string();
        assert!(err(bench("grpo", Some(1))).starts_with("--group 1: GRPO"));
        assert!(
            err(RlBench {
                new: 0,
                ..bench("ppo", None)
            })
            .starts_with("--new: must be at least 1")
        );
        assert!(err(bench("grpo", Some(0))).contains("--group"));
    }
}
