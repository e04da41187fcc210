//! `ppo` (Stage 3): settings from `config/stage3_ppo_config.json` (the
//! user's `{"ppo": {...}, "curriculum": {...}}`), the pipeline config's
//! model section and flags, the environment, then the RL recipe.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use trace_train::config::{
    self, HardwareConfig, ModelConfig, PipelineConfig, RlConfig, Sources, Stage3Config,
};
use trace_train::dataset::Source;
use trace_train::dist::{Communicator, Single};
use trace_train::env::Environment;
use trace_train::env::registry::{self, EnvData};
use trace_train::model::BasePrecision;
use trace_train::progress::Progress;
use trace_train::recipes::ppo::{self, RlJob, RlSummary};
use trace_train::sandbox;

#[derive(Args, Clone, Default, Serialize, Deserialize)]
#[command(rename_all = "snake_case")]
pub struct PpoArgs {
    /// Stage 3 config, `{"ppo": {...}, "curriculum": {...}}` (default:
    /// config/stage3_ppo_config.json when present).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Pipeline config whose `model` section applies (default:
    /// config/pipeline_config.json when present).
    #[arg(long)]
    pub pipeline_config: Option<PathBuf>,
    /// The policy's base model folder (default: Stage 2's merged model,
    /// checkpoints/stage2_sft/merged).
    #[arg(long)]
    pub model: Option<String>,
    /// `ppo` (value head, GAE), `grpo` (group-relative advantages),
    /// `dr_grpo` (GRPO without std or length normalisation) or `gspo`
    /// (a sequence-level ratio).
    #[arg(long)]
    pub algorithm: Option<String>,
    /// Where checkpoints (`step_N/`), `final/`, `merged/` and
    /// `metrics.jsonl` go (default checkpoints/stage3_ppo).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Prompts a step.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Completions a prompt (GRPO's group).
    #[arg(long)]
    pub group_size: Option<usize>,
    /// Learning rate of the LoRA adapter.
    #[arg(long)]
    pub learning_rate: Option<f64>,
    /// Optimizer steps of the run: its length, which the learning-rate
    /// schedule and the step budget plan for (`ppo.num_train_steps`).
    /// `--max_steps` stops earlier without changing that plan.
    #[arg(long)]
    pub num_train_steps: Option<usize>,
    /// Longest completion in tokens.
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// With a multi-step environment (`word_steps`, `python:` with an
    /// `Episode`, `http://`): the most actions an episode takes
    /// (`ppo.max_steps_per_episode`); it ends sooner when the environment
    /// says done.
    #[arg(long, value_name = "N")]
    pub max_steps_per_episode: Option<usize>,
    /// Sampling temperature.
    #[arg(long)]
    pub temperature: Option<f64>,
    /// KL coefficient to the reference policy (0 turns it off).
    #[arg(long)]
    pub kl_coef: Option<f64>,
    /// Checkpoint every N steps.
    #[arg(long)]
    pub save_steps: Option<usize>,
    #[arg(long)]
    /// Seed of task draws, sampling and minibatch order.
    pub seed: Option<u64>,
    /// `trace` (programs in the sandbox), any other environment of
    /// `eval --environment` (`word`, `sat`, `abd`, `ded`, `answers`,
    /// `word_steps`, ...), or a mixture joined by `+`, each optionally
    /// weighted (`trace:2+abd+ded`).
    #[arg(long)]
    pub environment: Option<String>,
    /// Rows of the trace environment: `builtin`, a JSONL path, `humaneval:PATH`,
    /// `synthetic:N[:SEED]`, a hub id, or several joined by `+`.
    #[arg(long)]
    pub dataset: Option<String>,
    /// Rows of ABD in a mixture: `builtin`, a JSONL path or a hub id.
    #[arg(long)]
    pub abd_dataset: Option<String>,
    /// Rows of DED in a mixture: `ded-builtin`, `humaneval:PATH`, a JSONL
    /// path or a hub id.
    #[arg(long)]
    pub ded_dataset: Option<String>,
    /// Turn the curriculum on or off (default: the config's `curriculum.enabled`).
    #[arg(long)]
    pub curriculum: Option<bool>,
    /// Sandbox worker slots (default: two a core, shared by the ranks of a
    /// several-GPU run).
    #[arg(long)]
    pub num_workers: Option<usize>,
    /// One-step off-policy: GPUs (of --num_gpus) that only sample, the
    /// next step's completions while the others train (default: the
    /// config's `ppo.sampler_ranks`; 0: synchronous).
    #[arg(long)]
    pub sampler_ranks: Option<usize>,
    /// Tokens (rows x padded length) one training pass holds at once; the
    /// update sums the micro-batches' gradients (default: the config's
    /// `ppo.micro_batch_tokens`; 0: chosen from the GPU's free memory).
    #[arg(long)]
    pub micro_batch_tokens: Option<usize>,
    /// Override one setting of the Stage 3 config by its key, as if the
    /// file said it: `--set ppo.top_p=0.9 --set curriculum.enabled=false`
    /// (presets and the other flags still go over it).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Seconds on a CPU: a tiny model the run makes itself (unless --model),
    /// a few small steps.
    #[arg(long)]
    pub quick_test: bool,
    /// Run programs WITHOUT isolation (rlimits only). Only for machines and
    /// programs you trust.
    #[arg(long = "unsafe-no-sandbox")]
    pub unsafe_no_sandbox: bool,
    #[command(flatten)]
    pub run: super::RunFlags,
    /// Settings given in place of a file (the pipeline's `stage3` section).
    #[arg(skip)]
    pub settings: Option<Box<Stage3Config>>,
    /// These arguments, as the pipeline resolved them for a stage on
    /// several GPUs: its ranks read them from this file.
    #[arg(long, hide = true)]
    #[serde(skip)]
    pub resolved: Option<PathBuf>,
}

/// The pipeline config of `args` (its `model` and `hardware` sections
/// apply), when one is named or `config/pipeline_config.json` exists.
fn pipeline_config(args: &PpoArgs) -> anyhow::Result<Option<PipelineConfig>> {
    let default_file = Path::new("config/pipeline_config.json");
    Ok(match &args.pipeline_config {
        Some(p) => Some(config::load(p)?),
        None if default_file.is_file() => Some(config::load(default_file)?),
        None => None,
    })
}

/// File values, then flags. Every flag is handled here.
pub fn resolve(args: &PpoArgs) -> anyhow::Result<RlJob> {
    let default_file = Path::new("config/stage3_ppo_config.json");
    let mut s3: Stage3Config = match (&args.settings, &args.config) {
        (Some(s), _) => (**s).clone(),
        (None, Some(p)) => config::load(p)?,
        (None, None) if default_file.is_file() => config::load(default_file)?,
        (None, None) => Stage3Config::default(),
    };
    // Checked with the flags below.
    config::apply_sets_unchecked(&mut s3, &mut Sources::default(), &args.set)?;
    let (mut model, hardware): (ModelConfig, HardwareConfig) = match pipeline_config(args)? {
        Some(mut p) => {
            if p.hardware.b200_mode {
                // The one-large-GPU preset of the pipeline applies to its
                // stages run alone too (bf16 base, no checkpointing, larger
                // micro-batches); flags still win.
                p.apply_b200(&mut Sources::default(), "hardware.b200_mode");
                s3.ppo.micro_batch_tokens = p.stage3.ppo.micro_batch_tokens;
            }
            (p.model, p.hardware)
        }
        None => Default::default(),
    };
    let c = &mut s3.ppo;
    macro_rules! set {
        ($flag:expr, $field:expr) => {
            if let Some(v) = $flag.clone() {
                $field = v;
            }
        };
    }
    set!(args.algorithm, c.algorithm);
    set!(args.batch_size, c.batch_size);
    set!(args.learning_rate, c.optim.learning_rate);
    set!(args.num_train_steps, c.num_train_steps);
    set!(args.max_new_tokens, c.max_new_tokens);
    set!(args.max_steps_per_episode, c.max_steps_per_episode);
    set!(args.temperature, c.temperature);
    set!(args.save_steps, c.save.save_steps);
    set!(args.seed, c.seed);
    set!(args.environment, c.environment);
    set!(args.dataset, c.dataset);
    set!(args.abd_dataset, c.abd_dataset);
    set!(args.ded_dataset, c.ded_dataset);
    set!(args.num_workers, c.num_workers);
    set!(args.sampler_ranks, c.sampler_ranks);
    set!(args.curriculum, s3.curriculum.enabled);
    if let Some(g) = args.group_size {
        c.group_size = Some(g);
    }
    if let Some(k) = args.kl_coef {
        c.kl_coef = Some(k);
    }
    if let Some(o) = &args.output_dir {
        c.save.output_dir = Some(o.clone());
    }
    if let Some(n) = args.micro_batch_tokens {
        c.micro_batch_tokens = Some(n);
    }
    if let Some((precision, _)) = args.run.base_precision()? {
        model.base_precision = precision;
    }
    let output_dir = c
        .save
        .output_dir
        .clone()
        .unwrap_or_else(|| "checkpoints/stage3_ppo".into());
    let mut model_spec = args.model.clone();
    if args.quick_test {
        c.batch_size = c.batch_size.min(2);
        c.num_train_steps = c.num_train_steps.min(3);
        c.max_new_tokens = c.max_new_tokens.min(16);
        c.mini_batch_size = 4;
        c.save.save_steps = 2;
        c.max_prompt_tokens = 1500;
        c.optim.learning_rate = 1e-3;
        if c.rl_algorithm().group_relative() {
            c.group_size = Some(2);
        }
        if model_spec.is_none() {
            let base = output_dir.join("base-model");
            trace_train::model::arch::tiny::write_tiny_chat_model(&base, 7)?;
            model_spec = Some(base.display().to_string());
        }
        model.base_precision = BasePrecision::Bf16;
    }
    let problems = config::Validate::problems(&s3);
    anyhow::ensure!(
        problems.is_empty(),
        "invalid settings:\n  - {}",
        problems.join("\n  - ")
    );
    let model_spec = model_spec.unwrap_or_else(|| "checkpoints/stage2_sft/merged".into());
    let base_dir = trace_train::model::io::resolve::resolve(&model_spec).with_context(|| {
        format!("no policy model at `{model_spec}`\nhint: run Stage 2 (`trace-train sft`) first, or pass --model")
    })?;
    let device = super::pick_device(args.run.device.as_deref().unwrap_or("auto"))?;
    // As SFT: the pipeline's `hardware.gradient_checkpointing` (on by
    // default) means "on a GPU"; the stage's key and the flag apply anywhere.
    s3.ppo.gradient_checkpointing = Some(
        args.run
            .gradient_checkpointing
            .or(s3.ppo.gradient_checkpointing)
            .unwrap_or(hardware.gradient_checkpointing && !device.is_cpu()),
    );
    let c = &s3.ppo;
    let (env, env_description) = environment(c, args.unsafe_no_sandbox)?;
    Ok(RlJob {
        config: s3.ppo.clone(),
        curriculum: s3.curriculum.clone(),
        model,
        base_dir,
        output_dir,
        device,
        env,
        env_description,
        resume: args.run.resume,
        force: args.run.force,
        max_steps: args.run.max_steps,
    })
}

/// The environment `c` names ([`registry::for_training`]) and its
/// description for the resume check. The trace environment alone gets
/// this host's share of the sandbox's slots when several ranks run here.
pub fn environment(
    c: &RlConfig,
    unsafe_no_sandbox: bool,
) -> anyhow::Result<(Arc<dyn Environment>, String)> {
    let trace_workers = if c.num_workers == 0 {
        (sandbox::default_workers() / super::launch::ranks_on_this_host()).max(1)
    } else {
        c.num_workers
    };
    registry::for_training(
        &c.environment,
        &EnvData::from(c),
        unsafe_no_sandbox,
        trace_workers,
    )
}

/// Resolves, without reading them, the local datasets `c`'s environment
/// reads (the trace part's `dataset`; a hub id is left to the run). A
/// pipeline calls it before its first stage, so a wrong path in Stage 3's
/// settings stops the run at once, not after hours of Stages 0-2.
pub fn check_local_datasets(c: &RlConfig) -> anyhow::Result<()> {
    if registry::reads_trace(&c.environment)? {
        Source::check_local(&c.dataset)?;
    }
    Ok(())
}

/// `ppo` from the command line: on one device, or on several GPUs (this
/// process starts one child a GPU, each child runs one rank).
pub fn run_command(args: &PpoArgs) -> anyhow::Result<()> {
    let from_file;
    let args = match &args.resolved {
        Some(file) => {
            from_file = super::launch::read_resolved::<PpoArgs>(file)?;
            &from_file
        }
        None => args,
    };
    let hardware = pipeline_config(args)?
        .map(|p| p.hardware)
        .unwrap_or_else(HardwareConfig::default);
    let requested = args.run.num_gpus.or(hardware.num_gpus);
    super::launch::dispatch(
        requested,
        args.run.device.as_deref().unwrap_or("auto"),
        || run(args).map(|_| ()),
        |child, progress| {
            let mut args = args.clone();
            args.run.device = Some(child.device());
            let job = resolve(&args)?;
            let comm = child.communicator(&job.device)?;
            run_job(&job, &*comm, progress).map(|_| ())
        },
    )
}

/// Stage 3 on one device.
pub fn run(args: &PpoArgs) -> anyhow::Result<RlSummary> {
    let job = resolve(args)?;
    run_job(&job, &Single, &super::progress::Bar::new("step"))
}

/// Where several GPUs ran in step and sampling and scoring (`split`: they,
/// then training, mean seconds a step) outweighed a training that ran: one-step
/// off-policy takes them off the trainers' path (at SmolLM2-135M on two
/// GPUs, 2.39x one GPU where two in step gave 0.95x).
fn off_policy_hint(
    world: usize,
    sampler_ranks: usize,
    split: Option<(f64, f64)>,
) -> Option<String> {
    let (beside, training) = split?;
    // A run that trained nothing (every group of equal rewards) has no
    // training to overlap.
    (world > 1 && sampler_ranks == 0 && training > 0.0 && beside > training).then(|| {
        format!(
            "hint: sampling and scoring took {beside:.2} s a step and training {training:.2} s; with `--sampler_ranks 1` one GPU makes the next step's batch while the others train (one-step off-policy), and a step takes about the longer of the two"
        )
    })
}

/// Where episodes of several actions trained an action a sequence (each
/// holding the conversation before it) and the algorithm can train an
/// episode as one sequence instead.
fn episode_sequences_hint(
    algorithm: &str,
    episodes_apart: u64,
    split: Option<(f64, f64)>,
) -> Option<String> {
    (episodes_apart > 0 && algorithm != "gspo").then(|| {
        let times = split
            .map(|(beside, training)| {
                format!(" (training took {training:.2} s a step, sampling and scoring {beside:.2})")
            })
            .unwrap_or_default();
        format!(
            "hint: {episodes_apart} episodes of several actions trained an action a sequence, each holding the conversation before it{times}; `--set ppo.episode_sequences=true` trains each episode as one sequence, with far fewer tokens through the model and the same gradient where a minibatch holds whole episodes (`mini_batch_size` then counts episodes)"
        )
    })
}

/// Runs `job` as `comm`'s rank and, on rank 0, reports it.
fn run_job(
    job: &RlJob,
    comm: &dyn Communicator,
    progress: &dyn Progress,
) -> anyhow::Result<RlSummary> {
    let lead = comm.rank() == 0;
    if lead {
        eprintln!(
            "stage 3: {} on the {} environment, {} steps of {} prompts x {} completions, from `{}`{}",
            job.config.algorithm,
            // As the user named it: a single environment of another
            // source runs as a mixture of one, whose name says nothing.
            job.config.environment,
            job.max_steps
                .map_or(job.config.num_train_steps as u64, |m| m
                    .min(job.config.num_train_steps as u64)),
            job.config.batch_size,
            job.config.group_size(),
            job.base_dir.display(),
            super::on_gpus(comm.world())
        );
        if (1..comm.world()).contains(&job.config.sampler_ranks) {
            eprintln!(
                "stage 3: one-step off-policy: the last {} GPU(s) sample each step's batch while the others train on the one before",
                job.config.sampler_ranks
            );
        }
    }
    let s = ppo::run_with(job, comm, progress).map_err(|e| {
        super::out_of_memory_hint(
            e,
            "lower ppo.micro_batch_tokens (--micro_batch_tokens; training passes) or turn gradient checkpointing on, or lower batch_size, group_size or max_new_tokens (sampling); checkpoints written so far are intact, continue with --resume",
        )
    })?;
    if !lead {
        return Ok(s);
    }
    let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
    let counts = super::counts;
    eprintln!(
        "stage 3: {} steps{}, reward {} -> {}, curriculum level {}; masked completions: {}; tasks passed over: {}",
        s.steps,
        s.resumed_from
            .map(|r| format!(" (resumed at {r})"))
            .unwrap_or_default(),
        fmt(s.first_reward),
        fmt(s.last_reward),
        s.curriculum_level,
        counts(&s.masked),
        counts(&s.skipped_tasks),
    );
    if let Some(hint) = off_policy_hint(comm.world(), job.config.sampler_ranks, s.split_secs) {
        eprintln!("{hint}");
    }
    if let Some(hint) =
        episode_sequences_hint(&job.config.algorithm, s.episodes_apart, s.split_secs)
    {
        eprintln!("{hint}");
    }
    if let Some(rows) = job.env.rows()
        && !s.bad_rows.is_empty()
    {
        eprintln!(
            "stage 3: {} of the {} rows of `{}` fail when their programs run in the sandbox and were not drawn again (the log names each)",
            s.bad_rows.len(),
            rows.len(),
            rows.name()
        );
    }
    super::report_ending(
        "stage 3",
        s.interrupted,
        s.stop_requested,
        &s.final_dir,
        &s.merged_dir,
    );
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: PpoArgs,
    }

    #[test]
    fn a_rank_reads_the_pipeline_settings_back_from_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base model");
        trace_train::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
        let mut settings = Stage3Config::default();
        settings.ppo.algorithm = "grpo".into();
        settings.ppo.batch_size = 3;
        settings.ppo.group_size = Some(5);
        settings.ppo.optim.learning_rate = 1.0e-4 / 3.0;
        settings.ppo.environment = "word".into();
        settings.curriculum.enabled = true;
        let args = PpoArgs {
            model: Some(base.display().to_string()),
            output_dir: Some(dir.path().join("out dir")),
            micro_batch_tokens: Some(512),
            settings: Some(Box::new(settings.clone())),
            run: super::super::RunFlags {
                device: Some("cpu".into()),
                num_gpus: Some(2),
                resume: true,
                no_4bit: true,
                gradient_checkpointing: Some(true),
                ..Default::default()
            },
            ..PpoArgs::default()
        };
        let file = dir.path().join("pipeline_ppo_settings.json");
        std::fs::write(&file, serde_json::to_string_pretty(&args).unwrap()).unwrap();
        let mut argv = vec![std::ffi::OsString::from("trace-train")];
        argv.extend(
            super::super::launch::resolved_argv("ppo", &file)
                .into_iter()
                .skip(1),
        );
        let flags = Wrap::try_parse_from(argv).unwrap().args;
        let back = super::super::launch::read_resolved::<PpoArgs>(flags.resolved.as_ref().unwrap())
            .unwrap();
        assert_eq!(back.run, args.run);
        assert!(!back.quick_test && back.resolved.is_none());
        let (job, want) = (resolve(&back).unwrap(), resolve(&args).unwrap());
        let json = |j: &RlJob| serde_json::to_value((&j.config, &j.curriculum)).unwrap();
        assert_eq!(json(&job), json(&want));
        assert_eq!(job.config.group_size, Some(5));
        assert_eq!(job.output_dir, dir.path().join("out dir"));
        assert_eq!(
            (
                job.config.gradient_checkpointing,
                job.config.micro_batch_tokens
            ),
            (Some(true), Some(512))
        );
    }

    #[test]
    fn checkpointing_and_the_micro_batch_budget_resolve_as_sfts() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        trace_train::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
        let stage3 = |ppo: serde_json::Value| {
            let f = dir
                .path()
                .join(format!("s3-{}.json", ppo.to_string().len()));
            std::fs::write(&f, serde_json::json!({"ppo": ppo}).to_string()).unwrap();
            f
        };
        let pipeline = dir.path().join("pipeline.json");
        std::fs::write(
            &pipeline,
            r#"{"hardware": {"gradient_checkpointing": true}}"#,
        )
        .unwrap();
        let args = |config: PathBuf, pipeline: &Path| PpoArgs {
            config: Some(config),
            pipeline_config: Some(pipeline.to_owned()),
            model: Some(base.display().to_string()),
            output_dir: Some(dir.path().join("out")),
            environment: Some("word".into()),
            run: super::super::RunFlags {
                device: Some("cpu".into()),
                ..Default::default()
            },
            ..PpoArgs::default()
        };
        let plain = stage3(serde_json::json!({}));
        // On by default means on a GPU: off on the CPU; the stage's key and
        // the flag apply anywhere, the flag last.
        let job = resolve(&args(plain.clone(), &pipeline)).unwrap();
        assert_eq!(job.config.gradient_checkpointing, Some(false));
        assert_eq!(job.config.micro_batch_tokens, None);
        let on =
            stage3(serde_json::json!({"gradient_checkpointing": true, "micro_batch_tokens": 640}));
        let job = resolve(&args(on.clone(), &pipeline)).unwrap();
        assert_eq!(
            (
                job.config.gradient_checkpointing,
                job.config.micro_batch_tokens
            ),
            (Some(true), Some(640))
        );
        let mut a = args(on, &pipeline);
        a.run.gradient_checkpointing = Some(false);
        a.micro_batch_tokens = Some(0);
        let job = resolve(&a).unwrap();
        assert_eq!(
            (
                job.config.gradient_checkpointing,
                job.config.micro_batch_tokens
            ),
            (Some(false), Some(0))
        );
        let mut a = args(plain.clone(), &pipeline);
        a.run.gradient_checkpointing = Some(true);
        let job = resolve(&a).unwrap();
        assert_eq!(job.config.gradient_checkpointing, Some(true));
        // The pipeline file's b200 preset: bf16 base, no checkpointing,
        // Stage 3's larger micro-batches; a flag still wins.
        let b200 = dir.path().join("b200.json");
        std::fs::write(&b200, r#"{"hardware": {"b200_mode": true}}"#).unwrap();
        let job = resolve(&args(plain.clone(), &b200)).unwrap();
        assert_eq!(
            job.config.micro_batch_tokens,
            Some(config::B200_MICRO_BATCH_TOKENS)
        );
        assert_eq!(job.model.base_precision, BasePrecision::Bf16);
        assert_eq!(job.config.gradient_checkpointing, Some(false));
        let mut fp8 = args(plain.clone(), &b200);
        fp8.run.base_precision = Some(BasePrecision::Fp8);
        assert_eq!(
            resolve(&fp8).unwrap().model.base_precision,
            BasePrecision::Fp8
        );
        fp8.run.no_4bit = true;
        let err = resolve(&fp8).err().unwrap().to_string();
        assert!(err.contains("--no_4bit") && err.contains("fp8"), "{err}");
        let job = resolve(&PpoArgs {
            micro_batch_tokens: Some(100),
            ..args(plain, &b200)
        })
        .unwrap();
        assert_eq!(job.config.micro_batch_tokens, Some(100));
    }

    /// `--set` and `--max_steps_per_episode` win over the file's key (the
    /// flag last); a zero or an unknown key is refused naming the key.
    #[test]
    fn max_steps_per_episode_and_set_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        trace_train::model::arch::tiny::write_tiny_chat_model(&base, 7).unwrap();
        let file = dir.path().join("s3.json");
        std::fs::write(&file, r#"{"ppo": {"max_steps_per_episode": 9}}"#).unwrap();
        let pipeline = dir.path().join("pipeline.json");
        std::fs::write(&pipeline, "{}").unwrap();
        let args = |n: Option<usize>| PpoArgs {
            config: Some(file.clone()),
            pipeline_config: Some(pipeline.clone()),
            model: Some(base.display().to_string()),
            output_dir: Some(dir.path().join("out")),
            environment: Some("word_steps".into()),
            max_steps_per_episode: n,
            run: super::super::RunFlags {
                device: Some("cpu".into()),
                ..Default::default()
            },
            ..PpoArgs::default()
        };
        assert_eq!(
            resolve(&args(None)).unwrap().config.max_steps_per_episode,
            9
        );
        assert_eq!(
            resolve(&args(Some(4)))
                .unwrap()
                .config
                .max_steps_per_episode,
            4
        );
        let err = resolve(&args(Some(0))).err().unwrap().to_string();
        assert!(err.contains("max_steps_per_episode"), "{err}");
        // `--set` reads as the file would; the flag still goes over it.
        let mut a = args(None);
        a.set = vec!["ppo.max_steps_per_episode=6".into(), "ppo.top_p=0.9".into()];
        let job = resolve(&a).unwrap();
        assert_eq!(
            (job.config.max_steps_per_episode, job.config.top_p),
            (6, 0.9)
        );
        a.max_steps_per_episode = Some(3);
        assert_eq!(resolve(&a).unwrap().config.max_steps_per_episode, 3);
        // A setting that needs another algorithm than the file's, given
        // by a flag: checked once the flags apply.
        a.set = vec![
            "ppo.episode_sequences=true".into(),
            "ppo.algorithm=gspo".into(),
        ];
        let err = format!("{:#}", resolve(&a).err().unwrap());
        assert!(err.contains("episode_sequences"), "{err}");
        a.algorithm = Some("grpo".into());
        assert!(resolve(&a).unwrap().config.episode_sequences);
        a.set = vec!["ppo.no_such_key=1".into()];
        let err = format!("{:#}", resolve(&a).err().unwrap());
        assert!(err.contains("ppo.no_such_key"), "{err}");
    }

    /// The episode-sequences hint: only where episodes of several actions
    /// trained apart, and not for GSPO, which cannot train them whole.
    #[test]
    fn episode_sequences_hint_only_where_episodes_trained_apart() {
        let hint = episode_sequences_hint("grpo", 12, Some((3.0, 9.5))).unwrap();
        assert!(hint.contains("12 episodes"), "{hint}");
        assert!(hint.contains("training took 9.50 s"), "{hint}");
        assert!(hint.contains("ppo.episode_sequences=true"), "{hint}");
        assert!(episode_sequences_hint("ppo", 1, None).is_some());
        assert_eq!(episode_sequences_hint("grpo", 0, Some((3.0, 9.5))), None);
        assert_eq!(episode_sequences_hint("gspo", 12, Some((3.0, 9.5))), None);
    }

    /// The off-policy hint: only for several GPUs in step where sampling
    /// and scoring outweighed training.
    #[test]
    fn off_policy_hint_only_where_sampling_outweighs_training_on_gpus_in_step() {
        let hint = off_policy_hint(2, 0, Some((1.5, 1.0))).unwrap();
        assert!(
            hint.contains("1.50 s") && hint.contains("--sampler_ranks 1"),
            "{hint}"
        );
        assert_eq!(off_policy_hint(2, 0, Some((0.5, 1.0))), None);
        assert_eq!(off_policy_hint(1, 0, Some((1.5, 1.0))), None);
        assert_eq!(off_policy_hint(2, 1, Some((1.5, 1.0))), None);
        assert_eq!(off_policy_hint(2, 0, None), None);
        assert_eq!(off_policy_hint(2, 0, Some((1.5, 0.0))), None);
    }
}
