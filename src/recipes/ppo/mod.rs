//! The Stage 3 recipe, PPO (default) or GRPO, one loop read top to bottom:
//!
//! 1. lock the output folder, load tokenizer and model (a fresh LoRA
//!    adapter on the Stage 2 merged model), the value head (PPO), the
//!    optimizers; resume from the newest valid `step_N/` when asked;
//! 2. each step: draw tasks from the environment's stream (made on a worker
//!    thread while the model samples) that the curriculum admits; sample
//!    `group_size` completions a prompt from the live model (this step's
//!    LoRA weights, never a copy); score them (a masked score is counted,
//!    never 0); GRPO drops groups whose rewards are all equal and samples
//!    fresh ones (dynamic sampling);
//! 3. old log-probs and values with the trainer's forward, reference
//!    log-probs with the adapter switched off; advantages (PPO: k1 KL in
//!    the per-token reward, GAE, whitening; GRPO: group-relative);
//! 4. `ppo_epochs` passes of minibatches: clipped surrogate (+ clipped value
//!    loss, - entropy bonus, + k-estimator KL for GRPO), gradient clipping,
//!    AdamW;
//!
//!    every pass of 3 and 4 runs in micro-batches of at most a token budget
//!    ([`crate::rl::memory`]); a minibatch's micro-batches keep its token
//!    weights and their gradients are summed before the non-finite guard,
//!    clipping and its one optimizer step, so the budget changes memory,
//!    not the update (up to the order of additions);
//! 5. metrics through the run log, the progress bar, a checkpoint every
//!    `save_steps` (`step_N/`) and on SIGTERM/SIGINT; at the end the adapter
//!    in `final/` (PEFT layout) and the merged model in `merged/`.
//!
//! [`run_with`] is those steps in order: [`collect`] (2), [`train`] (3-4),
//! [`Totals::over_ranks`] and [`StepRecord::scalars`] (5); everything around
//! the loop (lock, load, resume, checkpoints, outputs) is the kit's
//! ([`crate::kit`]).
//!
//! Every random choice is keyed by (seed, step, ...) and the task stream by
//! its cursor, so a resumed run repeats the uninterrupted one on CPU.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::{CurriculumConfig, ModelConfig, RlConfig};
use crate::data::{ChatTokenizer, Message, Role};
use crate::dist::{self, Communicator, Single, stats};
use crate::kit::checkpoint::{self, TrainerState};
use crate::kit::{Resume, Run, card, clip_scale, fingerprint, load, outputs};
use crate::model::decode::generate::{self, Generation, Sampling};
use crate::model::layers::lora::{LoraConfig, set_dropout_seed, without_adapters};
use crate::model::{self, LoadedModel};
use crate::progress::Progress;
use crate::reward;
use crate::rng::keyed;
use crate::train::completion::{self, Packed};
use crate::train::optim::AdamW;

use crate::env::{Barren, Environment, Score, SharedTasks, Task};
use crate::rl::advantage::{gae, informative, token_rewards, whiten_with};
use crate::rl::curriculum::Curriculum;
use crate::rl::loss::{
    Aggregation, KlEstimator, clipped_value_loss, completion_weights, effective_sample_share,
    tis_weights,
};
use crate::rl::memory::{self, micro_batches};
use crate::rl::value::ValueHead;

/// Checkpoint folders: `step_<N>/`.
pub const STEP_PREFIX: &str = "step_";

/// The truncated importance weights' cap of an off-policy run whose
/// `tis_cap` is 0.
pub const OFF_POLICY_TIS_CAP: f64 = 2.0;

/// Beside the trainable tensors in an off-policy run's checkpoint, under
/// this prefix: the weights its samplers were making the next batch with,
/// so a resume makes that batch again.
const SAMPLER_PREFIX: &str = "sampler.";

/// One RL run.
pub struct RlJob {
    pub config: RlConfig,
    pub curriculum: CurriculumConfig,
    pub model: ModelConfig,
    /// The policy's base (Stage 2's merged model).
    pub base_dir: PathBuf,
    pub output_dir: PathBuf,
    pub device: Device,
    pub env: Arc<dyn Environment>,
    /// What the environment draws from (dataset, rows), for the resume check.
    pub env_description: String,
    pub resume: bool,
    pub force: bool,
    /// Stop after this many steps (tests, quick runs).
    pub max_steps: Option<u64>,
}

/// What a finished run did.
#[derive(Debug, Clone, Serialize)]
pub struct RlSummary {
    pub steps: u64,
    pub resumed_from: Option<u64>,
    /// Mean reward of the first and last step.
    pub first_reward: Option<f64>,
    pub last_reward: Option<f64>,
    pub curriculum_level: usize,
    pub masked: BTreeMap<String, u64>,
    pub skipped_tasks: BTreeMap<String, u64>,
    /// Rows whose own program fails in the sandbox, with why: never drawn
    /// again after the first time.
    pub bad_rows: BTreeMap<u64, String>,
    pub final_dir: PathBuf,
    pub merged_dir: PathBuf,
    /// Stopped by a signal, after saving a checkpoint.
    pub interrupted: bool,
    /// A stop signal came, whether or not it cut the run (one during the
    /// last step does not: the run finishes and says so).
    pub stop_requested: bool,
    /// Rank 0's mean seconds a step, after the run's first step, spent
    /// sampling and scoring, and training; `None` with fewer than two steps
    /// (and on the samplers of an off-policy run).
    pub split_secs: Option<(f64, f64)>,
}

/// Where a run stands beyond the optimizer: saved in every checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RlState {
    /// The next draw of the task stream.
    pub cursor: u64,
    pub curriculum: Option<Curriculum>,
    /// Completions left out of the loss, by reason.
    pub masked: BTreeMap<String, u64>,
    /// Draws that gave no task, by reason.
    pub skipped_tasks: BTreeMap<String, u64>,
    /// Rows whose own program fails in the sandbox, with the reason (the
    /// draw order found them): their draws are passed over unrun. Absent
    /// from checkpoints written before it was kept.
    #[serde(default)]
    pub bad_rows: BTreeMap<u64, String>,
    /// How each environment's prompts fit `max_prompt_tokens`. Absent from
    /// checkpoints written before it was kept.
    #[serde(default)]
    pub prompt_fit: BTreeMap<String, crate::env::PromptFit>,
    /// GRPO groups dropped for equal rewards.
    pub dropped_groups: u64,
    /// Updates each optimizer made (one a minibatch): AdamW's bias
    /// correction counts them.
    pub optimizer_steps: u64,
    pub value_optimizer_steps: u64,
}

impl RlState {
    /// The draw side of `drawn` (the task cursor, the tasks passed over and
    /// why, the rows found bad, the prompts' fit) in place of this state's,
    /// the training side (masked completions, dropped groups, optimizer
    /// steps) kept: an off-policy trainer takes it from its samplers.
    fn adopt_draws(&mut self, drawn: RlState) {
        self.cursor = drawn.cursor;
        self.skipped_tasks = drawn.skipped_tasks;
        self.bad_rows = drawn.bad_rows;
        self.prompt_fit = drawn.prompt_fit;
    }
}

/// One sampled completion and what training needs of it (what the sampler
/// made travels to the trainers of an off-policy run; what they compute
/// does not).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sample {
    pub group: usize,
    pub prompt: Vec<u32>,
    /// The sampled tokens, with the stop token when one ended it.
    pub response: Vec<u32>,
    pub stopped: bool,
    pub reward: f64,
    pub bucket: Option<usize>,
    /// The multi-turn episode this answer is a turn of (its answers share
    /// the episode's reward and GRPO advantage); `None`: an episode alone.
    pub episode: Option<usize>,
    /// The sampler's log-probs of the response's tokens, the stop token's
    /// included (empty where the sampler kept none).
    pub sampler_logp: Vec<f32>,
    #[serde(skip)]
    old_logp: Vec<f64>,
    #[serde(skip)]
    ref_logp: Vec<f64>,
    #[serde(skip)]
    old_values: Vec<f64>,
    #[serde(skip)]
    advantages: Vec<f64>,
    #[serde(skip)]
    returns: Vec<f64>,
}

impl Sample {
    pub fn new(group: usize, prompt: Vec<u32>, g: &Generation, stop: u32, reward: f64) -> Self {
        let mut response = g.tokens.clone();
        let mut sampler_logp = g.logprobs.clone();
        if g.stopped {
            response.push(stop);
            if let Some(lp) = g
                .stop_logprob
                .filter(|_| sampler_logp.len() == g.tokens.len())
            {
                sampler_logp.push(lp);
            }
        }
        Self {
            group,
            prompt,
            response,
            stopped: g.stopped,
            reward,
            bucket: None,
            episode: None,
            sampler_logp,
            old_logp: Vec::new(),
            ref_logp: Vec::new(),
            old_values: Vec::new(),
            advantages: Vec::new(),
            returns: Vec::new(),
        }
    }
}

/// What one update did.
#[derive(Debug, Clone, Default)]
pub struct UpdateStats {
    pub policy_loss: f64,
    pub value_loss: f64,
    pub entropy: f64,
    pub clip_fraction: f64,
    pub kl_loss: f64,
    pub grad_norm: f64,
    pub minibatches: usize,
    pub skipped_minibatches: usize,
}

/// The model, its value head and optimizers: what samples and learns.
pub struct Policy {
    pub loaded: LoadedModel,
    pub tok: ChatTokenizer,
    pub cfg: RlConfig,
    pub value: Option<ValueHead>,
    opt: AdamW,
    value_opt: Option<AdamW>,
    stop_id: u32,
    agg: Aggregation,
    kl: KlEstimator,
    /// The token budget of a training pass's micro-batches.
    micro_tokens: usize,
}

impl Policy {
    /// Loads `base_dir` with a fresh adapter (and a value head for PPO).
    pub fn load(
        base_dir: &Path,
        cfg: &RlConfig,
        model_cfg: &ModelConfig,
        device: &Device,
    ) -> anyhow::Result<Self> {
        let lora = Self::lora_config(cfg)?;
        let (tok, loaded) =
            load::trainee(base_dir, load::Adapter::Fresh(&lora), model_cfg, device)?;
        Self::new(loaded, tok, cfg)
    }

    /// The adapter a policy trains: rank, alpha and targets from `cfg`,
    /// no dropout (the ratio of the first minibatch must be 1).
    pub fn lora_config(cfg: &RlConfig) -> anyhow::Result<LoraConfig> {
        Ok(LoraConfig {
            r: cfg.lora_r,
            alpha: cfg.lora_alpha,
            dropout: 0.0,
            target_modules: load::target_modules(&cfg.target_modules)?,
            seed: cfg.seed,
        })
    }

    /// A policy on a model already built with [`Policy::lora_config`]'s
    /// adapter (`bench rl` builds random weights of a shape this way),
    /// with a value head for PPO and fresh optimizers.
    pub fn new(
        mut loaded: LoadedModel,
        tok: ChatTokenizer,
        cfg: &RlConfig,
    ) -> anyhow::Result<Self> {
        let device = loaded.device.clone();
        let device = &device;
        let dtype = loaded.dtype;
        // The same gradients; each layer's input kept instead of its
        // activations. On by default on a GPU, as in SFT.
        let checkpointing = cfg.gradient_checkpointing.unwrap_or(!device.is_cpu());
        loaded.model.set_gradient_checkpointing(checkpointing);
        tok.check_against_vocab(loaded.model.vocab_size())?;
        let hidden = loaded.model.lm_head().dims()?.1;
        let value = cfg
            .rl_algorithm()
            .has_critic()
            .then(|| ValueHead::new(hidden, cfg.value_hidden, cfg.seed, &loaded.device))
            .transpose()?;
        let opt = AdamW::new(loaded.named_trainable_vars(), cfg.weight_decay)?;
        let value_opt = value
            .as_ref()
            .map(|v| AdamW::new(v.named_vars(), 0.0))
            .transpose()?;
        let stop_id = tok.end_of_turn().id;
        // After the weights and optimizers: the auto budget reads what is
        // left on the device.
        let budget = memory::choose(cfg, &loaded.model, dtype, device, checkpointing)?;
        tracing::info!(
            "stage 3: training passes in micro-batches of at most {} tokens ({}); gradient checkpointing {}",
            budget.tokens,
            budget.how,
            if checkpointing { "on" } else { "off" }
        );
        Ok(Self {
            agg: cfg.rl_algorithm().aggregation(
                Aggregation::parse(&cfg.loss_aggregation, cfg.max_new_tokens)
                    .context("loss_aggregation")?,
                cfg.max_new_tokens,
            ),
            kl: KlEstimator::parse(&cfg.kl_estimator).context("kl_estimator")?,
            loaded,
            tok,
            cfg: cfg.clone(),
            value,
            opt,
            value_opt,
            stop_id,
            micro_tokens: budget.tokens,
        })
    }

    /// Tokens (rows x padded length) one micro-batch of a training pass
    /// holds at most: `micro_batch_tokens`, or the budget chosen at load
    /// time ([`memory::choose`]).
    pub fn micro_batch_tokens(&self) -> usize {
        self.micro_tokens
    }

    /// Whether the decoder recomputes each layer in the backward pass.
    pub fn gradient_checkpointing(&self) -> bool {
        self.loaded.model.decoder().checkpointing()
    }

    /// The chat-template tokens of a user message.
    pub fn encode(&self, prompt: &str) -> anyhow::Result<Vec<u32>> {
        Ok(self
            .tok
            .encode_prompt(&[Message::new(Role::User, prompt.to_owned())])?)
    }

    /// Samples one completion of each prompt from the live model.
    pub fn sample(&self, prompts: &[Vec<u32>], seed: u64) -> anyhow::Result<Vec<Generation>> {
        self.sample_share(prompts, seed, 0)
    }

    /// [`Policy::sample`] of one rank's share of a batch whose first prompt
    /// here is the batch's `first` (its draws are the whole batch's).
    pub fn sample_share(
        &self,
        prompts: &[Vec<u32>],
        seed: u64,
        first: u64,
    ) -> anyhow::Result<Vec<Generation>> {
        self.sample_until(prompts, seed, first, &self.tok.stop_ids())
    }

    /// [`Policy::sample_share`] ending a completion only at `stop_ids`:
    /// with none, every completion runs to `max_new_tokens` (`bench rl`'s
    /// fixed answer length).
    pub fn sample_until(
        &self,
        prompts: &[Vec<u32>],
        seed: u64,
        first: u64,
        stop_ids: &[u32],
    ) -> anyhow::Result<Vec<Generation>> {
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let c = &self.cfg;
        let sampling = Sampling {
            temperature: c.temperature,
            top_p: c.top_p,
            top_k: c.top_k,
            seed,
            first_stream: first,
        };
        Ok(generate::sample(
            &self.loaded.model,
            prompts,
            c.max_new_tokens,
            stop_ids,
            self.tok.pad().id,
            c.sample_max_rows,
            &sampling,
            &self.loaded.device,
        )?)
    }

    pub fn stop_id(&self) -> u32 {
        self.stop_id
    }

    /// `samples` (prompt + response) packed for [`Policy::forward`].
    fn pack(&self, samples: &[&Sample]) -> candle_core::Result<Packed> {
        let rows: Vec<(&[u32], &[u32])> = samples
            .iter()
            .map(|s| (&s.prompt[..], &s.response[..]))
            .collect();
        completion::pack(&rows, self.tok.pad().id, &self.loaded.device)
    }

    /// The response tokens' log-probs `(R,)` and entropies `(R,)`, and the
    /// hidden states that predict them `(R, hidden)`; differentiable when
    /// `train`. The policy that sampled is softmax(logits / temperature):
    /// its log-probs, ratios and KL are taken under the same temperature.
    fn forward(&self, p: &Packed, train: bool) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let entropy_grad = train && self.cfg.entropy_coef > 0.0;
        completion::forward(
            &self.loaded.model,
            p,
            self.cfg.temperature,
            train,
            entropy_grad,
        )
    }

    /// Fills old log-probs, values (PPO) and reference log-probs (adapter
    /// off; when a KL term is on) of `samples`, without gradients, a
    /// micro-batch of at most [`Policy::micro_batch_tokens`] at a time (the
    /// value head on that micro-batch's rows only).
    pub fn score_old(&self, samples: &mut [Sample]) -> anyhow::Result<()> {
        let kl_on = self.cfg.kl_coef() > 0.0;
        let lens: Vec<usize> = samples
            .iter()
            .map(|s| s.prompt.len() + s.response.len())
            .collect();
        for part in micro_batches(&lens, self.micro_tokens) {
            let refs: Vec<&Sample> = part.iter().map(|&i| &samples[i]).collect();
            let p = self.pack(&refs)?;
            let (logp, _, rows) = self.forward(&p, false)?;
            let logp = logp.to_vec1::<f32>()?;
            let values = match &self.value {
                Some(v) => v.forward(&rows)?.to_vec1::<f32>()?,
                None => vec![0.0; logp.len()],
            };
            let ref_logp = if kl_on {
                without_adapters(|| self.forward(&p, false))?
                    .0
                    .to_vec1::<f32>()?
            } else {
                logp.clone()
            };
            let mut at = 0;
            for &i in &part {
                let s = &mut samples[i];
                let n = s.response.len();
                let f = |v: &[f32]| v[at..at + n].iter().map(|&x| x as f64).collect::<Vec<_>>();
                s.old_logp = f(&logp);
                s.old_values = f(&values);
                s.ref_logp = f(&ref_logp);
                at += n;
            }
        }
        Ok(())
    }

    /// Advantages and returns of `samples` (old log-probs and values filled).
    pub fn advantages(&self, samples: &mut [Sample]) {
        self.advantages_with(samples, &Single)
            .expect("one rank exchanges nothing");
    }

    /// [`Policy::advantages`] of this rank's share of a batch: GRPO's groups
    /// are whole on one rank; PPO whitens over every rank's tokens.
    pub fn advantages_with(
        &self,
        samples: &mut [Sample],
        comm: &dyn Communicator,
    ) -> anyhow::Result<()> {
        let c = &self.cfg;
        if c.rl_algorithm().group_relative() {
            let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for (i, s) in samples.iter().enumerate() {
                groups.entry(s.group).or_default().push(i);
            }
            for idx in groups.values() {
                // One reward an episode (its answers share it), in order of
                // first appearance; each answer takes its episode's advantage.
                let mut episodes: Vec<(Option<usize>, f64)> = Vec::new();
                let mut of: Vec<usize> = Vec::with_capacity(idx.len());
                for &i in idx {
                    let key = samples[i].episode;
                    let at = match key.and_then(|e| episodes.iter().position(|x| x.0 == Some(e))) {
                        Some(at) => at,
                        None => {
                            episodes.push((key, samples[i].reward));
                            episodes.len() - 1
                        }
                    };
                    of.push(at);
                }
                let r: Vec<f64> = episodes.iter().map(|x| x.1).collect();
                let adv = c.rl_algorithm().group_advantages(&r, c.scale_rewards);
                for (&i, &e) in idx.iter().zip(&of) {
                    let n = samples[i].response.len();
                    samples[i].advantages = vec![adv[e]; n];
                    samples[i].returns = vec![0.0; n];
                }
            }
        } else {
            let coef = c.kl_coef();
            for s in samples.iter_mut() {
                let kl: Vec<f64> = s
                    .old_logp
                    .iter()
                    .zip(&s.ref_logp)
                    .map(|(&lp, &rp)| KlEstimator::K1.value(lp, rp))
                    .collect();
                let rewards = token_rewards(s.response.len(), s.reward, &kl, coef);
                let (a, r) = gae(&rewards, &s.old_values, c.gamma, c.lam);
                s.advantages = a;
                s.returns = r;
            }
            if c.whiten_advantages {
                let mut rows: Vec<Vec<f64>> = samples
                    .iter_mut()
                    .map(|s| std::mem::take(&mut s.advantages))
                    .collect();
                let flat: Vec<f64> = rows.iter().flatten().copied().collect();
                let m = stats::moments(comm, &flat)?;
                whiten_with(&mut rows, m.mean, m.var.sqrt());
                for (s, a) in samples.iter_mut().zip(rows) {
                    s.advantages = a;
                }
            }
        }
        Ok(())
    }

    /// `ppo_epochs` passes of minibatches over `samples` (advantages
    /// filled), one optimizer step each; `lr` for the adapter.
    pub fn update(
        &mut self,
        samples: &[Sample],
        step: u64,
        lr: f64,
    ) -> anyhow::Result<UpdateStats> {
        let layout = Layout::alone(samples);
        self.update_with(samples, &layout, step, lr, &Single)
    }

    /// [`Policy::update`] of this rank's share (`samples`, placed in the
    /// whole batch by `layout`): every rank walks the same shuffled
    /// minibatches of the whole batch, computes the loss of its own
    /// members with the whole minibatch's token weights, and the gradients
    /// are summed over ranks before clipping and the step, so N ranks train
    /// as one process would on the whole batch.
    pub fn update_with(
        &mut self,
        samples: &[Sample],
        layout: &Layout,
        step: u64,
        lr: f64,
        comm: &dyn Communicator,
    ) -> anyhow::Result<UpdateStats> {
        let c = self.cfg.clone();
        anyhow::ensure!(
            layout.mine.len() == samples.len(),
            "{} samples but {} places in the batch",
            samples.len(),
            layout.mine.len()
        );
        let local: BTreeMap<usize, usize> = layout
            .mine
            .iter()
            .enumerate()
            .map(|(l, &g)| (g, l))
            .collect();
        let mut st = UpdateStats::default();
        let dev = self.loaded.device.clone();
        let n_adapter = self.opt.vars().len();
        for epoch in 0..c.ppo_epochs {
            // A seeded shuffle of the whole batch for this epoch.
            let mut order: Vec<usize> = (0..layout.lens.len()).collect();
            order.sort_by_key(|&i| keyed(c.seed ^ 0x5eed, step, (epoch * 1_000_003 + i) as u64));
            for (mbi, chunk) in order.chunks(c.mini_batch_size.max(1)).enumerate() {
                let lens: Vec<usize> = chunk.iter().map(|&g| layout.lens[g]).collect();
                let cw = completion_weights(self.agg, &lens);
                // This rank's members of the minibatch, with their weights.
                let (mb, mw): (Vec<&Sample>, Vec<f64>) = chunk
                    .iter()
                    .zip(&cw)
                    .filter_map(|(g, &w)| local.get(g).map(|&l| (&samples[l], w)))
                    .unzip();
                set_dropout_seed(keyed(c.seed, step, (epoch * 10_007 + mbi) as u64));
                let (grads, local_sums) = if mb.is_empty() {
                    (self.zero_gradients()?, [0.0; 7])
                } else {
                    self.member_gradients(&mb, &mw, &dev)?
                };
                // [policy loss, entropy, kl, value loss, loss, clipped, tokens],
                // summed over ranks in the gradients' collective (one a
                // minibatch, not two).
                let (sums, grads) = if comm.world() == 1 {
                    (local_sums.to_vec(), grads)
                } else {
                    let mut all = grads;
                    let v: Vec<f32> = local_sums.iter().map(|&x| x as f32).collect();
                    all.push(Tensor::from_vec(v, local_sums.len(), &dev)?);
                    let mut all = dist::all_reduce_sum(comm, &all)?;
                    let sums = all.pop().expect("pushed above").to_vec1::<f32>()?;
                    (sums.into_iter().map(f64::from).collect(), all)
                };
                let (g, vg) = grads.split_at(n_adapter);
                let norm = AdamW::grad_norm(g)?;
                let vnorm = AdamW::grad_norm(vg)?;
                if !sums[4].is_finite() || !norm.is_finite() || !vnorm.is_finite() {
                    tracing::warn!("step {step}: non-finite loss or gradient, minibatch skipped");
                    st.skipped_minibatches += 1;
                    continue;
                }
                let scale = |n: f64| clip_scale(n, c.max_grad_norm);
                self.opt.step(g, lr, scale(norm))?;
                if let Some(o) = &mut self.value_opt {
                    o.step(vg, c.value_learning_rate, scale(vnorm))?;
                }
                st.policy_loss += sums[0];
                st.entropy += sums[1];
                st.kl_loss += sums[2];
                st.value_loss += sums[3];
                st.clip_fraction += sums[5] / sums[6].max(1.0);
                st.grad_norm += norm;
                st.minibatches += 1;
            }
        }
        let k = st.minibatches.max(1) as f64;
        for x in [
            &mut st.policy_loss,
            &mut st.value_loss,
            &mut st.entropy,
            &mut st.clip_fraction,
            &mut st.kl_loss,
            &mut st.grad_norm,
        ] {
            *x /= k;
        }
        Ok(st)
    }

    /// The loss of this rank's members `mb` of a minibatch (token weights
    /// `w` a member, from the whole minibatch) and its gradients: the
    /// adapter's, then the value head's; and the sums the ranks add up:
    /// policy loss, entropy, KL, value loss, total loss, clipped tokens,
    /// tokens. A micro-batch of at most [`Policy::micro_batch_tokens`] at
    /// a time, each with its members' weights as they are (never
    /// renormalised), gradients and sums added up: every term is a
    /// weighted sum over tokens, so the total is the one pass's.
    fn member_gradients(
        &self,
        mb: &[&Sample],
        w: &[f64],
        dev: &Device,
    ) -> anyhow::Result<(Vec<Tensor>, [f64; 7])> {
        let lens: Vec<usize> = mb
            .iter()
            .map(|s| s.prompt.len() + s.response.len())
            .collect();
        let mut grads: Option<Vec<Tensor>> = None;
        let mut sums = [0.0; 7];
        for part in micro_batches(&lens, self.micro_tokens) {
            let members: Vec<&Sample> = part.iter().map(|&i| mb[i]).collect();
            let weights: Vec<f64> = part.iter().map(|&i| w[i]).collect();
            let (g, s) = self.micro_gradients(&members, &weights, dev)?;
            for (total, x) in sums.iter_mut().zip(s) {
                *total += x;
            }
            crate::train::optim::accumulate(&mut grads, g)?;
        }
        let grads = grads.context("a minibatch share without members")?;
        Ok((grads, sums))
    }

    /// [`Policy::member_gradients`] of one micro-batch, in one forward and
    /// backward pass.
    fn micro_gradients(
        &self,
        mb: &[&Sample],
        w: &[f64],
        dev: &Device,
    ) -> anyhow::Result<(Vec<Tensor>, [f64; 7])> {
        let c = &self.cfg;
        let cat = |f: &dyn Fn(&Sample) -> &Vec<f64>| -> candle_core::Result<Tensor> {
            let v: Vec<f32> = mb
                .iter()
                .flat_map(|s| f(s).iter().map(|&x| x as f32))
                .collect();
            let n = v.len();
            Tensor::from_vec(v, n, dev)
        };
        let old = cat(&|s| &s.old_logp)?;
        let adv = cat(&|s| &s.advantages)?;
        let p = self.pack(mb)?;
        let w: Vec<f32> = p
            .lens
            .iter()
            .zip(w)
            .flat_map(|(&len, &w)| std::iter::repeat_n(w as f32, len))
            .collect();
        let n = w.len();
        let w = Tensor::from_vec(w, n, dev)?;
        let (logp, ent, rows) = self.forward(&p, true)?;
        // With TIS, the policy-gradient term's token weights carry the
        // truncated ratio of the trainer's to the sampler's probability.
        let w_pg = if c.tis_cap > 0.0 {
            let mut tis: Vec<f32> = Vec::with_capacity(n);
            for s in mb {
                let w = tis_weights(&s.old_logp, &s.sampler_logp, c.tis_cap)?;
                tis.extend(w.into_iter().map(|x| x as f32));
            }
            (&w * Tensor::from_vec(tis, n, dev)?)?
        } else {
            w.clone()
        };
        let (pg, clip) = c.rl_algorithm().policy_loss(
            &logp,
            &old,
            &adv,
            &w_pg,
            &p.lens,
            c.clip_low,
            c.clip_high,
        )?;
        let ent_mean = (&ent * &w)?.sum_all()?;
        let mut loss = pg.clone();
        if c.entropy_coef > 0.0 {
            loss = (loss - (&ent_mean * c.entropy_coef)?)?;
        }
        let mut kl_val = 0.0;
        if c.rl_algorithm().group_relative() && c.kl_coef() > 0.0 {
            let rf = cat(&|s| &s.ref_logp)?;
            let kl = (self.kl.tensor(&logp, &rf)? * &w)?.sum_all()?;
            kl_val = kl.to_scalar::<f32>()? as f64;
            loss = (loss + (kl * c.kl_coef())?)?;
        }
        let mut vl_val = 0.0;
        if let Some(head) = &self.value {
            let v = head.forward(&rows)?;
            let vl = clipped_value_loss(
                &v,
                &cat(&|s| &s.old_values)?,
                &cat(&|s| &s.returns)?,
                &w,
                c.value_clip,
            )?;
            vl_val = vl.to_scalar::<f32>()? as f64;
            loss = (loss + (vl * c.vf_coef)?)?;
        }
        let loss_val = loss.to_scalar::<f32>()? as f64;
        let grads = self.loaded.model.backward(&loss)?;
        let mut g = self.opt.gradients(&grads)?;
        if let Some(o) = &self.value_opt {
            g.extend(o.gradients(&grads)?);
        }
        let tokens = n as f64;
        Ok((
            g,
            [
                pg.to_scalar::<f32>()? as f64,
                ent_mean.to_scalar::<f32>()? as f64,
                kl_val,
                vl_val,
                loss_val,
                // A count (`clip` is its share of the tokens).
                (clip * tokens).round(),
                tokens,
            ],
        ))
    }

    /// Zeros in the shapes of the adapter's and the value head's gradients:
    /// the share of a rank with no member in a minibatch.
    fn zero_gradients(&self) -> candle_core::Result<Vec<Tensor>> {
        self.trainable_vars()
            .iter()
            .map(|v| v.as_tensor().zeros_like())
            .collect()
    }

    /// The adapter's variables, then the value head's (the order of the
    /// gradients).
    fn trainable_vars(&self) -> Vec<candle_core::Var> {
        self.named_trainables()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// [`Policy::trainable_vars`] with their names.
    fn named_trainables(&self) -> Vec<(String, candle_core::Var)> {
        let mut v = self.opt.vars().to_vec();
        if let Some(o) = &self.value_opt {
            v.extend(o.vars().iter().cloned());
        }
        v
    }

    /// A copy of each trainable variable's values, in their order.
    fn trainable_values(&self) -> candle_core::Result<Vec<Tensor>> {
        self.trainable_vars()
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect()
    }

    /// The trainable tensors (adapter and value head) by name.
    fn params(&self) -> BTreeMap<String, Tensor> {
        let mut p = checkpoint::tensors_of(self.opt.vars());
        if let Some(v) = &self.value {
            p.extend(
                v.named_vars()
                    .into_iter()
                    .map(|(k, v)| (k, v.as_tensor().clone())),
            );
        }
        p
    }

    /// Both optimizers' moments by name.
    fn optim_state(&self) -> BTreeMap<String, Tensor> {
        let mut s = self.opt.state();
        if let Some(o) = &self.value_opt {
            s.extend(o.state());
        }
        s
    }

    fn restore(&mut self, ck: &checkpoint::Loaded, rl: &RlState) -> anyhow::Result<()> {
        ck.restore(self.opt.vars())?;
        self.opt.load_state(&ck.optim, rl.optimizer_steps)?;
        if let (Some(v), Some(o)) = (&self.value, &mut self.value_opt) {
            v.load(&ck.params)?;
            o.load_state(&ck.optim, rl.value_optimizer_steps)?;
        }
        Ok(())
    }
}

/// Where a rank's samples sit in the whole batch of a step.
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// Completion lengths (with the stop token) of the whole batch, every
    /// rank's samples in batch order.
    pub lens: Vec<usize>,
    /// The batch position of each of this rank's samples.
    pub mine: Vec<usize>,
}

impl Layout {
    /// One rank holding the whole batch.
    pub fn alone(samples: &[Sample]) -> Self {
        Self {
            lens: samples.iter().map(|s| s.response.len()).collect(),
            mine: (0..samples.len()).collect(),
        }
    }
}

/// The run's task stream from `rl`'s cursor on, its making shared by
/// `comm`'s ranks (the rows `rl` knows bad are not run again).
fn task_stream(job: &RlJob, rl: &RlState, comm: &dyn Communicator) -> SharedTasks {
    let cfg = &job.config;
    SharedTasks::start(
        Arc::clone(&job.env),
        cfg.seed,
        rl.cursor,
        (cfg.batch_size * 2).max(8),
        &rl.bad_rows,
        comm,
    )
}

/// Prompts of one step, with the tasks they came from.
struct Drawn {
    tasks: Vec<(Task, Vec<u32>, Option<usize>)>,
    env_secs: f64,
}

fn draw(
    stream: &mut SharedTasks,
    comm: &dyn Communicator,
    policy: &Policy,
    rl: &mut RlState,
    curriculum: &mut Curriculum,
    want: usize,
    step: u64,
) -> anyhow::Result<Drawn> {
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(want);
    // Counts the draws without a usable task, marks bad rows, and stops a
    // run that finds too few usable ones.
    let mut barren = Barren::new(comm.rank() == 0);
    while tasks.len() < want {
        let (cursor, id, task) = stream.recv(comm)?;
        rl.cursor = cursor + 1;
        let task = match task {
            Ok(t) => t,
            Err(reason) => {
                let env = stream.env();
                barren.skip(env, id, reason, &mut rl.bad_rows, &mut rl.skipped_tasks)?;
                continue;
            }
        };
        if !curriculum.admits(&task.difficulty, step) {
            barren.made();
            continue;
        }
        let ids = policy.encode(&task.prompt)?;
        let part = crate::env::part_name(stream.env(), id);
        let limit = policy.cfg.max_prompt_tokens;
        if ids.is_empty() || !crate::env::prompt_fits(&mut rl.prompt_fit, part, ids.len(), limit)? {
            let (env, why) = (stream.env(), "prompt_too_long".to_owned());
            barren.skip(env, id, why, &mut rl.bad_rows, &mut rl.skipped_tasks)?;
            continue;
        }
        barren.made();
        let bucket = curriculum.bucket_of(&task.difficulty);
        tasks.push((task, ids, bucket));
    }
    Ok(Drawn {
        tasks,
        env_secs: t0.elapsed().as_secs_f64(),
    })
}

/// The settings a resume must find unchanged: all but those that decide
/// memory only (`micro_batch_tokens`, `gradient_checkpointing`), which a
/// resume on another card may change; left out, not nulled, so older
/// checkpoints still match.
fn fingerprinted(cfg: &RlConfig) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(cfg)?;
    let defaults = serde_json::to_value(RlConfig::default())?;
    if let Some(m) = v.as_object_mut() {
        m.remove("micro_batch_tokens");
        m.remove("gradient_checkpointing");
        // Settings added since checkpoints were first written count only
        // when changed, so a checkpoint of an earlier version resumes.
        for k in [
            "abd_dataset",
            "ded_dataset",
            "temperature_schedule",
            "max_turns",
            "feedback",
            "turn_discount",
            "max_episode_tokens",
            "tis_cap",
            "sampler_ranks",
        ] {
            if m.get(k) == defaults.get(k) {
                m.remove(k);
            }
        }
    }
    Ok(v)
}

/// One run on one device.
pub fn run(job: &RlJob, progress: &dyn Progress) -> anyhow::Result<RlSummary> {
    run_with(job, &Single, progress)
}

/// One rank of a run over `comm`'s ranks (every rank calls it with the same
/// job, on its own device); with [`Single`], the one-device run.
///
/// Every rank reads the same tasks from one task stream whose making the
/// ranks share ([`SharedTasks`]) and samples and scores its block of the groups
/// ([`stats::groups_of_rank`]: whole groups, so GRPO's group statistics stay
/// on one rank), drawing the random numbers the whole batch would. What
/// needs the whole batch is combined: the kept-group count that decides
/// dynamic sampling's rounds, the rewards the curriculum and the metrics
/// see, PPO's whitening, the minibatches' token weights and the gradients.
/// Rank 0 alone logs and writes.
///
/// With `sampler_ranks` (one-step off-policy), the last ranks sample and the
/// others train, overlapped ([`offpolicy`]); the trainers run this loop
/// among themselves, taking each step's batch from the samplers.
pub fn run_with(
    job: &RlJob,
    comm: &dyn Communicator,
    progress: &dyn Progress,
) -> anyhow::Result<RlSummary> {
    let cfg = &job.config;
    let off_policy = cfg.sampler_ranks > 0;
    // The ranks that train: all of them, or the trainers' own group.
    let own;
    let train_comm: &dyn Communicator = if off_policy {
        let groups = offpolicy::groups(comm.world(), cfg.sampler_ranks)?;
        own = comm.split(&groups)?;
        if comm.rank() >= groups[0].len() {
            return offpolicy::sample_ahead(job, comm, &*own);
        }
        &*own
    } else {
        comm
    };
    let run = Run::begin("Stage 3", &job.output_dir, train_comm)?;

    // 1. Model, value head, optimizers; fresh start or resume.
    let mut policy = Policy::load(&job.base_dir, cfg, &job.model, &job.device)?;
    if off_policy && cfg.tis_cap == 0.0 {
        // Every batch but the first is one update old: its tokens are
        // weighted by the trainer's probability over the sampler's.
        policy.cfg.tis_cap = OFF_POLICY_TIS_CAP;
    }
    let mut total_steps = cfg.num_train_steps as u64;
    if let Some(m) = job.max_steps {
        total_steps = total_steps.min(m);
    }
    let fingerprint = fingerprint::of(
        serde_json::json!({"ppo": fingerprinted(cfg)?, "curriculum": job.curriculum}),
        job.base_dir.display().to_string(),
        &job.base_dir,
        job.env_description.clone(),
    )?;
    let mut state = TrainerState::new(fingerprint.clone());
    let mut rl = RlState::default();
    let mut curriculum = Curriculum::new(&job.curriculum);
    let mut resumed_from = None;
    let mut resumed_sampling = None;
    let how = Resume {
        resume: job.resume,
        force: job.force,
        prefix: STEP_PREFIX,
    };
    if let Some(ck) = run.resume_point(how, &fingerprint, &job.device)? {
        rl = serde_json::from_value(ck.state.extra.clone())
            .with_context(|| format!("`{}`: unreadable RL state", ck.dir.display()))?;
        policy.restore(&ck, &rl)?;
        if off_policy {
            resumed_sampling = policy
                .named_trainables()
                .iter()
                .map(|(name, _)| ck.params.get(&format!("{SAMPLER_PREFIX}{name}")).cloned())
                .collect();
        }
        if let Some(c) = rl.curriculum.take() {
            curriculum = c;
        }
        resumed_from = Some(ck.state.step);
        state = ck.state;
    }
    // Every rank starts from rank 0's adapter and value head.
    run.share_lead_weights(&policy.trainable_vars())?;
    let mut log = run.log(resumed_from)?;
    // Off-policy: the weights the samplers make the next batch with (a
    // resumed run's, those they had when it was saved).
    let mut sampling = match resumed_sampling {
        Some(w) => w,
        None if off_policy => policy.trainable_values()?,
        None => Vec::new(),
    };
    let mut stream = if off_policy {
        let at = (state.step, total_steps);
        offpolicy::start_samplers(comm, &policy, &sampling, at, &rl, &curriculum)?;
        None
    } else {
        Some(task_stream(job, &rl, comm))
    };

    // 2-5. The loop.
    progress.start(Some(total_steps), state.step);
    let (mut first_reward, mut last_reward) = (None, None);
    // Sampling and scoring, training, and the steps they add up over.
    let mut split = (0.0, 0.0, 0usize);
    let mut interrupted = false;
    while state.step < total_steps {
        let step = state.step;
        // This step's sampling temperature: its draws and every log-prob
        // of them (old, new, reference) are taken under it.
        policy.cfg.temperature = cfg.temperature_schedule.at(step, cfg.temperature);
        // Each step's peak device memory (weights included) is logged.
        crate::gpu::reset_peak_memory(&job.device)?;
        let t_step = Instant::now();
        // 2. Tasks, completions, scores: sampled here, or by the samplers
        // while this step's weights were trained.
        let (mut got, sampler_votes) = match &mut stream {
            Some(stream) => {
                let got = collect(job, comm, &policy, stream, &mut rl, &mut curriculum, step)?;
                let rewards: Vec<f64> = got.scored.iter().map(|x| x.reward).collect();
                curriculum.record(&rewards, step + 1);
                (got, 0.0)
            }
            None => offpolicy::receive(comm, train_comm, step, &mut rl, &mut curriculum)?,
        };
        let rewards: Vec<f64> = got.scored.iter().map(|x| x.reward).collect();
        // 3-4. Old log-probs, values, reference, advantages, update. The
        // samplers make the next batch from the weights this step starts
        // from.
        if off_policy {
            sampling = policy.trainable_values()?;
        }
        let trained = train(&mut policy, &mut got, step, train_comm)?;
        if got.layout.lens.is_empty() {
            state.skipped_steps += 1;
        }
        let votes = run.stop_vote() + sampler_votes;
        let totals = Totals::over_ranks(train_comm, &got, &trained, votes)?;
        for (why, n) in &totals.masked {
            *rl.masked.entry(why.clone()).or_default() += n;
        }
        rl.dropped_groups += totals.dropped;
        state.step += 1;
        state.tokens_seen += totals.seq_tokens as u64;

        // 5. Metrics, progress, checkpoints.
        let reward_mean = rewards.iter().sum::<f64>() / rewards.len().max(1) as f64;
        if first_reward.is_some() {
            split.0 += got.sample_secs + got.env_secs;
            split.1 += trained.secs;
            split.2 += 1;
        }
        first_reward.get_or_insert(reward_mean);
        last_reward = Some(reward_mean);
        let record = StepRecord {
            got: &got,
            trained: &trained,
            totals: &totals,
            secs: t_step.elapsed().as_secs_f64(),
        };
        let mut s = record.scalars(job, &policy, comm.world(), step, &rl, &curriculum)?;
        if off_policy {
            s.insert("time_wait_s".into(), got.wait_secs);
            // Updates between the weights that sampled this batch and the
            // ones it trains: none for a run's first batch (a resumed run's
            // first is the one that was in the making, sampled a step
            // before), one for every later batch.
            let fresh = state.step == 1;
            s.insert("staleness".into(), if fresh { 0.0 } else { 1.0 });
        }
        if let Some(log) = &mut log {
            let pairs: Vec<(&str, f64)> = s.iter().map(|(k, v)| (k.as_str(), *v)).collect();
            log.log(state.step, &pairs)?;
        }
        progress.set(state.step);
        progress.status(&format!(
            "reward {reward_mean:.3} kl {:.4} clip {:.3}{} {:.0} tok/s",
            totals.kl_mean,
            trained.up.clip_fraction,
            if curriculum.enabled {
                format!(" level {}", curriculum.label(curriculum.level))
            } else {
                String::new()
            },
            s["tokens_per_s"]
        ));

        let sampled_with = off_policy.then_some(&sampling[..]);
        let checkpoint_now = || save(job, &mut state, &rl, &curriculum, &policy, sampled_with);
        let vars = policy.trainable_vars();
        interrupted = run.after_step(
            step + 1,
            total_steps,
            cfg.save_steps,
            totals.stopping,
            &vars,
            checkpoint_now,
        )?;
        if off_policy {
            let goes_on = !interrupted && state.step < total_steps;
            offpolicy::send_weights(comm, &policy, goes_on)?;
        }
        if interrupted {
            break;
        }
    }
    progress.finish();
    drop(stream);

    let (final_dir, merged_dir) = outputs::dirs(&job.output_dir);
    run.check_in_sync(&policy.trainable_vars())?;
    if !interrupted && run.lead() {
        let sampled_with = off_policy.then_some(&sampling[..]);
        save(job, &mut state, &rl, &curriculum, &policy, sampled_with)?;
        write_outputs(
            job,
            &policy,
            state.step,
            comm.world(),
            &final_dir,
            &merged_dir,
        )?;
    }
    drop(log);
    run.draw_curves();
    Ok(RlSummary {
        steps: state.step,
        resumed_from,
        first_reward,
        last_reward,
        curriculum_level: curriculum.level,
        masked: rl.masked,
        skipped_tasks: rl.skipped_tasks,
        bad_rows: rl.bad_rows,
        final_dir,
        merged_dir,
        interrupted,
        stop_requested: run.stop_requested(),
        split_secs: (split.2 > 0).then(|| (split.0 / split.2 as f64, split.1 / split.2 as f64)),
    })
}

/// A step's sampling on this rank: its samples, where they sit in the whole
/// batch, every rank's scores, and this rank's counts.
#[derive(Default, Serialize, Deserialize)]
struct Collected {
    batch: Vec<Sample>,
    #[serde(skip)]
    layout: Layout,
    /// Every rank's scored episodes, in batch order.
    scored: Vec<Scored>,
    /// Feedback turns whose conversation tokens did not extend the earlier
    /// turn's prompt and answer (the chat template rewrote the past).
    template_drift: usize,
    /// Episodes ended by `max_episode_tokens` before their last turn.
    over_budget: usize,
    masked: BTreeMap<String, u64>,
    zero_var: usize,
    dropped: u64,
    new_tokens: usize,
    stopped: usize,
    groups_seen: usize,
    rounds: usize,
    env_secs: f64,
    sample_secs: f64,
    /// Off-policy: how long the trainer waited for the batch.
    #[serde(default)]
    wait_secs: f64,
}

/// One scored episode (a completion, with its retries when multi-turn).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Scored {
    /// The episode's reward: its last answer's, discounted by turns.
    reward: f64,
    bucket: Option<usize>,
    /// The mixture's environment.
    part: Option<usize>,
    /// The answer (1, 2, ...) that was right; `None` when none was.
    solved_at: Option<usize>,
    /// Answers after the first.
    retries: usize,
    /// Retries whose answer was the one before it (compared as scored).
    unchanged: usize,
}

/// Values a [`Scored`] travels as between ranks.
const SCORED: usize = 6;

/// One answer of an episode: the conversation it continued, what was
/// sampled and its score.
struct Turn {
    prompt: Vec<u32>,
    sampled: Generation,
    text: String,
    score: Score,
    /// The environment's feedback on this answer, once the episode went on.
    reply: Option<String>,
}

impl Turn {
    fn scored(
        job: &RlJob,
        policy: &Policy,
        task: &Task,
        prompt: Vec<u32>,
        sampled: Generation,
    ) -> anyhow::Result<Self> {
        let text = policy.tok.decode(&sampled.tokens, true)?;
        let score = if job.config.mask_truncated && !sampled.stopped {
            Score::Masked("truncated".into())
        } else {
            job.env.score(task, &text)
        };
        Ok(Self {
            prompt,
            sampled,
            text,
            score,
            reply: None,
        })
    }
}

/// Where a turn's sampling stands: the step, its sampling round, the turn
/// (1 for the second answer), and this rank's first sampling stream.
struct TurnAt {
    step: u64,
    round: usize,
    turn: usize,
    first: u64,
}

/// One more answer for every episode of `episodes` whose last answer was
/// scored wrong (below 1): its last prompt and answer, then the
/// environment's feedback as a user turn ([`ChatTokenizer::next_turn`]),
/// sampled together; `false` when no episode continues. Episodes whose
/// conversation would pass `max_episode_tokens` end instead; an episode
/// whose feedback cannot be made (a sandbox failure) is masked.
fn more_turns(
    job: &RlJob,
    policy: &Policy,
    mine: &[(Task, Vec<u32>, Option<usize>)],
    group: usize,
    episodes: &mut [Vec<Turn>],
    at: TurnAt,
    c: &mut Collected,
) -> anyhow::Result<bool> {
    let cfg = &job.config;
    let TurnAt {
        step,
        round,
        turn,
        first,
    } = at;
    let budget = match cfg.max_episode_tokens {
        0 => cfg.max_prompt_tokens + cfg.max_turns * (cfg.max_new_tokens + 256),
        n => n,
    };
    let (mut who, mut prompts, mut replies) = (Vec::new(), Vec::new(), Vec::new());
    let mut unsaid = Vec::new();
    for (j, ep) in episodes.iter().enumerate() {
        let last = ep.last().expect("an episode has its first answer");
        if !matches!(last.score, Score::Reward(r) if r < 1.0) {
            continue;
        }
        let task = &mine[j / group].0;
        let reply = match job.env.feedback(task, &last.text, &cfg.feedback) {
            Ok(reply) => reply,
            Err(why) => {
                unsaid.push((j, why));
                continue;
            }
        };
        let ids = policy
            .tok
            .next_turn(&last.prompt, &last.sampled.tokens, &reply)?;
        if ids.len() + cfg.max_new_tokens > budget {
            c.over_budget += 1;
            continue;
        }
        // The template over the whole conversation, for the record: where
        // it differs, it rewrote earlier turns (Qwen3 drops past thinking);
        // the episode goes on from the tokens the model read and wrote.
        let mut messages = vec![Message::new(Role::User, task.prompt.clone())];
        for t in ep {
            messages.push(Message::new(Role::Assistant, t.text.clone()));
            let said = t.reply.as_ref().unwrap_or(&reply);
            messages.push(Message::new(Role::User, said.clone()));
        }
        if policy.tok.encode_prompt(&messages)? != ids {
            c.template_drift += 1;
        }
        who.push(j);
        prompts.push(ids);
        replies.push(reply);
    }
    // An episode whose feedback could not be made (the sandbox failed
    // running its answer again) cannot go on as configured: its outcome is
    // unknown, so it is masked under `feedback_<why>`, none of it trained.
    for (j, why) in unsaid {
        episodes[j]
            .last_mut()
            .expect("an episode has its first answer")
            .score = Score::Masked(format!("feedback_{why}"));
    }
    if who.is_empty() {
        return Ok(false);
    }
    let key = (round as u64) | ((turn as u64) << 32);
    let gens = policy.sample_share(&prompts, keyed(cfg.seed, step, key), first)?;
    for (((j, ids), reply), g) in who.into_iter().zip(prompts).zip(replies).zip(gens) {
        let task = &mine[j / group].0;
        let t = Turn::scored(job, policy, task, ids, g)?;
        let ep = &mut episodes[j];
        ep.last_mut()
            .expect("an episode has its first answer")
            .reply = Some(reply);
        ep.push(t);
    }
    Ok(true)
}

/// Step 2: rounds of drawing tasks the curriculum admits, sampling this
/// rank's groups and scoring them, until the batch is full (or, with
/// GRPO's dynamic sampling, the rounds are spent).
fn collect(
    job: &RlJob,
    comm: &dyn Communicator,
    policy: &Policy,
    stream: &mut SharedTasks,
    rl: &mut RlState,
    curriculum: &mut Curriculum,
    step: u64,
) -> anyhow::Result<Collected> {
    let cfg = &job.config;
    let (rank, world) = (comm.rank(), comm.world());
    let group = cfg.group_size();
    let mut c = Collected::default();
    let mut kept_groups = 0usize;
    loop {
        let want = cfg.batch_size - kept_groups;
        let d = draw(stream, comm, policy, rl, curriculum, want, step)?;
        c.env_secs += d.env_secs;
        let share = stats::groups_of_rank(d.tasks.len(), world, rank);
        let mine = &d.tasks[share.clone()];
        let t0 = Instant::now();
        let prompts: Vec<Vec<u32>> = mine
            .iter()
            .flat_map(|(_, ids, _)| std::iter::repeat_n(ids.clone(), group))
            .collect();
        let gens = policy.sample_share(
            &prompts,
            keyed(cfg.seed, step, c.rounds as u64),
            (share.start * group) as u64,
        )?;
        c.sample_secs += t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        // Each completion's episode: its first answer, then (multi-turn)
        // an answer a feedback turn while it is wrong.
        let mut episodes: Vec<Vec<Turn>> = Vec::with_capacity(gens.len());
        for (j, g) in gens.into_iter().enumerate() {
            let (task, ids, _) = &mine[j / group];
            episodes.push(vec![Turn::scored(job, policy, task, ids.clone(), g)?]);
        }
        let mut retry_secs = 0.0;
        for turn in 1..cfg.max_turns {
            let t = Instant::now();
            let at = TurnAt {
                step,
                round: c.rounds,
                turn,
                first: (share.start * group) as u64,
            };
            if !more_turns(job, policy, mine, group, &mut episodes, at, &mut c)? {
                break;
            }
            retry_secs += t.elapsed().as_secs_f64();
        }
        let (mut kept_here, mut scored_here, mut members_here) = (0usize, Vec::new(), Vec::new());
        for (k, (task, _, bucket)) in mine.iter().enumerate() {
            let gid = c.groups_seen + share.start + k;
            let mut members = Vec::new();
            let mut rewards = Vec::new();
            for m in 0..group {
                let ep = &episodes[k * group + m];
                for t in ep {
                    c.new_tokens += t.sampled.tokens.len();
                    c.stopped += t.sampled.stopped as usize;
                }
                let last = ep.last().expect("an episode has its first answer");
                let r = match &last.score {
                    Score::Reward(r) => *r,
                    Score::Masked(why) => {
                        // The episode's outcome is unknown: none of its
                        // answers trains.
                        *c.masked.entry(why.clone()).or_default() += 1;
                        continue;
                    }
                };
                let answers = ep.len();
                let reward = r * cfg.turn_discount.powi(answers as i32 - 1);
                let unchanged = ep
                    .windows(2)
                    .filter(|w| reward::same_answer(&w[0].text, &w[1].text))
                    .count();
                let part = job.env.part_of(task.task_id);
                scored_here.extend([
                    reward,
                    bucket.map_or(-1.0, |b| b as f64),
                    part.map_or(-1.0, |p| p as f64),
                    if r == 1.0 { answers as f64 } else { -1.0 },
                    (answers - 1) as f64,
                    unchanged as f64,
                ]);
                rewards.push(reward);
                let episode = (cfg.max_turns > 1).then_some(gid * group + m);
                for t in ep {
                    let mut smp =
                        Sample::new(gid, t.prompt.clone(), &t.sampled, policy.stop_id(), reward);
                    smp.bucket = *bucket;
                    smp.episode = episode;
                    members.push(smp);
                }
            }
            if group > 1 && !informative(&rewards) {
                c.zero_var += 1;
                if cfg.rl_algorithm().group_relative() && cfg.dynamic_sampling {
                    c.dropped += 1;
                    continue;
                }
            }
            members.retain(|m| !m.response.is_empty());
            if !members.is_empty() {
                members_here.extend(members);
                kept_here += 1;
            }
        }
        // The round over every rank: kept groups, scores, lengths.
        let mut mine_flat = vec![kept_here as f64, (scored_here.len() / SCORED) as f64];
        mine_flat.extend(&scored_here);
        mine_flat.extend(members_here.iter().map(|m| m.response.len() as f64));
        let all = stats::all_gather_varlen(comm, &mine_flat)?;
        for (r, v) in all.iter().enumerate() {
            kept_groups += v[0] as usize;
            let n = v[1] as usize;
            let index = |x: f64| (x >= 0.0).then_some(x as usize);
            for t in v[2..2 + SCORED * n].chunks(SCORED) {
                c.scored.push(Scored {
                    reward: t[0],
                    bucket: index(t[1]),
                    part: index(t[2]),
                    solved_at: index(t[3]),
                    retries: t[4] as usize,
                    unchanged: t[5] as usize,
                });
            }
            if r == rank {
                let at = c.layout.lens.len();
                c.layout.mine.extend(at..at + members_here.len());
            }
            c.layout
                .lens
                .extend(v[2 + SCORED * n..].iter().map(|&l| l as usize));
        }
        // Later turns (their sampling and scoring) count as sampling.
        c.sample_secs += retry_secs;
        c.env_secs -= retry_secs;
        c.batch.extend(members_here);
        c.groups_seen += d.tasks.len();
        c.env_secs += t1.elapsed().as_secs_f64();
        c.rounds += 1;
        let short = kept_groups < cfg.batch_size;
        if !(cfg.rl_algorithm().group_relative()
            && cfg.dynamic_sampling
            && short
            && c.rounds <= cfg.max_resample_rounds)
        {
            return Ok(c);
        }
    }
}

/// What the training half of a step did on this rank.
#[derive(Default)]
struct Trained {
    up: UpdateStats,
    /// k1 KL of the old policy to the reference, summed over tokens.
    kl_sum: f64,
    kl_n: usize,
    /// The sampler's log-probs against the trainer's, summed and largest.
    mm_sum: f64,
    mm_max: f64,
    mm_n: usize,
    /// TIS weights' sum, sum of squares and the tokens at the cap (over
    /// `mm_n` tokens).
    tis_sum: f64,
    tis_sq: f64,
    tis_capped: f64,
    /// Prompt and response tokens of this rank's samples.
    seq_tokens: usize,
    secs: f64,
}

/// Steps 3-4: old log-probs, values and reference, advantages, then the
/// update (nothing when no rank kept a sample).
fn train(
    policy: &mut Policy,
    got: &mut Collected,
    step: u64,
    comm: &dyn Communicator,
) -> anyhow::Result<Trained> {
    let t0 = Instant::now();
    let mut t = Trained::default();
    if !got.layout.lens.is_empty() {
        policy.score_old(&mut got.batch)?;
        policy.advantages_with(&mut got.batch, comm)?;
        for smp in &got.batch {
            for (&lp, &rp) in smp.old_logp.iter().zip(&smp.ref_logp) {
                t.kl_sum += KlEstimator::K1.value(lp, rp);
                t.kl_n += 1;
            }
            t.seq_tokens += smp.prompt.len() + smp.response.len();
            // The sampler's log-probs against the trainer's forward on
            // the same tokens (kernels, batching and dtype differ).
            for (&a, &b) in smp.sampler_logp.iter().zip(&smp.old_logp) {
                let d = (a as f64 - b).abs();
                t.mm_sum += d;
                t.mm_max = t.mm_max.max(d);
                t.mm_n += 1;
            }
            let cap = policy.cfg.tis_cap;
            if cap > 0.0 && !smp.sampler_logp.is_empty() {
                for w in tis_weights(&smp.old_logp, &smp.sampler_logp, cap)? {
                    t.tis_sum += w;
                    t.tis_sq += w * w;
                    t.tis_capped += f64::from(u8::from(w >= cap));
                }
            }
        }
        let lr = policy.cfg.learning_rate;
        t.up = policy.update_with(&got.batch, &got.layout, step, lr, comm)?;
    }
    t.secs = t0.elapsed().as_secs_f64();
    Ok(t)
}

/// A step's counts over every rank, and the stop request they agree on.
struct Totals {
    zero_var: f64,
    dropped: u64,
    new_tokens: f64,
    stopped: f64,
    seq_tokens: f64,
    kl_mean: f64,
    /// Mean and largest sampler/trainer log-prob gap.
    mismatch: Option<(f64, f64)>,
    /// With TIS: the mean weight, the share of tokens at the cap and the
    /// weights' effective sample share.
    tis: Option<(f64, f64, f64)>,
    masked: BTreeMap<String, u64>,
    stopping: bool,
}

impl Totals {
    fn over_ranks(
        comm: &dyn Communicator,
        got: &Collected,
        t: &Trained,
        stop_vote: f64,
    ) -> anyhow::Result<Self> {
        let local = [
            got.zero_var as f64,
            got.dropped as f64,
            got.new_tokens as f64,
            got.stopped as f64,
            t.seq_tokens as f64,
            t.kl_sum,
            t.kl_n as f64,
            t.mm_sum,
            t.mm_n as f64,
            t.mm_max,
            stop_vote,
            t.tis_sum,
            t.tis_capped,
            t.tis_sq,
        ];
        let all = comm.all_gather_f64(&local)?;
        let total = |i: usize| all.iter().map(|v| v[i]).sum::<f64>();
        Ok(Self {
            zero_var: total(0),
            dropped: total(1) as u64,
            new_tokens: total(2),
            stopped: total(3),
            seq_tokens: total(4),
            kl_mean: total(5) / total(6).max(1.0),
            mismatch: (total(8) > 0.0).then(|| {
                (
                    total(7) / total(8),
                    all.iter().map(|v| v[9]).fold(0.0, f64::max),
                )
            }),
            tis: (total(11) > 0.0).then(|| {
                (
                    total(11) / total(8),
                    total(12) / total(8),
                    effective_sample_share(total(11), total(13), total(8)),
                )
            }),
            masked: stats::sum_counts(comm, &got.masked)?,
            stopping: total(10) > 0.0,
        })
    }
}

/// What a step logs, from its parts.
struct StepRecord<'a> {
    got: &'a Collected,
    trained: &'a Trained,
    totals: &'a Totals,
    secs: f64,
}

impl StepRecord<'_> {
    /// The step's scalars for the run log (`step` is the step's index).
    fn scalars(
        &self,
        job: &RlJob,
        policy: &Policy,
        world: usize,
        step: u64,
        rl: &RlState,
        curriculum: &Curriculum,
    ) -> anyhow::Result<BTreeMap<String, f64>> {
        let (got, up, n) = (self.got, &self.trained.up, self.totals);
        let cfg = &job.config;
        let mut s = BTreeMap::<String, f64>::new();
        let mut put = |k: &str, v: f64| {
            s.insert(k.to_owned(), v);
        };
        let rewards: Vec<f64> = got.scored.iter().map(|x| x.reward).collect();
        let n_scored = rewards.len().max(1) as f64;
        let sampled = (got.groups_seen * cfg.group_size()).max(1) as f64;
        put("reward", rewards.iter().sum::<f64>() / n_scored);
        put(
            "accuracy",
            got.scored.iter().filter(|x| x.solved_at.is_some()).count() as f64 / n_scored,
        );
        if cfg.max_turns > 1 {
            // Accuracy after each answer: episodes right by then.
            for t in 1..=cfg.max_turns {
                let by = got
                    .scored
                    .iter()
                    .filter(|x| x.solved_at.is_some_and(|a| a <= t));
                put(&format!("accuracy/turn={t}"), by.count() as f64 / n_scored);
            }
            let retries: usize = got.scored.iter().map(|x| x.retries).sum();
            let unchanged: usize = got.scored.iter().map(|x| x.unchanged).sum();
            put("retries", retries as f64);
            put(
                "unchanged_retries",
                unchanged as f64 / retries.max(1) as f64,
            );
            put("template_drift", got.template_drift as f64);
            put("episodes_over_budget", got.over_budget as f64);
        }
        put("scored", rewards.len() as f64);
        put("trained_samples", got.layout.lens.len() as f64);
        put("masked", n.masked.values().sum::<u64>() as f64);
        put("kl", n.kl_mean);
        put("kl_loss", up.kl_loss);
        put("clip_fraction", up.clip_fraction);
        put("entropy", up.entropy);
        put("policy_loss", up.policy_loss);
        put("grad_norm", up.grad_norm);
        put("lr", cfg.learning_rate);
        put("temperature", policy.cfg.temperature);
        put(
            "frac_zero_variance_groups",
            n.zero_var / got.groups_seen.max(1) as f64,
        );
        put("sampling_rounds", got.rounds as f64);
        put("response_tokens_mean", n.new_tokens / sampled);
        put("stopped_fraction", n.stopped / sampled);
        put("time_sample_s", got.sample_secs);
        put("time_env_s", got.env_secs);
        put("time_train_s", self.trained.secs);
        put("time_step_s", self.secs);
        if let Some(gib) = crate::gpu::peak_memory_gib(&job.device)? {
            put("peak_mem_gib", gib);
        }
        // Rank 0's sampling time; every rank's tokens.
        put(
            "sample_tokens_per_s",
            n.new_tokens / got.sample_secs.max(1e-9),
        );
        put(
            "tokens_per_s",
            (n.seq_tokens + n.new_tokens) / self.secs.max(1e-9),
        );
        put("task_cursor", rl.cursor as f64);
        if step == 0 {
            // Once: the budget is fixed for the run (train_config.json and
            // the log have it too).
            put("micro_batch_tokens", policy.micro_batch_tokens() as f64);
        }
        if world > 1 {
            put("world_size", world as f64);
        }
        if policy.value.is_some() {
            put("value_loss", up.value_loss);
        }
        if let Some((mean, max)) = n.mismatch {
            put("logprob_mismatch_mean", mean);
            put("logprob_mismatch_max", max);
        }
        if let Some((mean, capped, ess)) = n.tis {
            put("tis_weight_mean", mean);
            put("tis_capped_fraction", capped);
            put("tis_effective_sample_share", ess);
        }
        if cfg.rl_algorithm().group_relative() {
            put("dropped_groups_total", rl.dropped_groups as f64);
        }
        if curriculum.enabled {
            put("curriculum_level", curriculum.level as f64);
            put("curriculum_accuracy", curriculum.accuracy());
        }
        let mut by_bucket: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for x in &got.scored {
            let label = x
                .bucket
                .map_or_else(|| "n/a".to_owned(), |b| curriculum.label(b));
            let e = by_bucket.entry(label).or_default();
            e.0 += x.solved_at.is_some() as u8 as f64;
            e.1 += 1.0;
        }
        for (label, (hit, n)) in by_bucket {
            s.insert(format!("accuracy/{}={label}", curriculum.feature), hit / n);
        }
        // A mixture's environments apiece: reward and exact answers.
        let parts = job.env.parts();
        let mut by_part = vec![(0f64, 0f64, 0f64); parts.len()];
        for x in &got.scored {
            if let Some(e) = x.part.and_then(|p| by_part.get_mut(p)) {
                e.0 += x.reward;
                e.1 += x.solved_at.is_some() as u8 as f64;
                e.2 += 1.0;
            }
        }
        for (name, (sum, hit, n)) in parts.iter().zip(by_part) {
            if n > 0.0 {
                s.insert(format!("reward/environment={name}"), sum / n);
                s.insert(format!("accuracy/environment={name}"), hit / n);
            }
        }
        for (why, n) in &rl.masked {
            s.insert(format!("masked_total/{why}"), *n as f64);
        }
        for (why, n) in &rl.skipped_tasks {
            s.insert(format!("skipped_tasks_total/{why}"), *n as f64);
        }
        if job.env.rows().is_some() {
            s.insert("bad_rows".into(), rl.bad_rows.len() as f64);
        }
        Ok(s)
    }
}

/// A checkpoint `step_N/` of the run: the adapter and value head, both
/// optimizers, and the RL state (cursor, curriculum, counters) in the
/// trainer state's `extra`; off-policy, the samplers' weights too
/// (`sampled_with`, in [`Policy::trainable_vars`]'s order).
fn save(
    job: &RlJob,
    state: &mut TrainerState,
    rl: &RlState,
    curriculum: &Curriculum,
    policy: &Policy,
    sampled_with: Option<&[Tensor]>,
) -> anyhow::Result<()> {
    let mut extra = rl.clone();
    extra.curriculum = Some(curriculum.clone());
    extra.optimizer_steps = policy.opt.step;
    extra.value_optimizer_steps = policy.value_opt.as_ref().map_or(0, |o| o.step);
    state.extra = serde_json::to_value(&extra)?;
    let keep = match job.config.save_total_limit {
        0 => usize::MAX,
        k => k,
    };
    let mut params = policy.params();
    for ((name, _), t) in policy
        .named_trainables()
        .iter()
        .zip(sampled_with.unwrap_or(&[]))
    {
        params.insert(format!("{SAMPLER_PREFIX}{name}"), t.clone());
    }
    let dir = checkpoint::save_as(
        &job.output_dir,
        STEP_PREFIX,
        state,
        &params,
        &policy.optim_state(),
        keep,
    )?;
    // The adapter of this step in PEFT's layout beside the resume state,
    // for `eval --adapter` (resuming does not need it).
    model::io::adapter::save(
        &policy.loaded,
        &dir.join("adapter"),
        &job.base_dir.display().to_string(),
    )?;
    tracing::info!("saved `{}`", dir.display());
    Ok(())
}

/// The run's outputs: `final/` with the value head beside the adapter,
/// `merged/`, `train_config.json`.
fn write_outputs(
    job: &RlJob,
    policy: &Policy,
    steps: u64,
    world: usize,
    final_dir: &Path,
    merged_dir: &Path,
) -> anyhow::Result<()> {
    let cfg = &job.config;
    let info = card::CardInfo {
        base_model: job.base_dir.display().to_string(),
        base_commit: None,
        stage: "stage3_ppo".into(),
        train_file: job.env.name().to_string(),
        steps,
        lora_r: cfg.lora_r,
        lora_alpha: cfg.lora_alpha,
        target_modules: cfg.target_modules.clone(),
    };
    outputs::write_adapter_and_merged(
        &policy.loaded,
        &policy.tok,
        &job.base_dir,
        &info,
        final_dir,
        merged_dir,
    )?;
    if let Some(v) = &policy.value {
        let t: std::collections::HashMap<String, Tensor> = v
            .named_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&t, final_dir.join("value_head.safetensors"))?;
    }
    outputs::write_train_config(
        &job.output_dir,
        &serde_json::json!({
            "stage": "stage3_ppo", "ppo": cfg, "curriculum": job.curriculum,
            "model": job.model, "base_dir": job.base_dir, "environment": job.env.name(),
            "world_size": world, "micro_batch_tokens": policy.micro_batch_tokens(),
            "gradient_checkpointing": policy.gradient_checkpointing(),
        }),
    )
}

mod offpolicy;
#[cfg(test)]
mod tests;
