//! The phases of one Stage 3 step, which the loop ([`super::run_with`])
//! and the off-policy samplers ([`super::offpolicy`]) both call: the task
//! stream and its draws, sampling and scoring ([`collect`]), the update
//! ([`train`]), the batch's totals over ranks, the step's metrics, the
//! checkpoint and the outputs; the run's job, summary and saved state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::policy::{Layout, Policy, Sample, UpdateStats};
use crate::config::{CurriculumConfig, ModelConfig, RlConfig};
use crate::data::{Message, Role};
use crate::dist::{Communicator, stats};
use crate::kit::checkpoint::{self, TrainerState};
use crate::kit::{card, outputs};
use crate::model::decode::generate::Generation;
use crate::model::{self};
use crate::reward;
use crate::rng::keyed;

use crate::env::{self, Barren, Environment, Episode, Score, SharedTasks, Step, Task};
use crate::rl::advantage::informative;
use crate::rl::curriculum::Curriculum;
use crate::rl::loss::{KlEstimator, effective_sample_share, tis_weights};

/// Checkpoint folders: `step_<N>/`.
pub const STEP_PREFIX: &str = "step_";

/// The stage's name in errors and model cards.
pub const STAGE: &str = "stage3_ppo";

/// The truncated importance weights' cap of an off-policy run whose
/// `tis_cap` is 0.
pub const OFF_POLICY_TIS_CAP: f64 = 2.0;

/// Beside the trainable tensors in an off-policy run's checkpoint, under
/// this prefix: the weights its samplers were making the next batch with,
/// so a resume makes that batch again.
pub(super) const SAMPLER_PREFIX: &str = "sampler.";

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
    /// Rank 0's episodes of more than one action that trained an action a
    /// sequence.
    pub episodes_apart: u64,
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
    pub(super) fn adopt_draws(&mut self, drawn: RlState) {
        self.cursor = drawn.cursor;
        self.skipped_tasks = drawn.skipped_tasks;
        self.bad_rows = drawn.bad_rows;
        self.prompt_fit = drawn.prompt_fit;
    }
}

/// The run's task stream from `rl`'s cursor on, its making shared by
/// `comm`'s ranks (the rows `rl` knows bad are not run again).
pub(super) fn task_stream(job: &RlJob, rl: &RlState, comm: &dyn Communicator) -> SharedTasks {
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
pub(super) struct Drawn {
    pub(super) tasks: Vec<(Task, Vec<u32>, Option<usize>)>,
    pub(super) env_secs: f64,
}

pub(super) fn draw(
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
        let part = crate::env::part_name(stream.env(), id);
        let limit = policy.cfg.max_prompt_tokens;
        let (ids, len) = match crate::env::prompt_within(&policy.tok, &task.prompt, limit)? {
            crate::env::PromptLength::Fits(ids) => {
                let n = ids.len();
                (Some(ids), n)
            }
            crate::env::PromptLength::TooLong { tokens, .. } => (None, tokens),
        };
        let fits = crate::env::prompt_fits(&mut rl.prompt_fit, part, len, limit)?;
        let Some(ids) = ids.filter(|_| fits) else {
            let (env, why) = (stream.env(), "prompt_too_long".to_owned());
            barren.skip(env, id, why, &mut rl.bad_rows, &mut rl.skipped_tasks)?;
            continue;
        };
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
pub(super) fn fingerprinted(cfg: &RlConfig) -> anyhow::Result<serde_json::Value> {
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
            "max_steps_per_episode",
            "episode_sequences",
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

/// A step's sampling on this rank: its samples, where they sit in the whole
/// batch, every rank's scores, and this rank's counts.
#[derive(Default, Serialize, Deserialize)]
pub(super) struct Collected {
    pub(super) batch: Vec<Sample>,
    #[serde(skip)]
    pub(super) layout: Layout,
    /// Every rank's scored episodes, in batch order.
    pub(super) scored: Vec<Scored>,
    /// Feedback turns whose conversation tokens did not extend the earlier
    /// turn's prompt and answer (the chat template rewrote the past).
    pub(super) template_drift: usize,
    /// Episodes ended by `max_episode_tokens` before their last turn.
    pub(super) over_budget: usize,
    /// `episode_sequences`: episodes whose prompts did not chain, trained
    /// an action a sequence.
    #[serde(default)]
    pub(super) unchained: usize,
    /// Episodes of more than one action trained an action a sequence
    /// with `episode_sequences` off.
    #[serde(default)]
    pub(super) apart: usize,
    pub(super) masked: BTreeMap<String, u64>,
    pub(super) zero_var: usize,
    pub(super) dropped: u64,
    pub(super) new_tokens: usize,
    pub(super) stopped: usize,
    pub(super) groups_seen: usize,
    pub(super) rounds: usize,
    pub(super) env_secs: f64,
    pub(super) sample_secs: f64,
    /// Off-policy: how long the trainer waited for the batch.
    #[serde(default)]
    pub(super) wait_secs: f64,
}

/// One scored episode (a completion, with its retries when multi-turn).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct Scored {
    /// The episode's reward: its last answer's, discounted by turns.
    pub(super) reward: f64,
    pub(super) bucket: Option<usize>,
    /// The mixture's environment.
    pub(super) part: Option<usize>,
    /// The answer (1, 2, ...) that was right; `None` when none was.
    pub(super) solved_at: Option<usize>,
    /// Answers after the first.
    pub(super) retries: usize,
    /// Retries whose answer was the one before it (compared as scored).
    pub(super) unchanged: usize,
}

/// Values a [`Scored`] travels as between ranks.
pub(super) const SCORED: usize = 6;

/// One answer of an episode: the conversation it continued, what was
/// sampled and its score.
pub(super) struct Turn {
    pub(super) prompt: Vec<u32>,
    pub(super) sampled: Generation,
    pub(super) text: String,
    pub(super) score: Score,
    /// The environment's feedback on this answer, or the observation after
    /// it, once the episode went on.
    pub(super) reply: Option<String>,
    /// A multi-step environment's answer to this action (its score is
    /// `score`); `None` for a one-answer environment.
    pub(super) step: Option<Step>,
}

impl Turn {
    /// The sampled answer, not scored yet.
    fn sampled(policy: &Policy, prompt: Vec<u32>, sampled: Generation) -> anyhow::Result<Self> {
        let text = policy.tok.decode(&sampled.tokens, true)?;
        Ok(Self {
            prompt,
            sampled,
            text,
            score: Score::Masked("unscored".into()),
            reply: None,
            step: None,
        })
    }

    /// The sampled answer of a one-answer environment, scored.
    pub(super) fn scored(
        job: &RlJob,
        policy: &Policy,
        task: &Task,
        prompt: Vec<u32>,
        sampled: Generation,
    ) -> anyhow::Result<Self> {
        let mut t = Self::sampled(policy, prompt, sampled)?;
        t.score = if job.config.mask_truncated && !t.sampled.stopped {
            Score::Masked("truncated".into())
        } else {
            job.env.score(task, &t.text)
        };
        Ok(t)
    }
}

/// The episodes of a multi-step environment in progress, by episode
/// (`None` once one could not start).
type Running<'e> = Vec<Option<Box<dyn Episode + 'e>>>;

/// Each of `turns` (the new answers of episodes `who`) answered by its
/// episode's environment, in parallel: the step's score, observation and
/// whether it is done. A truncated answer ends its episode masked when
/// `mask_truncated`; an episode that could not start stays masked.
fn act(job: &RlJob, running: &mut Running<'_>, who: &[usize], turns: &mut [Turn]) {
    use rayon::prelude::*;
    let mask_truncated = job.config.mask_truncated;
    let mut slots: Vec<Option<&mut Option<Box<dyn Episode + '_>>>> =
        running.iter_mut().map(Some).collect();
    let mut work: Vec<(&mut Option<Box<dyn Episode + '_>>, &mut Turn)> = who
        .iter()
        .zip(turns.iter_mut())
        .map(|(&j, t)| (slots[j].take().expect("one new answer an episode"), t))
        .collect();
    work.par_iter_mut().for_each(|(ep, t)| {
        let step = match ep.as_mut() {
            _ if mask_truncated && !t.sampled.stopped => Step::masked("truncated"),
            Some(ep) => ep.act(&t.text),
            None => Step::masked("episode_not_started"),
        };
        if step.done {
            // Its session (a server's, a worker's) ends now.
            **ep = None;
        }
        t.score = step.score.clone();
        t.step = Some(step);
    });
}

/// Starts the episode of each first answer (`firsts[j]`, a completion of
/// `mine[j / group]`) and has it answered; an episode that cannot start is
/// masked with the environment's reason.
fn first_steps<'e>(
    job: &'e RlJob,
    mine: &[(Task, Vec<u32>, Option<usize>)],
    group: usize,
    firsts: &mut [Turn],
) -> Running<'e> {
    use rayon::prelude::*;
    let started: Vec<Result<Box<dyn Episode + 'e>, String>> = (0..firsts.len())
        .into_par_iter()
        .map(|j| env::begin(&*job.env, &mine[j / group].0))
        .collect();
    let mut why_not = Vec::new();
    let mut running: Running<'e> = started
        .into_iter()
        .enumerate()
        .map(|(j, s)| s.map_err(|why| why_not.push((j, why))).ok())
        .collect();
    let who: Vec<usize> = (0..firsts.len()).collect();
    act(job, &mut running, &who, firsts);
    for (j, why) in why_not {
        firsts[j].score = Score::Masked(why.clone());
        firsts[j].step = Some(Step::masked(why));
    }
    running
}

/// Where a turn's sampling stands: the step, its sampling round, the turn
/// (1 for the second answer), and this rank's first sampling stream.
pub(super) struct TurnAt {
    pub(super) step: u64,
    pub(super) round: usize,
    pub(super) turn: usize,
    pub(super) first: u64,
}

/// One more answer for every episode of `episodes` that goes on: a
/// one-answer environment's whose last answer was scored wrong (below 1),
/// after the environment's feedback; a multi-step environment's (with
/// `running`) whose last step is not done, after its observation. The
/// feedback or observation is a user turn after the last prompt and answer
/// ([`ChatTokenizer::next_turn`]); all are sampled together; `false` when
/// no episode continues. Episodes whose conversation would pass
/// `max_episode_tokens` end instead; an episode whose feedback cannot be
/// made (a sandbox failure) is masked.
#[allow(clippy::too_many_arguments)]
pub(super) fn more_turns(
    job: &RlJob,
    policy: &Policy,
    mine: &[(Task, Vec<u32>, Option<usize>)],
    group: usize,
    episodes: &mut [Vec<Turn>],
    running: Option<&mut Running<'_>>,
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
    let turns = match running {
        Some(_) => cfg.max_steps_per_episode,
        None => cfg.max_turns,
    };
    let budget = match cfg.max_episode_tokens {
        0 => cfg.max_prompt_tokens + turns * (cfg.max_new_tokens + 256),
        n => n,
    };
    let (mut who, mut prompts, mut replies) = (Vec::new(), Vec::new(), Vec::new());
    let mut unsaid = Vec::new();
    for (j, ep) in episodes.iter().enumerate() {
        let last = ep.last().expect("an episode has its first answer");
        let task = &mine[j / group].0;
        let reply = match &last.step {
            Some(s) => {
                if s.done || !matches!(s.score, Score::Reward(_)) {
                    continue;
                }
                s.observation.clone()
            }
            None => {
                if !matches!(last.score, Score::Reward(r) if r < 1.0) {
                    continue;
                }
                match job.env.feedback(task, &last.text, &cfg.feedback) {
                    Ok(reply) => reply,
                    Err(why) => {
                        unsaid.push((j, why));
                        continue;
                    }
                }
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
    let mut new = Vec::with_capacity(who.len());
    for ((&j, ids), g) in who.iter().zip(prompts).zip(gens) {
        new.push(match running {
            Some(_) => Turn::sampled(policy, ids, g)?,
            None => Turn::scored(job, policy, &mine[j / group].0, ids, g)?,
        });
    }
    if let Some(running) = running {
        act(job, running, &who, &mut new);
    }
    for ((j, reply), t) in who.into_iter().zip(replies).zip(new) {
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
pub(super) fn collect(
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
        // an answer a feedback turn while it is wrong, or (multi-step) an
        // action an observation until the environment says done.
        let stepped = job.env.multi_step();
        let mut episodes: Vec<Vec<Turn>> = Vec::with_capacity(gens.len());
        let mut running = None;
        if stepped {
            let mut firsts = Vec::with_capacity(gens.len());
            for (j, g) in gens.into_iter().enumerate() {
                firsts.push(Turn::sampled(policy, mine[j / group].1.clone(), g)?);
            }
            running = Some(first_steps(job, mine, group, &mut firsts));
            episodes.extend(firsts.into_iter().map(|t| vec![t]));
        } else {
            for (j, g) in gens.into_iter().enumerate() {
                let (task, ids, _) = &mine[j / group];
                episodes.push(vec![Turn::scored(job, policy, task, ids.clone(), g)?]);
            }
        }
        let turns = if stepped {
            cfg.max_steps_per_episode
        } else {
            cfg.max_turns
        };
        let mut retry_secs = 0.0;
        for turn in 1..turns {
            let t = Instant::now();
            let at = TurnAt {
                step,
                round: c.rounds,
                turn,
                first: (share.start * group) as u64,
            };
            if !more_turns(
                job,
                policy,
                mine,
                group,
                &mut episodes,
                running.as_mut(),
                at,
                &mut c,
            )? {
                break;
            }
            retry_secs += t.elapsed().as_secs_f64();
        }
        // Sessions still open (episodes cut by the step limit or the
        // token budget) end here.
        drop(running);
        let (mut kept_here, mut scored_here, mut members_here) = (0usize, Vec::new(), Vec::new());
        for (k, (task, _, bucket)) in mine.iter().enumerate() {
            let gid = c.groups_seen + share.start + k;
            let mut members = Vec::new();
            // Its episodes of several actions trained an action a sequence.
            let mut apart = 0;
            let mut rewards = Vec::new();
            for m in 0..group {
                let ep = &episodes[k * group + m];
                for t in ep {
                    c.new_tokens += t.sampled.tokens.len();
                    c.stopped += t.sampled.stopped as usize;
                }
                let last = ep.last().expect("an episode has its first answer");
                // A multi-step episode is masked when any step is; a
                // one-answer episode's outcome is its last answer's.
                let masked = match stepped {
                    true => ep.iter().find_map(|t| match &t.score {
                        Score::Masked(why) => Some(why),
                        Score::Reward(_) => None,
                    }),
                    false => match &last.score {
                        Score::Masked(why) => Some(why),
                        Score::Reward(_) => None,
                    },
                };
                if let Some(why) = masked {
                    // The episode's outcome is unknown: none of its
                    // answers trains.
                    *c.masked.entry(why.clone()).or_default() += 1;
                    continue;
                }
                let step_reward = |t: &Turn| match t.score {
                    Score::Reward(r) => r,
                    Score::Masked(_) => unreachable!("masked episodes are passed over"),
                };
                let answers = ep.len();
                // A multi-step episode's reward is its return (the sum of
                // its step rewards), a success when the environment says
                // so; a one-answer episode's its last answer's, discounted
                // by the answers before it, a success at 1.
                let (reward, solved) = if stepped {
                    let success = last.step.as_ref().is_some_and(|s| s.done && s.success);
                    (ep.iter().map(step_reward).sum::<f64>(), success)
                } else {
                    let r = step_reward(last);
                    (r * cfg.turn_discount.powi(answers as i32 - 1), r == 1.0)
                };
                let unchanged = ep
                    .windows(2)
                    .filter(|w| reward::same_answer(&w[0].text, &w[1].text))
                    .count();
                let part = job.env.part_of(task.task_id);
                scored_here.extend([
                    reward,
                    bucket.map_or(-1.0, |b| b as f64),
                    part.map_or(-1.0, |p| p as f64),
                    if solved { answers as f64 } else { -1.0 },
                    (answers - 1) as f64,
                    unchanged as f64,
                ]);
                rewards.push(reward);
                let episode = (cfg.max_turns > 1 || stepped).then_some(gid * group + m);
                let actions: Vec<Sample> = ep
                    .iter()
                    .map(|t| {
                        let mut smp = Sample::new(
                            gid,
                            t.prompt.clone(),
                            &t.sampled,
                            policy.stop_id(),
                            reward,
                        );
                        smp.bucket = *bucket;
                        smp.episode = episode;
                        smp.step_reward = stepped.then(|| step_reward(t));
                        smp
                    })
                    .collect();
                match stepped && cfg.episode_sequences {
                    // The whole episode as one sequence, its actions
                    // trained (or, where the prompts do not chain, an
                    // action a sequence).
                    true => match Sample::episode(actions) {
                        Ok(one) => members.push(one),
                        Err(actions) => {
                            c.unchained += 1;
                            members.extend(actions);
                        }
                    },
                    false => {
                        apart += usize::from(stepped && actions.len() > 1);
                        members.extend(actions);
                    }
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
                c.apart += apart;
            }
        }
        // The round over every rank: kept groups, scores, lengths.
        let mut mine_flat = vec![kept_here as f64, (scored_here.len() / SCORED) as f64];
        mine_flat.extend(&scored_here);
        mine_flat.extend(members_here.iter().map(|m| m.trained_len() as f64));
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
pub(super) struct Trained {
    pub(super) up: UpdateStats,
    /// k1 KL of the old policy to the reference, summed over tokens.
    pub(super) kl_sum: f64,
    pub(super) kl_n: usize,
    /// The sampler's log-probs against the trainer's, summed and largest.
    pub(super) mm_sum: f64,
    pub(super) mm_max: f64,
    pub(super) mm_n: usize,
    /// TIS weights' sum, sum of squares and the tokens at the cap (over
    /// `mm_n` tokens).
    pub(super) tis_sum: f64,
    pub(super) tis_sq: f64,
    pub(super) tis_capped: f64,
    /// Prompt and response tokens of this rank's samples.
    pub(super) seq_tokens: usize,
    pub(super) secs: f64,
}

/// Steps 3-4: old log-probs, values and reference, advantages, then the
/// update (nothing when no rank kept a sample).
pub(super) fn train(
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
            // The trained tokens only (an episode sequence's observations
            // are the environment's, and the sampler drew none of them).
            let trained = |i: &usize| smp.trains(*i);
            for (_, (&lp, &rp)) in (0..)
                .zip(smp.old_logp.iter().zip(&smp.ref_logp))
                .filter(|(i, _)| trained(i))
            {
                t.kl_sum += KlEstimator::K1.value(lp, rp);
                t.kl_n += 1;
            }
            t.seq_tokens += smp.prompt.len() + smp.response.len();
            // The sampler's log-probs against the trainer's forward on
            // the same tokens (kernels, batching and dtype differ).
            for (_, (&a, &b)) in (0..)
                .zip(smp.sampler_logp.iter().zip(&smp.old_logp))
                .filter(|(i, _)| trained(i))
            {
                let d = (a as f64 - b).abs();
                t.mm_sum += d;
                t.mm_max = t.mm_max.max(d);
                t.mm_n += 1;
            }
            let cap = policy.cfg.tis_cap;
            if cap > 0.0 && !smp.sampler_logp.is_empty() {
                let weights = tis_weights(&smp.old_logp, &smp.sampler_logp, cap)?;
                for (_, w) in (0..).zip(weights).filter(|(i, _)| trained(i)) {
                    t.tis_sum += w;
                    t.tis_sq += w * w;
                    t.tis_capped += f64::from(u8::from(w >= cap));
                }
            }
        }
        let lr = policy.cfg.optim.learning_rate;
        t.up = policy.update_with(&got.batch, &got.layout, step, lr, comm)?;
    }
    t.secs = t0.elapsed().as_secs_f64();
    Ok(t)
}

/// A step's counts over every rank, and the stop request they agree on.
pub(super) struct Totals {
    pub(super) zero_var: f64,
    pub(super) dropped: u64,
    pub(super) new_tokens: f64,
    pub(super) stopped: f64,
    pub(super) seq_tokens: f64,
    pub(super) kl_mean: f64,
    /// Mean and largest sampler/trainer log-prob gap.
    pub(super) mismatch: Option<(f64, f64)>,
    /// With TIS: the mean weight, the share of tokens at the cap and the
    /// weights' effective sample share.
    pub(super) tis: Option<(f64, f64, f64)>,
    pub(super) masked: BTreeMap<String, u64>,
    pub(super) stopping: bool,
}

impl Totals {
    pub(super) fn over_ranks(
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
pub(super) struct StepRecord<'a> {
    pub(super) got: &'a Collected,
    pub(super) trained: &'a Trained,
    pub(super) totals: &'a Totals,
    pub(super) secs: f64,
}

impl StepRecord<'_> {
    /// The step's scalars for the run log (`step` is the step's index).
    pub(super) fn scalars(
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
        if job.env.multi_step() {
            // Multi-step episodes: the mean return (`reward` too), steps
            // and the share the environment called a success (`accuracy`
            // too), and the mean reward a step.
            let steps: usize = got.scored.iter().map(|x| x.retries + 1).sum();
            let successes = got.scored.iter().filter(|x| x.solved_at.is_some()).count();
            put("episode_return", rewards.iter().sum::<f64>() / n_scored);
            put("episode_length", steps as f64 / n_scored);
            put("episode_success", successes as f64 / n_scored);
            put(
                "step_reward",
                rewards.iter().sum::<f64>() / steps.max(1) as f64,
            );
            put("episodes_over_budget", got.over_budget as f64);
            put("template_drift", got.template_drift as f64);
            if job.config.episode_sequences {
                put("episodes_unchained", got.unchained as f64);
            }
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
        put("lr", cfg.optim.learning_rate);
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
pub(super) fn save(
    job: &RlJob,
    state: &mut TrainerState,
    rl: &RlState,
    curriculum: &Curriculum,
    policy: &Policy,
    sampled_with: Option<&[Tensor]>,
    keep: usize,
) -> anyhow::Result<()> {
    let mut extra = rl.clone();
    extra.curriculum = Some(curriculum.clone());
    extra.optimizer_steps = policy.opt.step;
    extra.value_optimizer_steps = policy.value_opt.as_ref().map_or(0, |o| o.step);
    state.extra = serde_json::to_value(&extra)?;
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
        &card::base_names(None, &job.base_dir).0,
    )?;
    tracing::info!("saved `{}`", dir.display());
    Ok(())
}

/// The run's outputs: `final/` with the value head beside the adapter,
/// `merged/`, `train_config.json`.
pub(super) fn write_outputs(
    job: &RlJob,
    policy: &Policy,
    steps: u64,
    world: usize,
    final_dir: &Path,
    merged_dir: &Path,
) -> anyhow::Result<()> {
    let cfg = &job.config;
    let (base_model, origin) = card::base_names(None, &job.base_dir);
    let info = card::CardInfo {
        base_model,
        origin,
        base_commit: None,
        stage: STAGE.into(),
        train_file: job.env.name().to_string(),
        steps,
        lora: cfg.lora.clone(),
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
        crate::model::save_safetensors(&t, final_dir.join("value_head.safetensors"))?;
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
