//! The DPO recipe (Rafailov et al. 2023), one loop read top to bottom:
//!
//! 1. lock the output folder, load tokenizer and model with a fresh LoRA
//!    adapter (or a trained one to go on from) through the kit
//!    ([`crate::kit`]); tokenize the pairs: prompt and each answer exactly
//!    as the chat template renders the whole conversation
//!    ([`Example::new`], as SFT), over-long pairs dropped and counted;
//! 2. the reference: the adapter switched off, a frozen copy of the
//!    starting adapter, or every pair's log-probs under the starting model
//!    computed once before training; then resume from the newest valid
//!    checkpoint when asked;
//! 3. each optimizer step: `accum` micro-batches of `batch_size` pairs in a
//!    seeded order, each pair's chosen and rejected rows in one forward;
//!    the pair losses of [`crate::pref::loss`] (sigmoid, ipo, robust, hinge, +
//!    RPO's NLL) averaged over the step's pairs; the non-finite guard,
//!    clipping, AdamW at the cosine rate;
//! 4. metrics (`loss`, `rewards/chosen`, `rewards/rejected`,
//!    `rewards/margins`, `rewards/accuracies`, `logps/chosen`,
//!    `logps/rejected`, ...) through the run log, a checkpoint every
//!    `save_steps` and on SIGTERM/SIGINT; at the end `final/`, `merged/`,
//!    `train_config.json` and the curves.
//!
//! The data order and dropout masks are keyed by (seed, step), so a resumed
//! run repeats the uninterrupted one exactly. On several ranks the
//! micro-batches of a step are shared ([`crate::dist::shard`]); each pair's
//! loss is divided by the step's whole pair count, so the summed gradients
//! are the one-rank ones.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::{Tensor, Var};
use serde::Serialize;

use crate::config::{DpoConfig, ModelConfig};
use crate::data::{ChatTokenizer, Example, Message, Role};
use crate::dist::{Communicator, shard};
use crate::kit::outputs::Ending;
use crate::kit::{
    Guard, Run, RunOptions, card, clip_scale, fingerprint, load, next_micro_batches, outputs,
    planned_steps, summed_over_ranks,
};
use crate::model::LoadedModel;
use crate::model::layers::lora::{set_dropout_seed, without_adapters};
use crate::pref::loss::{LossKind, Objective, PairLogps, RewardStats};
use crate::pref::pairs::Pair;
use crate::pref::rollout::read_jsonl;
use crate::progress::Progress;
use crate::rng::keyed;
use crate::train::completion;
use crate::train::optim::AdamW;
use crate::train::schedule::Cosine;

/// One DPO run.
pub struct DpoJob {
    pub config: DpoConfig,
    pub model: ModelConfig,
    /// The policy's base (Stage 2's merged model, or a round's).
    pub base_dir: PathBuf,
    /// The base's commit, when it came from the hub cache (for the cards).
    pub base_commit: Option<String>,
    /// A trained adapter (PEFT layout) to go on training from; none: a
    /// fresh one.
    pub adapter: Option<PathBuf>,
    pub pairs_file: PathBuf,
    /// Output folder, device, resume, step limit.
    pub run: RunOptions,
}

/// What a finished run did.
#[derive(Debug, Clone, Serialize)]
pub struct DpoSummary {
    /// Pairs trained on.
    pub pairs: usize,
    /// Pairs longer than `model.max_length`, left out.
    pub dropped_too_long: usize,
    /// Optimizer steps done (those before a resume included).
    pub steps: u64,
    /// The checkpoint's step a resumed run went on from.
    pub resumed_from: Option<u64>,
    /// The mean pair loss of the first and the last step of this process.
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    /// The last step's share of pairs whose chosen reward was larger.
    pub last_accuracy: Option<f64>,
    /// Steps skipped for a non-finite loss or gradient.
    pub skipped_steps: u64,
    pub ending: Ending,
}

/// A pair in tokens: the prompt as the template renders it for
/// generation, each answer with its end-of-turn token unless it is open
/// (the start of an answer: [`Pair::chosen_open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPair {
    pub prompt: Vec<u32>,
    pub chosen: Vec<u32>,
    pub rejected: Vec<u32>,
}

impl TokenPair {
    /// Tokenizes `pair` as SFT tokenizes a chat: the whole conversation
    /// rendered by the chat template, split where the generation prompt
    /// ends (an error when the template does not render the prompt as a
    /// prefix of the conversation). An open answer is the same tokens
    /// without the end-of-turn token.
    pub fn new(tok: &ChatTokenizer, pair: &Pair) -> crate::data::Result<Self> {
        let prompt = pair.prompt.as_str();
        let chat = |answer: &str| {
            [
                Message::new(Role::User, prompt.to_owned()),
                Message::new(Role::Assistant, answer.to_owned()),
            ]
        };
        let c = Example::new(tok, &chat(&pair.chosen))?;
        let r = Example::new(tok, &chat(&pair.rejected))?;
        debug_assert_eq!(c.input_ids[..c.prompt_len], r.input_ids[..r.prompt_len]);
        // Example ends every answer with the end-of-turn token.
        let answer = |e: &Example, open: bool| {
            e.input_ids[e.prompt_len..e.len() - usize::from(open)].to_vec()
        };
        let t = Self {
            prompt: c.input_ids[..c.prompt_len].to_vec(),
            chosen: answer(&c, pair.chosen_open),
            rejected: answer(&r, pair.rejected_open),
        };
        if t.chosen.is_empty() || t.rejected.is_empty() {
            return Err(crate::data::DataError::Example {
                line: 0,
                message: "an open side with no text: it has no token to score".into(),
                hint: "an open side (`chosen_open`, `rejected_open`) is the start of an answer and needs some text; `prefs --first_error` never writes an empty one".into(),
            });
        }
        Ok(t)
    }

    /// Prompt + the longer answer: the longest row the pair puts in a batch.
    pub fn longest(&self) -> usize {
        self.prompt.len() + self.chosen.len().max(self.rejected.len())
    }
}

/// Where the reference log-probs come from.
enum Reference {
    /// The model with its adapter switched off.
    AdapterOff,
    /// The starting adapter's values, set in for the reference pass.
    Initial(Vec<Tensor>),
    /// Every pair's (chosen, rejected) summed log-probs, computed before
    /// training.
    Precomputed(Vec<(f64, f64)>),
}

/// The loaded model and what its forward passes need.
struct Trainee {
    loaded: LoadedModel,
    pad: u32,
    vars: Vec<(String, Var)>,
}

impl Trainee {
    /// `pairs` packed: the chosen rows, then the rejected rows.
    fn pack(&self, pairs: &[&TokenPair]) -> candle_core::Result<completion::Packed> {
        let rows: Vec<(&[u32], &[u32])> = pairs
            .iter()
            .map(|p| (&p.prompt[..], &p.chosen[..]))
            .chain(pairs.iter().map(|p| (&p.prompt[..], &p.rejected[..])))
            .collect();
        completion::pack(&rows, self.pad, &self.loaded.device)
    }

    /// Each row's summed answer log-probs, without gradients.
    fn sums(&self, p: &completion::Packed) -> candle_core::Result<Vec<f64>> {
        let (logp, _, _) = completion::forward(&self.loaded.model, p, 1.0, false, false)?;
        Ok(completion::row_sums(&logp.to_vec1::<f32>()?, &p.lens))
    }

    /// The reference's summed log-probs of each row of `p` (pairs `ids`).
    fn reference(
        &self,
        r: &Reference,
        p: &completion::Packed,
        ids: &[usize],
    ) -> anyhow::Result<Vec<f64>> {
        Ok(match r {
            Reference::AdapterOff => without_adapters(|| self.sums(p))?,
            Reference::Initial(start) => {
                // Swap the starting values in, and the live ones back.
                let live: Vec<Tensor> = self
                    .vars
                    .iter()
                    .map(|(_, v)| v.as_tensor().copy())
                    .collect::<candle_core::Result<_>>()?;
                let set = |ts: &[Tensor]| -> candle_core::Result<()> {
                    for ((_, v), t) in self.vars.iter().zip(ts) {
                        v.set(t)?;
                    }
                    Ok(())
                };
                set(start)?;
                let sums = self.sums(p);
                set(&live)?;
                sums?
            }
            Reference::Precomputed(all) => {
                let mut v: Vec<f64> = ids.iter().map(|&i| all[i].0).collect();
                v.extend(ids.iter().map(|&i| all[i].1));
                v
            }
        })
    }
}

/// Reads and tokenizes the pairs file; pairs longer than `max_length` are
/// left out and counted. A pair whose texts alone need more tokens than
/// that is left out unread: tokenising a record of tens of MB takes
/// gigabytes only to drop it.
pub fn read_pairs(
    tok: &ChatTokenizer,
    path: &std::path::Path,
    max_length: usize,
) -> anyhow::Result<(Vec<TokenPair>, usize)> {
    let raw: Vec<Pair> = read_jsonl(path, "pair")?;
    let mut out = Vec::with_capacity(raw.len());
    let mut too_long = 0;
    for (i, p) in raw.iter().enumerate() {
        let answer = p.chosen.len().max(p.rejected.len());
        if tok.fewest_tokens(p.prompt.len()) + tok.fewest_tokens(answer) > max_length {
            too_long += 1;
            continue;
        }
        let t = TokenPair::new(tok, p)
            .with_context(|| format!("`{}` pair {} (line {})", path.display(), i, i + 1))?;
        if t.longest() > max_length {
            too_long += 1;
        } else {
            out.push(t);
        }
    }
    Ok((out, too_long))
}

/// The settings a resume must find unchanged: all but where the files are
/// (the pairs are fingerprinted by their contents) and checkpointing, which
/// decides memory only.
fn fingerprinted(cfg: &DpoConfig) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(cfg)?;
    if let Some(m) = v.as_object_mut() {
        for k in ["pairs_file", "output_dir", "gradient_checkpointing"] {
            m.remove(k);
        }
    }
    Ok(v)
}

/// One rank of a run over `comm`'s ranks (every rank calls it with the
/// same job; [`crate::dist::Single`] for one device); rank 0 alone logs
/// and writes.
pub fn run_with(
    job: &DpoJob,
    comm: &dyn Communicator,
    progress: &dyn Progress,
) -> anyhow::Result<DpoSummary> {
    let run = Run::begin("dpo", &job.run.output_dir, comm)?;
    let (cfg, rank, world) = (&job.config, comm.rank(), comm.world());
    let objective = Objective {
        kind: LossKind::parse(&cfg.loss).map_err(|e| anyhow::anyhow!("dpo.loss: {e}"))?,
        beta: cfg.beta,
        epsilon: cfg.epsilon,
        nll_coef: cfg.nll_coef,
    };

    // 1. Tokenizer, model, pairs.
    let (tok, mut loaded) = match &job.adapter {
        None => {
            let lora = load::lora(&cfg.lora, cfg.lora_dropout, cfg.seed)?;
            load::trainee(
                &job.base_dir,
                load::Adapter::Fresh(&lora),
                &job.model,
                &job.run.device,
            )?
        }
        Some(a) => load::trainee(
            &job.base_dir,
            load::Adapter::Trained(a),
            &job.model,
            &job.run.device,
        )?,
    };
    loaded.model.set_gradient_checkpointing(
        cfg.gradient_checkpointing
            .unwrap_or(!job.run.device.is_cpu()),
    );
    let (pairs, dropped_too_long) = read_pairs(&tok, &job.pairs_file, job.model.max_length)?;
    if pairs.is_empty() {
        bail!(
            "no pairs to train on in `{}` ({dropped_too_long} longer than max_length {})\nhint: run `trace-train prefs` on more rollouts, or raise model.max_length",
            job.pairs_file.display(),
            job.model.max_length
        );
    }
    let vars = loaded.named_trainable_vars();
    let me = Trainee {
        pad: tok.pad().id,
        vars: vars.clone(),
        loaded,
    };
    let plan_of = |epoch: u64| -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| keyed(cfg.seed ^ 0xd90, epoch, i as u64));
        order
            .chunks(cfg.batch_size)
            .map(<[usize]>::to_vec)
            .collect()
    };
    let accum = cfg.gradient_accumulation_steps;
    let per_epoch = pairs.len().div_ceil(cfg.batch_size);
    let total_steps = planned_steps(per_epoch, accum, cfg.epochs, job.run.max_steps);
    let (lr, warmup, floor) = (
        cfg.optim.learning_rate,
        cfg.schedule.warmup_ratio,
        cfg.schedule.min_lr_ratio,
    );
    let schedule = Cosine::new(lr, total_steps as usize, warmup, floor);

    // 2. The reference (from the starting weights), then resume.
    if job.adapter.is_some() && cfg.reference == "adapter_off" {
        // TRL's trap (#4723): switching a trained adapter off gives the
        // base model, not the policy training starts from.
        tracing::warn!(
            "dpo: the reference is the base model without the adapter training starts from; `reference: initial` makes it a frozen copy of that adapter"
        );
    }
    let reference = match cfg.reference.as_str() {
        "adapter_off" => Reference::AdapterOff,
        "initial" => Reference::Initial(
            vars.iter()
                .map(|(_, v)| v.as_tensor().copy())
                .collect::<candle_core::Result<_>>()?,
        ),
        "precomputed" => {
            let mut all = Vec::with_capacity(pairs.len());
            for chunk in pairs.chunks(cfg.batch_size) {
                let refs: Vec<&TokenPair> = chunk.iter().collect();
                let s = me.sums(&me.pack(&refs)?)?;
                let n = chunk.len();
                all.extend((0..n).map(|i| (s[i], s[n + i])));
            }
            Reference::Precomputed(all)
        }
        other => bail!("dpo.reference: `{other}` is not one of adapter_off, initial, precomputed"),
    };
    let fingerprint = fingerprint::of(
        serde_json::json!({"dpo": fingerprinted(cfg)?, "adapter": job.adapter}),
        job.base_dir.display().to_string(),
        &job.base_dir,
        fingerprint::sha256_of(&[&job.pairs_file])?,
    )?;
    let mut opt = AdamW::new(vars.clone(), cfg.optim.weight_decay)?;
    let (mut state, resumed_from, mut log) = run.start_optimizer(
        job.run.resume,
        job.run.force,
        &fingerprint,
        &job.run.device,
        &mut opt,
    )?;
    let keep = cfg.save.keep();

    // 3-4. The loop.
    progress.start(Some(total_steps), state.step);
    let (mut first_loss, mut last_loss, mut last_accuracy) = (None, None, None);
    let mut guard = Guard::new(
        run.lead().then_some(job.run.output_dir.as_path()),
        crate::kit::checkpoint::SFT_PREFIX,
    );
    let mut interrupted = false;
    let mut plan = plan_of(state.epoch as u64);
    while state.step < total_steps {
        crate::gpu::reset_peak_memory(&job.run.device)?;
        let t0 = Instant::now();
        let micro = next_micro_batches(&mut state, accum, &mut plan, plan_of);
        let step_pairs: usize = micro.iter().map(Vec::len).sum();
        let mut grads: Option<Vec<Tensor>> = None;
        // [loss, stop, 7 reward sums, tokens] of this rank.
        let mut sums = vec![0.0; 10];
        for part in shard::split_step(&micro, world, rank) {
            let key = match part.slice {
                None => part.micro as u64,
                Some(s) => ((part.micro * world + s) as u64) | (1 << 32),
            };
            set_dropout_seed(keyed(cfg.seed, state.step, key));
            let batch: Vec<&TokenPair> = part.rows.iter().map(|&i| &pairs[i]).collect();
            let p = me.pack(&batch)?;
            let refs = me.reference(&reference, &p, &part.rows)?;
            let (logp, _, _) = completion::forward(&me.loaded.model, &p, 1.0, true, false)?;
            let own = completion::row_sums(&logp.to_vec1::<f32>()?, &p.lens);
            let n = batch.len();
            let logps: Vec<PairLogps> = (0..n)
                .map(|i| PairLogps {
                    chosen: own[i],
                    rejected: own[n + i],
                    ref_chosen: refs[i],
                    ref_rejected: refs[n + i],
                    chosen_len: p.lens[i],
                    rejected_len: p.lens[n + i],
                })
                .collect();
            let (_, per) = objective.batch(&logps, step_pairs);
            // The surrogate Σ w_t log π(t): its gradient is the loss's.
            let w: Vec<f32> = (0..2 * n)
                .flat_map(|row| {
                    let d = if row < n {
                        per[row].d_chosen
                    } else {
                        per[row - n].d_rejected
                    };
                    std::iter::repeat_n(d as f32, p.lens[row])
                })
                .collect();
            let r = w.len();
            let surrogate = (logp * Tensor::from_vec(w, r, &job.run.device)?)?.sum_all()?;
            let g = me.loaded.model.backward(&surrogate)?;
            crate::train::optim::accumulate(&mut grads, opt.gradients(&g)?)?;
            sums[0] += per.iter().map(|l| l.loss).sum::<f64>() / step_pairs.max(1) as f64;
            for (s, x) in sums[2..9]
                .iter_mut()
                .zip(RewardStats::sums(cfg.beta, &logps))
            {
                *s += x;
            }
            sums[9] += batch
                .iter()
                .map(|t| t.prompt.len() * 2 + t.chosen.len() + t.rejected.len())
                .sum::<usize>() as f64;
        }
        let grads = summed_over_ranks(comm, grads, &opt)?;
        sums[1] = run.stop_vote();
        let agreed = comm.sum_f64(&sums)?;
        let (loss, stopping) = (agreed[0], agreed[1] > 0.0);
        let rewards = RewardStats::from_sums(&agreed[2..9].try_into().expect("seven sums"));
        let norm = AdamW::grad_norm(&grads)?;
        let lr = schedule.lr(state.step as usize);
        if guard.admits("dpo", &mut state, loss, norm)? {
            opt.step(&grads, lr, clip_scale(norm, cfg.optim.max_grad_norm))?;
        }
        state.step += 1;
        state.tokens_seen += agreed[9] as u64;
        let secs = t0.elapsed().as_secs_f64();
        first_loss.get_or_insert(loss);
        last_loss = Some(loss);
        last_accuracy = Some(rewards.accuracies);
        let mut scalars = vec![
            ("epoch", state.epoch as f64),
            ("loss", loss),
            ("lr", lr),
            ("grad_norm", norm),
            ("pairs", step_pairs as f64),
            ("tokens_per_s", agreed[9] / secs.max(1e-9)),
            ("time_step_s", secs),
            ("skipped_steps", state.skipped_steps as f64),
        ];
        scalars.extend(rewards.scalars());
        run.log_step(&mut log, state.step, scalars, &job.run.device)?;
        progress.set(state.step);
        progress.status(&format!(
            "loss {loss:.4} margin {:.3} acc {:.2}",
            rewards.margins, rewards.accuracies
        ));
        if run.after_optimizer_step(
            &state,
            total_steps,
            cfg.save.save_steps,
            guard.keep(keep),
            stopping,
            &opt,
        )? {
            interrupted = true;
            break;
        }
    }
    progress.finish();

    // 5. Outputs.
    let (final_dir, merged_dir) = outputs::dirs(&job.run.output_dir);
    if !interrupted {
        guard.finish("dpo")?;
    }
    if run.finish_optimizer(&state, keep, interrupted, &opt)? {
        let (base_model, origin) = card::base_names(None, &job.base_dir);
        let info = card::CardInfo {
            base_model,
            origin,
            base_commit: job.base_commit.clone(),
            stage: "stage3_dpo".into(),
            train_file: job.pairs_file.display().to_string(),
            steps: state.step,
            lora: cfg.lora.clone(),
        };
        outputs::write_adapter_and_merged(
            &me.loaded,
            &tok,
            &job.base_dir,
            &info,
            &final_dir,
            &merged_dir,
        )?;
        outputs::write_train_config(
            &job.run.output_dir,
            &serde_json::json!({
                "stage": "stage3_dpo", "dpo": cfg, "model": job.model,
                "base_dir": job.base_dir, "adapter": job.adapter,
                "pairs_file": job.pairs_file, "pairs": pairs.len(),
                "dropped_too_long": dropped_too_long, "world_size": world,
            }),
        )?;
    }
    drop(log);
    run.draw_curves();
    Ok(DpoSummary {
        pairs: pairs.len(),
        dropped_too_long,
        steps: state.step,
        resumed_from,
        first_loss,
        last_loss,
        last_accuracy,
        skipped_steps: state.skipped_steps,
        ending: Ending {
            final_dir,
            merged_dir,
            interrupted,
            stop_requested: run.stop_requested(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::testing;

    /// A pair too long by its text alone is counted and left out before
    /// it is tokenised: here one that tokenising would refuse (an open
    /// side with no text) is counted, not an error.
    #[test]
    fn a_pair_surely_too_long_is_dropped_unread() {
        let tok = testing::tokenizer();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.jsonl");
        let pair = |chosen: &str, rejected: &str, chosen_open: bool| {
            serde_json::json!({"prompt_id": 0, "prompt": "q", "chosen": chosen,
                "rejected": rejected, "chosen_open": chosen_open, "kind": "correctness",
                "chosen_reward": 1.0, "rejected_reward": 0.0, "edit_distance": 1})
            .to_string()
        };
        let huge = "x".repeat(64 * tok.longest_token_bytes() + 1);
        std::fs::write(
            &path,
            [pair("a", "b", false), pair("", &huge, true)].join("\n"),
        )
        .unwrap();
        let (pairs, too_long) = read_pairs(&tok, &path, 64).unwrap();
        assert_eq!((pairs.len(), too_long), (1, 1));
        // Within the limit, the same bad pair is an error naming its line.
        std::fs::write(&path, pair("", "b", true)).unwrap();
        let err = read_pairs(&tok, &path, 64).unwrap_err();
        assert!(format!("{err:#}").contains("line 1"), "{err:#}");
    }
}
