//! The LoRA SFT recipe, used by Stage 1 (`warmup`, original programs) and
//! Stage 2 (`sft`, transformed programs). One loop, read top to bottom:
//!
//! 1. lock the output folder, load tokenizer and model (LoRA on the targets),
//!    tokenize the training set (loss on the answer and its end-of-turn token);
//! 2. resume from the newest valid checkpoint when asked (refused, with the
//!    differences, if config, data or tokenizer changed, unless forced);
//! 3. for each optimizer step: `accum` micro-batches, token-weighted mean
//!    cross-entropy, backward, gradients summed; a non-finite loss or gradient
//!    skips the step (counted; too many in a row stops the run); clip; AdamW
//!    at the cosine schedule's rate;
//! 4. metrics through `runlog` (JSONL and TensorBoard events), eval loss
//!    every `eval_steps`, a checkpoint every `save_steps` and on
//!    SIGTERM/SIGINT (then a clean exit);
//! 5. at the end, the adapter in PEFT's layout in `final/` and the merged
//!    model (with the tokenizer files) in `merged/`, each with a model card
//!    and `generation_config.json` (`train::card`), and the curves in
//!    `curves/`.
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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::{DType, Device, Tensor};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::config::{ModelConfig, SftConfig};
use crate::data::batch::{Batch, Batcher};
use crate::data::example::{BuildStats, Example, build_examples};
use crate::data::records::read_records;
use crate::data::tokenizer::ChatTokenizer;
use crate::dist::{self, Communicator, Single, shard};
use crate::model::lora::{LoraConfig, TargetModule, set_dropout_seed};
use crate::model::{self, LoadedModel};
use crate::runlog::{self, RunLog};
use crate::train::card;
use crate::train::checkpoint::{self, Fingerprint, RunLock, TrainerState};
use crate::train::loss::lm_head_cross_entropy;
use crate::train::optim::AdamW;
use crate::train::schedule::Cosine;

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
    pub base: crate::model::resolve::Resolved,
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
}

/// Consecutive non-finite steps tolerated before the run stops.
const MAX_BAD_STEPS: u64 = 10;

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
    let lead = rank == 0;
    let _lock = if lead {
        Some(RunLock::acquire(&job.output_dir)?)
    } else {
        None
    };
    let stop = crate::stop::flag()?;

    // 1. Tokenizer, model, data.
    let tok = ChatTokenizer::from_dir(&job.base_dir)?;
    let dtype = train_dtype(&job.model.dtype, &job.device);
    let lora = LoraConfig {
        r: cfg.lora_r,
        alpha: cfg.lora_alpha,
        dropout: cfg.lora_dropout as f32,
        target_modules: target_modules(&cfg.target_modules)?,
        seed: cfg.seed,
    };
    let mut loaded = model::load(&job.base_dir, Some(&lora), dtype, &job.device)?;
    loaded
        .model
        .set_gradient_checkpointing(job.gradient_checkpointing);
    // QLoRA: 4-bit frozen projections on a GPU (a CPU run keeps its dtype).
    let four_bit = job.model.load_in_4bit && !job.device.is_cpu();
    if four_bit {
        loaded.model.quantize_base()?;
    }
    tok.check_against_vocab(loaded.model.vocab_size())?;
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
    let eval_examples = match &job.eval_file {
        Some(p) if p.exists() => build_examples(&tok, &read_records(p)?, job.model.max_length)?.0,
        _ => Vec::new(),
    };
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
    let steps_per_epoch = per_epoch.div_ceil(accum) as u64;
    let mut total_steps = steps_per_epoch * cfg.epochs as u64;
    if let Some(m) = job.max_steps {
        total_steps = total_steps.min(m);
    }
    let schedule = Cosine::new(
        cfg.learning_rate,
        total_steps as usize,
        cfg.warmup_ratio,
        cfg.min_lr_ratio,
    );

    // 2. Fresh start or resume.
    let fingerprint = Fingerprint {
        config: serde_json::to_value(cfg)?,
        base_model: format!(
            "{}{}",
            job.base_dir.display(),
            if four_bit { " (NF4)" } else { "" }
        ),
        base_weights: weights_fingerprint(&job.base_dir)?,
        train_data_sha256: sha256_of(&[&job.train_file])?,
        tokenizer_sha256: sha256_of(&[
            &job.base_dir.join("tokenizer.json"),
            &job.base_dir.join("tokenizer_config.json"),
        ])?,
    };
    let vars = loaded.named_trainable_vars();
    let mut opt = AdamW::new(vars.clone(), cfg.weight_decay)?;
    let mut state = TrainerState {
        step: 0,
        epoch: 0,
        batch: 0,
        tokens_seen: 0,
        skipped_steps: 0,
        fingerprint: fingerprint.clone(),
        extra: serde_json::Value::Null,
    };
    let mut resumed_from = None;
    // Rank 0 looks first (it removes interrupted saves), the others after.
    let latest = if lead {
        let l = checkpoint::latest(&job.output_dir, &job.device)?;
        comm.barrier()?;
        l
    } else {
        comm.barrier()?;
        checkpoint::latest(&job.output_dir, &job.device)?
    };
    match (job.resume, latest) {
        (true, Some(ck)) => {
            let diff = fingerprint.differences(&ck.state.fingerprint);
            if !diff.is_empty() && !job.force {
                bail!(
                    "cannot resume {} from `{}`: the run changed:\n  - {}\nhint: restore the original settings, or pass --force to resume anyway",
                    job.stage,
                    ck.dir.display(),
                    diff.join("\n  - ")
                );
            }
            for (name, var) in &vars {
                let t = ck
                    .params
                    .get(name)
                    .with_context(|| format!("checkpoint `{}` lacks `{name}`", ck.dir.display()))?;
                var.set(&t.to_dtype(var.dtype())?)?;
            }
            opt.load_state(&ck.optim, ck.state.step)?;
            resumed_from = Some(ck.state.step);
            state = TrainerState {
                fingerprint: fingerprint.clone(),
                ..ck.state
            };
            tracing::info!("resuming {} at step {}", job.stage, state.step);
        }
        (false, Some(ck)) => bail!(
            "`{}` holds checkpoints of an earlier run (latest `{}`)\nhint: pass --resume to continue it, or choose another output folder",
            job.output_dir.display(),
            ck.dir.display()
        ),
        (_, None) => {}
    }
    // Every rank starts from rank 0's weights (they are equal already when
    // initialisation and checkpoint agree; this makes it certain).
    if world > 1 {
        let ts: Vec<Tensor> = vars.iter().map(|(_, v)| v.as_tensor().clone()).collect();
        for ((_, v), t) in vars.iter().zip(dist::broadcast(comm, &ts, 0)?) {
            v.set(&t)?;
        }
    }
    // Rank 0 alone logs; it keeps the steps up to the checkpoint (all of
    // them on a fresh start: none).
    let mut log = if lead {
        Some(RunLog::open(&job.output_dir, resumed_from)?)
    } else {
        None
    };

    // 3-4. The loop.
    if lead {
        progress.start(Some(total_steps), state.step);
    }
    let (mut first_loss, mut last_loss, mut eval_loss) = (None, None, None);
    let mut bad_in_a_row = 0u64;
    let mut interrupted = false;
    let mut stop_seen = false;
    let started = Instant::now();
    let tokens_at_start = state.tokens_seen;
    let mut plan = batcher.plan(state.epoch as u64);
    while state.step < total_steps {
        // Each step's peak device memory (weights included) is logged.
        crate::gpu::reset_peak_memory(&job.device)?;
        let t0 = Instant::now();
        // This step's micro-batches (example indices), from the saved data
        // position; every rank plans all of them and computes its share.
        let mut micro: Vec<Vec<usize>> = Vec::with_capacity(accum);
        while micro.len() < accum {
            if state.batch >= per_epoch {
                if !micro.is_empty() {
                    break; // the epoch's last, shorter step
                }
                state.epoch += 1;
                state.batch = 0;
                plan = batcher.plan(state.epoch as u64);
            }
            micro.push(plan[state.batch].clone());
            state.batch += 1;
        }
        let answer_tokens: usize = micro
            .iter()
            .flatten()
            .map(|&i| examples[i].answer_len())
            .sum();
        let step_tokens: usize = micro.iter().flatten().map(|&i| examples[i].len()).sum();
        let mut grads: Option<Vec<Tensor>> = None;
        let mut loss_sum = 0f64;
        for part in shard::split_step(&micro, world, rank) {
            // A whole micro-batch draws the masks a one-rank run draws; a
            // row slice its own.
            let key = match part.slice {
                None => part.micro as u64,
                Some(s) => ((part.micro * world + s) as u64) | (1 << 32),
            };
            set_dropout_seed(mix(cfg.seed, state.step, key));
            let b = batcher.batch(&part.rows);
            let (ids, mask, labels) = tensors(&b, &job.device)?;
            let hidden = loaded.model.forward_hidden(&ids, Some(&mask), true)?;
            let head = &loaded.model.lm_head().weight()?;
            let (sum, _) = lm_head_cross_entropy(&hidden, head, &labels)?;
            let loss = (sum / answer_tokens.max(1) as f64)?;
            loss_sum += loss.to_scalar::<f32>()? as f64;
            let g = loaded.model.backward(&loss)?;
            let step_grads = opt.gradients(&g)?;
            crate::train::optim::accumulate(&mut grads, step_grads)?;
        }
        state.tokens_seen += step_tokens as u64;
        // A rank with no share this step (an epoch's short last step on
        // many ranks) adds zeros.
        let grads = match grads {
            Some(g) => g,
            None => vars
                .iter()
                .map(|(_, v)| v.as_tensor().zeros_like())
                .collect::<candle_core::Result<_>>()?,
        };
        let grads = dist::all_reduce_sum(comm, &grads)?;
        // The loss and the stop request, agreed by all ranks (a signal seen
        // by one rank stops all of them at the same step).
        let agreed =
            comm.sum_f64(&[loss_sum, f64::from(u8::from(stop.load(Ordering::Relaxed)))])?;
        let loss_sum = agreed[0];
        let stopping = agreed[1] > 0.0;
        let norm = AdamW::grad_norm(&grads)?;
        let lr = schedule.lr(state.step as usize);
        if !loss_sum.is_finite() || !norm.is_finite() {
            state.skipped_steps += 1;
            bad_in_a_row += 1;
            tracing::warn!(
                "step {}: non-finite loss or gradient, skipped",
                state.step + 1
            );
            if bad_in_a_row >= MAX_BAD_STEPS {
                bail!(
                    "{} stopped: {bad_in_a_row} steps in a row had a non-finite loss or gradient (last checkpoint is intact)\nhint: lower the learning rate",
                    job.stage
                );
            }
        } else {
            bad_in_a_row = 0;
            let scale = if norm > cfg.max_grad_norm {
                cfg.max_grad_norm / norm
            } else {
                1.0
            };
            opt.step(&grads, lr, scale)?;
        }
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
            ("tokens_per_s", step_tokens as f64 / secs.max(1e-9)),
            ("time_step_s", secs),
            ("skipped_steps", state.skipped_steps as f64),
        ];
        if let Some(gib) = crate::gpu::peak_memory_gib(&job.device)? {
            scalars.push(("peak_mem_gib", gib));
        }
        if cfg.eval_steps > 0
            && state.step.is_multiple_of(cfg.eval_steps as u64)
            && !eval_examples.is_empty()
        {
            let e = evaluate_loss(
                &loaded,
                &eval_examples,
                cfg.batch_size,
                pad,
                &job.device,
                comm,
            )?;
            scalars.push(("eval_loss", e));
            eval_loss = Some(e);
        }
        if let Some(log) = log.as_mut() {
            scalars.push(("world_size", world as f64));
            log.log(state.step, &scalars)?;
            progress.set(state.step);
            progress.status(&format!(
                "loss {loss_sum:.4} {:.0} tok/s",
                step_tokens as f64 / secs.max(1e-9)
            ));
        }

        let periodic = cfg.save_steps > 0 && state.step.is_multiple_of(cfg.save_steps as u64);
        if (periodic || stopping) && state.step < total_steps {
            dist::check_in_sync(comm, &var_tensors(&vars))?;
            if lead {
                save_checkpoint(&job.output_dir, &state, &opt, cfg.save_total_limit)?;
            }
        }
        // A stop during the last step comes too late to cut anything: the
        // run is whole, and ends as one (final save and outputs).
        stop_seen |= stopping;
        if stopping && state.step < total_steps {
            interrupted = true;
            break;
        }
    }
    if lead {
        progress.finish();
    }

    // 5. Outputs of the stage.
    let final_dir = job.output_dir.join("final");
    let merged_dir = job.output_dir.join("merged");
    dist::check_in_sync(comm, &var_tensors(&vars))?;
    if !interrupted && lead {
        save_checkpoint(&job.output_dir, &state, &opt, cfg.save_total_limit)?;
        // A hub model is named by its id, as PEFT records it; a folder by its path.
        let base_name = job
            .base
            .repo
            .clone()
            .unwrap_or_else(|| job.base_dir.display().to_string());
        let info = card::CardInfo {
            base_model: base_name,
            base_commit: job.base.commit.clone(),
            stage: match job.stage.as_str() {
                "warmup" => "stage1_warmup".into(),
                "sft" => "stage2_sft".into(),
                other => other.into(),
            },
            train_file: job.train_file.display().to_string(),
            steps: state.step,
            lora_r: cfg.lora_r,
            lora_alpha: cfg.lora_alpha,
            target_modules: cfg.target_modules.clone(),
        };
        write_adapter_and_merged(&loaded, &tok, &job.base_dir, &info, &final_dir, &merged_dir)?;
        crate::atomic::write(
            &job.output_dir.join("train_config.json"),
            serde_json::to_string_pretty(&serde_json::json!({
                "stage": job.stage, "config": cfg, "model": job.model,
                "base_dir": job.base_dir, "base_model": job.base,
                "train_file": job.train_file,
            }))?
            .as_bytes(),
        )?;
    }
    // The trained outputs are safe by now: a failed drawing only warns.
    // Rank 0 wrote the metrics, so it alone draws them.
    let metrics = job.output_dir.join(runlog::METRICS_FILE);
    if lead
        && let Err(e) =
            runlog::read_metrics(&metrics).and_then(|r| runlog::curves::draw(&job.output_dir, &r))
    {
        tracing::warn!(
            "{}: curves not drawn: {e:#}\nhint: `trace-train report {}` draws them again",
            job.stage,
            job.output_dir.display()
        );
    }
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
        stop_requested: stop_seen || stop.load(Ordering::Relaxed),
    })
}

/// A stage's outputs: the adapter in PEFT's layout in `final_dir`, the
/// merged model with the base's tokenizer files in `merged_dir`, each with
/// its model card and `generation_config.json` (Stages 1, 2 and 3 alike).
pub(crate) fn write_adapter_and_merged(
    loaded: &LoadedModel,
    tok: &ChatTokenizer,
    base_dir: &Path,
    info: &card::CardInfo,
    final_dir: &Path,
    merged_dir: &Path,
) -> anyhow::Result<()> {
    model::adapter::save(loaded, final_dir, &info.base_model)?;
    model::adapter::merge(loaded, merged_dir)?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        crate::data::tokenizer::CHAT_TEMPLATE_FILE,
    ] {
        let src = base_dir.join(f);
        if src.exists() {
            std::fs::copy(&src, merged_dir.join(f))
                .with_context(|| format!("cannot copy `{}`", src.display()))?;
        }
    }
    let generation = card::generation_config(base_dir, tok)?;
    card::write(final_dir, info, card::Kind::Adapter, &generation)?;
    card::write(merged_dir, info, card::Kind::Merged, &generation)?;
    Ok(())
}

/// The projections named in a config's `target_modules`, each checked.
pub(crate) fn target_modules(names: &[String]) -> anyhow::Result<Vec<TargetModule>> {
    names
        .iter()
        .map(|m| {
            TargetModule::parse(m).with_context(|| {
                format!("target module `{m}` is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj")
            })
        })
        .collect()
}

/// The dtype a run computes in: the configured one (`bf16`, `f16` or
/// `f32`) on an accelerator, f32 on the CPU.
pub fn train_dtype(name: &str, device: &Device) -> DType {
    match (name, device.is_cpu()) {
        (_, true) | ("f32", _) => DType::F32,
        ("f16", _) => DType::F16,
        _ => DType::BF16,
    }
}

fn save_checkpoint(
    out: &Path,
    state: &TrainerState,
    opt: &AdamW,
    keep: usize,
) -> anyhow::Result<()> {
    let params: BTreeMap<String, Tensor> = opt
        .vars()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    let dir = checkpoint::save(out, state, &params, &opt.state(), keep)?;
    tracing::info!("saved `{}`", dir.display());
    Ok(())
}

fn var_tensors(vars: &[(String, candle_core::Var)]) -> Vec<Tensor> {
    vars.iter().map(|(_, v)| v.as_tensor().clone()).collect()
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

/// A seed for (run seed, step, micro-batch): dropout masks differ per step
/// and repeat exactly on resume.
pub(crate) fn mix(seed: u64, step: u64, micro: u64) -> u64 {
    let mut h = seed ^ 0x9e37_79b9_7f4a_7c15;
    for x in [step, micro] {
        h = (h ^ x).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 31;
    }
    h
}

pub(crate) fn sha256_of(paths: &[&Path]) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    for p in paths {
        if p.exists() {
            checkpoint::hash_file(&mut h, p)
                .with_context(|| format!("cannot read `{}`", p.display()))?;
        }
    }
    Ok(crate::hex(&h.finalize()))
}

/// A quick fingerprint of a model folder: `config.json`, and each weight
/// file's name, length and 32 samples of 4 KiB spread over it. Hashing all
/// of a 4B model's 8 GB would cost seconds on every start; merging an
/// adapter rewrites most projection bytes, which the samples see.
pub(crate) fn weights_fingerprint(dir: &Path) -> anyhow::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    const SAMPLES: u64 = 32;
    const CHUNK: u64 = 4096;
    let mut h = Sha256::new();
    let config = dir.join("config.json");
    h.update(
        std::fs::read(&config).with_context(|| format!("cannot read `{}`", config.display()))?,
    );
    for path in model::weight_files(dir)? {
        let mut f = std::fs::File::open(&path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        let len = f.metadata()?.len();
        h.update(path.file_name().unwrap_or_default().as_encoded_bytes());
        h.update(len.to_le_bytes());
        let mut buf = vec![0u8; CHUNK as usize];
        for i in 0..SAMPLES {
            let at = (len.saturating_sub(CHUNK)) * i / (SAMPLES - 1);
            f.seek(SeekFrom::Start(at))?;
            let n = f.read(&mut buf)?;
            h.update(&buf[..n]);
        }
    }
    Ok(crate::hex(&h.finalize()))
}
