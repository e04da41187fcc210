//! The LoRA SFT recipe, used by Stage 1 (`warmup`, original programs) and
//! Stage 2 (`sft`, transformed programs). One loop, read top to bottom:
//!
//! 1. lock the output folder, load tokenizer and model (LoRA on the targets;
//!    both through the kit, [`crate::kit`]), tokenize the training set (loss
//!    on the answer and its end-of-turn token);
//! 2. resume from the newest valid checkpoint when asked (refused, with the
//!    differences, if config, data or tokenizer changed, unless forced);
//! 3. for each optimizer step: `accum` micro-batches of `batch_size` rows
//!    (with `packing`, on by default on a GPU, the same records packed end
//!    to end into rows of at most `micro_batch_tokens` real tokens,
//!    attention inside each record, [`crate::data::batch::Packed`]; or,
//!    unpacked with `micro_batch_tokens`, regrouped by length into padded
//!    passes of at most that many positions), token-weighted mean
//!    cross-entropy, backward, gradients summed; a non-finite loss or gradient
//!    skips the step (counted; too many in a row stops the run); clip; AdamW
//!    at the cosine schedule's rate;
//! 4. metrics through `runlog` (JSONL and TensorBoard events), eval loss
//!    every `eval_steps`, a checkpoint every `save_steps` and on
//!    SIGTERM/SIGINT (then a clean exit);
//!    With `select` ([`crate::config::SelectConfig`]), every
//!    `select.every_steps` steps and after the last the adapter is scored
//!    (exact match on the select set by greedy decoding,
//!    [`crate::eval::exact`], or eval loss); the best so far is kept in
//!    `best/` and saved with each checkpoint's state ([`select`]);
//! 5. at the end, the adapter in PEFT's layout in `final/` and the merged
//!    model (with the tokenizer files) in `merged/`, each with a model card
//!    and `generation_config.json` (`kit::outputs`), and the curves in
//!    `curves/`. With `select` (metric not `last`) they hold the best
//!    step's weights, read back from `best/`.
//!
//! Everything that decides the numbers (data order, dropout masks, init) is
//! seeded, so a resumed run repeats the uninterrupted one exactly on CPU.
//!
//! Data parallel ([`run_with`] and a [`Communicator`] of several ranks):
//! every rank plans the same global batches and computes its share of each
//! step's micro-batches ([`crate::dist::shard`]); the loss of every share is
//! divided by the step's global answer-token count, so the gradients summed
//! over ranks are the one-rank gradients (up to the order of additions).
//! The guard, clipping and AdamW then run on every rank on the same summed
//! gradients, so the weights stay identical (checked at each checkpoint and
//! at the end). Rank 0 alone writes metrics, checkpoints and the outputs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::{Device, Tensor};
use serde::Serialize;

use crate::config::{ModelConfig, SftConfig};
use crate::data::batch::{Batch, Batcher, Packed};
use crate::data::example::{BuildStats, Example, build_examples};
use crate::data::records::read_records;
use crate::dist::{Communicator, Single, shard};
use crate::eval::EvalItem;
use crate::kit::{
    Guard, Run, card, clip_scale, fingerprint, load, next_micro_batches, outputs, planned_steps,
    summed_over_ranks,
};
use crate::model::LoadedModel;
use crate::model::layers::lora::set_dropout_seed;
use crate::model::layers::segments::Segments;
use crate::rng::keyed;
use crate::train::loss::lm_head_cross_entropy;
use crate::train::optim::AdamW;
use crate::train::schedule::Cosine;
use crate::train::select::{self, Metric, Pick, Selection};

pub use crate::progress::{NoProgress, Progress};

/// One SFT run.
pub struct SftJob {
    /// `warmup` or `sft`: names the run in messages.
    pub stage: String,
    pub config: SftConfig,
    pub model: ModelConfig,
    /// The base model folder (Stage 2: Stage 1's merged model).
    pub base_dir: PathBuf,
    /// How the base model was found (name, revision, commit), for the
    /// record and the model cards.
    pub base: crate::model::io::resolve::Resolved,
    pub train_file: PathBuf,
    pub eval_file: Option<PathBuf>,
    pub output_dir: PathBuf,
    pub device: Device,
    pub resume: bool,
    /// Resume even if config, data or tokenizer changed.
    pub force: bool,
    /// Stop after this many optimizer steps (tests, quick runs).
    pub max_steps: Option<u64>,
    /// Recompute each decoder layer in the backward pass instead of keeping
    /// its activations (same gradients, far less memory, about a third
    /// more compute).
    pub gradient_checkpointing: bool,
    /// With `config.select` scoring exact match: the items of
    /// `select.set` (made by the caller, as `eval` makes them), the first
    /// `select.limit`. Empty otherwise.
    pub select_items: Vec<EvalItem>,
}

/// The step `select` chose for `final/`.
#[derive(Debug, Clone, Serialize)]
pub struct Selected {
    /// `heldout_exact_match`, `eval_loss` or `last`.
    pub metric: String,
    /// The step whose weights are `final/`.
    pub step: u64,
    /// Its score when it was scored (exact match or eval loss).
    pub score: Option<f64>,
    /// The best scored step and its score (what `best/` holds).
    pub best: Option<Pick>,
}

/// What a finished run did.
#[derive(Debug, Clone, Serialize)]
pub struct SftSummary {
    pub steps: u64,
    pub resumed_from: Option<u64>,
    pub first_loss: Option<f64>,
    pub last_loss: Option<f64>,
    pub eval_loss: Option<f64>,
    pub skipped_steps: u64,
    pub examples: BuildStats,
    pub tokens_per_s: f64,
    pub final_dir: PathBuf,
    pub merged_dir: PathBuf,
    /// Stopped by a signal, after saving a checkpoint.
    pub interrupted: bool,
    /// A stop signal came, whether or not it cut the run (one during the
    /// last step does not: the run finishes and says so).
    pub stop_requested: bool,
    /// With `select`: the chosen step and its score.
    pub selected: Option<Selected>,
}

/// One run on one device.
pub fn run(job: &SftJob, progress: &dyn Progress) -> anyhow::Result<SftSummary> {
    run_with(job, &Single, progress)
}

/// One rank of a run over `comm`'s ranks (every rank calls it with the same
/// job, on its own device); with [`Single`], the usual one-device run.
pub fn run_with(
    job: &SftJob,
    comm: &dyn Communicator,
    progress: &dyn Progress,
) -> anyhow::Result<SftSummary> {
    let cfg = &job.config;
    let (rank, world) = (comm.rank(), comm.world());
    let run = Run::begin(&job.stage, &job.output_dir, comm)?;
    let lead = run.lead();

    // 1. Tokenizer, model, data.
    let lora = load::lora(&cfg.lora, cfg.lora_dropout, cfg.seed)?;
    let (tok, mut loaded) = load::trainee(
        &job.base_dir,
        load::Adapter::Fresh(&lora),
        &job.model,
        &job.device,
    )?;
    loaded
        .model
        .set_gradient_checkpointing(job.gradient_checkpointing);
    let records = read_records(&job.train_file)?;
    let (examples, stats) = build_examples(&tok, &records, job.model.max_length)?;
    if examples.is_empty() {
        bail!(
            "no training examples in `{}` ({} records, {} too long for max_length {})\nhint: raise model.max_length or check the file",
            job.train_file.display(),
            records.len(),
            stats.dropped_too_long,
            job.model.max_length
        );
    }
    if lead && stats.dropped_too_long > 0 {
        eprintln!(
            "{}",
            too_long_warning(&job.stage, &job.train_file, &stats, job.model.max_length)
        );
    }
    let eval_examples = match &job.eval_file {
        Some(p) if p.exists() => build_examples(&tok, &read_records(p)?, job.model.max_length)?.0,
        _ => Vec::new(),
    };
    let select_metric = match &cfg.select {
        Some(s) => Some(Metric::parse(&s.metric).with_context(|| {
            format!(
                "select.metric: `{}` is not one of {}",
                s.metric,
                crate::config::SELECT_METRICS.join(", ")
            )
        })?),
        None => None,
    };
    match select_metric {
        Some(Metric::EvalLoss) if eval_examples.is_empty() => bail!(
            "select.metric `eval_loss` needs eval examples, and `{}` gives none\nhint: pass --eval_file, or choose select.metric `heldout_exact_match`",
            job.eval_file
                .as_ref()
                .map_or("(no eval file)".into(), |p| p.display().to_string())
        ),
        Some(m) if !m.scores_loss() && job.select_items.is_empty() && lead => bail!(
            "select.set `{}` gives no items to score\nhint: name a set with records, or leave out `select`",
            cfg.select.as_ref().map_or("", |s| s.set.as_str())
        ),
        _ => {}
    }
    let pad = tok.pad().id;
    // On a GPU, a few row lengths (shape-stable steps: cuDNN graphs and
    // kernels reused); on the CPU, the longest example's (nothing to
    // reuse). `TRACE_TRAIN_LENGTH_BUCKETS=off` turns them off (to measure).
    let buckets =
        !job.device.is_cpu() && std::env::var("TRACE_TRAIN_LENGTH_BUCKETS").as_deref() != Ok("off");
    let batcher =
        Batcher::new(&examples, cfg.batch_size, cfg.seed, pad)?.with_length_buckets(buckets);
    let per_epoch = batcher.batches_per_epoch();
    let accum = cfg.gradient_accumulation_steps;
    let pass_budget = cfg.micro_batch_tokens.filter(|&n| n > 0);
    let packing = cfg.packing.unwrap_or(!job.device.is_cpu());
    let pack_budget = pass_budget
        .unwrap_or((cfg.batch_size * job.model.max_length).min(crate::config::PACK_TOKENS));
    let total_steps = planned_steps(per_epoch, accum, cfg.epochs, job.max_steps);
    let schedule = Cosine::new(
        cfg.optim.learning_rate,
        total_steps as usize,
        cfg.schedule.warmup_ratio,
        cfg.schedule.min_lr_ratio,
    );

    // 2. Fresh start or resume.
    let fingerprint = fingerprint::of(
        serde_json::to_value(cfg)?,
        fingerprint::base_label(
            &job.base_dir,
            load::held(job.model.base_precision, &job.device),
        ),
        &job.base_dir,
        fingerprint::sha256_of(&[&job.train_file])?,
    )?;
    let vars = loaded.named_trainable_vars();
    let mut opt = AdamW::new(vars.clone(), cfg.optim.weight_decay)?;
    let (mut state, resumed_from, mut log) =
        run.start_optimizer(job.resume, job.force, &fingerprint, &job.device, &mut opt)?;
    let keep = cfg.save.keep();
    let mut selection = Selection::from_extra(&state.extra)?;
    let best_dir = job.output_dir.join(select::BEST_DIR);
    if lead && select_metric.is_some() {
        select::remove_interrupted(&job.output_dir)?;
        if resumed_from.is_none() && best_dir.exists() {
            // A fresh run: an earlier run's best weights are not this one's.
            std::fs::remove_dir_all(&best_dir)
                .with_context(|| format!("cannot remove `{}`", best_dir.display()))?;
        }
    }
    // A hub model is named by its id, as PEFT records it; a folder by its
    // absolute path.
    let (base_name, origin) = card::base_names(job.base.repo.as_deref(), &job.base_dir);

    // 3-4. The loop.
    if lead {
        progress.start(Some(total_steps), state.step);
    }
    let (mut first_loss, mut last_loss, mut eval_loss) = (None, None, None);
    // The loss is the token cross-entropy over the head's vocabulary.
    let vocab = loaded.model.lm_head().weight()?.dim(0)?;
    let mut guard = Guard::new(
        lead.then_some(job.output_dir.as_path()),
        crate::kit::checkpoint::SFT_PREFIX,
    )
    .with_vocab(vocab);
    let mut interrupted = false;
    let started = Instant::now();
    let tokens_at_start = state.tokens_seen;
    let mut plan = batcher.plan(state.epoch as u64);
    while state.step < total_steps {
        // Each step's peak device memory (weights included) is logged.
        crate::gpu::reset_peak_memory(&job.device)?;
        let graphs_before = crate::model::attention_graph_builds();
        let t0 = Instant::now();
        // This step's micro-batches (example indices), from the saved data
        // position; every rank plans all of them and computes its share.
        let micro = next_micro_batches(&mut state, accum, &mut plan, |e| batcher.plan(e));
        let micro = match pass_budget {
            _ if packing => batcher.pack_passes(&micro, pack_budget),
            Some(budget) => batcher.regroup(&micro, budget),
            None => micro,
        };
        let answer_tokens: usize = micro
            .iter()
            .flatten()
            .map(|&i| examples[i].answer_len())
            .sum();
        let step_tokens: usize = micro.iter().flatten().map(|&i| examples[i].len()).sum();
        // Positions the step computes, padding included.
        let positions: usize = micro
            .iter()
            .map(|m| match packing {
                true => batcher.packed_len(m),
                false => m.len() * batcher.row_len(m),
            })
            .sum();
        let mut grads: Option<Vec<Tensor>> = None;
        // The passes' losses, read back once the step's work is queued (a
        // read in between would leave the GPU idle while the next pass's
        // kernels are launched).
        let mut pass_losses: Vec<Tensor> = Vec::new();
        for part in shard::split_step(&micro, world, rank) {
            // A whole micro-batch draws the masks a one-rank run draws; a
            // row slice its own.
            let key = match part.slice {
                None => part.micro as u64,
                Some(s) => ((part.micro * world + s) as u64) | (1 << 32),
            };
            set_dropout_seed(keyed(cfg.seed, state.step, key));
            let (hidden, labels) = if packing {
                let p = batcher.pack(&part.rows);
                let (ids, positions, segments, labels) = packed_tensors(&p, &job.device)?;
                let hidden = loaded
                    .model
                    .forward_hidden_packed(&ids, &positions, &segments, true)?;
                (hidden, labels)
            } else {
                let b = batcher.batch(&part.rows);
                let (ids, mask, labels) = tensors(&b, &job.device)?;
                (
                    loaded.model.forward_hidden(&ids, Some(&mask), true)?,
                    labels,
                )
            };
            crate::gpu::memory_mark(&job.device, "forward")?;
            let head = &loaded.model.lm_head().weight()?;
            let (sum, _) = lm_head_cross_entropy(&hidden, head, &labels)?;
            let loss = (sum / answer_tokens.max(1) as f64)?;
            pass_losses.push(loss.detach());
            crate::gpu::memory_mark(&job.device, "loss")?;
            let g = loaded.model.backward(&loss)?;
            let step_grads = opt.gradients(&g)?;
            crate::train::optim::accumulate(&mut grads, step_grads)?;
            crate::gpu::memory_mark(&job.device, "backward end")?;
        }
        state.tokens_seen += step_tokens as u64;
        let grads = summed_over_ranks(comm, grads, &opt)?;
        // The loss and the stop request, agreed by all ranks (a signal seen
        // by one rank stops all of them at the same step).
        let mut loss_sum = 0f64;
        for l in &pass_losses {
            loss_sum += l.to_scalar::<f32>()? as f64;
        }
        let agreed = comm.sum_f64(&[loss_sum, run.stop_vote()])?;
        let loss_sum = agreed[0];
        let stopping = agreed[1] > 0.0;
        let norm = AdamW::grad_norm(&grads)?;
        let lr = schedule.lr(state.step as usize);
        if guard.admits(&job.stage, &mut state, loss_sum, norm)? {
            opt.step(&grads, lr, clip_scale(norm, cfg.optim.max_grad_norm))?;
        }
        crate::gpu::memory_mark(&job.device, "optimizer")?;
        state.step += 1;
        let secs = t0.elapsed().as_secs_f64();
        first_loss.get_or_insert(loss_sum);
        last_loss = Some(loss_sum);
        let mut scalars = vec![
            ("epoch", state.epoch as f64),
            ("loss", loss_sum),
            ("lr", lr),
            ("grad_norm", norm),
            ("answer_tokens", answer_tokens as f64),
            ("passes", micro.len() as f64),
            ("tokens_per_s", step_tokens as f64 / secs.max(1e-9)),
            (
                "padding",
                1.0 - step_tokens as f64 / positions.max(1) as f64,
            ),
            ("time_step_s", secs),
            ("skipped_steps", state.skipped_steps as f64),
        ];
        if !job.device.is_cpu() {
            // New shapes' attention graphs: built once each, seconds apiece.
            let graphs = crate::model::attention_graph_builds();
            scalars.push(("graph_builds", (graphs.0 - graphs_before.0) as f64));
            scalars.push(("time_graph_build_s", graphs.1 - graphs_before.1));
        }
        let select_due = match (select_metric, &cfg.select) {
            (Some(metric), Some(sc)) if select::due(state.step, total_steps, sc.every_steps) => {
                Some((metric, sc))
            }
            _ => None,
        };
        // The eval loss once a step, whether the schedule or the selection
        // (or both) asks for it.
        let eval_due = cfg.eval_steps > 0
            && state.step.is_multiple_of(cfg.eval_steps as u64)
            && !eval_examples.is_empty();
        let step_eval_loss = if eval_due || select_due.is_some_and(|(m, _)| m.scores_loss()) {
            Some(evaluate_loss(
                &loaded,
                &eval_examples,
                cfg.batch_size,
                pad,
                &job.device,
                comm,
            )?)
        } else {
            None
        };
        if eval_due && let Some(e) = step_eval_loss {
            scalars.push(("eval_loss", e));
            eval_loss = Some(e);
        }
        if let Some((metric, sc)) = select_due {
            // Scored before this step's checkpoint, which saves the choice.
            let score = if let Some(e) = step_eval_loss.filter(|_| metric.scores_loss()) {
                scalars.push(("select/eval_loss", e));
                Some(e)
            } else if lead {
                let r = crate::eval::exact::exact_match(
                    &loaded.model,
                    &tok,
                    &job.select_items,
                    sc.batch_size,
                    sc.max_new_tokens,
                    &job.device,
                )?;
                scalars.push(("select/exact_match", r.accuracy));
                scalars.push(("select/exact_match_lo", r.interval.lo));
                scalars.push(("select/exact_match_hi", r.interval.hi));
                Some(r.accuracy)
            } else {
                // Rank 0 alone scores exact match and keeps `best/`.
                None
            };
            if let Some(score) = score
                && selection.offer(metric, state.step, score)
                && lead
            {
                select::write_best(
                    &job.output_dir,
                    &loaded,
                    opt.vars(),
                    &base_name,
                    &sc.metric,
                    Pick {
                        step: state.step,
                        score,
                    },
                )?;
            }
            selection.into_extra(&mut state.extra)?;
        }
        run.log_step(&mut log, state.step, scalars, &job.device)?;
        if lead {
            progress.set(state.step);
            progress.status(&format!(
                "loss {loss_sum:.4} {:.0} tok/s",
                step_tokens as f64 / secs.max(1e-9)
            ));
        }

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
    if lead {
        progress.finish();
    }

    // 5. Outputs of the stage.
    let (final_dir, merged_dir) = outputs::dirs(&job.output_dir);
    let mut selected = None;
    if !interrupted {
        guard.finish(&job.stage)?;
    }
    if run.finish_optimizer(&state, keep, interrupted, &opt)? {
        if let (Some(metric), Some(sc)) = (select_metric, &cfg.select) {
            let step = selection.chosen(metric, state.step);
            if step != state.step {
                // The last weights are in the last checkpoint; the chosen
                // ones become the outputs.
                select::restore_best(&job.output_dir, step, opt.vars())?;
            }
            let score = selection.best.filter(|b| b.step == step).map(|b| b.score);
            selected = Some(Selected {
                metric: sc.metric.clone(),
                step,
                score,
                best: selection.best,
            });
            if lead {
                eprintln!(
                    "{}: select: final/ holds step {step}{} (metric {})",
                    job.stage,
                    score.map_or_else(String::new, |v| format!(", {} {v:.4}", metric.scored())),
                    sc.metric
                );
            }
        }
        let info = card::CardInfo {
            base_model: base_name,
            origin,
            base_commit: job.base.commit.clone(),
            stage: match job.stage.as_str() {
                "warmup" => "stage1_warmup".into(),
                "sft" => "stage2_sft".into(),
                other => other.into(),
            },
            train_file: job.train_file.display().to_string(),
            steps: selected.as_ref().map_or(state.step, |s| s.step),
            lora: cfg.lora.clone(),
        };
        outputs::write_adapter_and_merged(
            &loaded,
            &tok,
            &job.base_dir,
            &info,
            &final_dir,
            &merged_dir,
        )?;
        outputs::write_train_config(
            &job.output_dir,
            &serde_json::json!({
                "stage": job.stage, "config": cfg, "model": job.model,
                "base_dir": job.base_dir, "base_model": job.base,
                "train_file": job.train_file,
                "selected": selected,
            }),
        )?;
    }
    // Rank 0 wrote the metrics, so it alone draws them.
    drop(log);
    run.draw_curves();
    let secs = started.elapsed().as_secs_f64();
    Ok(SftSummary {
        steps: state.step,
        resumed_from,
        first_loss,
        last_loss,
        eval_loss,
        skipped_steps: state.skipped_steps,
        examples: stats,
        tokens_per_s: (state.tokens_seen - tokens_at_start) as f64 / secs.max(1e-9),
        final_dir,
        merged_dir,
        interrupted,
        stop_requested: run.stop_requested(),
        selected,
    })
}

/// Input ids, attention mask and labels of a batch, as (B, L) tensors.
fn tensors(b: &Batch, dev: &Device) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let shape = (b.batch, b.seq_len);
    Ok((
        Tensor::from_slice(&b.input_ids, shape, dev)?,
        Tensor::from_slice(&b.attention_mask, shape, dev)?,
        Tensor::from_slice(&b.labels, shape, dev)?,
    ))
}

/// A packed row's ids, positions and labels, `(1, T)` tensors, and its
/// attention layout.
fn packed_tensors(
    p: &Packed,
    dev: &Device,
) -> candle_core::Result<(Tensor, Tensor, Segments, Tensor)> {
    let shape = (1, p.len);
    Ok((
        Tensor::from_slice(&p.input_ids, shape, dev)?,
        Tensor::from_slice(&p.positions, shape, dev)?,
        Segments::new(&p.gather, &p.scatter, p.seq_len, &p.lens, dev)?,
        Tensor::from_slice(&p.labels, shape, dev)?,
    ))
}

/// Mean cross-entropy over the eval set's answer tokens (no gradients);
/// rank r evaluates batches r, r + world, ... and the sums are combined.
fn evaluate_loss(
    m: &LoadedModel,
    examples: &[Example],
    batch_size: usize,
    pad: u32,
    dev: &Device,
    comm: &dyn Communicator,
) -> anyhow::Result<f64> {
    let batcher = Batcher::new(examples, batch_size, 0, pad)?;
    let (mut sum, mut n) = (0f64, 0usize);
    let (rank, world) = (comm.rank(), comm.world());
    for (j, ids) in batcher.plan(0).into_iter().enumerate() {
        if j % world != rank {
            continue;
        }
        let b = batcher.batch(&ids);
        let (ids, mask, labels) = tensors(&b, dev)?;
        let hidden = m.model.forward_hidden(&ids, Some(&mask), false)?;
        let (s, c) = lm_head_cross_entropy(&hidden, &m.model.lm_head().weight()?, &labels)?;
        sum += s.to_scalar::<f32>()? as f64;
        n += c;
    }
    let total = comm.sum_f64(&[sum, n as f64])?;
    Ok(total[0] / total[1].max(1.0))
}

/// What a stage says before training when records are left out for their
/// length: how many, the longest, and the setting to raise.
fn too_long_warning(
    stage: &str,
    file: &std::path::Path,
    stats: &crate::data::example::BuildStats,
    max_length: usize,
) -> String {
    let longest = match (stats.longest_dropped, stats.dropped_unread) {
        (0, n) => format!("{n} of them too long to tokenise"),
        (l, 0) => format!("the longest has {l} tokens"),
        (l, n) => format!("the longest tokenised has {l} tokens; {n} were too long to tokenise"),
    };
    format!(
        "{stage}: warning: {} of {} records in `{}` are longer than max_length {max_length} and are left out ({longest})\nhint: raise --max_length (model.max_length) to train on them",
        stats.dropped_too_long,
        stats.records,
        file.display(),
    )
}
