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
//! [`run_with`] is those steps in order, each a function of [`phases`]
//! (which the off-policy samplers of [`offpolicy`] call too):
//! `phases::collect` (2), `phases::train` (3-4), `Totals::over_ranks` and
//! `StepRecord::scalars` (5); [`policy`] holds the model, the value head
//! and the update's math; everything around the loop (lock, load, resume,
//! checkpoints, outputs) is the kit's ([`crate::kit`]).
//!
//! Every random choice is keyed by (seed, step, ...) and the task stream by
//! its cursor, so a resumed run repeats the uninterrupted one on CPU.

use std::time::Instant;

use anyhow::Context;

use crate::dist::{Communicator, Single};
use crate::kit::checkpoint::TrainerState;
use crate::kit::{Resume, Run, fingerprint, outputs};
use crate::progress::Progress;

use crate::rl::curriculum::Curriculum;

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
        policy.restore(&ck, rl.optimizer_steps, rl.value_optimizer_steps)?;
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

    // Stops a run whose policy collapsed to uniform or whose every
    // minibatch is non-finite, setting aside the checkpoints since.
    let vocab = policy.loaded.model.lm_head().weight()?.dim(0)?;
    let mut guard =
        crate::kit::step::Guard::new(run.lead().then_some(job.output_dir.as_path()), STEP_PREFIX)
            .with_vocab(vocab);
    let keep = |guard: &crate::kit::step::Guard| guard.keep(cfg.save.keep());

    // 2-5. The loop.
    progress.start(Some(total_steps), state.step);
    let (mut first_reward, mut last_reward) = (None, None);
    // Sampling and scoring, training, and the steps they add up over.
    let mut split = (0.0, 0.0, 0usize);
    let mut episodes_apart = 0u64;
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
        let finite = trained.up.minibatches > 0 || trained.up.skipped_minibatches == 0;
        guard.admits_rl(STAGE, &mut state, finite, trained.up.entropy)?;
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
        episodes_apart += got.apart as u64;
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
        let kept = keep(&guard);
        let checkpoint_now = || {
            save(
                job,
                &mut state,
                &rl,
                &curriculum,
                &policy,
                sampled_with,
                kept,
            )
        };
        let vars = policy.trainable_vars();
        interrupted = run.after_step(
            step + 1,
            total_steps,
            cfg.save.save_steps,
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
    if !interrupted {
        guard.finish(STAGE)?;
    }
    if !interrupted && run.lead() {
        let sampled_with = off_policy.then_some(&sampling[..]);
        save(
            job,
            &mut state,
            &rl,
            &curriculum,
            &policy,
            sampled_with,
            keep(&guard),
        )?;
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
        episodes_apart,
    })
}

mod offpolicy;
mod phases;
mod policy;

use phases::*;
pub use phases::{OFF_POLICY_TIS_CAP, RlJob, RlState, RlSummary, STEP_PREFIX};
pub use policy::{Layout, Policy, Sample, UpdateStats};
#[cfg(test)]
mod tests;
