//! The policy a PPO/GRPO run trains: the model with its adapter (and, for
//! PPO, the value head), the optimizers, and what one step does with it:
//! sampling completions, scoring them under the policy and the reference,
//! and the clipped update. The loop that drives it is `super` (and
//! `super::offpolicy` on several GPUs).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::{ModelConfig, RlConfig};
use crate::data::ChatTokenizer;
use crate::dist::{self, Communicator, Single, stats};
use crate::kit::checkpoint::{self};
use crate::kit::{clip_scale, load};
use crate::model::LoadedModel;
use crate::model::decode::generate::{self, Generation, Sampling};
use crate::model::layers::lora::{LoraConfig, set_dropout_seed, without_adapters};
use crate::rng::keyed;
use crate::train::completion::{self, Packed};
use crate::train::optim::AdamW;

use crate::rl::advantage::{gae, token_rewards, whiten_with};
use crate::rl::loss::{
    Aggregation, KlEstimator, clipped_value_loss, completion_weights, tis_weights,
};
use crate::rl::memory::{self, micro_batches};
use crate::rl::value::ValueHead;

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
    /// A multi-step episode's reward for this action (`reward` is then
    /// the episode's return): PPO's advantages run over its steps.
    #[serde(default)]
    pub step_reward: Option<f64>,
    /// The sampler's log-probs of the response's tokens, the stop token's
    /// included (empty where the sampler kept none).
    pub sampler_logp: Vec<f32>,
    /// Which response tokens train (`ppo.episode_sequences`: an episode's
    /// actions, not the observations between them); empty: every one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trained: Vec<bool>,
    /// An episode sequence's actions, in order: where each lies in the
    /// response and its step reward (PPO's advantages run over them);
    /// empty for any other sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actions: Vec<Action>,
    #[serde(skip)]
    pub(super) old_logp: Vec<f64>,
    #[serde(skip)]
    pub(super) ref_logp: Vec<f64>,
    #[serde(skip)]
    pub(super) old_values: Vec<f64>,
    #[serde(skip)]
    pub(super) advantages: Vec<f64>,
    #[serde(skip)]
    pub(super) returns: Vec<f64>,
}

/// One action of an episode sequence: response tokens `start..end`, and
/// the reward the environment gave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Action {
    pub start: usize,
    pub end: usize,
    pub reward: f64,
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
            step_reward: None,
            sampler_logp,
            trained: Vec::new(),
            actions: Vec::new(),
            old_logp: Vec::new(),
            ref_logp: Vec::new(),
            old_values: Vec::new(),
            advantages: Vec::new(),
            returns: Vec::new(),
        }
    }
}

impl Sample {
    /// Whether response token `i` trains.
    pub fn trains(&self, i: usize) -> bool {
        self.trained.get(i).copied().unwrap_or(true)
    }

    /// The response tokens that train.
    pub fn trained_len(&self) -> usize {
        match self.trained.is_empty() {
            true => self.response.len(),
            false => self.trained.iter().filter(|&&t| t).count(),
        }
    }

    /// One multi-step episode's actions `steps` (in order) as one sample:
    /// the first action's prompt, then each action and the observation
    /// tokens the next action's prompt adds, only the actions trained.
    /// The actions back, unchanged, when a prompt is not the one before it
    /// plus that action's response (a template that rewrote earlier turns).
    pub fn episode(steps: Vec<Sample>) -> Result<Self, Vec<Sample>> {
        // Each prompt is the one before it, its response, then the
        // observation.
        let chained = !steps.is_empty()
            && steps.windows(2).all(|w| {
                let seen = w[0].prompt.len() + w[0].response.len();
                w[1].prompt.len() >= seen
                    && w[1].prompt[..w[0].prompt.len()] == w[0].prompt[..]
                    && w[1].prompt[w[0].prompt.len()..seen] == w[0].response[..]
            });
        if !chained {
            return Err(steps);
        }
        let first = &steps[0];
        let (mut response, mut trained, mut sampler_logp) = (Vec::new(), Vec::new(), Vec::new());
        let mut actions = Vec::with_capacity(steps.len());
        for (k, s) in steps.iter().enumerate() {
            if k > 0 {
                let observation = &s.prompt[first.prompt.len() + response.len()..];
                response.extend_from_slice(observation);
                trained.extend(std::iter::repeat_n(false, observation.len()));
                sampler_logp.extend(std::iter::repeat_n(0.0, observation.len()));
            }
            actions.push(Action {
                start: response.len(),
                end: response.len() + s.response.len(),
                reward: s.step_reward.unwrap_or(s.reward),
            });
            response.extend_from_slice(&s.response);
            trained.extend(std::iter::repeat_n(true, s.response.len()));
            sampler_logp.extend_from_slice(&s.sampler_logp);
        }
        let keep_logp = steps
            .iter()
            .all(|s| s.sampler_logp.len() == s.response.len());
        let last = steps.last().expect("checked above");
        Ok(Self {
            group: first.group,
            prompt: first.prompt.clone(),
            response,
            stopped: last.stopped,
            reward: first.reward,
            bucket: first.bucket,
            episode: first.episode,
            step_reward: None,
            sampler_logp: if keep_logp { sampler_logp } else { Vec::new() },
            trained,
            actions,
            old_logp: Vec::new(),
            ref_logp: Vec::new(),
            old_values: Vec::new(),
            advantages: Vec::new(),
            returns: Vec::new(),
        })
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
    pub(super) opt: AdamW,
    pub(super) value_opt: Option<AdamW>,
    pub(super) stop_id: u32,
    pub(super) agg: Aggregation,
    pub(super) kl: KlEstimator,
    /// The token budget of a training pass's micro-batches.
    pub(super) micro_tokens: usize,
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
        load::lora(&cfg.lora, 0.0, cfg.seed)
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
        let opt = AdamW::new(loaded.named_trainable_vars(), cfg.optim.weight_decay)?;
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
        Ok(self.tok.encode_prompt(&[crate::data::Message::new(
            crate::data::Role::User,
            prompt.to_owned(),
        )])?)
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
    pub(super) fn pack(&self, samples: &[&Sample]) -> candle_core::Result<Packed> {
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
    pub(super) fn forward(
        &self,
        p: &Packed,
        train: bool,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
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
                    let s = &mut samples[i];
                    let n = s.response.len();
                    // An episode sequence's observations take nothing.
                    s.advantages = (0..n)
                        .map(|t| if s.trains(t) { adv[e] } else { 0.0 })
                        .collect();
                    s.returns = vec![0.0; n];
                }
            }
        } else if samples
            .iter()
            .any(|s| s.step_reward.is_some() || !s.actions.is_empty())
        {
            // Multi-step episodes: GAE over each episode's steps, an
            // episode being its actions in order (samples of one episode,
            // or the actions of one episode sequence).
            let coef = c.kl_coef();
            // A step's reward less its KL penalty (k1 summed over the
            // action's tokens), and the value at the action's last token.
            let step = |s: &Sample, span: std::ops::Range<usize>, reward: f64| -> (f64, f64) {
                let lp = s.old_logp.get(span.clone()).unwrap_or(&[]);
                let rp = s.ref_logp.get(span.clone()).unwrap_or(&[]);
                let kl: f64 = lp
                    .iter()
                    .zip(rp)
                    .map(|(&lp, &rp)| KlEstimator::K1.value(lp, rp))
                    .sum();
                let value = span
                    .end
                    .checked_sub(1)
                    .and_then(|last| s.old_values.get(last))
                    .copied()
                    .unwrap_or(0.0);
                (reward - coef * kl, value)
            };
            // Each episode's steps in order: (sample, its tokens, reward).
            // An action trained apart is a step over its whole response;
            // an episode sequence is an episode whose steps are its actions.
            type Steps = Vec<(usize, std::ops::Range<usize>, f64)>;
            let mut episodes: BTreeMap<usize, Steps> = BTreeMap::new();
            let mut alone: Vec<Steps> = Vec::new();
            for (i, s) in samples.iter().enumerate() {
                if !s.actions.is_empty() {
                    alone.push(
                        s.actions
                            .iter()
                            .map(|a| (i, a.start..a.end, a.reward))
                            .collect(),
                    );
                    continue;
                }
                let one = (i, 0..s.response.len(), s.step_reward.unwrap_or(s.reward));
                match s.episode {
                    Some(e) => episodes.entry(e).or_default().push(one),
                    // Samples of no episode are each an episode of one step.
                    None => alone.push(vec![one]),
                }
            }
            for steps in episodes.into_values().chain(alone) {
                let (rewards, values): (Vec<f64>, Vec<f64>) = steps
                    .iter()
                    .map(|(i, span, reward)| step(&samples[*i], span.clone(), *reward))
                    .unzip();
                let (a, r) = gae(&rewards, &values, c.gamma, c.lam);
                // The tokens outside every step (an episode sequence's
                // observations, which train nothing) take 0.
                for (i, _, _) in &steps {
                    let n = samples[*i].response.len();
                    samples[*i].advantages = vec![0.0; n];
                    samples[*i].returns = vec![0.0; n];
                }
                for (k, (i, span, _)) in steps.into_iter().enumerate() {
                    samples[i].advantages[span.clone()].fill(a[k]);
                    samples[i].returns[span].fill(r[k]);
                }
            }
            self.whiten(samples, comm)?;
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
            self.whiten(samples, comm)?;
        }
        Ok(())
    }

    /// PPO's advantages whitened over every rank's tokens, when
    /// `whiten_advantages`.
    fn whiten(&self, samples: &mut [Sample], comm: &dyn Communicator) -> anyhow::Result<()> {
        if self.cfg.whiten_advantages {
            // Over the tokens that train (an episode sequence's
            // observations stay out, at 0).
            let mut rows: Vec<Vec<f64>> = samples
                .iter()
                .map(|s| {
                    (0..s.advantages.len())
                        .filter(|&i| s.trains(i))
                        .map(|i| s.advantages[i])
                        .collect()
                })
                .collect();
            let flat: Vec<f64> = rows.iter().flatten().copied().collect();
            let m = stats::moments(comm, &flat)?;
            whiten_with(&mut rows, m.mean, m.var.sqrt());
            for (s, a) in samples.iter_mut().zip(rows) {
                let mut whitened = a.into_iter();
                for i in 0..s.advantages.len() {
                    s.advantages[i] = match s.trains(i) {
                        true => whitened.next().expect("one a trained token"),
                        false => 0.0,
                    };
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
                let scale = |n: f64| clip_scale(n, c.optim.max_grad_norm);
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
    pub(super) fn member_gradients(
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
    pub(super) fn micro_gradients(
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
        // Each member's weight on its trained tokens, 0 on the rest (an
        // episode sequence's observations).
        let w: Vec<f32> = mb
            .iter()
            .zip(p.lens.iter().zip(w))
            .flat_map(|(s, (&len, &w))| {
                (0..len).map(move |i| if s.trains(i) { w as f32 } else { 0.0 })
            })
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
        // The tokens that train (`clip` is its share of them).
        let tokens = mb.iter().map(|s| s.trained_len()).sum::<usize>() as f64;
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
    pub(super) fn zero_gradients(&self) -> candle_core::Result<Vec<Tensor>> {
        self.trainable_vars()
            .iter()
            .map(|v| v.as_tensor().zeros_like())
            .collect()
    }

    /// The adapter's variables, then the value head's (the order of the
    /// gradients).
    pub(super) fn trainable_vars(&self) -> Vec<candle_core::Var> {
        self.named_trainables()
            .into_iter()
            .map(|(_, v)| v)
            .collect()
    }

    /// [`Policy::trainable_vars`] with their names.
    pub(super) fn named_trainables(&self) -> Vec<(String, candle_core::Var)> {
        let mut v = self.opt.vars().to_vec();
        if let Some(o) = &self.value_opt {
            v.extend(o.vars().iter().cloned());
        }
        v
    }

    /// A copy of each trainable variable's values, in their order.
    pub(super) fn trainable_values(&self) -> candle_core::Result<Vec<Tensor>> {
        self.trainable_vars()
            .iter()
            .map(|v| v.as_tensor().copy())
            .collect()
    }

    /// The trainable tensors (adapter and value head) by name.
    pub(super) fn params(&self) -> BTreeMap<String, Tensor> {
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
    pub(super) fn optim_state(&self) -> BTreeMap<String, Tensor> {
        let mut s = self.opt.state();
        if let Some(o) = &self.value_opt {
            s.extend(o.state());
        }
        s
    }

    /// Restores the optimizers and the value head from `ck`, saved after
    /// `optimizer_steps` policy and `value_optimizer_steps` value steps.
    pub(super) fn restore(
        &mut self,
        ck: &checkpoint::Loaded,
        optimizer_steps: u64,
        value_optimizer_steps: u64,
    ) -> anyhow::Result<()> {
        ck.restore(self.opt.vars())?;
        self.opt.load_state(&ck.optim, optimizer_steps)?;
        if let (Some(v), Some(o)) = (&self.value, &mut self.value_opt) {
            v.load(&ck.params)?;
            o.load_state(&ck.optim, value_optimizer_steps)?;
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
            lens: samples.iter().map(Sample::trained_len).collect(),
            mine: (0..samples.len()).collect(),
        }
    }
}
