//! One-step off-policy Stage 3 (`ppo.sampler_ranks`): the last ranks of the
//! run only sample, the others only train, and the two overlap. While the
//! trainers update the policy on step k's batch, the samplers make step
//! k+1's from the weights the trainers started step k with; the trainers'
//! new weights reach the samplers after each step, so every batch but the
//! first is one update old when it is trained on. The loss corrects for it
//! with truncated importance weights on the samplers' log-probs
//! (`ppo.tis_cap`, 2 unless set).
//!
//! Two exchanges over the whole run's communicator a step:
//! 1. the batch: every sampler's samples and counts, and the draw side of
//!    the run's state after the batch's draws (task cursor, rows found bad,
//!    curriculum), which the trainers' checkpoints save;
//! 2. the weights: rank 0's adapter (and value head) to every rank, and
//!    whether the run goes on.
//!
//! The samplers draw and score tasks among themselves (their own
//! communicator, as the ranks of a synchronous run do); the trainers train
//! among theirs. A checkpoint holds the samplers' weights beside the
//! trainers' (and the samplers' draw state), so a resumed run makes the
//! batch that was being made when it was saved again, from the same
//! weights, and goes on as the uninterrupted run would.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Context;
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use crate::dist::{Communicator, stats};
use crate::kit::outputs;
use crate::rl::curriculum::Curriculum;

use super::phases::*;
use super::policy::*;

/// The ranks of a run of `world` with `samplers` sampler ranks, as
/// [`Communicator::split`] groups: the trainers first (rank 0, which logs
/// and writes, trains), then the samplers.
pub(super) fn groups(world: usize, samplers: usize) -> anyhow::Result<Vec<Vec<usize>>> {
    anyhow::ensure!(
        samplers < world,
        "ppo.sampler_ranks: {samplers} of the run's {world} GPU(s) sample, which leaves none to train\nhint: run on more GPUs (--num_gpus {}), or set sampler_ranks to 0 (every GPU samples, then trains)",
        samplers + 1
    );
    Ok(vec![
        (0..world - samplers).collect(),
        (world - samplers..world).collect(),
    ])
}

/// Where a run's draws stand when sampling starts or resumes.
#[derive(Serialize, Deserialize)]
struct Start {
    step: u64,
    total: u64,
    rl: RlState,
    curriculum: Curriculum,
}

/// One step's batch from one sampler rank.
#[derive(Serialize, Deserialize)]
struct Shipment {
    step: u64,
    got: Collected,
    /// The run's state after this batch's draws.
    rl: RlState,
    curriculum: Curriculum,
    stop_vote: f64,
}

/// Every rank's bytes through `world`; rank `from`'s.
fn gather_from(world: &dyn Communicator, mine: &[u8], from: usize) -> anyhow::Result<Vec<u8>> {
    Ok(stats::all_gather_bytes(world, mine)?.swap_remove(from))
}

/// Rank 0's values of the trainable variables on every rank of `world`.
fn share_weights(world: &dyn Communicator, policy: &Policy) -> anyhow::Result<()> {
    let vars = policy.trainable_vars();
    crate::dist::share_lead(world, &vars.iter().collect::<Vec<_>>())
}

/// The trainers' side of the start (every trainer calls it): where the
/// draws stand, the weights to make the first batch with (`first`, in
/// [`Policy::trainable_vars`]'s order: rank 0's), then rank 0's weights, to
/// the samplers. On a fresh start both are the starting weights; on a
/// resume the first are those the samplers had when the checkpoint was
/// saved, so the batch they were making is made again.
pub(super) fn start_samplers(
    world: &dyn Communicator,
    policy: &Policy,
    first: &[Tensor],
    (step, total): (u64, u64),
    rl: &RlState,
    curriculum: &Curriculum,
) -> anyhow::Result<()> {
    let start = Start {
        step,
        total,
        rl: rl.clone(),
        curriculum: curriculum.clone(),
    };
    let bytes = if world.rank() == 0 {
        serde_json::to_vec(&start)?
    } else {
        Vec::new()
    };
    gather_from(world, &bytes, 0)?;
    crate::dist::broadcast(world, first, 0)?;
    share_weights(world, policy)
}

/// The trainers' side of exchange 1: step `step`'s batch from every
/// sampler, this trainer's share of it (whole groups, so GRPO's group
/// statistics stay on one trainer) placed in the whole batch, and the
/// samplers' stop votes. The run's draw state and curriculum become the
/// samplers'. Counts that the ranks' totals add up stay on the first
/// trainer alone.
pub(super) fn receive(
    world: &dyn Communicator,
    train: &dyn Communicator,
    step: u64,
    rl: &mut RlState,
    curriculum: &mut Curriculum,
) -> anyhow::Result<(Collected, f64)> {
    let t0 = Instant::now();
    let all = stats::all_gather_bytes(world, &[])?;
    let mut ships = Vec::new();
    for bytes in &all[train.world()..] {
        let s: Shipment =
            serde_json::from_slice(bytes).context("a sampler's batch did not decode")?;
        anyhow::ensure!(
            s.step == step,
            "a sampler sent step {}'s batch for step {step}",
            s.step
        );
        ships.push(s);
    }
    let mut ships = ships.into_iter();
    let first = ships.next().context("no sampler rank sent a batch")?;
    let stop_votes = first.stop_vote;
    rl.adopt_draws(first.rl);
    *curriculum = first.curriculum;
    let mut got = first.got;
    let stop_votes = ships.fold(stop_votes, |votes, s| {
        got.zero_var += s.got.zero_var;
        got.dropped += s.got.dropped;
        got.new_tokens += s.got.new_tokens;
        got.stopped += s.got.stopped;
        for (why, n) in s.got.masked {
            *got.masked.entry(why).or_default() += n;
        }
        got.batch.extend(s.got.batch);
        votes + s.stop_vote
    });
    // The batch in the order one sampler would have made it: each sampler
    // holds its share of every sampling round, the groups numbered across
    // rounds and samplers. Then whole groups a trainer, in that order.
    got.batch.sort_by_key(|s| s.group);
    let mut starts = Vec::new();
    for (i, s) in got.batch.iter().enumerate() {
        if i == 0 || got.batch[i - 1].group != s.group {
            starts.push(i);
        }
    }
    starts.push(got.batch.len());
    let share = stats::groups_of_rank(starts.len() - 1, train.world(), train.rank());
    let mine = starts[share.start]..starts[share.end];
    got.layout = Layout {
        lens: got.batch.iter().map(Sample::trained_len).collect(),
        mine: mine.clone().collect(),
    };
    got.batch = got.batch.drain(mine).collect();
    if train.rank() != 0 {
        got.zero_var = 0;
        got.dropped = 0;
        got.new_tokens = 0;
        got.stopped = 0;
        got.masked.clear();
    }
    got.wait_secs = t0.elapsed().as_secs_f64();
    Ok((got, stop_votes))
}

/// The trainers' side of exchange 2: rank 0's new weights to the samplers,
/// and whether the run goes on (rank 0's word).
pub(super) fn send_weights(
    world: &dyn Communicator,
    policy: &Policy,
    goes_on: bool,
) -> anyhow::Result<()> {
    share_weights(world, policy)?;
    world.all_gather_f64(&[f64::from(u8::from(goes_on))])?;
    Ok(())
}

/// A sampler rank's whole run: the batches of steps `start..total`, each
/// sampled while the trainers train on the one before, from the weights
/// they started that step with.
pub(super) fn sample_ahead(
    job: &RlJob,
    world: &dyn Communicator,
    samplers: &dyn Communicator,
) -> anyhow::Result<RlSummary> {
    let cfg = &job.config;
    let mut policy = Policy::load(&job.base_dir, cfg, &job.model, &job.device)?;
    let stop = crate::stop::flag()?;
    let start: Start = serde_json::from_slice(&gather_from(world, &[], 0)?)
        .context("the trainers' start did not decode")?;
    // The first batch's weights, then the trainers' own.
    share_weights(world, &policy)?;
    let Start {
        mut step,
        total,
        mut rl,
        mut curriculum,
    } = start;
    let mut stream = task_stream(job, &rl, samplers);
    let mut sample = |policy: &mut Policy,
                      rl: &mut RlState,
                      curriculum: &mut Curriculum,
                      step: u64|
     -> anyhow::Result<Collected> {
        policy.cfg.temperature = cfg.temperature_schedule.at(step, cfg.temperature);
        let got = collect(job, samplers, policy, &mut stream, rl, curriculum, step)?;
        let rewards: Vec<f64> = got.scored.iter().map(|x| x.reward).collect();
        curriculum.record(&rewards, step + 1);
        Ok(got)
    };
    let mut next = if step < total {
        Some(sample(&mut policy, &mut rl, &mut curriculum, step)?)
    } else {
        None
    };
    share_weights(world, &policy)?;
    let mut finished = step >= total;
    while let Some(got) = next.take() {
        let ship = Shipment {
            step,
            got,
            rl: rl.clone(),
            curriculum: curriculum.clone(),
            stop_vote: f64::from(u8::from(stop.load(Ordering::Relaxed))),
        };
        stats::all_gather_bytes(world, &serde_json::to_vec(&ship)?)?;
        // The next batch, while the trainers train on this one.
        let ahead = if step + 1 < total {
            Some(sample(&mut policy, &mut rl, &mut curriculum, step + 1)?)
        } else {
            None
        };
        share_weights(world, &policy)?;
        let goes_on = world.all_gather_f64(&[0.0])?[0][0] > 0.5;
        step += 1;
        finished = step >= total;
        if goes_on {
            next = ahead;
        }
    }
    drop(stream);
    let (final_dir, merged_dir) = outputs::dirs(&job.output_dir);
    Ok(RlSummary {
        steps: step,
        resumed_from: None,
        first_reward: None,
        last_reward: None,
        curriculum_level: curriculum.level,
        masked: BTreeMap::new(),
        skipped_tasks: rl.skipped_tasks,
        bad_rows: rl.bad_rows,
        final_dir,
        merged_dir,
        interrupted: !finished,
        stop_requested: stop.load(Ordering::Relaxed),
        split_secs: None,
        episodes_apart: 0,
    })
}
